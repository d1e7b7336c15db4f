"""The requests gate's integrity verdict (kvgate.gates.requests.integrity_verdict) on hand-built
deliveries: pure, no server, no sleeping."""

from __future__ import annotations

import json

from kvgate.gates.requests import integrity_verdict
from kvgate.http.integrity import Delivery, Overlap
from kvgate.verdict import Status

TOKENS = ["The", " keeper", " lit", " the", " lamp"]


def logprobs(tokens, alt_gap=2.0, at=None, alt=None):
    out = []
    for i, t in enumerate(tokens):
        other = alt if i == at else "x"
        out.append({"token": t, "logprob": -0.1, "top_logprobs": [{"token": t, "logprob": -0.1},
                                                                   {"token": other, "logprob": -0.1 - alt_gap}]})
    return {"content": out}


def whole(tokens=TOKENS, prompt_tokens=12, **lp):
    return json.dumps({"id": "chatcmpl-1", "choices": [{"index": 0, "message": {"content": "".join(tokens)},
                                                        "finish_reason": "length", "logprobs": logprobs(tokens, **lp)}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens)}}).encode()


def stream(tokens=TOKENS, prompt_tokens=12, finish=True, done=True):
    events = [{"choices": [{"index": 0, "delta": {"content": t}, "logprobs": logprobs([t]), "finish_reason": None}]}
              for t in tokens]
    if finish:
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        events.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens)}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + ("data: [DONE]\n\n" if done else "")
    return body.encode()


def d(label, body, stream=False, long=True, content_length="auto", error=None, rendered=12, status=200):
    cl = (len(body) if not stream else None) if content_length == "auto" else content_length
    return Delivery(label, stream, long, status, cl, body, error, rendered, 1.0)


def overlap(*bodies, alone=None, direct=None):
    return Overlap(4, alone or d("the long request alone", whole()), list(bodies), direct)


def healthy():
    return [d("long (not streamed)", whole()), d("long (streamed)", stream(), stream=True),
            d("short 2", whole(["a", "b"], prompt_tokens=9), long=False, rendered=9)]


def test_whole_bodies_pass_naming_what_was_checked():
    v = integrity_verdict(overlap(*healthy()), 0.1)
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("3 requests at once: every body whole (2 matched their Content-Length, 2 parsed as "
                                "JSON, 1 streams ended with a finish chunk and [DONE]); usage.prompt_tokens = /tokenize's "
                                "count on 3; the long temperature-0 answer (23 characters, sha256 "), v.message
    assert "the same 2 times in overlap; no direct-to-pod endpoint given (--direct-endpoint) -> PASS" in v.message


def test_a_body_short_of_its_content_length_fails_naming_the_bytes():
    body = whole()
    cut = d("long (not streamed)", body[:100], content_length=len(body), error="RemoteProtocolError: peer closed")
    v = integrity_verdict(overlap(cut, *healthy()[1:]), 0.1)
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (1, 0, "bodies")
    assert (f"long (not streamed): Content-Length {len(body):,}, received 100 bytes ({len(body) - 100:,} short); the "
            f"same request alone: {len(body):,} bytes") in v.message, v.message


def test_a_cut_body_without_a_content_length_fails_as_json_that_does_not_parse():
    v = integrity_verdict(overlap(d("long (not streamed)", whole()[:60], content_length=None)), 0.1)
    assert v.status is Status.FAIL and "60 bytes that do not parse as JSON (they end " in v.message, v.message


def test_a_stream_without_its_terminal_events_fails_naming_what_is_missing():
    v = integrity_verdict(overlap(d("long (streamed)", stream(finish=False, done=False), stream=True)), 0.1)
    assert v.status is Status.FAIL
    assert "long (streamed): a stream of " in v.message and "and 5 events with no finish chunk and no [DONE]" in v.message
    no_done = integrity_verdict(overlap(d("long (streamed)", stream(done=False), stream=True)), 0.1)
    assert "with no [DONE]" in no_done.message and "finish chunk and" not in no_done.message.split("-> FAIL")[0]


def test_a_prompt_counted_otherwise_than_tokenize_fails_naming_both():
    v = integrity_verdict(overlap(d("short 2", whole(["a"], prompt_tokens=7), long=False, rendered=9)), 0.1)
    assert v.status is Status.FAIL
    assert "short 2: usage.prompt_tokens 7 where /tokenize renders the conversation sent as 9 tokens" in v.message


def test_a_long_answer_that_drifts_fails_and_a_near_tie_passes_named():
    other = ["The", " keeper", " saw", " a", " ship"]
    drift = integrity_verdict(overlap(d("long (not streamed)", whole(other, at=2, alt=" lit")),
                                      alone=d("the long request alone", whole(at=2, alt=" saw"))), 0.1)
    assert drift.status is Status.FAIL
    assert "long (not streamed): 21 characters, sha256 " in drift.message and "where the same request alone gave 23 " \
        "characters" in drift.message and "parts at token 2 (' lit' alone, ' saw' here, 2 nats apart)" in drift.message
    tie = overlap(d("long (not streamed)", whole(other, alt_gap=0.05, at=2, alt=" lit")),
                  alone=d("the long request alone", whole(alt_gap=0.05, at=2, alt=" saw")))
    v = integrity_verdict(tie, 0.1)
    assert v.status is Status.PASS and "(1 parting at a near tie: long (not streamed) parts at token 2" in v.message


def test_the_direct_endpoint_is_compared_with_the_alone_answer():
    same = integrity_verdict(overlap(*healthy(), direct=d("on the direct endpoint", whole())), 0.1)
    assert same.status is Status.PASS and "; the direct endpoint's answer the same -> PASS" in same.message
    other = integrity_verdict(overlap(*healthy(), direct=d("on the direct endpoint", whole(["A"] * 5))), 0.1)
    assert other.status is Status.FAIL and "on the direct endpoint: 5 characters" in other.message


def test_no_whole_alone_answer_fails_as_itself():
    bad = integrity_verdict(overlap(*healthy(), alone=d("alone", b"<html>502 Bad Gateway</html>", status=502)), 0.1)
    assert bad.status is Status.FAIL and bad.message.startswith("the long request alone got 502 (<html>502 Bad Gateway")
    cut = d("alone", whole()[:50], content_length=len(whole()))
    v = integrity_verdict(overlap(*healthy(), alone=cut), 0.1)
    assert v.status is Status.FAIL and "the long request alone was delivered incomplete: Content-Length" in v.message
