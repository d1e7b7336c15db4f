"""Causes told from their look-alikes (issue 48). An answer cache in front, a gateway dropping the
system turn and two deployments behind one URL all give the system golden a ``prompt_tokens`` of 9
where its rendering with the system turn is 15 (9 = the rendering without it): each must be named as
itself and not as the others, from what measured it -- one response id (and ``created``) answering
two different requests; the count equal to the rendering without the system turn, every answer its
own and of one identity; ``system_fingerprint`` changing between requests. Then: history trimmed by
a gateway (the count = the last user turn's rendering), multibyte text corrupted in the stream only
(U+FFFD streamed, the non-streamed answer intact), and faults that FAIL several cases, where each case
carries only the cause its own evidence supports.

Pure rules first (no I/O), then the answers suite through pytester against the fault-injecting fake
(tests/fakes/fake_vllm.py: ``answer_cache_first_words``, ``gateway_drops_system``, ``split_fleet``,
``gateway_keeps_last_turn``, ``forget_first_turn``, ``split_utf8``, ``inject_fffd``,
``keepalive_data_colon``, ``compress_prompt``); one suite run per test (1-2 s each)."""

from __future__ import annotations

import httpx
import pytest

from kvgate.answers.causes import cache_finding, fleet_finding, serving_cause, shared_responses
from kvgate.answers.observe import Asked
from kvgate.gates.answers import (MemoryObservation, MultibyteObservation, RenderingObservation, Suspects,
                                  history_trimmed, memory_verdict, multibyte_verdict, rendering_cause,
                                  stream_corrupts, system_message_verdict)
from kvgate.http.rendering import Rendering
from kvgate.profile.models import GoldenExpect, GoldenSpec
from kvgate.verdict import Status

from .fakes.fake_vllm import FakeConfig, FakeVLLM
from .test_answers_vs_fake import ANSWERS, NEEDLE, run
from .test_gates_vs_fake import KEEPALIVE, run_suites

pytest_plugins = ["pytester"]

#: The phrase each look-alike's rule names it by.
CACHE, DROPPED, FLEET = ("an answer cache in front", "the system message never reached the server",
                         "more than one deployment answers behind the endpoint")
RULES = {"cache": CACHE, "dropped-system": DROPPED, "fleet": FLEET}
#: the fake's fault for each look-alike
LOOKALIKES = {"cache": "answer_cache_first_words", "dropped-system": "gateway_drops_system", "fleet": "split_fleet"}


def answer(text="Paris.", rid=None, created=1_700_000_000, prompt_tokens=9, fp=None, model="m"):
    return Asked("chat", False, text=text, prompt_tokens=prompt_tokens, response_id=rid, created=created,
                 system_fingerprint=fp, model=model)


def rendered(n):
    return Rendering(tuple(range(n)))


# ------------------------------------------------------------------------------------ pure rules

def test_cache_rule_names_one_response_for_two_requests_and_nothing_else():
    shared = {"capital-france": answer(rid="chatcmpl-1"), "system/capital-japan": answer(rid="chatcmpl-1"),
              "opposite-up": answer(rid="chatcmpl-2")}
    found = cache_finding(shared, about="system/capital-japan", rendered={"system/capital-japan": 15})
    assert found == ("an answer cache in front serves one request's response for another: response id 'chatcmpl-1', "
                     "created 1700000000 answered both capital-france and system/capital-japan (2 requests in all); "
                     "its usage (9 prompt tokens) is another prompt's: system/capital-japan renders to 15 tokens by "
                     "/tokenize")
    assert shared_responses(shared) == {("chatcmpl-1", 1_700_000_000): ["capital-france", "system/capital-japan"]}
    assert cache_finding(shared, about="opposite-up") is None  # its response is its own
    # every request its own id (a dropped system turn, a split fleet): no cache; the same id with another created
    # is two responses
    own = {"a": answer(rid="chatcmpl-1"), "b": answer(rid="chatcmpl-2")}
    assert cache_finding(own) is None and serving_cause(own) is None
    assert cache_finding({"a": answer(rid="x", created=1), "b": answer(rid="x", created=2)}) is None
    assert cache_finding({"a": answer(rid=None), "b": answer(rid=None)}) is None  # no id: nothing measured


def test_cache_rule_finds_a_replay_under_a_fresh_id_by_another_prompts_usage_and_text():
    """A cache that writes a fresh id into each replay (tests/fakes cache_fresh_ids does, keyed right):
    the system golden's count is not its rendering but capital-france's, and so is its text."""
    replay = {"capital-france": answer("Paris is the capital.", rid="1"),
              "system/capital-japan": answer("Paris is the capital.", rid="2", created=1_700_000_001)}
    found = cache_finding(replay, about="system/capital-japan", rendered={"system/capital-japan": 15})
    assert found == ("an answer cache in front serves one request's response for another: system/capital-japan's "
                     "answer is capital-france's, text and usage alike ('Paris is the capital.', 9 prompt tokens), "
                     "under another id; its usage is another prompt's: system/capital-japan renders to 15 tokens by "
                     "/tokenize")
    # not measured (no rendering), its own count, or its own text (a dropped system turn counts 9 too): no cache
    assert cache_finding(replay, about="system/capital-japan") is None
    assert cache_finding(replay, about="system/capital-japan", rendered={"system/capital-japan": 9}) is None
    dropped = {**replay, "system/capital-japan": answer("Tokyo is the capital.", rid="2")}
    assert cache_finding(dropped, about="system/capital-japan", rendered={"system/capital-japan": 15}) is None


def test_fleet_rule_names_identities_that_change_between_requests_and_nothing_else():
    split = {"a": answer(rid="1"), "b": answer(rid="2", fp="fp-b"), "c": answer(rid="3")}
    assert fleet_finding(split) == ("more than one deployment answers behind the endpoint (a canary split?): the "
                                    "answers carry 2 identities: system_fingerprint None on a, c; system_fingerprint "
                                    "'fp-b' on b")
    assert "model 'm' on a; model 'm2' on b" in fleet_finding({"a": answer(rid="1"), "b": answer(rid="2", model="m2")})
    # one identity (a cache serving the same body, a gateway dropping the system turn): no fleet
    assert fleet_finding({"a": answer(rid="1"), "b": answer(rid="1")}) is None
    assert fleet_finding({"a": answer(rid="1", fp="fp"), "b": answer(rid="2", fp="fp")}) is None
    # a cache is named before the fleet
    both = {"a": answer(rid="1"), "b": answer(rid="1"), "c": answer(rid="3", fp="fp-b")}
    assert serving_cause(both).startswith(CACHE)


W, WO, U = rendered(15), rendered(9), Rendering(tuple(range(100, 115)))


@pytest.mark.parametrize("serving, want", [
    (None, DROPPED),
    (cache_finding({"capital-france": answer(rid="1"), "sys": answer(rid="1")}, about="sys"), CACHE),
    (fleet_finding({"capital-france": answer(rid="1"), "sys": answer(rid="2", fp="fp-b")}), FLEET),
])
def test_system_message_names_the_look_alike_its_evidence_measured(serving, want):
    obs = RenderingObservation("sys", W, WO, U, served=9, serving=serving)
    v = system_message_verdict(obs)
    assert v.status is Status.FAIL and v.cause.startswith(want), v.cause
    assert [p for p in RULES.values() if p in v.cause] == [want]  # and none of the others
    # the rendering suspect (what the other cases' FAILs carry) names a dropped system turn only when nothing
    # else served the count
    assert (rendering_cause(obs) is not None) == (serving is None)
    if serving is not None:
        assert "(= the rendering without it, as a dropped system turn would count)" in v.message
        assert Suspects(rendering=rendering_cause(obs), serving=serving).cause() == serving
    # healthy both ways: the count with the system turn PASSes whatever else was seen
    assert system_message_verdict(RenderingObservation("sys", W, WO, U, served=15, serving=serving)).status is Status.PASS


MEMORY = GoldenSpec(name="name-alice", messages=[{"role": "user", "content": "My name is Alice."},
                                                 {"role": "assistant", "content": "Hi Alice!"},
                                                 {"role": "user", "content": "What is my name?"}],
                    expect=GoldenExpect(regex=r"\bAlice\b"))


@pytest.mark.parametrize("count, named", [(7, True), (21, False), (12, False)])
def test_history_trimmed_is_named_only_when_the_count_is_the_last_turns_rendering(count, named):
    o = MemoryObservation(MEMORY, answer("I do not know.", prompt_tokens=count), whole=rendered(21),
                          last_turn=rendered(7))
    v = memory_verdict([o], suspects=Suspects())
    assert v.status is Status.FAIL
    if named:
        assert v.cause == ("the earlier turns never reached the server (a gateway keeping only the last user turn?): "
                           "the server counted 7 prompt tokens for name-alice = the rendering of its last user turn "
                           "alone (21 with its earlier turns, by /tokenize)")
        assert v.evidence["conversations"]["name-alice"]["rendered_last_turn"] == 7
    else:  # the whole conversation counted (the model forgot), or neither: the counts do not tell
        assert v.cause is None and history_trimmed(o) is None
    # not measured, or both renderings alike: no cause; remembered: PASS without one
    assert history_trimmed(MemoryObservation(MEMORY, answer(prompt_tokens=7))) is None
    assert history_trimmed(MemoryObservation(MEMORY, answer(prompt_tokens=7), rendered(7), rendered(7))) is None
    ok = memory_verdict([MemoryObservation(MEMORY, answer("It is Alice.", prompt_tokens=count), rendered(21),
                                           rendered(7))])
    assert ok.status is Status.PASS and ok.cause is None


def mb(plain, streamed, name="cjk"):
    return MultibyteObservation(name, "?", 0.0, Asked("chat", False, text=plain), Asked("chat", True, text=streamed))


def test_stream_corruption_is_named_only_when_the_non_streamed_text_is_intact():
    only_stream = [mb("一年有十二个月。", "一年有\ufffd二个月\ufffd"), mb("하늘", "하늘", "hangul")]
    v = multibyte_verdict(only_stream)
    assert v.status is Status.FAIL and v.cause == (
        "the stream corrupts multibyte text (U+FFFD only in the streamed answer; the non-streamed one intact): 1 of 2 "
        "streamed answers, e.g. cjk@t=0 streamed '一年有\ufffd二个月\ufffd' vs non-streamed '一年有十二个月。'")
    both = [mb("一年有\ufffd二个月。", "一年有\ufffd二个月。")]  # the engine's text is broken: not the stream's
    assert multibyte_verdict(both).status is Status.FAIL and multibyte_verdict(both).cause is None
    assert stream_corrupts(both + only_stream) is None
    # a stream that differs without U+FFFD (sampling): not this cause
    assert stream_corrupts([mb("一年有十二个月。", "一年有十二个月。 (take 2)")]) is None
    assert multibyte_verdict([mb("하늘", "하늘")]).status is Status.PASS


# ------------------------------------------------------------------------ the fakes, through the suite

def _lookalike_run(pytester, fault):
    """The answers suite against the answering fake with ``fault``; the cache's gateway is warm (one
    client asked 'What is the capital of France?' before the run: its body is what every chat whose
    last user turn begins 'What is the capital' gets). Gates by case."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE)) as f:
        f.config.faults.add(fault)
        if fault == "answer_cache_first_words":
            r = httpx.post(f"{f.base_url}/v1/chat/completions", json={
                "model": "fake-model", "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}, timeout=10)
            assert r.status_code == 200
        _, summary, gates = run(pytester, f.url)
    return gates


#: answers/accuracy is judged apart: its decision rule is revised under the same issue, and a healthy
#: 10-item task may be INCONCLUSIVE by it; under the cache it is answered wrong (5 of 10) and not PASS
APART = {"accuracy"}
#: look-alike -> the cases it FAILs (each carrying its own cause), the same on every run
LOOKALIKE_FAILS = {"cache": {"system-message", "golden", "accuracy", "input-paths"},
                   "dropped-system": {"system-message", "input-paths"},
                   "fleet": {"system-message", "input-paths"}}


@pytest.mark.parametrize("lookalike", list(LOOKALIKES))
def test_each_lookalike_is_named_as_itself_and_not_as_the_others(pytester, lookalike):
    """One row of the 3x3 matrix: fault ``lookalike`` against the three rules (cache, dropped system
    turn, split fleet); the row's own rule fires on every case the fault FAILs, the other two on none."""
    gates = _lookalike_run(pytester, LOOKALIKES[lookalike])
    failed = {c for c, g in gates.items() if g["status"] != "PASS" and c not in APART}
    assert failed == LOOKALIKE_FAILS[lookalike] - APART, {c: gates[c]["message"] for c in failed}
    if lookalike == "cache":
        assert gates["accuracy"]["status"] != "PASS" and CACHE in gates["accuracy"].get("cause", "")
    # the look-alike is real: the system golden counted 9 = its rendering without the system turn, every time
    assert gates["system-message"]["measured"]["value"] == 9 and gates["system-message"]["limit"]["value"] == 15
    row = {rule: sorted(c for c in failed if phrase in (gates[c].get("cause") or "")) for rule, phrase in RULES.items()}
    assert row == {rule: sorted(failed) if rule == lookalike else [] for rule in RULES}, row
    cause = gates["system-message"]["cause"]
    if lookalike == "cache":  # the evidence: one response id, another prompt's usage
        assert "answered both capital-france and system/capital-japan" in cause
        assert "its usage (9 prompt tokens) is another prompt's: system/capital-japan renders to 15 tokens" in cause
    if lookalike == "fleet":
        assert "system_fingerprint 'fp-b' on system/capital-japan" in cause
    assert all(g.get("cause") is None for g in gates.values() if g["status"] == "PASS")


def test_history_trimmed_by_a_gateway_is_named_a_model_that_forgets_is_not(pytester):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE,
                             faults={"gateway_keeps_last_turn"})) as f:
        _, _, gates = run(pytester, f.url)
    failed = {c: g for c, g in gates.items() if g["status"] != "PASS" and c not in APART}
    assert set(failed) == {"multi-turn"}, {c: g["message"] for c, g in failed.items()}
    assert failed["multi-turn"]["cause"] == (
        "the earlier turns never reached the server (a gateway keeping only the last user turn?): the server counted "
        "7 prompt tokens for name-alice = the rendering of its last user turn alone (21 with its earlier turns, by "
        "/tokenize)")
    # the look-alike: the model gets the whole conversation (usage counts it) and forgets: no cause measured
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE,
                             faults={"forget_first_turn"})) as f:
        _, _, gates = run(pytester, f.url)
    assert gates["multi-turn"]["status"] == "FAIL" and gates["multi-turn"].get("cause") is None
    assert gates["multi-turn"]["evidence"]["conversations"]["name-alice"]["prompt_tokens"] == 21


@pytest.mark.parametrize("fault, cause", [
    ("split_utf8", "the stream corrupts multibyte text (U+FFFD only in the streamed answer; the non-streamed one "
                   "intact): 6 of 6 streamed answers, e.g. cjk@t=0 streamed '一年有\ufffd二个月\ufffd' vs non-streamed "
                   "'一年有十二个月。'"),
    ("inject_fffd", None),  # U+FFFD on both paths: not the stream's
])
def test_multibyte_corrupted_in_the_stream_only_is_named(pytester, fault, cause):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE, faults={fault})) as f:
        _, _, gates = run(pytester, f.url)
    assert gates["multibyte"]["status"] == "FAIL" and gates["multibyte"].get("cause") == cause, gates["multibyte"]
    if fault == "split_utf8":  # the only case it FAILs: the other answers are ASCII
        assert [c for c, g in gates.items() if g["status"] != "PASS" and c not in APART] == ["multibyte"]


def test_a_prompt_shortening_proxy_is_named_by_long_context_only(pytester):
    """compress_prompt: long-context counts the server's prompt_tokens below the prompt it verified
    and names the shortening; the six max-context FAILs (their counts off, or 200 for an over-length
    prompt) carry no cause: their own evidence does not tell a proxy from a server that truncates."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE,
                             faults={"compress_prompt"})) as f:
        _, _, answers = run(pytester, f.url, "-k", "long-context")
    assert answers["long-context"]["status"] == "FAIL"
    assert answers["long-context"]["cause"].startswith("the prompt was shortened before the model: the server counted "
                                                       "45 prompt tokens of the 128-token prompt sent")
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"compress_prompt"})) as f:
        _, _, gates = run_suites(pytester, f.url, suites=["suites/test_max_context.py"])
    failed = {i: g for i, g in gates.items() if g["status"] == "FAIL"}
    assert len(failed) == 6 and all(g.get("cause") is None for g in failed.values()), failed
    with FakeVLLM(FakeConfig(max_tokens_cap=64)) as f:  # healthy: every max-context case PASSes
        _, _, gates = run_suites(pytester, f.url, suites=["suites/test_max_context.py"])
    assert {g["status"] for g in gates.values()} == {"PASS"}


@pytest.mark.parametrize("fault", ["keepalive_data_colon", "prefill_keepalives"])
def test_a_keepalive_sent_as_data_is_named_by_the_keepalive_case_only(pytester, fault):
    """Every stream meets a keepalive (keepalive_s 5 ms, prefills longer): ``data: : PROCESSING``
    FAILs framing, the openai-SDK check and keepalive; only keepalive, which reads the raw frames,
    names it. Healthy ': ping' comments: framing and the SDK check PASS."""
    with FakeVLLM(FakeConfig(**{**KEEPALIVE, "keepalive_s": 0.005}, faults={fault})) as f:
        _, _, gates = run_suites(pytester, f.url, suites=["suites/test_streaming.py"])
    cases = {i.removeprefix("fake-vllm/streaming/"): g for i, g in gates.items()}
    framing_sdk = [c for c in cases if c.split("/")[0] in ("framing", "openai-sdk")]
    assert len(framing_sdk) == 4
    if fault == "prefill_keepalives":
        assert all(cases[c]["status"] == "PASS" for c in framing_sdk), {c: cases[c]["message"] for c in framing_sdk}
        return
    failed = {c for c, g in cases.items() if g["status"] == "FAIL"}
    assert failed == {*framing_sdk, "keepalive"}, {c: cases[c]["message"] for c in failed}
    assert cases["keepalive"]["cause"] == "a keepalive comment is sent as a data: event (`data: : PROCESSING\\n\\n`)"
    assert {c: cases[c].get("cause") for c in framing_sdk} == dict.fromkeys(framing_sdk)
    assert cases["framing/chat"]["message"] == "non-JSON event ': PROCESSING' -> FAIL"
