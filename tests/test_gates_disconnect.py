"""The disconnect gate's INVALID reasons are honest: when the decode rate (and so how long the cut
request would have run on) cannot be estimated -- a starved client that reads its stream in
bunches, too few events, no time between them -- the verdict says so; it never prints a negative
duration or a cause that did not happen. (FAIL/PASS against the fake: tests/test_gates_vs_fake.py.)"""

from __future__ import annotations

import dataclasses
import itertools
import re

import httpx
import pytest

from kvgate.http.client import Endpoint, KvClient, Reply, StreamReply
from kvgate.gates.disconnect import disconnect_verdict
from kvgate.http.metrics import GaugePoll
from kvgate.http.probes import DecodeRate, DisconnectObservation, Exchange, decode_rate, estimate_rate
from kvgate.verdict import Status

CANARY_OK = Reply(200, '{"choices": [{"text": " a b c d", "finish_reason": "length"}], '
                       '"usage": {"prompt_tokens": 4, "completion_tokens": 4}}', 0.05)


def sse(n: int) -> bytes:
    chunks = [f'data: {{"choices": [{{"text": " t{i}", "index": 0}}]}}\n\n' for i in range(n)]
    return ("".join(chunks) + "data: [DONE]\n\n").encode()


def starved_client(event_times: list[float]) -> KvClient:
    """A client whose clock says when *it* read each event: a starved client reads them in one go."""
    ticks = itertools.chain([0.0], event_times, itertools.repeat(event_times[-1] + 0.001))
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=sse(len(event_times)),
                                                               headers={"content-type": "text/event-stream"}))
    return KvClient(Endpoint("http://kvgate.test"), transport=transport, clock=lambda: next(ticks))


def observation(rate: DecodeRate | None, natural_s: float | None, case: str = "mid-request",
                cut: bool = True) -> DisconnectObservation:
    hung = Exchange("completions", False, {"max_tokens": 64}, Reply(0, "hung up", 0.3))
    poll = GaugePoll("running", 0.0, True, [(0.05, 0.0)], 0.05)
    canary = Exchange("completions", False, {"max_tokens": 4}, CANARY_OK)
    return DisconnectObservation(case, 0.0, hung, cut, 0.3, natural_s, poll, canary, rate)


def no_negative_numbers(message: str) -> None:
    assert not re.search(r"(?<![\w.])-\d", message), message


def test_starved_client_reading_its_stream_in_one_burst_gets_no_rate():
    # the server decoded 32 tokens over ~0.3 s, but the client was off-CPU and read them all at 0.80 s
    times = [0.8 + i * 1e-5 for i in range(32)]
    with starved_client(times) as client:
        rate = decode_rate(client, "m")
    assert rate.tps is None and "arrived in bursts" in rate.why and "client read them in bunches" in rate.why


def test_starved_client_disconnect_is_invalid_and_says_why():
    rate = estimate_rate([0.8 + i * 1e-5 for i in range(32)])
    v = disconnect_verdict(observation(rate, None), deadline_s=2.0)
    assert v.status is Status.INVALID
    assert v.message.startswith("the decode rate could not be estimated (32 of 32 token events arrived in bursts")
    assert "cannot be told from the request finishing on its own (mid-request)" in v.message
    assert "would have finished" not in v.message  # no cause that did not happen
    no_negative_numbers(v.message)
    assert v.evidence["decode_rate"]["tps"] is None and v.evidence["decode_rate"]["bunched"] == 31


def test_rate_that_contradicts_the_observation_prints_no_negative_duration():
    # the old message: "the request would have finished -1.55 s after the hang-up anyway"
    v = disconnect_verdict(observation(DecodeRate(5000.0, None, 32, 0.0062, 0), -1.55), deadline_s=2.0)
    assert v.status is Status.INVALID
    assert "should have finished 1.55 s before the hang-up, yet it was still running" in v.message
    assert "5,000.0 tokens/s" in v.message
    no_negative_numbers(v.message)


def test_request_about_to_finish_anyway_is_invalid_with_its_numbers():
    v = disconnect_verdict(observation(DecodeRate(100.0, None, 32, 0.31, 0), 0.12), deadline_s=2.0)
    assert v.status is Status.INVALID and "would have finished 0.12 s after the hang-up anyway" in v.message
    assert "at 100.0 tokens/s" in v.message


def test_trustworthy_rate_lets_the_release_be_judged():
    v = disconnect_verdict(observation(DecodeRate(50.0, None, 32, 0.62, 0), 1.2), deadline_s=2.0)
    assert v.status is Status.PASS and v.unit == "s" and v.limit == 0.6


@pytest.mark.parametrize("times, fragment", [
    ([], "only 0 token events arrived"),
    ([0.1, 0.2], "only 2 token events arrived"),
    ([0.5, 0.5, 0.5, 0.5], "all 4 token events carry the same arrival time"),
    ([0.1, 0.101, 0.102, 0.103, 0.104], "within 4.00 ms, too close together to time"),
])
def test_rate_not_estimable_reasons(times, fragment):
    r = estimate_rate(times)
    assert r.tps is None and fragment in r.why


def test_rate_from_evenly_spaced_events():
    r = estimate_rate([0.1 + 0.02 * i for i in range(11)])
    assert r.tps == pytest.approx(50.0) and r.why is None


def buffered_probe(times: list[float]) -> DecodeRate:
    """The decode-rate estimate of a probe stream whose token chunks arrived at ``times`` (s)."""
    events = [(t, f'{{"choices": [{{"text": " t{i}", "index": 0}}]}}') for i, t in enumerate(times)]
    reply = StreamReply(200, events + [(times[-1] + 1e-5, "[DONE]")], elapsed_s=times[-1] + 1e-5)
    return dataclasses.replace(estimate_rate(times), reply=reply)


def test_decode_rate_keeps_its_probe_stream():
    with starved_client([0.1 + 0.02 * i for i in range(8)]) as client:
        rate = decode_rate(client, "m")
    assert rate.reply is not None and rate.reply.status == 200 and len(rate.reply.events) == 9


def test_buffered_rate_probe_makes_the_disconnect_invalid_naming_the_buffering():
    # a proxy held the 32-token probe stream until it ended (1.3 s): every chunk in one read
    rate = buffered_probe([1.3 + i * 1e-5 for i in range(32)])
    assert "or a proxy that buffers the stream" in rate.why
    for case in ("mid-stream", "before-first-token", "mid-request"):
        v = disconnect_verdict(observation(rate, None, case=case), deadline_s=2.0)
        assert v.status is Status.INVALID
        assert v.message.startswith("the decode-rate probe's stream was buffered: all 32 content chunks arrived "
                                    "within 1 ms, 1.30 s after the request (a proxy in front holds the SSE bytes; "
                                    "set proxy_buffering off / X-Accel-Buffering: no)")
        assert f"cannot be told from the request finishing on its own ({case})" in v.message
        assert v.evidence["decode_rate_delivery"]["bursts"] == 1


def test_a_starved_read_shorter_than_the_hold_limit_keeps_its_own_reason():
    # the same burst 0.8 s after the request: a starved client looks like this too, so not named buffering
    rate = buffered_probe([0.8 + i * 1e-5 for i in range(32)])
    v = disconnect_verdict(observation(rate, None), deadline_s=2.0)
    assert v.status is Status.INVALID and v.message.startswith("the decode rate could not be estimated (") and "of 32 token events arrived in bursts" in v.message
