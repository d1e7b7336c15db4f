"""Verdicts of the edge-requests gate (kvgate.gates.requests) on hand-built observations: pure,
no server, no sleeping."""

from __future__ import annotations

import json

import httpx

from kvgate.http.client import Endpoint, KvClient, Reply, StreamReply
from kvgate.gates.requests import (EDGE_CASES, REJECT, chunk_problems, edge_outcome_verdict, min_tokens_verdict,
                                   non_ascii_verdict, openai_error_shape, route_timeout_verdict)
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


def test_route_timeout_arithmetic():
    # 512 tokens x 20 ms + 0.5 s = 10.7 s
    v = route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, 10.0)
    assert v.status is Status.FAIL
    assert "512 tokens x ITL p95 20.0 ms + TTFT 500 ms = 10.7 s > gateway route timeout 10 s" in v.message
    assert route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, 11.0).status is Status.PASS
    v = route_timeout_verdict(timed_stream(0.5, 0.02, 512), 512, None)
    assert v.status is Status.PASS and v.skipped_parts  # live PASS, arithmetic not checked


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
