"""The edge-requests gate (suites/test_requests.py) against the fault-injecting fake vLLM: PASS on
the healthy fake, FAIL naming the case on each fault; garbage from the endpoint (HTML error
pages, empty 502s, cut streams) is a verdict in every server-facing suite, never a harness error;
SSE framing the spec allows (CRLF, comments, event fields) passes. Suites run through pytester
with ``--endpoint``; verdicts are read back from summary.json."""

from __future__ import annotations

import pytest
import yaml

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import fake, run_suites  # noqa: F401  (fake: the healthy fake fixture, shared)

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
SUITE = ["suites/test_requests.py"]
SERVER_SUITES = ["suites/test_max_context.py", "suites/test_max_tokens.py", "suites/test_streaming.py",
                 "suites/test_requests.py", "suites/test_load.py"]


def run(pytester, url, suites=SUITE, profile=PROFILE):
    """:func:`tests.test_gates_vs_fake.run_suites`, gates keyed without the profile name."""
    result, summary, gates = run_suites(pytester, url, suites=suites, profile=profile)
    return result, summary, {k.removeprefix("fake-vllm/"): g for k, g in gates.items()}


def test_healthy_fake_passes_every_edge_request(pytester, fake):
    result, summary, gates = run(pytester, fake.url)
    assert summary["overall"] == "PASS", [g["message"] for g in gates.values() if g["status"] != "PASS"]
    assert len(gates) == 33 and all(g["status"] == "PASS" for g in gates.values())
    # ids read from profile data; a 4xx case names the server's reason, a 200 case its tokens
    assert "-> 400" in gates["requests/max-tokens/zero/chat"]["message"]
    assert "-> 404" in gates["requests/malformed/unknown-model"]["message"]
    assert "-> 200" in gates["requests/max-tokens/null/completions"]["message"]
    assert "valid as openai ChatCompletionChunk (strict)" in gates["requests/chunk-schema/chat"]["message"]
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


# fault -> (gates that must FAIL, fragment of their message)
FAULT_CASES = {
    "validation_500": (["requests/max-tokens/zero/completions", "requests/max-tokens/string/chat",
                        "requests/malformed/not-json", "requests/malformed/wrong-types"], "never a 5xx"),
    "empty_prompt_kills": (["requests/empty-prompt/string"], "server unhealthy, whatever /health says"),
    "plain_error_body": (["requests/malformed/not-json", "requests/max-tokens/negative/chat"],
                         "without OpenAI's error body"),
    "ignore_min_tokens": (["requests/min-tokens/completions", "requests/min-tokens/chat"], "at least 32 must"),
    "split_utf8": (["requests/non-ascii-stream/completions", "requests/non-ascii-stream/chat"],
                   "replacement characters"),
    "finish_reason_empty": (["requests/chunk-schema/chat"], "fails ChatCompletionChunk at choices.0.finish_reason"),
    "usage_unasked": (["requests/chunk-schema/completions", "requests/chunk-schema/chat"], "not asked for"),
    "error_mid_stream": (["requests/chunk-schema/completions"], "is an error object"),
    "truncated_stream": (["requests/chunk-schema/chat", "requests/route-timeout"], "RemoteProtocolError"),
}


@pytest.mark.parametrize("fault", list(FAULT_CASES))
def test_edge_gate_fails_on_fault(pytester, fake, fault):
    fake.config.faults.add(fault)
    result, summary, gates = run(pytester, fake.url)
    must_fail, fragment = FAULT_CASES[fault]
    assert summary["overall"] == "FAIL" and result.ret == pytest.ExitCode.TESTS_FAILED
    for gate in must_fail:
        assert gates[gate]["status"] == "FAIL", (gate, gates[gate])
        assert fragment in gates[gate]["message"] and "-> FAIL" in gates[gate]["message"], gates[gate]["message"]


def test_edge_case_on_fault_names_the_request_and_status(pytester, fake):
    fake.config.faults.add("validation_500")
    _, _, gates = run(pytester, fake.url)
    msg = gates["requests/max-tokens/negative/completions"]["message"]
    assert "{'max_tokens': -1}" in msg and "answered 500" in msg and "max_tokens must be at least 1" in msg
    assert gates["requests/max-tokens/negative/completions"]["measured"] == {"value": 500, "unit": "HTTP status"}


def _profile_with(tmp_path, **limits):
    data = yaml.safe_load(PROFILE.read_text())
    data["limits"].update(limits)
    path = tmp_path / "fake-vllm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_route_timeout_below_longest_stream_fails_arithmetic_and_live(pytester, fake, tmp_path):
    """A gateway with a 0.3 s total route timeout in front of 10 ms tokens: the 64-token stream the
    profile allows (~0.64 s) is cut without [DONE], and the profile's declared timeout fails the
    arithmetic (the cut stream's measured time plus its missing tokens at its mean gap > 0.3 s)."""
    fake.config.faults.add("route_timeout")
    fake.config.route_timeout_s, fake.config.itl_s = 0.3, 0.01
    _, summary, gates = run(pytester, fake.url, profile=_profile_with(tmp_path, route_timeout_s=0.3))
    g = gates["requests/route-timeout"]
    assert g["status"] == "FAIL"
    checks = {c["gate"]: c for c in g["checks"]}
    assert "was cut after" in checks["requests/route-timeout/live"]["message"]
    assert "no [DONE]" in checks["requests/route-timeout/live"]["message"]
    arith = checks["requests/route-timeout/arithmetic"]
    assert arith["status"] == "FAIL" and "longest allowed generation 64 tokens = measured" in arith["message"]
    assert "more x TPOT" in arith["message"]
    assert "> gateway route timeout 0.3 s" in arith["message"]


def test_route_timeout_declared_and_long_enough_passes(pytester, fake, tmp_path):
    _, _, gates = run(pytester, fake.url, profile=_profile_with(tmp_path, route_timeout_s=60))
    g = gates["requests/route-timeout"]
    assert g["status"] == "PASS" and "<= gateway route timeout 60 s" in g["message"], g["message"]
    assert g["skipped_checks"] == []


@pytest.mark.parametrize("fault", ["sse_crlf", "sse_comments", "sse_event_fields"])
def test_sse_framing_the_spec_allows_passes(pytester, fake, fault):
    fake.config.faults.add(fault)
    _, summary, gates = run(pytester, fake.url, suites=["suites/test_streaming.py", "suites/test_requests.py"])
    assert summary["overall"] == "PASS", [g["message"] for g in gates.values() if g["status"] != "PASS"]


GARBAGE = {
    "html_error_page": "502 Bad Gateway",
    "empty_502": "answered 502",
    "truncated_stream": "incomplete chunked read",
}


@pytest.mark.parametrize("fault", list(GARBAGE))
def test_garbage_from_the_endpoint_is_a_verdict_not_a_traceback(pytester, fault):
    """Every server-facing suite against an endpoint answering garbage: each gate ends in a
    verdict (FAIL naming what arrived), none in a harness error."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={fault})) as f:
        result, summary, gates = run(pytester, f.url, suites=SERVER_SUITES)
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) == 0 and outcomes.get("failed", 0) > 0, outcomes
    assert {g["status"] for g in gates.values()} <= {"PASS", "FAIL", "SKIP"}, \
        [(k, g["status"], g["message"]) for k, g in gates.items() if g["status"] not in ("PASS", "FAIL", "SKIP")]
    assert any(GARBAGE[fault] in g["message"] for g in gates.values() if g["status"] == "FAIL"), \
        [g["message"] for g in gates.values()]


def test_max_context_probe_on_never_scheduled_request_ends_at_deadline(pytester, tmp_path):
    """Case 1, live: a server that admits the full-length request and never schedules it (vLLM 0.32
    with a KV pool of exactly one full-length sequence): the probe ends at its deadline with a
    verdict naming the pattern (waiting 1, running 0), not a hang."""
    profile = _profile_with(tmp_path, request_timeout_s=1.5)
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"never_schedule"})) as f:
        result, _, gates = run(pytester, f.url, suites=["suites/test_max_context.py"], profile=profile)
    for api in ("completions", "chat"):
        g = gates[f"max-context/{api}"]
        assert g["status"] == "FAIL", g
        assert "no answer within its 1.5 s deadline" in g["message"], g["message"]
        assert "waiting 1, running 0 -> admitted but never scheduled" in g["message"], g["message"]
        assert g["evidence"]["queue"][-1] == {"t_s": g["evidence"]["queue"][-1]["t_s"], "waiting": 1.0, "running": 0.0}
    # the shorter requests (over-length rejections, canaries) are scheduled: only the full-length probe hangs
    assert all(g["status"] == "PASS" for k, g in gates.items() if k.startswith("max-context/over-length"))


def test_chat_template_kwargs_reach_tokenize_and_generation(pytester, fake, tmp_path):
    """Case 2: a template option (enable_thinking false: two more tokens) declared in the profile
    is sent to /tokenize and to the chat request alike, so the exact-length chat prompt is exact."""
    profile = _profile_with(tmp_path, chat_template_kwargs={"enable_thinking": False})
    _, _, gates = run(pytester, fake.url, suites=["suites/test_max_context.py"], profile=profile)
    g = gates["max-context/chat"]
    assert g["status"] == "PASS", g["message"]
    assert g["evidence"]["request"]["chat_template_kwargs"] == {"enable_thinking": False}
    req = next(r for r in fake.state.requests if r.endpoint == "chat" and r.status == 200 and r.prompt_tokens > 200)
    assert req.prompt_tokens == g["evidence"]["prompt_tokens_verified"]


def test_edge_requests_through_the_route_prefix(pytester, fake):
    """Case 4 through a route prefix (KServe's /openai/v1): the same documented outcomes; a
    server answering 500 there is caught there too."""
    _, summary, gates = run(pytester, fake.base_url + "/openai/v1")
    assert summary["overall"] == "PASS" and len(gates) == 33, [g["message"] for g in gates.values()
                                                               if g["status"] != "PASS"]
    fake.config.faults.add("validation_500")
    _, _, gates = run(pytester, fake.base_url + "/openai/v1")
    assert gates["requests/max-tokens/negative/chat"]["status"] == "FAIL"
    assert "answered 500" in gates["requests/max-tokens/negative/chat"]["message"]
