"""Verdicts of the edge-requests gate (kvgate.gates.requests) on hand-built observations: pure,
no server, no sleeping."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from kvgate.http.client import Endpoint, KvClient, Reply, StreamReply
from kvgate.gates.requests import (EDGE_CASES, FALLBACK_TOKENS_PER_BYTE, REJECT, body_ladder, body_size_verdict,
                                   chunk_problems, edge_outcome_verdict, first_rung, ladder_body, min_tokens_verdict,
                                   non_ascii_verdict, openai_error_shape, prompt_bytes, route_timeout_verdict,
                                   tokens_per_byte)
from kvgate.http.probes import Exchange
from kvgate.verdict import Status

CASES = {c.name: c for c in EDGE_CASES}


def chunk(api, text=None, finish=None, index=0, usage=None, choices=True, **extra):
    if api == "chat":
        ch = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        obj = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    else:
        ch = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = {"id": "c1", "object": "text_completion", "created": 1, "model": "m"}
    ch.update(extra)
    obj["choices"] = [ch] if choices else []
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj)


def stream(*datas, done=True, transport_error=None):
    events = [(0.01 * i, d) for i, d in enumerate(datas)] + ([(0.01 * len(datas), "[DONE]")] if done else [])
    return StreamReply(200, events, elapsed_s=0.01 * len(events), transport_error=transport_error)


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_valid_chat_and_completion_streams_have_no_problems():
    for api in ("chat", "completions"):
        r = stream(chunk(api, "a"), chunk(api, "b", "length"))
        assert chunk_problems(api, r) == []
        r = stream(chunk(api, "a"), chunk(api, "b", "length"), chunk(api, choices=False, usage=USAGE))
        assert chunk_problems(api, r, usage_asked=True) == []


def test_empty_finish_reason_fails_the_sdk_chunk_type():
    r = stream(chunk("chat", "a", ""), chunk("chat", "b", "stop"))
    problems = chunk_problems("chat", r)
    assert any("fails ChatCompletionChunk at choices.0.finish_reason" in p for p in problems), problems


def test_missing_index_and_string_created_fail_strictly():
    bad = json.loads(chunk("completions", "a"))
    del bad["choices"][0]["index"]
    assert any("choices.0.index" in p for p in chunk_problems("completions", stream(json.dumps(bad), chunk(
        "completions", "b", "stop"))))
    bad = json.loads(chunk("chat", "a", "stop"))
    bad["created"] = "1"  # strict: no coercion of "1" to 1
    assert any("at created" in p for p in chunk_problems("chat", stream(json.dumps(bad))))


def test_n2_stream_needs_one_finish_per_choice():
    ok = stream(chunk("chat", "a", index=0), chunk("chat", "b", index=1), chunk("chat", "", "length", index=0),
                chunk("chat", "", "length", index=1))
    assert chunk_problems("chat", ok, n=2) == []
    missing = stream(chunk("chat", "a", index=0), chunk("chat", "b", "length", index=0))
    assert any("finish chunks per choice index {0: 1}" in p for p in chunk_problems("chat", missing, n=2))


def test_usage_only_where_asked_and_last():
    unasked = stream(chunk("chat", "a", usage=USAGE), chunk("chat", "b", "stop"))
    assert any("not asked for" in p for p in chunk_problems("chat", unasked))
    early = stream(chunk("chat", choices=False, usage=USAGE), chunk("chat", "b", "stop"))
    assert any("want exactly one, the last chunk" in p for p in chunk_problems("chat", early, usage_asked=True))


def test_error_event_garbage_and_cut_streams_are_problems_not_exceptions():
    r = stream(chunk("chat", "a"), '{"error": {"message": "EngineCore died", "type": "x"}}', "<html>oops", done=False,
               transport_error="RemoteProtocolError: incomplete chunked read")
    problems = chunk_problems("chat", r)
    assert any("error object 'EngineCore died'" in p for p in problems)
    assert any("not a JSON object: '<html>oops'" in p for p in problems)
    assert any("no 'data: [DONE]' (RemoteProtocolError" in p for p in problems)


def test_openai_error_shape():
    assert openai_error_shape({"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}) is None
    assert openai_error_shape({"detail": "Not Found"}) == "no 'error' object"
    assert openai_error_shape({"error": "Unauthorized"}).startswith("no 'error' object")
    assert openai_error_shape({"error": {"message": "x"}}) == "error.type missing or not a string"
    assert openai_error_shape(None) == "the body is not a JSON object"


def ex(status, body, api="completions", sent=None):
    text = body if isinstance(body, str) else json.dumps(body)
    return Exchange(api, False, sent or {"model": "m", "prompt": "hi"}, Reply(status, text, 0.01))


def completion(ct, pt=5, text="x"):
    return {"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}}


def test_edge_outcomes():
    case = CASES["max-tokens/huge/completions"]
    assert edge_outcome_verdict(case, ex(400, {"error": {"message": "too big", "type": "BadRequestError"}}),
                                512, 2048).status is Status.PASS
    v = edge_outcome_verdict(case, ex(500, {"error": {"message": "boom", "type": "InternalServerError"}}), 512, 2048)
    assert v.status is Status.FAIL and "answered 500 (boom)" in v.message and "never a 5xx" in v.message
    v = edge_outcome_verdict(case, ex(200, completion(600, pt=10)), 512, 2048)
    assert v.status is Status.FAIL and "600 completion tokens; at most 512" in v.message
    v = edge_outcome_verdict(case, ex(200, completion(30, pt=2016)), 512, 2048)
    assert v.status is Status.PASS and "at most 32" in v.message  # the rest of the context
    v = edge_outcome_verdict(case, ex(400, "Bad Request"), 512, 2048)
    assert v.status is Status.FAIL and "without OpenAI's error body" in v.message
    v = edge_outcome_verdict(case, ex(0, "ReadTimeout: timed out"), 512, 2048)
    assert v.status is Status.FAIL and "no answer" in v.message


def test_string_max_tokens_accepted_fails():
    case = CASES["max-tokens/string/chat"]
    assert case.expect == REJECT
    v = edge_outcome_verdict(case, ex(200, completion(16), api="chat"), 512, 2048)
    assert v.status is Status.FAIL and "must be rejected 4xx" in v.message


def test_html_200_is_a_fail_naming_it():
    v = edge_outcome_verdict(CASES["empty-prompt/list-of-empty"], ex(200, "<html><body>maintenance</body></html>"),
                             512, 2048)
    assert v.status is Status.FAIL and "non-JSON body '<html>" in v.message


def test_echo_with_max_tokens_0_counts_the_prompt_not_usage():
    case = CASES["malformed/echo-logprobs-max-tokens-0"]
    sent = {"model": "m", "prompt": "the kv cache pool", "echo": True, "max_tokens": 0, "logprobs": 1}
    v = edge_outcome_verdict(case, ex(200, completion(1, text="the kv cache pool"), sent=sent), 512, 2048)
    assert v.status is Status.PASS and "usage.completion_tokens 1: counts a token it did not return" in v.message
    v = edge_outcome_verdict(case, ex(200, completion(1, text="the kv cache pool and more"), sent=sent), 512, 2048)
    assert v.status is Status.FAIL and "at most 0" in v.message


def test_min_tokens():
    def fin(ct, reason):
        body = completion(ct)
        body["choices"][0]["finish_reason"] = reason
        return ex(200, body)
    assert min_tokens_verdict(fin(40, "stop"), 32, 64, 512).status is Status.PASS
    v = min_tokens_verdict(fin(2, "stop"), 32, 64, 512)
    assert v.status is Status.FAIL and "2 completion tokens came back" in v.message and "at least 32" in v.message
    v = min_tokens_verdict(fin(40, "length"), 32, 64, 512)
    assert v.status is Status.FAIL and "means 'stop'" in v.message
    assert min_tokens_verdict(fin(16, "length"), 32, 64, 16).status is Status.PASS  # the server's cap of 16 comes first
    assert min_tokens_verdict(fin(16, "length"), 32, 64, 512).status is Status.FAIL  # below min_tokens
    assert min_tokens_verdict(fin(64, "length"), 32, 64, 512).status is Status.PASS


def test_non_ascii_replacement_characters_named():
    plain = Exchange("completions", False, {}, Reply(200, json.dumps(completion(2, text=" 토큰🙂")), 0.01))
    good = Exchange("completions", True, {}, stream(chunk("completions", " 토"), chunk("completions", "큰🙂", "length")))
    assert non_ascii_verdict(good, plain).status is Status.PASS
    bad = Exchange("completions", True, {}, stream(chunk("completions", " 토\ufffd"), chunk("completions", "🙂", "length")))
    v = non_ascii_verdict(bad, plain)
    assert v.status is Status.FAIL and v.gate == "requests/non-ascii-stream/completions"
    assert "1 replacement characters" in v.message


def timed_stream(ttft, itl, n, done=True):
    events = [(ttft + i * itl, chunk("completions", f" t{i}", "length" if i == n - 1 else None)) for i in range(n)]
    if done:
        events.append((ttft + n * itl, "[DONE]"))
    return Exchange("completions", True, {"max_tokens": n}, StreamReply(200, events, elapsed_s=events[-1][0]))


def stream_of(ttft, gaps, n_max=None):
    """A completed stream: a token at ``ttft``, then one after each of ``gaps`` (seconds), [DONE]."""
    t = [ttft]
    for g in gaps:
        t.append(t[-1] + g)
    events = [(x, chunk("completions", f" t{i}", "length" if i == len(t) - 1 else None)) for i, x in enumerate(t)]
    events.append((t[-1] + 0.001, "[DONE]"))
    return Exchange("completions", True, {"max_tokens": n_max or len(t)}, StreamReply(200, events, elapsed_s=events[-1][0]))


def test_route_timeout_arithmetic_is_the_measured_stream_when_it_ran_whole():
    # 512 tokens: 0.5 s + 511 x 20 ms = 10.72 s measured
    v = route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, 10.0)
    assert v.status is Status.FAIL and v.measured == pytest.approx(10.74, abs=0.01) and v.limit == 10.0
    assert "measured whole: 512 tokens ended in 10.74 s > gateway route timeout 10 s" in v.message
    assert route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, 11.0).status is Status.PASS
    v = route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, None)
    assert v.status is Status.PASS and v.skipped_parts  # live PASS, arithmetic not checked


def test_route_timeout_issue_48_stalls_beside_other_probes_do_not_fail_a_healthy_gateway():
    """Issue 48: a 32-token stream that ended with [DONE] in 13.73 s while other probes ran beside
    it (four gaps stretched to ~2 s) read '32 x ITL p95 2298.2 ms + TTFT 497 ms = 74.0 s >
    60 s -> FAIL'. p95 x n is no bound on a sum: the estimate is the stream itself, 13.73 s."""
    gaps = [0.2] * 31
    for i in (3, 11, 19, 27):
        gaps[i] = 1.96  # the stretched gaps
    ex = stream_of(0.497, gaps)
    assert ex.reply.elapsed_s == pytest.approx(13.738, abs=0.001)
    old = 32 * float(np.percentile(gaps, 95)) + 0.497
    assert old > 60  # what the p95 x n arithmetic said
    v = route_timeout_verdict(ex, 32, 60.0, beside=5)
    assert v.status is Status.PASS, v.message
    assert "32 tokens ended in 13.74 s <= gateway route timeout 60 s" in v.message
    assert "timed beside 5 other probes in flight" in v.message and v.measured <= 13.74
    assert route_timeout_verdict(ex, 32, 60.0, beside=0).message.count("timed alone") == 1
    # the same stream against a timeout below its real duration: FAIL naming measured and limit
    v = route_timeout_verdict(ex, 32, 10.0, beside=5)
    assert v.status is Status.FAIL and v.measured == pytest.approx(13.738, abs=0.001) and v.limit == 10.0
    assert "13.74 s > gateway route timeout 10 s" in v.message


def test_route_timeout_extrapolates_a_short_stream_by_its_mean_gap_and_bounds_the_sum():
    # the server ended after 64 tokens; the profile allows 512: 0.5 + 63 x 20 ms measured, 448 more
    ex = stream_of(0.5, [0.02] * 63, n_max=512)
    t = ex.reply.elapsed_s
    v = route_timeout_verdict(ex, 512, 60.0)
    assert v.status is Status.PASS and "448 more x TPOT 20.0 ms" in v.message
    assert v.evidence["requests/route-timeout/arithmetic"]["evidence"]["longest_generation_s"]["point"] == \
        pytest.approx(t + 448 * 0.02, abs=1e-3)
    v = route_timeout_verdict(ex, 512, 5.0)
    assert v.status is Status.FAIL and v.measured == pytest.approx(t + 448 * 0.02, abs=0.01)
    # noisy gaps: the mean's bounds straddle a timeout between them -> INCONCLUSIVE, not PASS/FAIL
    rng = np.random.default_rng(0)
    noisy = stream_of(0.5, list(rng.exponential(0.02, 15)), n_max=512)
    ev = route_timeout_verdict(noisy, 512, 60.0).evidence["requests/route-timeout/arithmetic"]["evidence"]
    lo, hi = ev["longest_generation_s"]["lower"], ev["longest_generation_s"]["upper"]
    assert lo < hi
    v = route_timeout_verdict(noisy, 512, (lo + hi) / 2)
    assert v.status is Status.INCONCLUSIVE and "straddle" in v.message, v.message


def test_route_timeout_on_the_fake_both_ways():
    """Live on the fault-injection fake (32 tokens, 20 ms apart: ~0.65 s): a gateway whose total
    timeout (0.3 s) is below the stream's duration cuts it -- FAIL naming when and how many tokens;
    the healthy fake PASSes, also timed while four other streams ran beside the probe."""
    from concurrent.futures import ThreadPoolExecutor
    from kvgate.http.probes import send
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    def probe(f, beside=0):
        c = KvClient(Endpoint(f.base_url), timeout_s=10)
        b = {"model": FakeConfig().served_name, "prompt": "the kv cache", "max_tokens": 32, "temperature": 0,
             "ignore_eos": True}
        with ThreadPoolExecutor(max_workers=beside + 1) as pool:
            others = [pool.submit(send, c, "completions", dict(b), stream=True) for _ in range(beside)]
            ex = send(c, "completions", b, stream=True)
            [o.result() for o in others]
        return ex

    with FakeVLLM(FakeConfig(itl_s=0.02, faults={"route_timeout"}, route_timeout_s=0.3)) as f:
        v = route_timeout_verdict(probe(f), 32, 0.3)
    assert v.status is Status.FAIL and "was cut after" in v.message and "no [DONE]" in v.message, v.message
    with FakeVLLM(FakeConfig(itl_s=0.02)) as f:
        alone, crowded = probe(f), probe(f, beside=4)
    for ex, k in ((alone, 0), (crowded, 4)):
        v = route_timeout_verdict(ex, 32, 60.0, beside=k)
        assert v.status is Status.PASS and "measured whole: 32 tokens" in v.message, v.message
        assert v.measured == pytest.approx(ex.reply.elapsed_s, abs=0.001)
    v = route_timeout_verdict(alone, 32, alone.reply.elapsed_s / 2)  # a declared timeout below the real duration
    assert v.status is Status.FAIL and v.limit == pytest.approx(alone.reply.elapsed_s / 2)


def test_route_timeout_cut_stream_fails_live():
    cut = timed_stream(0.1, 0.01, 40, done=False)
    cut.reply.transport_error = "RemoteProtocolError: peer closed connection"
    v = route_timeout_verdict(cut, 512, 300.0)
    assert v.status is Status.FAIL and "was cut after" in v.message and "no [DONE]" in v.message
    gw = Exchange("completions", True, {}, StreamReply(504, text="<html>504 Gateway Time-out</html>", elapsed_s=30))
    v = route_timeout_verdict(gw, 512, 300.0)
    assert v.status is Status.FAIL and "answered 504" in v.message


def test_client_sends_chat_template_kwargs_to_tokenize():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"count": 7})

    with KvClient(Endpoint("http://kv.test"), transport=httpx.MockTransport(handler),
                  chat_template_kwargs={"enable_thinking": False}) as client:
        client.tokenize(model="m", messages=[{"role": "user", "content": "hi"}])
        client.tokenize(model="m", prompt="hi")
    assert seen[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in seen[1]  # a completions prompt has no template


# ---- the body-size ladder (requests/body-size)

M = "kvgate-tiny-llama"
HTML_413 = "<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body></html>"
TOO_LONG = {"error": {"message": "This model's maximum context length is 2048 tokens. However, your request has "
                                 "4100 input tokens.", "type": "BadRequestError", "code": 400}}


def ladder_completion(prompt_tokens=10):
    return json.dumps({"id": "c", "object": "text_completion", "created": 1, "model": M,
                       "choices": [{"index": 0, "text": " a", "logprobs": None, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
                                 "total_tokens": prompt_tokens + 1}})


def rung_ex(status, text, ctype="application/json"):
    return Exchange("completions", False, {"raw": "..."}, Reply(status, text, 0.01, {"content-type": ctype}))


def ladder(answer, max_model_len=2048, per_byte=0.33):
    """The rungs and an exchange for each from ``answer(rung)`` -> (status, text[, content-type])."""
    rungs = body_ladder(M, max_model_len, per_byte)
    return rungs, [rung_ex(*answer(r)) for r in rungs]


def healthy(r):
    return (200, ladder_completion()) if r.allowed and r.text == "ascii" else (400, json.dumps(TOO_LONG))


def test_ladder_bodies_have_their_exact_byte_size_and_text():
    for size, text in ((1024, "ascii"), (6180, "ascii"), (6180, "multibyte"), (120, "multibyte")):
        body = ladder_body(M, size, text)
        assert len(body) == size, (size, text)
        obj = json.loads(body)
        assert obj["max_tokens"] == 1 and obj["model"] == M and len(obj["prompt"].encode()) == prompt_bytes(M, size)
        if text == "multibyte":
            assert sum(len(c.encode()) > 1 for c in obj["prompt"]) > prompt_bytes(M, size) // 8


def test_ladder_rungs_from_a_few_kb_to_max_context_2x_and_multibyte():
    rungs = body_ladder(M, 2048, 0.33)
    names = [r.name for r in rungs]
    assert names == ["1,024 B", "4,096 B", "max-context", "2x max-context", "multibyte"]
    top = rungs[2]
    assert top.allowed and 2030 <= top.est_tokens <= 2048 - 1 - 8 and 6000 < top.body_bytes < 6300
    assert not rungs[3].allowed and rungs[3].est_tokens > 2048 and rungs[4].body_bytes == top.body_bytes
    assert rungs[4].est_tokens is None  # multibyte: its tokens per byte are another ratio
    # a 128k-token context stays small: x4 steps to the max-context rung
    assert 5 <= len(body_ladder(M, 131072, 0.25)) <= 9
    # a context too short for a 1 KB prompt: the first rung's prompt is max_model_len // 2 bytes at most
    small = first_rung(M, 256)
    assert prompt_bytes(M, small.body_bytes) <= 128 and small.body_bytes < 1024


def test_tokens_per_byte_from_the_first_rung_usage_else_the_rule_of_thumb():
    first = first_rung(M, 2048)
    per, how = tokens_per_byte(rung_ex(200, ladder_completion(prompt_tokens=330)), M, first.body_bytes)
    assert per == pytest.approx(330 / prompt_bytes(M, 1024)) and "usage.prompt_tokens 330" in how
    per, how = tokens_per_byte(rung_ex(413, HTML_413, "text/html"), M, first.body_bytes)
    assert per == FALLBACK_TOKENS_PER_BYTE and "assumed" in how


def test_healthy_ladder_passes_with_400_beyond_max_model_len():
    rungs, exs = ladder(healthy)
    v = body_size_verdict(rungs, exs, 2048, "0.330 tokens per byte")
    assert v.status is Status.PASS, v.message
    assert "(2x max-context) 400" in v.message and "max-context ~2,03" in v.message
    assert [row["status"] for row in v.evidence["rungs"]] == [200, 200, 200, 400, 400]
    # measured/limit read one way: the largest allowed body, answered, against the largest allowed (was
    # "20,186 bytes" -- the over-length rung -- against "10,129 bytes allowed bytes" under a PASS)
    assert v.measured == v.limit == rungs[2].body_bytes and v.unit == "bytes" and v.limit_unit is None
    # a multibyte max-context body the engine completes is fine too; an over-length one completed as well
    assert body_size_verdict(*ladder(lambda r: (200, ladder_completion())), 2048, "").status is Status.PASS


def test_gateway_413_below_max_context_fails_naming_the_cliff():
    def gateway(r):
        return (413, HTML_413, "text/html") if r.body_bytes > 4096 else healthy(r)

    rungs, exs = ladder(gateway)
    v = body_size_verdict(rungs, exs, 2048, "0.330 tokens per byte")
    assert v.status is Status.FAIL and v.measured == rungs[2].body_bytes and v.unit == "bytes"
    top = rungs[2]
    assert v.message.startswith(f'bodies up to 4,096 bytes answered 200; 413 (HTML: "413 Request Entity Too Large") '
                                f"from {top.body_bytes:,} bytes (max-context) for a body of ~{top.est_tokens:,} tokens, "
                                "under max_model_len 2,048 -> FAIL (gateway body-size cliff between 4,096 and "
                                f"{top.body_bytes:,} bytes; 2 of 5 rungs"), v.message


@pytest.mark.parametrize("answer,fragment", [
    (lambda r: (500, json.dumps({"error": {"message": "ext_proc failed", "type": "x"}})) if r.body_bytes > 2000
     else healthy(r), '500 (JSON error: "ext_proc failed") from 4,096 bytes for a body'),
    (lambda r: (502, "<html><h1>502 Bad Gateway</h1></html>", "text/html") if not r.allowed else healthy(r),
     "a 5xx for an over-length body"),
    (lambda r: (400, "Bad Request", "text/plain") if r.text == "multibyte" else healthy(r),
     '400 (text/plain: "Bad Request") from'),
    (lambda r: (400, json.dumps(TOO_LONG)) if r.name == "max-context" else healthy(r),
     "400 (JSON error: \"This model's maximum context length"),
    (lambda r: (0, "ReadTimeout: timed out") if r.body_bytes == 4096 else healthy(r), "no answer (ReadTimeout"),
    (lambda r: (200, "<html>ok</html>", "text/html") if r.body_bytes == 1024 else healthy(r), "200 with non-JSON body"),
])
def test_ladder_fails_on_answers_that_are_not_documented(answer, fragment):
    v = body_size_verdict(*ladder(answer), 2048, "0.330 tokens per byte")
    assert v.status is Status.FAIL and fragment in v.message, v.message


def test_413_beyond_the_profile_is_a_gateway_limit_the_ladder_accepts():
    rungs, exs = ladder(lambda r: (413, HTML_413, "text/html") if not r.allowed else healthy(r))
    v = body_size_verdict(rungs, exs, 2048, "")
    assert v.status is Status.PASS and "(2x max-context) 413" in v.message


def test_a_route_that_refuses_every_body_is_not_called_a_size_cliff():
    """A static server answering 501 to every POST: the smallest rung fails too -- no size limit."""
    v = body_size_verdict(*ladder(lambda r: (501, "<html><title>Unsupported method</title></html>", "text/html")),
                          2048, "assumed")
    assert v.status is Status.FAIL and "from 1,024 bytes for a body" in v.message, v.message
    assert "no body answered, the smallest included: the route refuses completions of any size" in v.message
    assert "cliff" not in v.message
