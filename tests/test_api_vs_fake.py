"""The api gate (suites/test_api.py) against the fault-injecting fake vLLM: every case PASSes on the
healthy fake; each fault FAILs exactly its case, naming what it measured; a server without the
Responses and Messages routes SKIPs those cases naming its answer; a profile's accepted gap turns
its check's finding into a SKIP part. Suites run through pytester with ``--endpoint``; verdicts
are read back from summary.json."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import fake, run_suites  # noqa: F401  (fake: the healthy fake fixture, shared)

# imported here, not first in each pytester run (which would import anthropic's SDK again: ~1-2 s);
# the anthropic SDK's types are built on first use (kvgate.http.sdk._anthropic): built here too
import kvgate.gates.api  # noqa: E402,F401
from kvgate.http.sdk import MESSAGE_EVENT  # noqa: E402,F401

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
CASES = ["responses/reply", "responses/stream", "responses/store", "messages/reply", "messages/stream", "messages/count-tokens",
         "logprobs/chat", "logprobs/completions", "n/chat", "n/completions", "stop/chat", "stop/completions",
         "max-completion-tokens/chat", "continuous-usage/chat", "continuous-usage/completions"]


def run(pytester, url, *extra, profile=PROFILE):
    result, summary, gates = run_suites(pytester, url, *extra, suites=["suites/test_api.py"], profile=profile)
    return result, summary, {k.removeprefix("fake-vllm/api/"): g for k, g in gates.items()}


def test_healthy_fake_passes_every_api_case(pytester, fake):
    result, summary, gates = run(pytester, fake.url)
    assert list(gates) == CASES
    assert summary["overall"] == "PASS", {k: g["message"] for k, g in gates.items() if g["status"] != "PASS"}
    assert all(g["status"] == "PASS" and not g["skipped_checks"] for g in gates.values())
    assert "terminal 'response.incomplete' carries status 'incomplete'" in gates["responses/stream"]["message"]
    assert "the openai SDK's responses.stream parsed it" in gates["responses/stream"]["message"]
    assert "the follow-up with previous_response_id counts 21 input tokens (>= the stored turn's 17)" in \
        gates["responses/store"]["message"]
    assert "stop_reason 'stop_sequence' naming it" in gates["messages/reply"]["message"]
    assert "the anthropic SDK's messages.stream parsed it" in gates["messages/stream"]["message"]
    assert "counted 9 input tokens, the reply's usage says 9" in gates["messages/count-tokens"]["message"]
    stop = gates["stop/completions"]
    assert stop["evidence"]["stop"] == stop["evidence"]["stop"].strip() and " " in stop["evidence"]["stop"]
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


# fault -> (the one case it must FAIL, a fragment of that case's message naming what it measured)
FAULT_CASES = {
    "responses_no_terminal": ("responses/stream", "no terminal event (response.completed / incomplete / failed)"),
    "responses_empty_output": ("responses/stream", "the terminal response's output holds 0 characters"),
    "responses_completed_when_incomplete": ("responses/stream", "terminal event 'response.completed' carries status "
                                            "'incomplete'; the spec's event for it is 'response.incomplete'"),
    "messages_no_stop": ("messages/stream", "no message_stop; the stream ended with 'message_delta'"),
    "top_logprobs_null": ("logprobs/chat", "top_logprobs is None; the spec gives an array of 3"),
    "stop_fragment_leak": ("stop/chat", "of the stop string past where the answer ends"),
    "n_one_choice": ("n/completions", "1 choices indexed [0], want [0, 1]"),
    "ignore_max_completion_tokens": ("max-completion-tokens/chat", "64 completion tokens, finish 'length'; want 8"),
    "forget_previous_response": ("responses/store", "the follow-up with previous_response_id counts 5 input tokens, "
                                 "fewer than the stored turn's 17 (input + output)"),
    "stream_usage_mismatch": ("continuous-usage/completions", "the final usage chunk counts 9 completion tokens, 8 "
                              "were generated"),
}
#: Cases a fault fails besides its own, for the same defect (chat and completions share the code path).
ALSO = {"stop_fragment_leak": {"stop/completions"}, "n_one_choice": {"n/chat"},
        "stream_usage_mismatch": {"continuous-usage/chat"}}
#: The faults in two runs (each fault's cases apart from the others' in its run: a case that fails
#: is failed by its own fault), so the proof costs two runs of the suite, not nine.
GROUPS = {"responses-messages-logprobs-n": ["responses_no_terminal", "messages_no_stop", "top_logprobs_null",
                                            "n_one_choice", "ignore_max_completion_tokens"],
          "responses-stop-usage": ["responses_empty_output", "stop_fragment_leak", "stream_usage_mismatch",
                                   "forget_previous_response"]}


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_fault_fails_exactly_its_case(pytester, fake, group):
    fake.config.faults.update(GROUPS[group])
    result, summary, gates = run(pytester, fake.url)
    owned = {c: f for f in GROUPS[group] for c in {FAULT_CASES[f][0]} | ALSO.get(f, set())}
    assert len(owned) == sum(1 + len(ALSO.get(f, ())) for f in GROUPS[group])  # no case shared by two faults
    failed = {k for k, g in gates.items() if g["status"] == "FAIL"}
    assert failed == set(owned), {k: gates[k]["message"] for k in failed ^ set(owned)}
    assert summary["overall"] == "FAIL" and result.ret == pytest.ExitCode.TESTS_FAILED
    for fault in GROUPS[group]:
        case, fragment = FAULT_CASES[fault]
        msg = gates[case]["message"]
        assert fragment in msg and "-> FAIL" in msg, (fault, msg)
    assert all(g["status"] == "PASS" for k, g in gates.items() if k not in failed), \
        {k: g["message"] for k, g in gates.items() if g["status"] != "PASS" and k not in failed}
    if group == "responses-stop-usage":  # the leaked fragment named, the non-streamed answer right
        g = gates["stop/chat"]
        stop, want = g["evidence"]["stop"], g["evidence"]["want"]
        leaked = g["evidence"]["got_stream"][len(want):]
        assert leaked and stop.startswith(leaked) and g["evidence"]["got_plain"] == want
        assert f"leaks {leaked!r} of the stop string" in g["message"]


def test_accepted_gap_reports_the_finding_without_failing(pytester, fake, tmp_path):
    """vLLM 0.32's response.completed for an incomplete response (the fault imitates it): FAIL,
    and with the profile accepting the gap the case PASSes, the check a SKIP part saying why."""
    fake.config.faults.add("responses_completed_when_incomplete")
    fake.config.responses_store = False  # like vLLM without VLLM_ENABLE_RESPONSES_API_STORE=1
    data = yaml.safe_load(PROFILE.read_text())
    data["api"] = {"accepted_gaps": {"responses/stream/terminal-event": "vLLM 0.32 (responses/serving.py)"}}
    profile = tmp_path / "fake-vllm.yaml"
    profile.write_text(yaml.safe_dump(data))
    _, summary, gates = run(pytester, fake.url, profile=profile)
    g = gates["responses/stream"]
    assert g["status"] == "PASS" and summary["overall"] == "PASS", g
    assert [c["check"] for c in g["skipped_checks"]] == ["api/responses/stream/terminal-event"], g
    assert g["skipped_checks"][0]["reason"].startswith("accepted gap (profile api.accepted_gaps: vLLM 0.32")
    assert "terminal event 'response.completed' carries status 'incomplete'" in g["skipped_checks"][0]["reason"]
    store = gates["responses/store"]
    assert store["status"] == "SKIP" and "answered 404" in store["message"], store
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in store["message"]


def test_server_without_the_routes_skips_them_naming_the_answer(pytester):
    """llama.cpp's server has neither /v1/responses nor /v1/messages: those cases SKIP with its 404;
    the rest are judged."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, server="llama.cpp")) as f:
        _, _, gates = run(pytester, f.url)
    for case in ("responses/reply", "responses/stream", "responses/store", "messages/reply", "messages/stream",
                 "messages/count-tokens"):
        assert gates[case]["status"] == "SKIP", (case, gates[case])
        assert "not served here (404: File Not Found)" in gates[case]["message"], gates[case]["message"]
    assert gates["max-completion-tokens/chat"]["status"] == "PASS"


def test_contract_diffed_against_the_recorded_serving_revision(pytester, fake):
    """The serving revision recorded (--gate-mode record: the api verdicts land in golden.json);
    the same server against its recording PASSes compare/contract; a new revision that answers n=2
    with one choice FAILs it naming both n cases as regressions."""
    only = ["-k", "api or contract"]
    suites = ["suites/test_api.py", "suites/test_compare.py"]
    rec = pytester.path / "reports"
    result, summary, _ = run_suites(pytester, fake.url, "--gate-mode=record", *only, suites=suites, profile=PROFILE)
    assert summary["outcome"] == "RECORDED", summary["outcome"]
    golden = json.loads((rec / "golden.json").read_text())
    assert {c: r["status"] for c, r in golden["contract"].items()} == {f"api/{c}": "PASS" for c in CASES}
    assert all(r["said"].endswith("-> PASS") for r in golden["contract"].values()), golden["contract"]
    recording = pytester.path / "serving"
    rec.rename(recording)
    _, _, gates = run_suites(pytester, fake.url, f"--baseline-reports={recording}", *only, suites=suites, profile=PROFILE)
    g = gates["fake-vllm/compare/contract"]
    assert g["status"] == "PASS" and g["message"].startswith(f"all that held on the recorded baseline {recording}"), \
        g["message"]
    assert "(15 cases) holds on the new revision" in g["message"], g["message"]
    fake.config.faults.add("n_one_choice")
    result, _, gates = run_suites(pytester, fake.url, f"--baseline-reports={recording}", *only, suites=suites,
                                  profile=PROFILE)
    g = gates["fake-vllm/compare/contract"]
    assert g["status"] == "FAIL" and result.ret == pytest.ExitCode.TESTS_FAILED, g["message"]
    assert g["message"].startswith("2 of what held on the recorded baseline") and "(15 cases) do not hold" in \
        g["message"], g["message"]
    assert 'do not hold on the new revision: api/n/chat (baseline PASS: "chat with n=2' in g["message"], g["message"]
    assert '-> PASS"; here FAIL: "' in g["message"] and 'api/n/completions (baseline PASS: "' in g["message"]
    lost = g["evidence"]["lost"]
    assert [x["case"] for x in lost] == ["api/n/chat", "api/n/completions"], lost
    assert all(x["baseline"]["said"].endswith("-> PASS") and "FAIL" in x["new"]["said"] for x in lost), lost


def test_an_sdk_invalid_responses_event_names_the_missing_field_and_whether_clients_break(pytester, fake):
    """vLLM 0.28's Responses stream (the faults imitate it): usage without
    input_tokens_details.cache_write_tokens, and response.completed ending an incomplete response.
    The stream and the reply FAIL naming that exact path in the member each event's type selects
    (ResponseCompletedEvent, not the union's first member ResponseAudioDeltaEvent) as strict-schema
    drift -- the SDK's default parse, and the real SDK stream, still hand the client the data."""
    fake.config.faults.update({"responses_no_cache_write_tokens", "responses_completed_when_incomplete"})
    _, summary, gates = run(pytester, fake.url, "-k", "responses_api")
    assert set(gates) == {"responses/reply", "responses/stream"}
    g = gates["responses/stream"]
    checks = {c["gate"].removeprefix("api/responses/stream/"): c for c in g["checks"]}
    assert g["status"] == "FAIL" and {k for k, c in checks.items() if c["status"] != "PASS"} == \
        {"strict-schema", "terminal-event"}, checks
    msg = checks["strict-schema"]["message"]
    assert msg.startswith("streamed POST /v1/responses: 3 of 16 events fail the strict schema: response.created fails "
                          "openai "), msg
    assert "'s ResponseCreatedEvent at response.usage.input_tokens_details.cache_write_tokens: Field required (also " \
           "response.in_progress, response.completed) -- strict-schema drift: its default parse (as clients call it) " \
           "still hands the client the event, response.usage.input_tokens_details.cache_write_tokens None -> FAIL" in msg
    assert "ResponseAudioDeltaEvent" not in g["message"]
    assert g["cause"] == checks["strict-schema"]["cause"], g  # the only part with a cause
    assert g["cause"].startswith("the server omits response.usage.input_tokens_details.cache_write_tokens in "
                                 "response.created, response.in_progress, response.completed, which openai "), g["cause"]
    assert "requires (ResponseCreatedEvent and the others): strict-schema drift -- the SDK's default parse, as clients " \
           "call it, still hands clients the data (response.usage.input_tokens_details.cache_write_tokens None)" in \
           g["cause"], g["cause"]
    assert checks["schema"]["status"] == "PASS" and "default parse hands clients all 16 events" in \
        checks["schema"]["message"]
    assert checks["sdk"]["message"].startswith("the openai SDK's responses.stream parsed it")  # measured: it delivers
    found = g["evidence"]["api/responses/stream/strict-schema"]["evidence"]["sdk_findings"]
    assert [(f["kind"], f["member"], f["path"], f["breaks"]) for f in found] == [
        (k, m, "response.usage.input_tokens_details.cache_write_tokens", False) for k, m in (
            ("response.created", "ResponseCreatedEvent"), ("response.in_progress", "ResponseInProgressEvent"),
            ("response.completed", "ResponseCompletedEvent"))]
    r = gates["responses/reply"]
    assert r["status"] == "FAIL" and r["message"].startswith("POST /v1/responses (max_output_tokens 8, ignore_eos): the "
                                                             "reply fails openai "), r
    assert "'s Response at usage.input_tokens_details.cache_write_tokens: Field required -- strict-schema drift" in \
        r["message"], r["message"]
    assert r["cause"].startswith("the server omits usage.input_tokens_details.cache_write_tokens in the reply"), r


def test_accepted_strict_schema_drift_never_accepts_a_client_break(pytester, fake, tmp_path):
    """The drift accepted under api.accepted_gaps (responses/*/strict-schema): the reply PASSes with
    the finding a SKIP part; a terminal event whose response is a string (responses_terminal_response_id)
    still FAILs the stream as breaking clients -- the SDK's default parse hands them a str where it
    types a Response, and the real SDK stream raises."""
    fake.config.faults.update({"responses_no_cache_write_tokens", "responses_terminal_response_id"})
    data = yaml.safe_load(PROFILE.read_text())
    data["api"] = {"accepted_gaps": {f"responses/{c}/strict-schema": "vLLM 0.28 omits cache_write_tokens"
                                     for c in ("reply", "stream")}}
    profile = tmp_path / "fake-vllm.yaml"
    profile.write_text(yaml.safe_dump(data))
    _, _, gates = run(pytester, fake.url, "-k", "responses_api", profile=profile)
    r = gates["responses/reply"]
    assert r["status"] == "PASS" and [c["check"] for c in r["skipped_checks"]] == \
        ["api/responses/reply/strict-schema"], r
    assert r["skipped_checks"][0]["reason"].startswith("accepted gap (profile api.accepted_gaps: vLLM 0.28 omits")
    g = gates["responses/stream"]
    checks = {c["gate"].removeprefix("api/responses/stream/"): c for c in g["checks"]}
    assert g["status"] == "FAIL" and checks["strict-schema"]["status"] == "SKIP", g
    assert {k for k, c in checks.items() if c["status"] == "FAIL"} == {"schema", "sdk"}, checks
    msg = checks["schema"]["message"]
    assert msg.startswith("streamed POST /v1/responses: 1 of 16 events breaks clients: response.incomplete fails "
                          "openai "), msg
    assert "'s ResponseIncompleteEvent at response: Input should be a valid dictionary or instance of Response (got " \
           "'resp_" in msg and "-- breaks clients: its default parse (as clients call it) hands the client response " \
           "as a str ('resp_" in msg, msg
    assert g["cause"].startswith("the server sends response as 'resp_"), g["cause"]
    assert "in response.incomplete where openai " in g["cause"] and " types an object (ResponseIncompleteEvent): the " \
        "SDK's default parse, as clients call it, leaves clients nothing to read into there (breaks clients" in \
        g["cause"], g["cause"]
    assert checks["sdk"]["message"].startswith("streamed POST /v1/responses: the openai SDK's responses.stream raised")
