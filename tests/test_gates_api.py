"""Verdicts of the api gate (kvgate.gates.api) on hand-built observations: pure, no server."""

from __future__ import annotations

import json

import pytest

from kvgate.gates.api import (messages_grammar, responses_grammar, responses_stream_verdict, spanning_stop,
                              with_gaps)
from kvgate.http.client import StreamReply
from kvgate.http.probes import Exchange
from kvgate.http.sdk import SdkFinal
from kvgate.verdict import Status, Verdict

GAP = {"responses/stream/terminal-event": "vLLM 0.32 (responses/serving.py)"}


def response(status, text):
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "none", "tools": []}


def responses_stream(terminal, status="incomplete", text=" a b"):
    evs = [{"type": "response.created", "response": {**response("in_progress", ""), "output": []}},
           {"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}},
           *({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": "msg_1",
              "delta": d, "logprobs": []} for d in (" a", " b")),
           {"type": "response.output_item.done", "output_index": 0, "item": response(status, text)["output"][0]},
           {"type": terminal, "response": response(status, text)}]
    events = [(0.01 * i, json.dumps({**e, "sequence_number": i})) for i, e in enumerate(evs)]
    return Exchange("responses", True, {}, StreamReply(200, events, elapsed_s=0.1))


def test_terminal_event_must_match_the_status_unless_the_gap_is_accepted():
    sdk = SdkFinal(" a b", "incomplete", None)
    v = responses_stream_verdict(responses_stream("response.completed"), sdk, {})
    assert v.status is Status.FAIL
    assert "terminal event 'response.completed' carries status 'incomplete'; the spec's event for it is " \
           "'response.incomplete' -> FAIL" in v.message
    v = responses_stream_verdict(responses_stream("response.completed"), sdk, GAP)
    assert v.status is Status.PASS
    part = {p.gate: p for p in v.parts}["api/responses/stream/terminal-event"]
    assert part.status is Status.SKIP and part.message.startswith("accepted gap (profile api.accepted_gaps: vLLM 0.32")
    v = responses_stream_verdict(responses_stream("response.incomplete"), sdk, GAP)
    assert v.status is Status.PASS and "no longer seen: the entry can go" in v.message


def test_sdk_failure_and_text_mismatch_fail_the_sdk_check():
    v = responses_stream_verdict(responses_stream("response.incomplete"), SdkFinal("", None, "RuntimeError: boom"), {})
    assert v.status is Status.FAIL and "the openai SDK's responses.stream raised RuntimeError: boom" in v.message


GRAMMAR_BREAKS = {
    "responses": (responses_grammar, [
        {"type": "response.in_progress", "sequence_number": 0},
        {"type": "response.output_item.added", "output_index": 0, "sequence_number": 2},
        {"type": "response.completed", "sequence_number": 3}, {"type": "response.completed", "sequence_number": 4}],
        ["first event 'response.in_progress', want 'response.created'", "sequence_number jumps 0 -> 2 at event 1",
         "output items [0] added and never done", "2 terminal events, want one"]),
    "messages": (messages_grammar, [{"type": "content_block_delta", "index": 1}, {"type": "message_delta", "delta": {}}],
                 ["first event 'content_block_delta', want 'message_start'",
                  "no message_stop; the stream ended with 'message_delta'", "a content_block_delta for block 1, not open",
                  "1 message_delta events; want one carrying the stop_reason"]),
}


@pytest.mark.parametrize("api", list(GRAMMAR_BREAKS))
def test_grammar_names_each_break(api):
    grammar, events, problems = GRAMMAR_BREAKS[api]
    assert grammar(events) == problems


def test_messages_grammar_allows_pings():
    ok = [{"type": "message_start"}, {"type": "content_block_start", "index": 0}, {"type": "ping"},
          {"type": "content_block_delta", "index": 0}, {"type": "content_block_stop", "index": 0},
          {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}, {"type": "message_stop"}]
    assert messages_grammar(ok) == []


def test_spanning_stop_spans_a_boundary_first_seen_there():
    # vLLM: tokens rebuild the text; a partial multi-byte token reads "" where the text has U+FFFD
    assert spanning_stop(["sequence", " decode", "\x14"], "sequence decode\x14") == "ce d"
    assert spanning_stop(["", "ab"], "\ufffdab") is None
    # the fake's logprobs tokens lack the leading space: found one character on
    assert spanning_stop([f"tok{i}" for i in (1, 2, 3)], " tok1 tok2 tok3") == "k2 t"
    # a boundary whose string occurs earlier is passed over ("at a" at 1 is the first boundary's)
    assert spanning_stop([" at", " at", " at"], " at at at") == "at a"
    assert spanning_stop(["ab", "\x14", "\x14"], "ab\x14\x14") is None  # nothing printable across a boundary


def test_with_gaps_leaves_unlisted_failures_alone():
    parts = [Verdict("api/x/y/a", Status.FAIL, "a broke -> FAIL"), Verdict("api/x/y/b", Status.PASS, "b -> PASS")]
    assert with_gaps("api/x/y", parts, GAP).status is Status.FAIL


def test_a_reply_that_ended_on_its_own_skips_the_limit_check_truthfully():
    """A server that does not honour ignore_eos: a reply ending after 3 of 8 tokens and saying so
    (completed / end_turn) SKIPs the limit's outcome; one saying incomplete at 3 tokens FAILs."""
    from kvgate.gates.api import messages_reply_verdict, responses_reply_verdict
    from kvgate.http.client import Reply

    def ex(body):
        return Exchange("x", False, {}, Reply(200, json.dumps(body), 0.01))

    usage = {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8, "input_tokens_details": {
        "cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    done = {**response("completed", " a b"), "usage": usage}
    v = responses_reply_verdict(ex(done), 8, {})
    assert v.status is Status.SKIP and "ended on its own after 3 tokens" in v.message
    lying = {**done, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    v = responses_reply_verdict(ex(lying), 8, {})
    assert v.status is Status.FAIL and "usage.output_tokens 3, want 8" in v.message
    msg = {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text", "text": "a"}],
           "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 3}}
    v = messages_reply_verdict(ex(msg), None, None, 8, {})
    assert v.status is Status.SKIP and "stop_reason 'end_turn'" in v.message
    v = messages_reply_verdict(ex({**msg, "stop_reason": "max_tokens"}), None, None, 8, {})
    assert v.status is Status.FAIL and "usage.output_tokens 3, want 8 (max_tokens reached)" in v.message


# ---------------------------------------------------------------- an SDK parse failure at its path

def completed(**changes):
    """A valid response.completed event, ``changes`` set on its response (None: the key removed)."""
    resp = {**response("completed", " a b"), "usage": {
        "input_tokens": 5, "output_tokens": 2, "total_tokens": 7, "input_tokens_details": {
            "cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    for k, v in changes.items():
        if v is None:
            resp.pop(k)
        else:
            resp[k] = v
    return {"type": "response.completed", "sequence_number": 5, "response": resp}


def test_a_parse_failure_is_named_in_the_member_the_type_selects():
    """vLLM 0.28's usage without cache_write_tokens: validated against ResponseCompletedEvent (the
    type's member; the union's own error names ResponseAudioDeltaEvent.delta), the path is the real
    one, and the SDK's default parse still hands the event over, the field None: drift."""
    from kvgate.gates.api import sdk_finding
    from kvgate.http.sdk import RESPONSE_EVENT
    ev = completed()
    assert sdk_finding(RESPONSE_EVENT, ev) is None
    del ev["response"]["usage"]["input_tokens_details"]["cache_write_tokens"]
    f = sdk_finding(RESPONSE_EVENT, ev)
    assert (f.kind, f.member, f.path, f.error, f.got, f.breaks) == (
        "response.completed", "ResponseCompletedEvent", "response.usage.input_tokens_details.cache_write_tokens",
        "Field required", None, False)
    assert f.delivers == "its default parse (as clients call it) still hands the client the event, " \
                         "response.usage.input_tokens_details.cache_write_tokens None"


def test_a_nested_union_is_read_in_the_member_its_type_selects():
    """Response.output is a union of ~20 item types: a message item's text of the wrong kind is
    named at response.output.0.content.0.text (the message member's), not at another member's
    field; a scalar of the wrong kind is drift (the client reads it as sent); a list sent as a string
    breaks clients."""
    from kvgate.gates.api import sdk_finding
    from kvgate.http.sdk import RESPONSE_EVENT
    item = response("completed", "x")["output"][0]
    f = sdk_finding(RESPONSE_EVENT, completed(output=[{**item, "content": [{**item["content"][0], "text": 5}]}]))
    assert (f.path, f.got, f.breaks) == ("response.output.0.content.0.text", "5", False), f
    assert f.delivers.endswith("still hands the client response.output.0.content.0.text as sent (an int (5))")
    f = sdk_finding(RESPONSE_EVENT, completed(output=[{**item, "content": "x"}]))
    assert (f.path, f.breaks, f.expects) == ("response.output.0.content", True, "a list"), f


@pytest.mark.parametrize("change, path, delivers", [
    ({"response": "resp_1"}, "response", "hands the client response as a str ('resp_1') where "
     "ResponseCompletedEvent types an object: nothing to read into"),
    ({"response": None}, "response", "hands the client response as null where ResponseCompletedEvent types an "
     "object: nothing to read into"),
    ({"response": {**completed()["response"], "usage": 7}}, "response.usage", "hands the client response.usage as an "
     "int (7) where ResponseCompletedEvent types an object: nothing to read into"),
])
def test_an_object_the_sdk_types_that_comes_as_something_else_breaks_clients(change, path, delivers):
    from kvgate.gates.api import sdk_finding
    from kvgate.http.sdk import RESPONSE_EVENT
    ev = {**completed(), **change}
    if change.get("response", 1) is None:
        del ev["response"]
    f = sdk_finding(RESPONSE_EVENT, ev)
    assert (f.path, f.breaks) == (path, True) and f.delivers == f"its default parse (as clients call it) {delivers}", f


def test_the_stream_verdict_tells_drift_from_a_client_break_with_a_cause():
    """Drift FAILs strict-schema (accepted under api.accepted_gaps: a SKIP part, the case PASSes);
    a client break FAILs schema, and the accepted drift gap does not accept it."""
    sdk = SdkFinal(" a b", "incomplete", None)
    ex = responses_stream("response.incomplete")
    events = [(t, json.loads(d)) for t, d in ex.reply.events]
    del events[-1][1]["response"]["parallel_tool_calls"]  # a required bool: drift
    drift = Exchange("responses", True, {}, StreamReply(200, [(t, json.dumps(e)) for t, e in events], elapsed_s=0.1))
    v = responses_stream_verdict(drift, sdk, {})
    parts = {p.gate.rsplit("/", 1)[1]: p for p in v.parts}
    assert v.status is Status.FAIL and parts["strict-schema"].status is Status.FAIL and parts["schema"].passed
    assert "1 of 6 events fails the strict schema: response.incomplete fails openai " in v.message
    assert "'s ResponseIncompleteEvent at response.parallel_tool_calls: Field required -- strict-schema drift" in v.message
    assert v.cause.startswith("the server omits response.parallel_tool_calls in response.incomplete, which openai ")
    gap = {"responses/stream/strict-schema": "a reason"}
    v = responses_stream_verdict(drift, sdk, gap)
    assert v.status is Status.PASS and v.cause is None
    assert [p.gate for p in v.skipped_parts] == ["api/responses/stream/strict-schema"]
    events[-1][1]["response"] = "resp_1"
    broken = Exchange("responses", True, {}, StreamReply(200, [(t, json.dumps(e)) for t, e in events], elapsed_s=0.1))
    v = responses_stream_verdict(broken, sdk, gap)
    parts = {p.gate.rsplit("/", 1)[1]: p for p in v.parts}
    assert v.status is Status.FAIL and parts["schema"].status is Status.FAIL and parts["strict-schema"].passed
    assert "1 of 6 events breaks clients: response.incomplete fails" in v.message
    assert v.cause.startswith("the server sends response as 'resp_1' in response.incomplete where openai ")
    assert "types an object (ResponseIncompleteEvent): the SDK's default parse, as clients call it, leaves clients " \
           "nothing to read into there (breaks clients, not only the strict schema)" in v.cause


def test_messages_events_are_read_in_their_member_too():
    """The anthropic SDK's RawMessageStreamEvent: a text delta without its text is drift (the
    client reads None); a message_delta without usage breaks clients (the SDK types an object);
    an event type no member has is drift, named."""
    from kvgate.gates.api import schema_parts, sdk_finding
    from kvgate.http.sdk import MESSAGE_EVENT
    f = sdk_finding(MESSAGE_EVENT, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}})
    assert (f.member, f.path, f.breaks) == ("RawContentBlockDeltaEvent", "delta.text", False), f
    f = sdk_finding(MESSAGE_EVENT, {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}})
    assert (f.member, f.path, f.breaks) == ("RawMessageDeltaEvent", "usage", True), f
    f = sdk_finding(MESSAGE_EVENT, {"type": "message_bogus"})
    assert (f.member, f.breaks) == (None, False) and f.error.startswith("no member of anthropic ")
    assert f.error.endswith("'s RawMessageStreamEvent has type 'message_bogus'")
    ok = [{"type": "message_stop"}]
    assert [p.status for p in schema_parts("api/messages/stream", MESSAGE_EVENT, ok, "s", {})] == [Status.PASS] * 2
