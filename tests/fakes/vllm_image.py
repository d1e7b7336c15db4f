"""A local Docker image that behaves like ``vllm/vllm-openai`` for the docker launcher's tests:
Debian bookworm (``debootstrap --variant=minbase --include=python3``, imported with ``docker
import`` -- nothing can be pulled here) plus the fake vLLM and the pure-Python packages it needs,
copied from this venv, and a ``vllm.entrypoints.openai.api_server`` shim that reads vLLM's own
command line (``--served-model-name``, ``--host``, ``--port``, ``--max-model-len``,
``--override-generation-config``; ``--fake-fault``/``--fake-set`` from a test profile's
``engine.extra_args``) and serves the fake with it.

Also the Docker engine itself: :func:`ensure_docker` uses a running one, or starts
``dockerd --bridge=none --iptables=false`` as root when the binary is installed, or says why not.

Cached: the bookworm root file system as a tar in ``$KVGATE_CACHE_DIR/docker`` (default
``~/.cache/kvgate/docker``; ~25-100 s to make once), the image by a tag hashing everything
copied into it (a rebuild, ``docker import`` of ~150 MB, takes a few seconds).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PACKAGES = ("anyio", "uvicorn", "prometheus_client", "starlette", "h11", "click", "sniffio", "idna",
            "typing_extensions")
SITE = "/opt/kvgate/site"
IMAGE_REPO = "local/kvgate-fake-vllm"

SHIM = '''"""vllm.entrypoints.openai.api_server stand-in: vLLM's command line -> the fake vLLM."""
import argparse
import json
import sys

import fake_vllm

p = argparse.ArgumentParser()
p.add_argument("--model")
p.add_argument("--served-model-name")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, default=8000)
p.add_argument("--max-model-len", type=int)
p.add_argument("--override-generation-config")
p.add_argument("--fake-fault", action="append", default=[], help="a fake_vllm fault (tests: engine.extra_args)")
p.add_argument("--fake-set", action="append", default=[], help="a FakeConfig FIELD=VALUE (tests: engine.extra_args)")
args, rest = p.parse_known_args()
print("fake vLLM in a container; ignoring", rest, flush=True)
argv = ["--host", args.host, "--port", str(args.port), "--served-name", args.served_model_name or args.model]
if args.max_model_len:
    argv += ["--max-model-len", str(args.max_model_len)]
cap = json.loads(args.override_generation_config or "{}").get("max_new_tokens")
if cap:
    argv += ["--set", f"max_tokens_cap={cap}"]
for fault in args.fake_fault:
    argv += ["--fault", fault]
for item in args.fake_set:
    argv += ["--set", item]
sys.exit(fake_vllm.main(argv))
'''


class Unavailable(Exception):
    """No Docker engine or no way to build the image here; the message says why (a SKIP reason)."""


def cache_dir() -> Path:
    return Path(os.environ.get("KVGATE_CACHE_DIR", Path.home() / ".cache" / "kvgate")) / "docker"


def _docker(*args: str, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], input=input, capture_output=True, timeout=timeout)


def ensure_docker(log: Path, wait_s: float = 30.0) -> subprocess.Popen | None:
    """A Docker engine to talk to: None when one answers already, else the ``dockerd`` this started
    (the caller stops it). Raises :class:`Unavailable` with the reason."""
    if shutil.which("docker") is None:
        raise Unavailable("no docker CLI (apt-get install docker.io)")
    if _docker("info", timeout=20).returncode == 0:
        return None
    if shutil.which("dockerd") is None:
        raise Unavailable("no Docker engine running and no dockerd installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        raise Unavailable("no Docker engine running, and dockerd needs root")
    proc = subprocess.Popen(["dockerd", "--bridge=none", "--iptables=false"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"dockerd exited with {proc.returncode}: {log.read_text()[-300:]}")
        if _docker("info", timeout=10).returncode == 0:
            return proc
        time.sleep(0.5)
    proc.terminate()
    raise Unavailable(f"dockerd did not answer within {wait_s:g} s")


def base_rootfs() -> Path:
    """The cached bookworm+python3 root file system tar (made with debootstrap when missing)."""
    tar = cache_dir() / "bookworm-python3.tar"
    if tar.is_file():
        return tar
    if shutil.which("debootstrap") is None:
        raise Unavailable("no debootstrap to build a local base image (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise Unavailable("debootstrap needs root")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tar.parent) as tmp:
        root = Path(tmp) / "rootfs"
        r = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", "bookworm", str(root)],
                           capture_output=True, timeout=900)
        if r.returncode != 0:
            raise Unavailable(f"debootstrap failed: {r.stdout.decode(errors='replace')[-300:]}")
        part = tar.with_suffix(".tar.part")
        subprocess.run(["tar", "-C", str(root), "-cf", str(part), "."], check=True)
        part.replace(tar)
    return tar


def _extra_files() -> dict[str, bytes]:
    """Path in the image -> content: the packages, the fake, the shim."""
    files: dict[str, bytes] = {}
    for name in PACKAGES:
        dist = md.distribution(name)
        for f in dist.files or ():
            if f.suffix in (".py", ".typed") and not str(f).startswith(".."):
                files[f"{SITE}/{f}"] = Path(dist.locate_file(f)).read_bytes()
    files[f"{SITE}/fake_vllm.py"] = (HERE / "fake_vllm.py").read_bytes()
    for pkg in ("vllm", "vllm/entrypoints", "vllm/entrypoints/openai"):
        files[f"{SITE}/{pkg}/__init__.py"] = b""
    files[f"{SITE}/vllm/entrypoints/openai/api_server.py"] = SHIM.encode()
    return files


def image() -> str:
    """The fake-vLLM image's tag, built when missing. Raises :class:`Unavailable`."""
    files = _extra_files()
    return _import(IMAGE_REPO, {p: (lambda d=d: d) for p, d in files.items()},
                   "".join(sorted(f"{p}:{hashlib.sha256(d).hexdigest()}" for p, d in files.items())))


def _import(repo: str, files: dict[str, "Callable[[], bytes]"], digest: str) -> str:
    """``docker import`` of the cached bookworm root plus ``files`` (image path -> content), with
    ``PYTHONPATH`` at :data:`SITE`; tagged by a hash of the base and ``digest``, reused when present."""
    base = base_rootfs()
    h = hashlib.sha256(f"{base.stat().st_size}:{base.stat().st_mtime_ns}:{digest}".encode())
    tag = f"{repo}:{h.hexdigest()[:12]}"
    if _docker("image", "inspect", tag).returncode == 0:
        return tag
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as out, tarfile.open(base) as src:
            for member in src:
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
            for path, read in files.items():
                data = read()
                info = tarfile.TarInfo("." + path)
                info.size, info.mode, info.mtime = len(data), 0o755 if path.endswith(".so") else 0o644, 0
                out.addfile(info, io.BytesIO(data))
        buf.seek(0)
        r = subprocess.run(["docker", "import", "--change", f"ENV PYTHONPATH={SITE}", "-", tag], stdin=buf,
                           capture_output=True, timeout=600)
    if r.returncode != 0:
        raise Unavailable(f"docker import failed: {r.stderr.decode(errors='replace')[-300:]}")
    return tag


def _closure(roots: tuple[str, ...]) -> list[md.Distribution]:
    """The installed distributions ``roots`` need (their requirements, recursively; no extras)."""
    import re

    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for r in dist.requires or ():
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def python_base_image() -> str:
    """A base for kvgate's Dockerfile with no network: bookworm + python3 + kvgate's dependencies
    (no extras) and pip/setuptools, copied from this venv (same CPython 3.11 ABI) onto
    ``PYTHONPATH``. Build the Dockerfile on it with ``PIP_ARGS=--no-deps --no-build-isolation``."""
    files: dict[str, Callable[[], bytes]] = {}
    digest = []
    deps = [d for d in _closure(("kvgate", "pip", "setuptools")) if d.metadata["Name"].lower() != "kvgate"]
    for dist in deps:
        digest.append(f"{dist.metadata['Name']}=={dist.version}")
        for f in dist.files or ():
            src = Path(dist.locate_file(f))
            if str(f).startswith("..") or "__pycache__" in str(f) or not src.is_file():
                continue
            files[f"{SITE}/{f}"] = src.read_bytes
    return _import("local/kvgate-pybase", files, ",".join(sorted(digest)))
