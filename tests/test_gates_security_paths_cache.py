"""The security gate's input-paths and cache verdicts (kvgate.gates.security) on hand-built
observations: pure, no server, no sleeping."""

from __future__ import annotations

import json

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

def ans(rid, text="a fox", status=200, label="x"):
    return Answer(label, Reply(status, json.dumps({"id": rid, "choices": [{"message": {"content": text}}]}), 0.3))


def cache_run(variants=None, callers=None, timing=(0.7, 0.71, 0.72, 0.70, 0.73), note=""):
    kinds = ["first", "repeat", "fresh", "repeat", "fresh"]
    return CacheRun(base=ans("chatcmpl-base"), variants=variants or {f: ans(f"chatcmpl-{f}") for f in
                                                                     ("response_format", "stop", "seed")},
                    callers=callers, second_key_note=note, timing=list(zip(kinds, timing)))


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
                                "compared (the profile names no second key); 2 identical repeats took at most 710 ms, "
                                "3 uncached requests at least 700 ms: no repeat served from a cache -> PASS")


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


@pytest.mark.parametrize("repeats,hit", [((0.004, 0.005), True), ((0.62, 0.62), True), ((0.64, 0.1), False),
                                         ((0.005, 0.70), False)])
def test_a_cache_hit_is_every_repeat_faster_than_every_uncached_request(repeats, hit):
    # uncached 0.7 .. 0.73 s: a hit needs every repeat below 0.9 x 0.70 = 0.63 s (one slow repeat: no hit)
    timing = (0.70, repeats[0], 0.72, repeats[1], 0.73)
    v = cache_verdict(CacheSpec(), cache_run(timing=timing))
    assert (v.status is Status.FAIL) is hit, v.message
    if hit:
        assert "every repeat more than 10% faster -- a response cache the profile does not declare" in v.message


def test_a_declared_cache_names_its_hit_and_still_keys_the_fields():
    v = cache_verdict(CacheSpec(declared=True), cache_run(timing=(0.7, 0.004, 0.72, 0.005, 0.73)))
    assert v.status is Status.PASS and "took at most 5 ms, 3 uncached requests at least 700 ms: the declared cache's " \
        "hit -> PASS" in v.message, v.message
    bad = cache_verdict(CacheSpec(declared=True), cache_run(variants={"seed": ans("chatcmpl-base")},
                                                            timing=(0.7, 0.004, 0.72, 0.005, 0.73)))
    assert bad.status is Status.FAIL and "another seed" in bad.message


def test_nothing_to_compare_is_invalid():
    assert cache_verdict(CacheSpec(), CacheRun(base=ans("b", status=503))).status is Status.INVALID
    assert cache_verdict(CacheSpec(), CacheRun(base=ans("b"), timing_errors=["first: 500"])).status is Status.INVALID
