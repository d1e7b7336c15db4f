"""gates/streaming.py: the single-request TTFT uses the same first-token rule as the load client;
a stream whose content a proxy held back arrives in bursts and is named buffered."""

import re

import pytest

from kvgate.http.client import Reply, StreamReply
from kvgate.http.probes import Exchange
from kvgate.gates.streaming import buffering_verdict, delivery, first_token_s, stream_gaps
from kvgate.verdict import Status

ROLE = '{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
TOKEN = '{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
FINISH = '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'


def reply(events):
    return StreamReply(status=200, events=events, elapsed_s=events[-1][0] if events else 0.0)


def test_chat_role_announcement_is_not_the_first_token():
    r = reply([(0.010, ROLE), (0.250, TOKEN), (0.260, FINISH), (0.261, "[DONE]")])
    assert first_token_s(r) == 0.250


def test_completions_first_text_chunk_is_the_first_token():
    r = reply([(0.120, '{"choices":[{"index":0,"text":"a","finish_reason":null}]}'), (0.2, "[DONE]")])
    assert first_token_s(r) == 0.120


def test_no_token_at_all_gives_none():
    assert first_token_s(reply([(0.01, ROLE), (0.02, FINISH), (0.03, "[DONE]")])) is None
    assert first_token_s(reply([(0.01, "not json"), (0.02, "[DONE]")])) is None


def test_gaps_count_the_silence_before_the_first_event():
    assert stream_gaps(reply([(0.5, ROLE), (0.75, TOKEN)])) == [0.5, 0.25]


# ---- buffering ---------------------------------------------------------------------------------------


def timed(times, role_at=None):
    """A chat stream whose token chunks arrive at ``times`` (s), then the finish chunk and [DONE]."""
    events = ([(role_at, ROLE)] if role_at is not None else []) + [(t, TOKEN) for t in times]
    end = times[-1] if times else 0.0
    return reply(events + [(end + 1e-5, FINISH), (end + 2e-5, "[DONE]")])


def verdict(times, plain_s=None, **kw):
    ex = Exchange("chat", True, {"max_tokens": len(times)}, timed(times, **kw))
    plain = Exchange("chat", False, {}, Reply(200, "{}", plain_s)) if plain_s is not None else None
    return buffering_verdict(ex, plain)


def burst(n, at, step=2e-5):
    return [at + i * step for i in range(n)]


def test_all_chunks_in_one_burst_at_the_end_fail_naming_the_buffering():
    # 128 tokens generated over 2.4 s (~19 ms apart) but held by a proxy until the response ended
    v = verdict(burst(128, 2.41), plain_s=2.4, role_at=2.41)
    assert v.status is Status.FAIL
    assert v.message == ("all 128 content chunks arrived within 3 ms, 2.41 s after the request (generation took "
                         "2.40 s, timed non-streamed) -> FAIL (the stream is buffered: a proxy in front holds the SSE "
                         "bytes; set proxy_buffering off / X-Accel-Buffering: no)")
    assert v.measured == 2.41 and v.limit == 1.0 and v.unit == "s"
    assert v.evidence["delivery"]["bursts"] == 1 and v.evidence["delivery"]["content_chunks"] == 128


def test_a_buffer_flushed_each_time_it_fills_fails_too():
    # a 16 KB buffer: ~70 chunks per flush, the first flush 1.4 s after the request
    v = verdict(burst(70, 1.40) + burst(58, 2.56))
    assert v.status is Status.FAIL
    assert v.message.startswith("128 content chunks arrived in 2 bursts (each within 1 ms); 70 of them after 1.40 s "
                                "of silence (the stream ended 2.56 s after the request) -> FAIL (the stream is buffered")


def test_a_stream_spread_over_its_generation_passes():
    v = verdict([0.05 + 0.019 * i for i in range(128)], plain_s=2.4)
    assert v.status is Status.PASS
    assert v.message == ("128 content chunks arrived in 128 reads over 2.41 s (first 0.05 s after the request; longest "
                         "wait 0.05 s): streamed as generated -> PASS")


def test_the_tiny_cpu_vllm_ms_apart_passes():
    # short ITL, short stream: every chunk its own read
    assert verdict([0.02 + 0.003 * i for i in range(64)]).status is Status.PASS


def test_a_fast_server_read_in_one_go_is_not_called_buffered():
    # the healthy fake (no delays), or a client that read a whole short stream late: held < 1 s
    v = verdict(burst(64, 0.3))
    assert v.status is Status.PASS
    assert "all 64 content chunks arrived within 1 ms, 0.30 s after the request: held back less than 1 s" in v.message
    assert "cannot be told from a client that read late" in v.message


def test_a_starved_client_reading_in_a_few_bunches_is_not_called_buffered():
    # a long TTFT (queued 1.5 s), then read in bunches of 4: 4 per read on average is below 8
    times = [1.5 + 0.04 * (i // 4) + 1e-5 * (i % 4) for i in range(64)]
    assert delivery(timed(times)).bursts == 16
    assert verdict(times).status is Status.PASS


@pytest.mark.parametrize("n", [0, 15])
def test_too_few_chunks_are_not_judged(n):
    if n == 0:
        v = buffering_verdict(Exchange("chat", True, {}, reply([(0.1, ROLE), (0.2, FINISH), (0.3, "[DONE]")])))
        assert v.status is Status.FAIL and "no content chunk" in v.message
    else:
        v = verdict(burst(n, 3.0))
        assert v.status is Status.SKIP and "only 15 content chunks; buffering is judged from 16" in v.message


def test_a_stream_that_did_not_answer_fails():
    v = buffering_verdict(Exchange("chat", True, {}, StreamReply(status=502, text="<html>")))
    assert v.status is Status.FAIL and "answered 502" in v.message


# ---- the openai SDK's parse: never a PASS on nothing -----------------------------------------------


def _plain(text):
    return Exchange("completions", False, {}, Reply(200, '{"choices":[{"text":%s}]}' % __import__("json").dumps(text),
                                                    0.1))


def test_sdk_verdict_needs_chunks_a_finish_reason_and_the_same_text():
    from kvgate.gates.streaming import sdk_verdict
    from kvgate.http.sdk import SdkStream

    ok = sdk_verdict("completions", SdkStream("hi there", 3, ["length"], None, 200, "text/event-stream", "data: {"),
                     _plain("hi there"))
    assert ok.status is Status.PASS and ok.message == ("openai SDK parsed 3 chunks, finish_reason 'length', the "
                                                        "non-streamed text (8 chars) -> PASS")
    page = "<html><head><title>Sign in \x1b[31m</title></head><body>" + "x" * 900 + "</body></html>"
    none = sdk_verdict("completions", SdkStream("", 0, [], None, 200, "text/html", page[:512]), _plain(""))
    assert none.status is Status.FAIL and none.measured == 0
    assert none.message == ('openai SDK parsed no chunk from the stream: it answered 200 text/html, HTML: "Sign in '
                            '\\x1b[31m" -> FAIL (a client sees an empty answer and no error)')  # escaped
    assert len(none.evidence["body_head"]) <= 300
    cut = sdk_verdict("completions", SdkStream("hi", 2, [], None, 200, "text/event-stream", "data:"), _plain("hi"))
    assert cut.status is Status.FAIL and "parsed 2 chunks but no finish_reason" in cut.message
    gone = sdk_verdict("chat", SdkStream("", 0, [], "not sent: the engine is hung"), _plain("hi"))
    assert gone.status is Status.INVALID and "got no answer (not sent: the engine is hung) -> INVALID" in gone.message


# ---- a buffer in front of a fast server: flushes less than a second apart, one size each --------------


def through_buffer(n, itl_s, size, text="x" * 200):
    """A completions stream of ``n`` tokens made ``itl_s`` apart, as a proxy holding ``size``-byte
    pieces delivers it: each event arrives with the flush that completes it (2e-5 s apart in a read)."""
    datas = ['{"choices":[{"index":0,"text":"%s","finish_reason":null}]}' % text] * n
    datas += ['{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', "[DONE]"]
    made = [0.05 + itl_s * i for i in range(len(datas))]
    events, sent, flush_at, k = [], 0, 0.0, 0
    ends = []
    for t, d in zip(made, datas):
        sent += len(d) + 8
        ends.append((sent, t))
    total = sent
    for i, (end, t) in enumerate(ends):
        piece = -(-end // size)  # the flush that completes this event
        done = min(piece * size, total)
        flush_at = next(tt for e, tt in ends if e >= done) if done < total else made[-1]
        k = k + 1 if events and abs(events[-1][0] - flush_at) < 1e-3 else 0
        events.append((flush_at + 2e-5 * k, datas[i]))
    return StreamReply(status=200, events=events, elapsed_s=events[-1][0])


def test_a_16_kb_buffer_in_front_of_a_fast_server_fails_naming_its_pieces():
    # 240 tokens 5 ms apart (1.2 s) of ~250 bytes each through 16 KB: ~64 events a flush, 0.33 s apart
    r = through_buffer(240, 0.005, 16384)
    d = delivery(r)
    assert d.held_s < 1.0 and d.bunched and d.fixed_pieces and len(d.pieces) == 3
    v = buffering_verdict(Exchange("completions", True, {"max_tokens": 240}, r))
    assert v.status is Status.FAIL, v.message
    assert re.match(r"24[01] content chunks arrived in 4 bursts \(each within \d+ ms\), the 3 before the last "
                    r"16\.\d-16\.\d KB each \(a buffer of ~16 KB flushed each time it filled\), 0\.\d\d s apart at most "
                    r"\(the stream ended 1\.2\d s after the request\) -> FAIL \(the stream is buffered", v.message), v.message
    # the same stream read as generated passes; 64 tokens fit one buffer whole and cannot show it
    healthy = StreamReply(status=200, events=[(0.05 + 0.005 * i, d_) for i, (_, d_) in enumerate(r.events)],
                          elapsed_s=1.3)
    assert buffering_verdict(Exchange("completions", True, {}, healthy)).status is Status.PASS
    one = buffering_verdict(Exchange("completions", True, {}, through_buffer(64, 0.005, 16384)))
    assert one.status is Status.PASS and "held back less than 1 s" in one.message


def test_reads_of_random_sizes_are_not_a_buffer():
    # a client starved now and then: bunches of 9, 14, 11, 20 ... events; never one size
    sizes = [9, 14, 11, 20, 16, 10, 25, 12]
    times, t = [], 0.1
    for s_ in sizes:
        times += [t + 1e-5 * j for j in range(s_)]
        t += 0.3
    d = delivery(timed(times))
    assert d.bunched and not d.fixed_pieces and verdict(times).status is Status.PASS


def test_the_probe_is_sized_from_the_measured_rate():
    from kvgate.gates.streaming import buffer_probe_tokens

    assert buffer_probe_tokens(64, 0.4, 512) == 240      # 160 tokens/s x 1.5 s
    assert buffer_probe_tokens(64, 0.4, 512, 250.0) == 263  # 64 KB of 250-byte events
    assert buffer_probe_tokens(64, 0.1, 512) == 512      # capped by the server's cap
    assert buffer_probe_tokens(64, 2.0, 512) is None     # slow: the 64-token stream is the probe
    assert buffer_probe_tokens(64, None, 512) is None    # the request failed: nothing timed
    assert buffer_probe_tokens(64, 0.4, 64) is None      # no room to ask for more


def test_two_empty_texts_are_not_the_same_text():
    from kvgate.gates.streaming import sdk_verdict, stream_text_verdict
    from kvgate.http.sdk import SdkStream

    finish_only = reply([(0.01, FINISH), (0.02, "[DONE]")])
    v = stream_text_verdict(Exchange("chat", True, {}, finish_only),
                            Exchange("chat", False, {}, Reply(200, '{"choices":[{"message":{"content":""}}]}', 0.1)))
    assert v.status is Status.FAIL and "both empty (2 events): nothing was generated to compare -> FAIL" in v.message
    sdk = sdk_verdict("completions", SdkStream("", 1, ["length"], None, 200, "text/event-stream", "data:"), _plain(""))
    assert sdk.status is Status.FAIL and "nothing was generated to compare -> FAIL" in sdk.message


# ------------------------------------------------------------------------------ keepalive

from kvgate.gates.streaming import keepalive_verdict  # noqa: E402
from kvgate.http.client import RawStream  # noqa: E402
from kvgate.http.stream import read_keepalive  # noqa: E402


def chunk(text):
    return ('data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            f'"delta":{{"content":"{text}"}},"finish_reason":null}}]}}\n\n').encode()


def long_prefill(keepalive=b": ping\n\n", ttft_s=0.5, every_s=0.05, tokens=4):
    """A stream that waits ttft_s for its first token, sending ``keepalive`` every every_s meanwhile."""
    ticks = [round(every_s * (i + 1), 4) for i in range(int(ttft_s / every_s) + 1)]
    pieces = [(t, keepalive) for t in ticks if t < ttft_s - 1e-9] if keepalive else []
    pieces += [(ttft_s + 0.01 * i, chunk(f"t{i}")) for i in range(tokens)]
    return RawStream(200, pieces + [(ttft_s + 0.01 * tokens, b"data: [DONE]\n\n")], "text/event-stream")


def test_well_formed_keepalives_pass_with_the_data_gap_judged_beside_the_byte_gap():
    v = keepalive_verdict(read_keepalive("chat", long_prefill(ttft_s=0.5), 1000), 30)
    assert v.status is Status.PASS and v.cause is None, v.message
    assert "14 SSE frames (9 comment keepalives) keep to the grammar -> PASS" in v.message
    assert "kvgate, the openai SDK and httpx-sse read the same 4 events (8 chars) -> PASS" in v.message
    assert ("largest gap between data events 0.500 s (before the first data event), largest gap between bytes 0.050 s "
            "(9 comment keepalives) on the 1,000-token prompt; an event-counting idle timeout of 30 s is not reached") \
        in v.message
    assert v.measured == 0.5 and v.limit == 30  # the gap part heads a PASS


def test_keepalives_that_hide_a_data_gap_past_the_idle_timeout_fail_naming_both_gaps():
    v = keepalive_verdict(read_keepalive("chat", long_prefill(ttft_s=45, every_s=10), 8000), 30)
    assert v.status is Status.FAIL and v.measured == 45 and v.limit == 30, v.message
    assert v.message == ("largest gap between data events 45.000 s (before the first data event), largest gap between "
                         "bytes 10.000 s (4 comment keepalives): the keepalives kept bytes flowing, but an idle timer "
                         "that counts events (stream_idle_timeout_s 30 s) cuts this stream -> FAIL")
    assert v.cause == ("comment keepalives hid a 45.000 s wait for data before the first data event (the TTFT of the "
                       "8,000-token prompt): bytes came every 10.000 s at most")
    silent = keepalive_verdict(read_keepalive("chat", long_prefill(keepalive=None, ttft_s=45), 8000), 30)
    assert silent.status is Status.FAIL and "nothing came for 45.000 s: any idle timer (30 s)" in silent.message
    assert silent.cause is None  # no keepalive hid anything: the idle-gap check's territory
    unjudged = keepalive_verdict(read_keepalive("chat", long_prefill(ttft_s=45, every_s=10), 8000), None)
    assert unjudged.status is Status.PASS and "no limits.stream_idle_timeout_s" not in unjudged.message
    assert unjudged.evidence["streaming/keepalive/gap"]["status"] == "SKIP"


def test_a_keepalive_sent_as_data_fails_naming_the_raw_frame_and_every_parser():
    v = keepalive_verdict(read_keepalive("chat", long_prefill(keepalive=b"data: : PROCESSING\n\n"), 1000), 30)
    assert v.status is Status.FAIL, v.message
    assert v.message.startswith("9 of 14 SSE frames break the grammar clients parse: `data: : PROCESSING\\n\\n` at "
                                "0.050 s: a data: line whose value starts with ':'"), v.message
    assert "openai SDK 0 events (0 chars), then JSONDecodeError" in v.message
    assert "kvgate 0 events (0 chars), then event 1 is not a JSON object: ': PROCESSING'" in v.message
    assert v.cause == "a keepalive comment is sent as a data: event (`data: : PROCESSING\\n\\n`)"


def test_an_id_line_then_a_ping_fails_naming_the_empty_dispatch():
    v = keepalive_verdict(read_keepalive("chat", long_prefill(keepalive=b"id: 7\n: ping\n\n"), 1000), 30)
    assert v.status is Status.FAIL, v.message
    assert "`id: 7\\n: ping\\n\\n` at 0.050 s: a frame with id: and no data: (openai-python and httpx-sse dispatch it " \
           "as an empty event: JSONDecodeError)" in v.message, v.message
    assert "kvgate 4 events (8 chars); openai SDK 0 events (0 chars), then JSONDecodeError" in v.message
    assert "httpx-sse 0 events (0 chars), then event 1 is not a JSON object: ''" in v.message
    assert v.cause.startswith("a frame carries a field but no data:")


def test_a_stream_that_was_refused_or_carried_no_data_fails_and_no_prompt_skips():
    refused = keepalive_verdict(read_keepalive("chat", RawStream(400, [], "application/json", '{"error": "too long"}')), 30)
    assert refused.status is Status.FAIL and "answered 400" in refused.message
    empty = keepalive_verdict(read_keepalive("chat", RawStream(200, [(0.1, b": ping\n\n")], "text/event-stream")), 30)
    assert empty.status is Status.FAIL and "carried no data event in 8 bytes" in empty.message
    assert keepalive_verdict(None, 30, skip="no /tokenize").status is Status.SKIP
