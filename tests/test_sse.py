"""The one SSE event classifier (kvgate.http.sse): every kind, completions and chat shapes, and that
both folds over it (kvgate.http.stream.summarize for probes, RequestRecord for load) agree on tokens."""

from __future__ import annotations

import json

import pytest

from kvgate.http.client import StreamReply
from kvgate.load import RequestRecord
from kvgate.http.sse import CHUNK, DONE, ERROR, MALFORMED, classify, error_text
from kvgate.http.stream import summarize


def cmpl(text: str | None = "x", finish: str | None = None, **choice: object) -> str:
    ch: dict[str, object] = {"index": 0, "finish_reason": finish, **choice}
    if text is not None:
        ch["text"] = text
    return json.dumps({"id": "c", "object": "text_completion", "choices": [ch]})


def chat(delta: dict[str, object], finish: str | None = None, **choice: object) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}]})


USAGE = json.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                         "total_tokens": 5}})


# ----------------------------------------------------------------------------- kinds


@pytest.mark.parametrize("data", ["[DONE]", " [DONE] ", "[DONE]\n"])
def test_done_sentinel(data: str) -> None:
    ev = classify(data)
    assert ev.kind == DONE and ev.obj is None and not ev.choices


@pytest.mark.parametrize("data", ["not json", "{\"choices\": [", "", "[1, 2]", "42", "null", '"text"', "[DONE"])
def test_garbage_and_non_objects_are_malformed(data: str) -> None:
    ev = classify(data)
    assert ev.kind == MALFORMED and ev.data == data and not ev.is_content and ev.usage is None


def test_error_event_carries_the_error_and_its_message() -> None:
    ev = classify(json.dumps({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}))
    assert ev.kind == ERROR and ev.error["code"] == 500 and ev.error_text == "engine died"
    assert classify('{"error": "plain text"}').error_text == "plain text"
    assert classify('{"error": null}').kind == ERROR  # the key decides, whatever its value
    assert len(error_text({"error": {"message": "m" * 500}})) == 200


def test_completions_content_chunk() -> None:
    ev = classify(cmpl("Hello"))
    assert ev.kind == CHUNK and ev.is_content and not ev.is_role and not ev.is_finish and not ev.is_usage
    (c,) = ev.choices
    assert c.text == "Hello" and c.piece == "Hello" and c.step and c.role is None and c.finish_reason is None


def test_completions_empty_text_is_a_decode_step() -> None:
    """A byte-level tokenizer emits tokens that complete no character yet: vLLM streams text ""."""
    ev = classify(cmpl(""))
    assert ev.is_content and ev.choices[0].text == "" and ev.choices[0].piece == ""


def test_completions_choice_without_text_is_no_step() -> None:
    ev = classify(cmpl(None, finish="stop"))
    assert not ev.is_content and ev.is_finish and ev.finish_reason == "stop"


def test_finish_chunk_with_its_last_text_is_content_and_finish() -> None:
    ev = classify(cmpl("end", finish="length"))
    assert ev.is_content and ev.is_finish and ev.finish_reason == "length"


def test_chat_role_announcement_is_not_a_token() -> None:
    ev = classify(chat({"role": "assistant", "content": ""}))
    assert ev.kind == CHUNK and ev.is_role and not ev.is_content
    assert ev.choices[0].role == "assistant" and ev.choices[0].text == ""
    assert classify(chat({"role": "assistant"})).is_role


def test_chat_role_with_text_is_content() -> None:
    ev = classify(chat({"role": "assistant", "content": "Hi"}))
    assert ev.is_content and not ev.is_role and ev.choices[0].piece == "Hi"


@pytest.mark.parametrize("delta, step, piece", [
    ({"content": "a"}, True, "a"),
    ({"content": ""}, True, ""),          # empty delta without a role: a decode step
    ({}, False, ""),                       # the final chunk's empty delta
    ({"content": None}, False, ""),
    ({"reasoning_content": "think"}, True, "think"),
    ({"content": None, "reasoning": "r"}, True, "r"),
    ({"content": "a", "reasoning_content": "r"}, True, "a"),
    ({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}, True, ""),
])
def test_chat_delta_shapes(delta: dict[str, object], step: bool, piece: str) -> None:
    ev = classify(chat(delta))
    assert ev.is_content is step and ev.choices[0].step is step and ev.choices[0].piece == piece


def test_chat_finish_chunk() -> None:
    ev = classify(chat({}, finish="stop"))
    assert ev.is_finish and not ev.is_content and ev.finish_reason == "stop"


def test_usage_chunk() -> None:
    ev = classify(USAGE)
    assert ev.kind == CHUNK and ev.is_usage and ev.usage["completion_tokens"] == 2
    assert not ev.choices and not ev.is_content and not ev.is_finish and not ev.is_role
    # continuous usage stats: usage rides on a content chunk
    both = json.loads(cmpl("x"))
    both["usage"] = {"completion_tokens": 1}
    ev = classify(json.dumps(both))
    assert ev.is_usage and ev.is_content
    assert classify(json.dumps({"choices": [], "usage": None})).usage is None


def test_logprob_tokens_per_choice() -> None:
    c = classify(cmpl("ab", logprobs={"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0]})).choices[0]
    assert c.logprob_tokens == 2
    lp = {"content": [{"token": "a"}, {"token": "b"}, {"token": "c"}]}
    c = classify(chat({"content": "ab"}, logprobs=lp)).choices[0]
    assert c.logprob_tokens == 3
    assert classify(cmpl("x")).choices[0].logprob_tokens is None
    assert classify(cmpl("x", logprobs=None)).choices[0].logprob_tokens is None


def test_choices_that_are_not_objects_are_set_aside() -> None:
    ev = classify(json.dumps({"choices": [{"index": 0, "text": "a"}, "junk", 3]}))
    assert ev.kind == CHUNK and len(ev.choices) == 1 and ev.bad_choices == ("junk", 3) and ev.is_content
    ev = classify(json.dumps({"choices": 7}))  # not a list: one bad choice, no exception
    assert ev.bad_choices == (7,) and not ev.choices


def test_several_choices_n_gt_1() -> None:
    data = json.dumps({"choices": [{"index": 0, "text": "a", "finish_reason": None},
                                   {"index": 1, "text": "b", "finish_reason": "length"}]})
    ev = classify(data)
    assert [c.index for c in ev.choices] == [0, 1] and ev.is_content and ev.finish_reason == "length"


# ----------------------------------------------------------------------------- both folds agree


def _record(events: list[str]) -> RequestRecord:
    body = "".join(f"data: {e}\n\n" for e in events).encode()
    r = RequestRecord(index=0, scheduled_s=0.0, sent_s=0.0, status=200, content_type="text/event-stream", end_s=1.0)
    r.piece_s, r.pieces = [0.5], [body]
    return r.finalize()


def test_probe_and_load_folds_agree_on_a_chat_stream() -> None:
    events = [chat({"role": "assistant", "content": ""}), chat({"content": "He"}), chat({"content": ""}),
              chat({"content": "llo"}), chat({}, finish="length"), USAGE, "[DONE]"]
    s = summarize(StreamReply(200, [(0.1 * i, e) for i, e in enumerate(events)]))
    r = _record(events)
    assert s.text == r.text == "Hello"
    assert s.finish_reasons == ["length"] and r.finish_reason == "length"
    assert s.usage == r.usage and s.done and r.done and r.error is None
    assert len(r.content_s) == 3 and r.tokens == 2 and r.tokens_from == "usage"  # role chunk is no token


def test_load_counts_steps_when_no_usage_came() -> None:
    r = _record([cmpl("a"), cmpl(""), cmpl("b", finish="length"), "[DONE]"])
    assert r.tokens == 3 and r.tokens_from == "chunks" and r.text == "ab"


def test_folds_report_error_and_garbage() -> None:
    events = [cmpl("a"), '{"error": {"message": "boom"}}', "garbage", "[DONE]"]
    s = summarize(StreamReply(200, [(0.0, e) for e in events]))
    assert s.errors == [{"message": "boom"}] and s.undecodable == ["garbage"] and s.done
    r = _record(events)
    assert r.error == "stream error: boom" and r.undecodable == 1


# ----------------------------------------------------------------------------- one framer, one clipping rule


def test_every_reader_uses_the_one_framer_and_they_agree():
    from kvgate.http import client, sse
    from kvgate.load import record, split_sse

    assert client.iter_sse_data is sse.iter_data and record.split_sse is split_sse is sse.split_sse
    body = (": keepalive\r\n\r\ndata: a\r\ndata:b\r\n\r\nevent: x\ndata:  two spaces\n\n"
            "data: {\"x\": 1}\n\nevent: only\n\ndata: [DONE]\n\n")
    want = ["a\nb", " two spaces", '{"x": 1}', "[DONE]"]  # one space after the colon dropped, no more
    assert list(sse.iter_data(body.splitlines())) == want
    raw = body.encode()
    assert split_sse([1.0, 2.0, 3.0], [raw[:7], raw[7:40], raw[40:]])[1] == want
    assert split_sse([1.0], [raw.replace(b"\r", b"")])[1] == want  # the fast path (no CR) too
    assert sse.event_data([": ping"]) is None and sse.event_data(["data: x\r"]) == "x"


def test_stream_reply_chunks_are_what_classify_decodes():
    from kvgate.http.client import StreamReply

    reply = StreamReply(200, [(0.1, '{"choices": []}'), (0.2, "not json"), (0.3, "[1, 2]"),
                              (0.4, '{"error": {"message": "boom"}}'), (0.5, " [DONE] ")])
    assert reply.done
    assert reply.chunks() == [(0.1, {"choices": []}), (0.2, "not json"), (0.3, "[1, 2]"),
                              (0.4, {"error": {"message": "boom"}})]


def test_error_text_is_cut_at_a_word_boundary_like_every_quoted_text():
    from kvgate.http.sse import ERROR_TEXT_CAP, error_text
    from kvgate.http.text import clip

    message = "This model's maximum context length is 2048 tokens. However, you requested " + \
              " ".join(f"token{i}" for i in range(60))
    assert len(message) > ERROR_TEXT_CAP
    text = error_text({"error": {"message": message}})
    assert text == clip(message, ERROR_TEXT_CAP) and len(text) <= ERROR_TEXT_CAP and text.endswith("…")
    head = text[:-1]
    assert message.startswith(head) and message[len(head)] == " "  # no word cut in half
    assert error_text({"error": "short\nand\tplain"}) == "short and plain"  # one line


# ------------------------------------------------------------------------------ the grammar (keepalive case)

from kvgate.http.sse import grammar, largest_gap, second_parser  # noqa: E402


def test_grammar_reads_frames_with_their_times_and_counts_keepalives():
    pieces = [(0.1, b": ping\n\n"), (0.2, b": ping\r\n\r\n"), (0.9, b"data: " + chat({"content": "a"}).encode() + b"\n"),
              (0.95, b"\ndata: [DONE]\n\n")]
    g = grammar(pieces)
    assert [(f.t, f.data is not None, f.comments) for f in g.frames] == [(0.1, False, 1), (0.2, False, 1),
                                                                          (0.95, True, 0), (0.95, True, 0)]
    assert g.problems == [] and g.keepalives == 2 and g.data_times == [0.95, 0.95] and g.tail == ""
    assert largest_gap(g.data_times) == (0.95, 0)  # the wait for the first data event
    assert largest_gap([t for t, _ in pieces]) == (pytest.approx(0.7), 2)
    assert largest_gap([]) == (0.0, -1)


@pytest.mark.parametrize("frame, kind", [
    (b"data: : PROCESSING\n\n", "data-colon"),
    (b"data:: PROCESSING\n\n", "data-colon"),
    (b"id: 7\n: ping\n\n", "no-data-dispatch"),
    (b"event: ping\n\n", "no-data-dispatch"),
    (b"data: \n\n", "empty-event"),
    (b"PROCESSING\n\n", "not-a-field"),
])
def test_each_grammar_break_is_named_with_its_raw_frame(frame, kind):
    g = grammar([(0.0, b"data: " + chat({"content": "a"}).encode() + b"\n\n"), (0.5, frame), (0.6, b"data: [DONE]\n\n")])
    assert [p.kind for p in g.problems] == [kind], g.problems
    assert g.problems[0].frame.t == 0.5 and g.problems[0].frame.raw == frame.decode()
    assert "\\n" in g.problems[0].frame.shown and "\n" not in g.problems[0].frame.shown


def test_a_bare_colon_and_event_fields_with_data_keep_to_the_grammar():
    g = grammar([(0.0, b":\n\nevent: message\nid: 1\ndata: {}\n\n")])
    assert g.problems == [] and g.keepalives == 1


def test_httpx_sse_dispatches_what_kvgate_skips():
    body = b": ping\n\nid: 3\n: ping\n\ndata: {}\n\ndata: [DONE]\n\n"
    assert second_parser(body) == ["", "{}", "[DONE]"]  # the id: frame is an empty event to it
