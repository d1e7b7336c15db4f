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
