"""The security gate's input-paths and cache verdicts (kvgate.gates.security) on hand-built
observations: pure, no server, no sleeping."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from kvgate.gates.security import cache_verdict, input_paths_verdict, path_bounded
from kvgate.http.client import Reply
from kvgate.profile.models import CacheSpec, SecuritySpec
from kvgate.security.cache import Answer, CacheRun, replayed
from kvgate.security.paths import EXPANDING_TEMPLATE, PATH_PROBES, RENDERED_RISE, TEMPLATE_WORDS
from kvgate.security.probe import PathRun, PathSent
from kvgate.verdict import Status

UNTRUSTED = SecuritySpec()
TRUSTED = SecuritySpec(request_chat_template="trusted")
PROBE = {p.name: p for p in PATH_PROBES}
CANARY = Reply(200, '{"choices": [{"text": "OK"}]}', 0.05)
HEALTHY = Reply(200, "", 0.001)


def chat(prompt_tokens=33, out=4, choices=1, rid="chatcmpl-1", text="OK"):
    return Reply(200, json.dumps({"id": rid, "choices": [{"message": {"content": text}}] * choices,
                                  "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out}}), 0.2)


def responses(input_tokens=33, out=4):
    return Reply(200, json.dumps({"id": "resp_1", "output": [], "usage": {"input_tokens": input_tokens,
                                                                           "output_tokens": out}}), 0.2)


def run(replies, **kw):
    """A PathRun: the plain chat/responses requests counted 33 tokens; ``replies``: path name -> answer."""
    sent = [PathSent(PROBE[name], r, kw.get("canary", CANARY), kw.get("health", HEALTHY), kw.get("alive", True),
                     kw.get("side_ttft_s"), kw.get("side")) for name, r in replies.items()]
    return PathRun(plain={"chat": chat(), "responses": responses(), "messages": chat()}, sent=sent)


def test_the_template_always_terminates_and_adds_enough_words():
    # one bounded loop, no recursion: what a request may carry; a rendering adds >= RENDERED_RISE tokens
    assert EXPANDING_TEMPLATE.count("{% for") == 2 and f"range({TEMPLATE_WORDS})" in EXPANDING_TEMPLATE
    assert "macro" not in EXPANDING_TEMPLATE and "recursive" not in EXPANDING_TEMPLATE
    assert RENDERED_RISE <= TEMPLATE_WORDS // 2
    templated = [p.name for p in PATH_PROBES if p.template]
    assert templated == [f"{k}/{r}" for r in ("chat", "responses", "messages")
                         for k in ("chat_template", "chat_template_kwargs")]
    assert PROBE["chat_template_kwargs/responses"].body("m")["chat_template_kwargs"] == {"chat_template": EXPANDING_TEMPLATE}
    assert "prompt" not in PROBE["prompt_embeds"].body("m")  # pure prompt embeds


@pytest.mark.parametrize("route,reply,bounded", [
    ("chat", chat(out=4), True), ("chat", chat(out=5), False), ("chat", chat(choices=2), False),
    ("responses", responses(out=4), True), ("responses", responses(out=5), False),
    ("messages", Reply(200, '{"content": [], "usage": {"output_tokens": 4}}', 0.1), True),
    ("chat", Reply(200, "<html>oops</html>", 0.1), False), ("chat", Reply(200, '{"id": "x"}', 0.1), False),
])
def test_a_bounded_200_has_the_routes_shape_and_at_most_the_tokens_asked(route, reply, bounded):
    assert path_bounded(route, reply) is bounded


def test_every_path_refused_or_bounded_passes_naming_the_ignored_templates():
    v = input_paths_verdict(UNTRUSTED, run({"chat_template/chat": Reply(400, '{"error": {"message": "no"}}', 0.003),
                                             "chat_template/responses": responses(33 + RENDERED_RISE - 1),
                                             "guided-legacy": chat()}), CANARY, 10, 3000)
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("3 input paths in time: 1 refused 4xx, 2 bounded 200s (guided-legacy, "
                                "chat_template/responses); request templates (untrusted: never rendered): 1 refused, 1 ignored")


def test_an_untrusted_template_rendered_fails_naming_the_prompt_counts():
    v = input_paths_verdict(UNTRUSTED, run({"chat_template/responses": responses(33 + RENDERED_RISE)}), CANARY, 10, 3000)
    assert v.status is Status.FAIL
    assert (f"a request chat_template on responses: 200 with the request's template rendered (prompt counted "
            f"{33 + RENDERED_RISE} tokens, 33 for the same request without it") in v.message, v.message


def test_a_trusted_template_rendered_passes_while_the_side_canary_keeps_its_ttft():
    replies = {"chat_template/chat": chat(33 + TEMPLATE_WORDS)}
    ok = input_paths_verdict(TRUSTED, run(replies, side_ttft_s=0.4), CANARY, 10, 3000)
    assert ok.status is Status.PASS and "1 rendered with a canary on another connection within 3000 ms" in ok.message
    slow = input_paths_verdict(TRUSTED, run(replies, side_ttft_s=3.5), CANARY, 10, 3000)
    assert slow.status is Status.FAIL and "a canary on another connection waited 3,500 ms for its first token " \
        "(limit 3000 ms)" in slow.message, slow.message
    none = input_paths_verdict(TRUSTED, run(replies, side="503: busy"), CANARY, 10, 3000)
    assert none.status is Status.FAIL and "the canary on another connection got no token (503: busy)" in none.message


def test_a_5xx_a_late_answer_a_dead_engine_and_a_sick_health_each_fail_named():
    err = Reply(500, '{"error": {"message": "EngineCore encountered an issue"}}', 0.01)
    v = input_paths_verdict(UNTRUSTED, run({"prompt_embeds": err}), CANARY, 10, 3000)
    assert v.status is Status.FAIL and "pure prompt_embeds (no prompt): 500 (" in v.message, v.message
    late = input_paths_verdict(UNTRUSTED, run({"guided-legacy": Reply(200, chat().text, 12.0)}), CANARY, 10, 3000)
    assert "the legacy guided_json / guided_regex / guided_choice / guided_grammar fields: 200 after 12.0 s within 10 s" \
        in late.message
    dead = run({"chat_template_kwargs/responses": err}, canary=Reply(500, "dead", 0.01), alive=False)
    dead.sent.append(PathSent(PROBE["guided-legacy"], None))
    v = input_paths_verdict(UNTRUSTED, dead, CANARY, 10, 3000)
    assert v.status is Status.FAIL and ", the engine down after one" in v.message
    assert "the 2-token canary got 500 (non-JSON: \"dead\"): the engine is down" in v.message and "1 not sent after it (guided-legacy)" \
        in v.message, v.message
    sick = input_paths_verdict(UNTRUSTED, run({"guided-legacy": chat()}, health=Reply(503, "", 0.01)), CANARY, 10, 3000)
    assert sick.status is Status.FAIL and "after the legacy guided_json" in sick.message and "/health answered 503" \
        in sick.message


def test_a_server_without_a_health_route_is_judged_by_the_canary_alone():
    """llama-cpp-python has no /health (every GET 404, measured 2026-12-05): not a finding after each
    path; one 404 among 200s is (the route went away after a path)."""
    absent = Reply(404, '{"detail":"Not Found"}', 0.002)
    replies = {"guided-legacy": chat(), "prompt_embeds": Reply(400, '{"error": {"message": "no"}}', 0.01)}
    v = input_paths_verdict(UNTRUSTED, run(replies, health=absent), CANARY, 10, 3000)
    assert v.status is Status.PASS and "the canary generated after each; /health not judged: every GET /health " \
        "answered 404 (the server has no such route) -> PASS" in v.message, v.message
    mixed = run(replies)
    mixed.sent[1] = PathSent(mixed.sent[1].probe, mixed.sent[1].reply, CANARY, absent, True, None, None)
    v = input_paths_verdict(UNTRUSTED, mixed, CANARY, 10, 3000)
    assert v.status is Status.FAIL and "/health answered 404" in v.message, v.message


def test_no_generation_before_the_first_path_is_invalid():
    v = input_paths_verdict(UNTRUSTED, run({"guided-legacy": chat()}), Reply(0, "refused", 1.0), 10, 3000)
    assert v.status is Status.INVALID


# ------------------------------------------------------------------------------------------ cache

def ans(rid, text="a fox", status=200, label="x", elapsed=0.3, created=None, cached=None, logprobs=None, sent_at=0.0,
        prompt_tokens=20):
    body = {"id": rid, "choices": [{"message": {"content": text}}]}
    if created is not None:
        body["created"] = created
    if logprobs is not None:
        body["choices"][0]["logprobs"] = {"content": [{"token": "t", "logprob": lp} for lp in logprobs]}
    body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 8}
    if cached is not None:
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return Answer(label, Reply(status, json.dumps(body), elapsed), sent_at)


def healthy_timed(rng, pairs=5, cold=0.7, warm=0.62, sigma=0.08, details=True):
    """A healthy vLLM behind nothing: the first request prefills cold, every later one (repeat or
    control: the same prompt tokens) hits the prefix cache, each answer a fresh body; times with
    lognormal noise and a slow drift of the host."""
    timed, t, n = [], 0.0, 0
    plan = ["first"] + [k for _ in range(pairs) for k in rng.sample(["repeat", "control"], 2)]
    for i, kind in enumerate(plan):
        e = (cold if kind == "first" else warm) * (1 + 0.02 * i) * float(np.exp(rng.gauss(0, sigma)))
        timed.append((kind, ans(f"chatcmpl-{i}", "one two three", elapsed=e, created=int(100 + t),
                                cached=(0 if kind == "first" else 16) if details else None, sent_at=t)))
        t += e
        n += 1
    return timed


def sampled_fresh(n=3, logprob=-0.9, tokens=12, texts=None):
    texts = texts or [f"Paris is {i} ..." for i in range(n)]
    return [ans(f"chatcmpl-s{i}", texts[i], logprobs=[logprob] * tokens) for i in range(n)]


def cache_run(variants=None, callers=None, note="", timed=None, sampled=None, seed=0):
    timed = healthy_timed(random.Random(seed)) if timed is None else timed
    return CacheRun(base=ans("chatcmpl-base"), variants=variants or {f: ans(f"chatcmpl-{f}") for f in
                                                                     ("response_format", "stop", "seed")},
                    callers=callers, second_key_note=note, timed=timed,
                    timing=[(k, a.reply.elapsed_s) for k, a in timed if a.reply.status == 200],
                    sampled=sampled_fresh() if sampled is None else sampled)


def replaying(timed, fresh_ids=True, created_again=True, fast=0.004):
    """The timed look behind a response cache keyed right: every repeat is the first answer's body
    at once (``fresh_ids``: under a new id; ``created_again``: and a new created)."""
    first = timed[0][1]
    out = [timed[0]]
    for i, (kind, a) in enumerate(timed[1:], 1):
        if kind == "repeat":
            body = json.loads(first.reply.text)
            if fresh_ids:
                body["id"] = f"chatcmpl-replay-{i}"
            if created_again:
                body["created"] = a.created
            a = Answer(a.label, Reply(200, json.dumps(body), fast), a.sent_at)
        out.append((kind, a))
    return out


def test_replayed_is_the_same_id_or_the_same_bytes_never_two_errors():
    assert replayed(ans("a"), ans("a", text="other"))
    assert not replayed(ans("a"), ans("b"))
    same = Answer("x", Reply(200, "{}", 0.1))
    assert replayed(same, Answer("y", Reply(200, "{}", 0.1)))  # an id-less body, byte for byte
    assert not replayed(ans("a", status=500), ans("a", status=500))  # two errors are not a cache hit


def test_fresh_answers_everywhere_pass_naming_what_was_not_compared():
    v = cache_verdict(CacheSpec(), cache_run(note="the profile names no second key"))
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("3 changed fields (response_format, stop, seed) each answered afresh; callers not "
                                "compared (the profile names no second key); 3 sampled answers to one request each "
                                "drawn afresh; every identical repeat a fresh body through the engine; 5 identical "
                                "repeats against 5 same-prompt controls (unit: request"), v.message
    assert "repeat/control time ratio " in v.message and "no repeat served from a cache -> PASS" in v.message
    assert v.evidence["timing"]["ratio"]["m"] == 5 and v.evidence["sampled"]["answered"] == 3


def test_issue_48_a_prefix_cache_that_makes_repeats_faster_passes_over_many_seeds():
    # the FAIL of issue 48: 2 repeats at most 34 ms against 3 uncached at least 39 ms. Here every
    # repeat and control hits vLLM's prefix cache (11% faster than the cold first request), with
    # noise and host drift: 2,000 seeded runs, none FAILs; INCONCLUSIVE (timing's only outcome
    # against it) within the timing bound's stated 1%
    statuses = Counter(cache_verdict(CacheSpec(), cache_run(seed=s)).status for s in range(2000))
    assert statuses[Status.FAIL] == 0, statuses
    assert statuses[Status.INCONCLUSIVE] <= 20, statuses
    assert statuses[Status.PASS] >= 1980, statuses


def test_the_other_callers_body_fails_naming_it():
    v = cache_verdict(CacheSpec(), cache_run(callers=(ans("chatcmpl-A", "blue, Oslo"), ans("chatcmpl-A", "blue, Oslo"))))
    assert v.status is Status.FAIL
    assert "the second caller got the first caller's body (id chatcmpl-A, 'blue, Oslo') for the same request" in v.message


def test_a_key_without_a_field_fails_naming_the_field():
    variants = {"stop": ans("chatcmpl-stop"), "seed": ans("chatcmpl-base")}
    v = cache_verdict(CacheSpec(), cache_run(variants=variants))
    assert v.status is Status.FAIL
    assert "the same messages with another seed got the base request's body (id chatcmpl-base): the cache key omits it" \
        in v.message, v.message


def test_a_repeat_with_the_first_body_fails_naming_it_with_the_timing_beside():
    timed = replaying(healthy_timed(random.Random(1)), fresh_ids=False)
    v = cache_verdict(CacheSpec(), cache_run(timed=timed))
    assert v.status is Status.FAIL, v.message
    assert "5 of 5 identical repeats got the first answer's body (id chatcmpl-0) -- a response cache the profile " \
        "does not declare" in v.message, v.message
    assert "repeats faster than the engine answers the same prompt (upper bound under 0.90) -> FAIL" in v.message


def test_a_replay_under_fresh_ids_fails_on_its_usage():
    # the repeats carry the first answer's cached_tokens 0; every control through the engine found 16
    timed = replaying(healthy_timed(random.Random(2)))
    v = cache_verdict(CacheSpec(), cache_run(timed=timed))
    assert v.status is Status.FAIL, v.message
    assert "5 identical repeats carried the first answer's usage (cached_tokens 0) while every same-prompt control " \
        "found 16-16 prompt tokens in vLLM's prefix cache: the repeats never reached the engine" in v.message, v.message


def test_a_replay_under_a_fresh_id_keeping_created_fails_once_two_seconds_apart():
    timed = replaying(healthy_timed(random.Random(3), details=False), created_again=False)
    first = timed[0][1]
    v = cache_verdict(CacheSpec(), cache_run(timed=timed))
    later = [a for k, a in timed if k == "repeat" and a.sent_at - first.sent_at - first.reply.elapsed_s >= 2.0]
    assert later and v.status is Status.FAIL, v.message
    assert f"{len(later)} identical repeats sent at least 2 s after the first answer carried its text and its " \
        f"created {first.created}" in v.message, v.message


def test_a_sampled_text_repeated_beyond_its_logprobs_fails():
    same = sampled_fresh(texts=["Oslo is cold."] * 3)  # 12 tokens at -0.9: at most 2e-4 a draw with 10x slack
    v = cache_verdict(CacheSpec(), cache_run(sampled=same))
    assert v.status is Status.FAIL, v.message
    assert "the sampled request (temperature 1, unseeded) got the first answer's text 'Oslo is cold.' again 2 of 2 " \
        "times under fresh ids: its 12 tokens' logprobs give it at most 0.0002 a draw (10x slack), so 2 of 2 has " \
        "chance 4.2e-08 < 0.001 -- replays" in v.message, v.message


def test_a_peaked_model_repeating_its_likely_text_passes():
    # each token at -0.01 nats: the text is drawn 89% of the time, so repeats are what sampling gives
    v = cache_verdict(CacheSpec(), cache_run(sampled=sampled_fresh(texts=["Oslo."] * 3, logprob=-0.01)))
    assert v.status is Status.PASS, v.message
    assert v.evidence["sampled"]["chance"] > 0.5


def test_a_repeated_sampled_text_without_logprobs_is_inconclusive():
    same = [ans(f"chatcmpl-s{i}", "Oslo is cold.") for i in range(3)]
    v = cache_verdict(CacheSpec(), cache_run(sampled=same))
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "the sampled request got the same text 3 times under fresh ids and the server reports no logprobs" in v.message


def test_a_server_that_writes_no_id_is_not_failed_for_equal_greedy_bodies():
    # temperature 0, no id, no created: identical bytes are what a healthy server gives
    timed = [(k, Answer(a.label, Reply(200, json.dumps({"choices": [{"message": {"content": "one two"}}]}),
                                       a.reply.elapsed_s), a.sent_at)) for k, a in healthy_timed(random.Random(6))]
    v = cache_verdict(CacheSpec(), cache_run(timed=timed))
    assert v.status is Status.PASS, v.message


def test_timing_alone_never_fails():
    # repeats at 4 ms against controls at 600 ms, every body fresh and no usage details: INCONCLUSIVE
    timed = [(k, ans(a.id, a.text, elapsed=0.004 if k == "repeat" else a.reply.elapsed_s, created=a.created,
                     sent_at=a.sent_at)) for k, a in healthy_timed(random.Random(4), details=False)]
    v = cache_verdict(CacheSpec(), cache_run(timed=timed))
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "repeats faster than the engine answers the same prompt (upper bound under 0.90), but no answer carries a " \
        "replay's evidence" in v.message and "timing alone never FAILs" in v.message, v.message


def test_a_declared_cache_names_its_hit_and_still_keys_the_fields():
    timed = replaying(healthy_timed(random.Random(5)), fresh_ids=False)
    v = cache_verdict(CacheSpec(declared=True), cache_run(timed=timed))
    assert v.status is Status.PASS and "the declared cache's hit: 5 of 5 identical repeats got the first answer's " \
        "body" in v.message, v.message
    bad = cache_verdict(CacheSpec(declared=True), cache_run(variants={"seed": ans("chatcmpl-base")}, timed=timed))
    assert bad.status is Status.FAIL and "another seed" in bad.message


def test_what_ran_beside_the_timing_look_is_stated():
    run = cache_run()
    run.beside = {"running": 3, "idle": False, "waited_s": 10.0, "left": 2,
                  "words": "measured beside 2 requests the server was still running after 10.0 s (not this probe's)"}
    v = cache_verdict(CacheSpec(), run)
    assert v.status is Status.PASS and "(measured beside 2 requests the server was still running after 10.0 s " \
        "(not this probe's)): no repeat served from a cache -> PASS" in v.message, v.message
    assert v.evidence["beside"]["left"] == 2


def test_nothing_to_compare_is_invalid():
    assert cache_verdict(CacheSpec(), CacheRun(base=ans("b", status=503))).status is Status.INVALID
    assert cache_verdict(CacheSpec(), CacheRun(base=ans("b"), timing_errors=["first: 500"])).status is Status.INVALID
    only_first = [("first", ans("f")), ("repeat", ans("r", status=500)), ("control", ans("c"))]
    assert cache_verdict(CacheSpec(), cache_run(timed=only_first)).status is Status.INVALID
