"""The load generator: scheduling math with an injected clock (no sleeping), the raw HTTP/1.1
client against a tiny asyncio server on 127.0.0.1 (port 0), and INVALID detection.

Timing margins are generous on purpose: nothing here asserts a latency tighter than tens of
milliseconds, so a loaded CI machine does not make these tests flaky.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest

from kvgate.http.client import Endpoint
from kvgate.load import (
    HttpxTransport,
    LoadResult,
    RawHttpTransport,
    RequestRecord,
    RequestSpec,
    chat_request,
    completion_request,
    frozen_heap,
    make_transport,
    poisson_offsets,
    run_closed_loop,
    run_open_loop,
    split_sse,
)
from kvgate.stats import summarize
from kvgate.verdict import Status

# ----------------------------------------------------------------------------- fakes


class FakeClock:
    """Virtual time: ``sleep`` advances it instead of waiting."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, d: float) -> None:
        self.t += max(0.0, d)
        await asyncio.sleep(0)


class FakeTransport:
    """Records concurrency; each send "takes" ``service_s`` of virtual time via a few yields."""

    name = "fake"

    def __init__(self, clock: FakeClock | None = None, service_s: float = 0.0, yields: int = 3,
                 on_send: Any = None) -> None:
        self.fake_clock = clock
        self.service_s = service_s
        self.yields = yields
        self.on_send = on_send
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[int] = []
        self.closed = False

    def bind(self, clock: Any, t0: float, max_connections: int) -> None:
        self.clock, self.t0 = clock, t0

    def prepare(self, spec: RequestSpec) -> RequestSpec:
        return spec

    async def send(self, spec: RequestSpec, rec: RequestRecord, timeout_s: float) -> None:
        rec.sent_s = self.clock() - self.t0
        self.sent.append(rec.index)
        if self.on_send is not None:
            self.on_send(rec)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(self.yields):
                await asyncio.sleep(0)
            if self.fake_clock is not None and self.service_s:
                self.fake_clock.t += self.service_s
        finally:
            self.in_flight -= 1
        rec.status = 200
        rec.content_type = "text/event-stream"
        t = self.clock() - self.t0
        rec.piece_s = [t, t]
        rec.pieces = [b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n', b"data: [DONE]\n\n"]
        rec.end_s = t

    async def aclose(self) -> None:
        self.closed = True


SPEC = RequestSpec("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 1, "stream": True})


# ----------------------------------------------------------------------------- scheduling


def test_poisson_offsets_are_seeded_reproducible_and_have_the_right_rate():
    a = poisson_offsets(2000, 50.0, 7)
    assert a == poisson_offsets(2000, 50.0, 7)
    assert a == poisson_offsets(2000, 50.0, np.random.default_rng(7))
    assert a != poisson_offsets(2000, 50.0, 8)
    assert a[0] == 0.0 and all(b >= x for x, b in zip(a, a[1:]))
    mean_gap = a[-1] / (len(a) - 1)
    assert mean_gap == pytest.approx(1 / 50.0, rel=0.1)  # 1999 exponential gaps: ~2 % sd
    assert poisson_offsets(3, float("inf")) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        poisson_offsets(3, 0.0)


def test_open_loop_sends_at_the_scheduled_offsets_with_a_virtual_clock():
    clock = FakeClock()
    tr = FakeTransport(clock)
    res = asyncio.run(run_open_loop(None, SPEC, n=20, rate_rps=100.0, rng=3, clock=clock, sleep=clock.sleep,
                                    transport=tr, loop_monitor_s=None, deadline_s=60.0))
    want = poisson_offsets(20, 100.0, 3)
    assert [r.scheduled_s for r in res.records] == pytest.approx(want)
    assert [r.sent_s for r in res.records] == pytest.approx(want)
    assert res.max_lag_s == pytest.approx(0.0, abs=1e-9)
    assert res.client_kept_up(0.001) and res.invalid_verdict("latency") is None
    assert res.mode == "open" and res.n_requested == 20 and not res.deadline_hit and tr.closed
    # finalize ran after the run: content events decoded
    r = res.records[0]
    assert r.tokens == 1 and r.tokens_from == "chunks" and r.done and r.finish_reason == "length"
    assert r.first_token_s == r.end_s


def test_open_loop_explicit_offsets_and_max_in_flight_slips_the_schedule():
    clock = FakeClock()
    tr = FakeTransport(clock, service_s=1.0)  # each request "takes" 1 s
    res = asyncio.run(run_open_loop(None, SPEC, n=4, offsets_s=[0, 0, 0, 0], max_in_flight=1, clock=clock,
                                    sleep=clock.sleep, transport=tr, loop_monitor_s=None))
    assert tr.max_in_flight == 1
    lags = [r.lag_s for r in res.records]
    assert lags == pytest.approx([0.0, 1.0, 2.0, 3.0])  # one at a time: the schedule slips
    assert not res.client_kept_up(0.5)


def test_closed_loop_never_exceeds_concurrency_and_sends_each_request_once():
    tr = FakeTransport(yields=5)
    res = asyncio.run(run_closed_loop(None, SPEC, n=50, concurrency=4, transport=tr, loop_monitor_s=None))
    assert tr.max_in_flight == 4
    assert sorted(tr.sent) == list(range(50)) and len(res.records) == 50
    assert res.concurrency == 4 and res.mode == "closed"


def test_runs_inside_frozen_heap_skip_their_own_full_collection(monkeypatch):
    """A run collects and freezes the heap itself; inside frozen_heap (a series of waves or looks)
    only the outermost block does, once, and unfreezes at its end (nested blocks leave it frozen)."""
    import gc

    from kvgate.load import schedule

    calls: list[str] = []
    monkeypatch.setattr(schedule.gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(schedule.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(schedule.gc, "unfreeze", lambda: calls.append("unfreeze"))

    def run() -> LoadResult:
        return asyncio.run(run_closed_loop(None, SPEC, n=3, concurrency=1, transport=FakeTransport(),
                                           loop_monitor_s=None))

    run()
    assert calls == ["collect", "freeze", "unfreeze"]
    calls.clear()
    with frozen_heap():
        for _ in range(3):
            assert len(run().records) == 3
        with frozen_heap():
            run()
        assert calls == ["collect", "freeze"]
    assert calls == ["collect", "freeze", "unfreeze"]
    assert gc.isenabled()


def test_closed_loop_stops_at_the_deadline_by_itself():
    clock = FakeClock()
    tr = FakeTransport(clock, service_s=1.0)
    res = asyncio.run(run_closed_loop(None, SPEC, n=100, concurrency=1, deadline_s=3.5, clock=clock,
                                      sleep=clock.sleep, transport=tr, loop_monitor_s=None))
    assert len(res.records) == 4 and res.deadline_hit and res.n_requested == 100  # a load that lasts to the deadline
    clock = FakeClock()
    res = asyncio.run(run_closed_loop(None, SPEC, n=100, concurrency=1, deadline_s=3.5, clock=clock,
                                      sleep=clock.sleep, transport=FakeTransport(clock, service_s=1.0),
                                      loop_monitor_s=None, expected_e2e_s=[]))
    # the finish rule on: 3 end at 1, 2, 3 s; a 4th (p99 e2e so far 1 s) could not finish in the 0.5 s left
    assert len(res.records) == 3 and res.deadline_hit and all(r.ok and not r.censored for r in res.records)


class TimedTransport(FakeTransport):
    """A FakeTransport that honours the request's timeout: a send longer than ``timeout_s`` ends
    at the timeout with the transport's "timeout: ..." error (as RawHttpTransport does)."""

    async def send(self, spec: RequestSpec, rec: RequestRecord, timeout_s: float) -> None:
        if self.service_s <= timeout_s:
            return await super().send(spec, rec, timeout_s)
        rec.sent_s = self.clock() - self.t0
        await asyncio.sleep(0)
        self.fake_clock.t += timeout_s
        rec.status, rec.content_type = 200, "text/event-stream"
        rec.error = f"timeout: no complete response within {timeout_s:.3f} s"
        rec.end_s = self.clock() - self.t0


def test_a_request_the_run_deadline_cuts_is_censored_not_a_server_error():
    clock = FakeClock()
    tr = TimedTransport(clock, service_s=1.0)
    # nothing seen yet: the first wave starts and the 0.5 s deadline cuts both
    res = asyncio.run(run_closed_loop(None, SPEC, n=4, concurrency=2, deadline_s=0.5, clock=clock,
                                      sleep=clock.sleep, transport=tr, loop_monitor_s=None))
    assert res.deadline_hit and res.records and all(r.censored and not r.ok and not r.failed for r in res.records)
    assert summarize(res.records)["errors"] == 0 and summarize(res.records)["censored"] == len(res.records)
    # with an e2e known from earlier batches (1 s) and 0.5 s left, nothing starts
    clock2 = FakeClock()
    res = asyncio.run(run_closed_loop(None, SPEC, n=4, concurrency=2, deadline_s=0.5, clock=clock2, sleep=clock2.sleep,
                                      transport=TimedTransport(clock2, service_s=1.0), loop_monitor_s=None,
                                      expected_e2e_s=[1.0]))
    assert res.records == [] and res.deadline_hit
    # its own request timeout (below the time left) is the server's: an error, not censored
    clock3 = FakeClock()
    res = asyncio.run(run_closed_loop(None, SPEC, n=1, concurrency=1, deadline_s=10.0, request_timeout_s=0.5,
                                      clock=clock3, sleep=clock3.sleep, transport=TimedTransport(clock3, service_s=1.0),
                                      loop_monitor_s=None))
    assert [r.failed for r in res.records] == [True] and not res.records[0].censored


def test_open_loop_stops_dispatching_past_the_deadline():
    clock = FakeClock()
    res = asyncio.run(run_open_loop(None, SPEC, n=10, offsets_s=[float(i) for i in range(10)], deadline_s=4.5,
                                    clock=clock, sleep=clock.sleep, transport=FakeTransport(clock),
                                    loop_monitor_s=None))
    assert [r.index for r in res.records] == [0, 1, 2, 3, 4] and res.deadline_hit


def test_requests_cycle_and_single_spec_needs_n():
    specs = [RequestSpec("/a", {}, tag="short"), RequestSpec("/b", {}, tag="long")]
    res = asyncio.run(run_closed_loop(None, specs, n=5, concurrency=2, transport=FakeTransport(),
                                      loop_monitor_s=None))
    assert sorted((r.index, r.tag) for r in res.records) == [
        (0, "short"), (1, "long"), (2, "short"), (3, "long"), (4, "short")]
    with pytest.raises(ValueError):
        asyncio.run(run_closed_loop(None, SPEC, concurrency=1, transport=FakeTransport()))


# ----------------------------------------------------------------------------- INVALID


def test_a_clock_that_jumps_shows_the_client_did_not_keep_up():
    clock = FakeClock()

    def jump(rec: RequestRecord) -> None:
        if rec.index == 7:
            clock.t += 0.5  # the client was frozen for 500 ms after sending request 7

    res = asyncio.run(run_open_loop(None, SPEC, n=10, offsets_s=[i * 0.01 for i in range(10)], clock=clock,
                                    sleep=clock.sleep, transport=FakeTransport(clock, on_send=jump),
                                    loop_monitor_s=None))
    assert res.max_lag_s == pytest.approx(0.5 - 0.01, abs=1e-6)
    assert not res.client_kept_up(0.010)
    assert res.client_kept_up(0.010, q=50)  # the median request was on time (only 8 and 9 were late)
    v = res.invalid_verdict("latency-slo", 0.010)
    assert v is not None and v.status is Status.INVALID and "INVALID" in v.message
    assert v.evidence["max_schedule_lag_s"] == pytest.approx(0.49, abs=1e-6)


def test_a_cpu_blocking_callback_starves_the_client_and_is_detected():
    """Real clock: request 1 blocks the event loop for 150 ms (time.sleep), so requests due
    every 10 ms go out late and the loop ticker wakes late. Bound 50 ms: a 3x margin."""

    def block(rec: RequestRecord) -> None:
        if rec.index == 1:
            time.sleep(0.15)

    res = asyncio.run(run_open_loop(None, SPEC, n=20, offsets_s=[i * 0.01 for i in range(20)],
                                    transport=FakeTransport(on_send=block), loop_monitor_s=0.005))
    assert res.max_lag_s > 0.1
    assert res.max_loop_lag_s > 0.1
    assert not res.client_kept_up(0.05, q=100)
    assert res.invalid_verdict("latency-slo", 0.05, q=100).status is Status.INVALID


# ----------------------------------------------------------------------------- in-test server


def sse_event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


class Server:
    """HTTP/1.1 keep-alive server; behaviour chosen by the request path."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(hdrs.get("content-length", "0")))
                req = {"method": method, "path": path, "headers": hdrs, "body": json.loads(body or b"{}")}
                self.requests.append(req)
                keep = await self.respond(req, writer)
                if not keep:
                    return
        finally:
            writer.close()

    async def respond(self, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        path, body = req["path"], req["body"]
        sse_head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        if path == "/v1/completions":
            n = int(body.get("max_tokens", 3))
            delay = float(body.get("delay", 0.0))
            w.write(sse_head)
            for i in range(n):
                fr = "length" if i == n - 1 else None
                w.write(chunk(sse_event({"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": fr}]})))
                await w.drain()
                if delay:
                    await asyncio.sleep(delay)
            usage = {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2}
            w.write(chunk(sse_event({"choices": [], "usage": usage})) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif path == "/v1/chat/completions":
            w.write(sse_head)
            w.write(chunk(sse_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})))
            for piece in ["Hel", "lo"]:
                await asyncio.sleep(0.002)
                w.write(chunk(sse_event({"choices": [{"index": 0, "delta": {"content": piece}}]})))
            w.write(chunk(sse_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})))
            w.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif path == "/big":  # one 1 MiB SSE event (think echo of a long prompt), in 64 KiB chunks
            text = "x" * (1 << 20)
            ev = sse_event({"choices": [{"index": 0, "text": text}]})
            w.write(sse_head)
            for i in range(0, len(ev), 65536):
                w.write(chunk(ev[i:i + 65536]))
                await w.drain()
            w.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif path == "/split":  # events split across HTTP chunks, CRLF line endings, comments
            w.write(sse_head)
            raw = b': ping\r\n\r\ndata: {"choices":[{"index":0,"text":"a"}]}\r\n\r\ndata: {"choices":[{"ind'
            w.write(chunk(raw))
            await w.drain()
            await asyncio.sleep(0.01)
            w.write(chunk(b'ex":0,"text":"b"}]}\n\ndata: [DONE]\n\n') + b"0\r\n\r\n")
        elif path == "/slow":
            await asyncio.sleep(float(body.get("delay", 2.0)))
            return False
        elif path == "/e400":
            msg = json.dumps({"error": {"message": "maximum context length is 256", "type": "BadRequestError",
                                        "code": 400}}).encode()
            w.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(msg), msg))
        elif path == "/e500":
            w.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
                    b"transfer-encoding: chunked\r\n\r\n" + chunk(b"engine dead") + b"0\r\n\r\n")
        elif path == "/garbage":
            w.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\nwhat")
            return False
        elif path == "/badchunk":
            w.write(sse_head + b"zz\r\nhello\r\n")
            return False
        elif path == "/cut":  # dies mid-stream
            w.write(sse_head + chunk(sse_event({"choices": [{"index": 0, "text": "a"}]})))
            await w.drain()
            return False
        elif path == "/close-delimited":  # HTTP/1.0 style: body until close
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                    + sse_event({"choices": [{"index": 0, "text": "a"}]}) + b"data: [DONE]\n\n")
            await w.drain()
            return False
        elif path == "/midstream-error":
            w.write(sse_head + chunk(sse_event({"error": {"message": "boom", "code": 500}}))
                    + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif path == "/json":
            msg = json.dumps({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                              "usage": {"completion_tokens": 1}}).encode()
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(msg), msg))
        elif path == "/drop-after":  # claims keep-alive, then closes: the next request must retry
            w.write(sse_head + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await w.drain()
            return False
        else:
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        await w.drain()
        return True

    async def __aenter__(self) -> "Server":
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:  # handlers still sleeping (/slow) must not hold wait_closed up
            w.close()
        await self.server.wait_closed()

    def endpoint(self, **kw: Any) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.port}", **kw)


def spec(path: str, **body: Any) -> RequestSpec:
    return RequestSpec(path, {"model": "m", "stream": True, **body})


def run(coro_fn: Any) -> Any:
    async def main() -> Any:
        async with Server() as srv:
            return await coro_fn(srv)

    return asyncio.run(asyncio.wait_for(main(), 20))


# ----------------------------------------------------------------------------- raw client


def test_raw_client_streams_chunked_sse_with_timestamps_and_reuses_the_connection():
    async def go(srv: Server) -> tuple[LoadResult, Server]:
        ep = srv.endpoint()
        req = completion_request(ep, model="m", prompt="hi", max_tokens=5, delay=0.002)
        return await run_closed_loop(ep, req, n=4, concurrency=1, deadline_s=10), srv

    res, srv = run(go)
    assert res.transport == "raw-http1.1" and srv.connections == 1 and res.connections_opened == 1
    assert [r.reused_connection for r in res.records] == [False, True, True, True]
    for r in res.records:
        assert r.ok and r.status == 200 and r.done and r.error is None
        assert r.tokens == 5 and r.tokens_from == "usage" and r.finish_reason == "length"
        assert r.text == "t0 t1 t2 t3 t4 " and len(r.content_s) == 5 and len(r.chunk_s) == 7
        assert r.scheduled_s <= r.sent_s <= r.first_byte_s <= r.first_token_s <= r.end_s
        assert r.chunk_s == sorted(r.chunk_s) and r.content_s[-1] - r.content_s[0] > 0.004
        assert r.pieces == [] and r.events[-1] == "[DONE]"
    assert srv.requests[0]["body"]["stream_options"] == {"include_usage": True}
    assert res.chunks == 28 and res.cpu_s >= 0 and res.wall_s > 0


def test_raw_client_concurrent_streams_and_chat():
    async def go(srv: Server) -> LoadResult:
        ep = srv.endpoint()
        req = chat_request(ep, model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return await run_closed_loop(ep, req, n=8, concurrency=4, deadline_s=10)

    res = run(go)
    assert len(res.records) == 8 and res.connections_opened == 4
    for r in res.records:
        assert r.ok and r.text == "Hello" and r.finish_reason == "stop" and r.done
        assert len(r.content_s) == 2 and r.tokens == 2 and r.tokens_from == "chunks"
        assert r.first_token_s == r.content_s[0] > r.chunk_s[0]  # the role-only chunk is not a token


def test_endpoint_headers_route_prefix_and_host_override_are_sent():
    async def go(srv: Server) -> Server:
        ep = srv.endpoint(route_prefix="/openai/v1", api_key="sk-test", host_header="latest-m.example")
        req = completion_request(ep, model="m", prompt="p", max_tokens=1, headers={"x-request-id": "r-1"})
        await run_closed_loop(ep, req, n=1, concurrency=1, deadline_s=10)
        return srv

    srv = run(go)
    r = srv.requests[0]
    assert r["path"] == "/openai/v1/completions"
    assert r["headers"]["authorization"] == "Bearer sk-test"
    assert r["headers"]["host"] == "latest-m.example" and r["headers"]["x-request-id"] == "r-1"


def test_hang_up_after_k_chunks_and_after_t_seconds():
    async def go(srv: Server) -> tuple[LoadResult, Server]:
        ep = srv.endpoint()
        specs = [
            RequestSpec("/v1/completions", {"max_tokens": 50, "delay": 0.005}, hangup_after_chunks=3),
            RequestSpec("/slow", {"delay": 3.0}, hangup_after_s=0.05),
            RequestSpec("/v1/completions", {"max_tokens": 2}),
        ]
        return await run_closed_loop(ep, specs, concurrency=1, deadline_s=10), srv

    res, srv = run(go)
    k, t, after = res.records
    assert k.hung_up and k.error is None and not k.ok and 3 <= len(k.chunk_s) < 10 and not k.done
    assert k.undecodable == 0 and k.tokens == len(k.chunk_s)
    assert t.hung_up and t.status == 0 and t.first_byte_s is None
    assert 0.04 <= t.end_s - t.sent_s < 1.0  # hung up at ~50 ms, far before the server's 3 s
    assert after.ok and after.tokens == 2  # the run continues on a fresh connection
    assert srv.connections == 3


def test_http_errors_are_recorded_with_their_bodies():
    async def go(srv: Server) -> LoadResult:
        return await run_closed_loop(srv.endpoint(), [spec("/e400"), spec("/e500"), spec("/nope")],
                                     concurrency=1, deadline_s=10)

    e400, e500, e404 = run(go).records
    assert e400.status == 400 and e400.error == "HTTP 400: maximum context length is 256"
    assert "BadRequestError" in e400.body and e400.end_s is not None
    assert e500.status == 500 and e500.error == "HTTP 500: engine dead"
    assert e404.status == 404 and e404.error.startswith("HTTP 404")


def test_garbage_and_broken_servers_become_recorded_errors_not_exceptions():
    async def go(srv: Server) -> LoadResult:
        specs = [spec("/garbage"), spec("/badchunk"), spec("/cut"), spec("/midstream-error"), spec("/split"),
                 spec("/close-delimited"), spec("/json")]
        return await run_closed_loop(srv.endpoint(), specs, concurrency=1, deadline_s=10)

    garbage, badchunk, cut, midstream, split, closedelim, js = run(go).records
    assert garbage.status == 0 and garbage.error.startswith("bad HTTP status line")
    assert badchunk.status == 200 and badchunk.error.startswith("bad chunk size line")
    assert cut.error.startswith("connection closed mid-response") and cut.chunk_s and not cut.done
    assert midstream.status == 200 and midstream.error == "stream error: boom" and midstream.done
    assert split.ok and split.text == "ab" and split.done and len(split.chunk_s) == 3  # ": ping" skipped
    assert split.chunk_s[1] - split.chunk_s[0] > 0.005  # "b" completed by the later HTTP chunk
    assert closedelim.ok and closedelim.text == "a" and closedelim.done
    assert js.ok and js.text == "hi" and js.tokens == 1 and js.first_token_s is None


def test_a_one_mebibyte_event_streams_through_intact():
    async def go(srv: Server) -> LoadResult:
        return await run_closed_loop(srv.endpoint(), spec("/big"), n=1, concurrency=1, deadline_s=10)

    (r,) = run(go).records
    assert r.ok and len(r.text) == 1 << 20 and r.done and len(r.chunk_s) == 2


def test_a_keep_alive_connection_closed_by_the_server_is_retried_transparently():
    async def go(srv: Server) -> tuple[LoadResult, Server]:
        specs = [spec("/drop-after"), spec("/v1/completions", max_tokens=1)]
        return await run_closed_loop(srv.endpoint(), specs, concurrency=1, deadline_s=10), srv

    res, srv = run(go)
    assert all(r.ok for r in res.records) and srv.connections == 2


def test_request_timeout_connect_failure_and_run_deadline():
    async def go(srv: Server) -> tuple[LoadResult, LoadResult]:
        slow = await run_closed_loop(srv.endpoint(), spec("/slow", delay=5.0), n=2, concurrency=2,
                                     deadline_s=10, request_timeout_s=0.1)
        cut = await run_closed_loop(srv.endpoint(), spec("/slow", delay=5.0), n=2, concurrency=2, deadline_s=0.2)
        return slow, cut

    slow, cut = run(go)
    assert all(r.error.startswith("timeout") for r in slow.records) and not slow.deadline_hit
    assert all(r.error.startswith("timeout") for r in cut.records) and cut.deadline_hit and cut.wall_s < 2.0

    async def refused() -> LoadResult:
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        return await run_closed_loop(Endpoint(f"http://127.0.0.1:{port}"), SPEC, n=2, concurrency=1, deadline_s=5)

    res = asyncio.run(refused())
    assert [r.error.startswith("connect failed") for r in res.records] == [True, True]


def test_open_loop_against_the_server_keeps_up_with_a_generous_bound():
    async def go(srv: Server) -> LoadResult:
        ep = srv.endpoint()
        return await run_open_loop(ep, completion_request(ep, model="m", prompt="p", max_tokens=3), n=20,
                                   rate_rps=200.0, rng=1, deadline_s=10)

    res = run(go)
    assert all(r.ok for r in res.records) and len(res.records) == 20
    assert res.client_kept_up(0.05)  # typical lag is ~1 ms; 50 ms leaves room for a busy CI box


def test_httpx_fallback_gives_the_same_records():
    async def go(srv: Server) -> LoadResult:
        ep = srv.endpoint()
        specs = [completion_request(ep, model="m", prompt="p", max_tokens=3),
                 RequestSpec("/v1/completions", {"max_tokens": 50, "delay": 0.005}, hangup_after_chunks=2),
                 spec("/e400")]
        return await run_closed_loop(ep, specs, concurrency=1, deadline_s=10, transport=HttpxTransport(ep))

    ok, hung, bad = run(go).records
    assert ok.ok and ok.tokens == 3 and ok.done and ok.first_token_s >= ok.sent_s
    assert hung.hung_up and hung.error is None
    assert bad.error.startswith("HTTP 400: maximum")


def test_transport_choice_by_scheme():
    assert isinstance(make_transport(Endpoint("http://127.0.0.1:1")), RawHttpTransport)
    assert isinstance(make_transport(Endpoint("https://llm.example")), HttpxTransport)
    with pytest.raises(ValueError):
        RawHttpTransport(Endpoint("https://llm.example"))


# ----------------------------------------------------------------------------- SSE splitting


def test_split_sse_times_each_event_by_the_piece_that_completed_it():
    pieces = [b"data: a\n", b"\ndata: b\r\n\r\nda", b"ta: c1\ndata: c2\n\n: comment\n\n", b"data: tail"]
    times, data = split_sse([1.0, 2.0, 3.0, 4.0], pieces)
    assert data == ["a", "b", "c1\nc2", "tail"]
    assert times == [2.0, 2.0, 3.0, 4.0]
    assert split_sse([], []) == ([], [])
    # the same without CR (the fast path), a blank line split across pieces
    lf = [b"data: a\n", b"\ndata: b\n\nda", b"ta: c1\ndata: c2\n\n: comment\n\n", b"data: tail"]
    assert split_sse([1.0, 2.0, 3.0, 4.0], lf) == ([2.0, 2.0, 3.0, 4.0], ["a", "b", "c1\nc2", "tail"])
    assert split_sse([1.0, 2.0], [b"data: x\n\n", b"\n\ndata: y\n\n"]) == ([1.0, 2.0], ["x", "y"])
    assert split_sse([1.0], [b'data: x\n\ndata: {"cut'], tail=False) == ([1.0], ["x"])


# ----------------------------------------------------------------------------- sync API


def test_sync_closed_and_open_loop_on_the_timed_event_loop():
    """The sync wrappers run their own loop (poll-time timestamps); the server runs in a thread."""
    import threading

    from kvgate.load import _TIMED, closed_loop, new_event_loop, open_loop

    ready = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            async with Server() as srv:
                box["srv"], box["stop"] = srv, asyncio.Event()
                ready.set()
                await box["stop"].wait()

        loop = asyncio.new_event_loop()
        box["loop"] = loop
        loop.run_until_complete(main())
        loop.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    assert ready.wait(10)
    try:
        ep = box["srv"].endpoint()
        req = completion_request(ep, model="m", prompt="p", max_tokens=4, delay=0.001)
        res = closed_loop(ep, req, n=6, concurrency=3, deadline_s=10)
        ol = open_loop(ep, req, n=5, rate_rps=500.0, rng=2, deadline_s=10)
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        th.join(10)
    for r in res.records + ol.records:
        assert r.ok and r.tokens == 4 and r.sent_s <= r.first_byte_s <= r.first_token_s <= r.end_s
        assert r.chunk_s == sorted(r.chunk_s)
    loop = new_event_loop()
    try:
        assert loop in _TIMED and _TIMED[loop].t > 0
    finally:
        loop.close()


def test_a_hung_up_record_with_a_cut_off_event_is_not_an_error():
    r = RequestRecord(index=0, scheduled_s=0.0, sent_s=0.0, status=200, content_type="text/event-stream",
                      hung_up=True, end_s=0.3)
    r.piece_s, r.pieces = [0.1, 0.2], [b'data: {"choices":[{"index":0,"text":"a"}]}\n\n', b'data: {"choi']
    r.finalize()
    assert r.error is None and r.undecodable == 0 and r.text == "a" and r.chunk_s == [0.1] and not r.ok
    assert r.row()["chunks"] == 1 and r.row()["hung_up"] is True


# ----------------------------------------------------------------------------- scenarios: own prefixes, de-synchronised
# (issue 48: F7 -- every timed request its own prefix; F2 -- no lock-step waves)
def _scenario_run(monkeypatch, what):
    """Run ``what(client, endpoint, profile)`` against the fault-injection fake with every spec the
    load runs send recorded; returns (result, [spec lists of each run], first-16-token tuples of each run)."""
    import kvgate.load.scenarios as scenarios
    from kvgate.http.client import KvClient
    from kvgate.profile.models import load_profile
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    from .conftest import REPO

    runs: list[list[Any]] = []

    def spy(real):
        def call(endpoint, requests, **kw):
            runs.append(list(requests))
            return real(endpoint, requests, **kw)
        return call
    monkeypatch.setattr(scenarios, "closed_loop", spy(scenarios.closed_loop))
    monkeypatch.setattr(scenarios, "open_loop", spy(scenarios.open_loop))
    prof = load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml"))
    with FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.001)) as fake:
        ep = Endpoint(fake.url.removesuffix("/v1"))
        with KvClient(ep, timeout_s=10.0) as client:
            out = what(client, ep, prof)

            def head(spec: Any) -> tuple[int, ...]:
                r = client.tokenize(model=prof.model.served_name, prompt=spec.body["prompt"])
                return tuple(r.json["tokens"][:16])
            heads = [[head(s) for s in run] for run in runs]
    return out, runs, heads


def test_latency_slo_sends_every_request_its_own_first_kv_block_and_thinks_between_sends(monkeypatch):
    from kvgate.load.scenarios import run_latency

    obs, runs, heads = _scenario_run(monkeypatch, lambda c, e, p: run_latency(c, e, p, rng=np.random.default_rng(1)))
    flat = [h for run in heads for h in run]
    n = len(obs.result.records)
    assert n > 16 and len(flat) == n  # more looks than the first: every batch's requests built for it, none cycled
    assert len(set(flat)) == len(flat), "two requests of latency/slo share their first 16 tokens (one KV block)"
    think = obs.extra["think_s"]
    assert think["n"] == n and 0 < think["mean"] < think["max"]  # a random think before every send
    lag = obs.result.max_lag_s
    assert lag < 0.25, lag  # the think moves scheduled_s: it is the design, not a client falling behind


def test_interference_shorts_alone_and_mixed_have_prompts_of_their_own_at_random_offsets(monkeypatch):
    from kvgate.load.scenarios import run_interference

    def go(c, e, p):
        return run_interference(c, e, p, rng=np.random.default_rng(7))
    (alone, mixed), runs, heads = _scenario_run(monkeypatch, go)
    flat = [h for run in heads for h in run]
    assert len(set(flat)) == len(flat), "two requests of interference (alone or mixed) share their first KV block"
    alone_heads, mixed_heads = set(heads[0]), {h for run in heads[1:] for h in run}
    assert not alone_heads & mixed_heads  # the alone baseline is never the mixed shorts' cache
    ex = mixed.extra
    assert sum(ex["short_waves"]) == len([r for r in mixed.result.records if r.tag == "short"]) and ex["waves"] >= 4
    offs = ex["offsets_s"]
    assert len(offs) == ex["waves"] and all(len(o) == 4 and o == sorted(o) for o in offs)
    window = ex["prefill_window_s"]
    assert 0.05 <= window["first_guess"] <= 1.0
    spread = [o[-1] - o[0] for o in offs]
    assert max(spread) > 0.0375  # not four shorts 12.5 ms apart: each its own point of the window
    # the same seed draws the same offsets (injected randomness); another seed others
    from kvgate.load.scenarios import short_offsets
    assert short_offsets(np.random.default_rng(3), 4, 1.0) == short_offsets(np.random.default_rng(3), 4, 1.0)
    assert short_offsets(np.random.default_rng(3), 4, 1.0) != short_offsets(np.random.default_rng(4), 4, 1.0)


def test_think_transport_draws_from_the_median_e2e_and_moves_the_schedule():
    from kvgate.load.desync import ThinkTransport
    from kvgate.load.record import RequestRecord

    clock = {"t": 0.0}
    slept: list[float] = []

    class Inner:
        name = "inner"

        def bind(self, c, t0, m):
            pass

        def prepare(self, s):
            return s

        async def send(self, p, rec, timeout_s):
            rec.sent_s = clock["t"]
            clock["t"] += 2.0  # every request takes 2 s
            rec.first_token_s = rec.end_s = clock["t"]

        async def aclose(self):
            pass

    async def sleep(s):
        slept.append(s)
        clock["t"] += s

    t = ThinkTransport(Inner(), np.random.default_rng(0), share=0.25, first_s=0.1, sleep=sleep)
    t.bind(lambda: clock["t"], 0.0, 4)
    recs = [RequestRecord(index=i, scheduled_s=clock["t"]) for i in range(20)]

    async def go():
        for r in recs:
            r.scheduled_s = clock["t"]
            await t.send(None, r, 60.0)
    asyncio.run(go())
    assert t.thinks_s[0] <= 0.1 and all(x <= 0.5 for x in t.thinks_s[1:]) and max(t.thinks_s[1:]) > 0.1
    assert all(abs(r.sent_s - r.scheduled_s) < 1e-9 for r in recs)  # the think is not schedule lag
    t2 = ThinkTransport(Inner(), np.random.default_rng(0), share=0.25, first_s=0.1, sleep=sleep)
    t2.bind(lambda: clock["t"], 0.0, 4)
    r = RequestRecord(index=0, scheduled_s=0.0)
    asyncio.run(t2.send(None, r, 0.1))  # no time to think near the deadline
    assert t2.thinks_s == [0.0]
