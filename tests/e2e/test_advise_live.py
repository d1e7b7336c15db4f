"""``kvgate advise --metrics`` against a live embedded vLLM after a mixed load, end to end: the
histograms vLLM fills while serving become a profile that passes the fit gate.

One vLLM start-up (~40 s on 2 cores); marked e2e. Run under the exclusive lock:
``flock /work/kvgate-vllm.lock .venv/bin/python -m pytest tests/e2e/test_advise_live.py``.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvgate.gates.fit import fit_verdict
from kvgate.launch.local import EmbeddedServer
from kvgate.launch.tinymodel import TinySpec, ensure_model
from kvgate.authoring.lint import lint_file
from kvgate.profile.models import load_profile

from ..conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SHORT, LONG = (40, 16), (1500, 32)  # (prompt tokens, output tokens)
MIX = [SHORT] * 12 + [LONG] * 4


def test_advise_from_live_histograms_after_a_mixed_load(tmp_path):
    tiny = load_profile("tiny-cpu")
    model_dir = ensure_model(TinySpec.from_architecture(tiny.model.architecture))
    server = EmbeddedServer(tiny, model_dir, tmp_path / "vllm.log", startup_budget_s=240)
    try:
        url = server.start().rstrip("/")
        api = url if url.endswith("/v1") else f"{url}/v1"
        served = tiny.model.served_name

        def send(shape: tuple[int, int]) -> int:
            prompt, output = shape
            body = {"model": served, "prompt": [100] * prompt, "max_tokens": output, "min_tokens": output,
                    "ignore_eos": True, "temperature": 0}
            r = httpx.post(f"{api}/completions", json=body, timeout=120)
            r.raise_for_status()
            usage = r.json()["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, output)
            return r.status_code

        with ThreadPoolExecutor(max_workers=4) as pool:  # bounded: 16 requests, 4 at a time
            assert list(pool.map(send, MIX)) == [200] * len(MIX)

        out = tmp_path / "advised.yaml"
        proc = subprocess.run(
            [sys.executable, "-m", "kvgate", "advise", "--metrics", url, "--hf-config", str(model_dir / "config.json"),
             "--served-name", served, "--dtype", "float32", "--kv-cache-memory-bytes", str(64 << 20),
             "--concurrency", "4", "-o", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 requests" in proc.stdout and "paired quantile by quantile" in proc.stdout
    prof = load_profile(str(out))
    # the long requests (1,500 + 32 tokens) sit in vLLM's (1000, 2000] prompt bucket: p99 of prompt +
    # output interpolates to ~2,000 tokens -> one 1,024-token step up
    assert prof.engine.max_model_len == 2048
    assert prof.engine.kv_cache_memory_bytes == 64 << 20 and prof.model.architecture.layers == 2
    assert prof.workloads["observed-long"].long and prof.workloads["observed-long"].concurrency == 1
    assert prof.workloads["observed-short"].prompt_tokens <= 50
    assert fit_verdict(prof).status.value == "PASS"
    _, findings = lint_file(str(out))
    assert [f.line() for f in findings if f.counts] == []
