"""The engine watch (kvgate.http.watch): a request past its deadline makes it check the engine once;
a canary that gets no answer while /health is 200 classifies it hung, once, and every later send is
refused without the network; an engine that answers the canary is not hung; a stream silent after
its first event classifies the server as stalling streams. Transport and clock injected, no sleeps."""

from __future__ import annotations

import httpx
import pytest

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient
from kvgate.http.watch import EngineWatch

METRICS = "vllm:num_requests_running{model_name=\"m\"} 2.0\nvllm:num_requests_waiting{model_name=\"m\"} 5.0\n"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def server(*, canary: str = "hang", health: int = 200, seen: list | None = None, clock: Clock | None = None,
           canary_s: float = 0.0):
    """A MockTransport handler: /health answers ``health``; the canary (max_tokens 4) hangs
    (ReadTimeout), answers 200 (``ok``) after ``canary_s`` of the injected clock, or 500; every
    other generation times out (the request that passed its deadline)."""
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request.url.path)
        path = request.url.path
        if path == "/health":
            return httpx.Response(health)
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path.endswith("/completions") and b'"max_tokens":4' in request.content.replace(b" ", b""):
            if canary == "hang":
                raise httpx.ReadTimeout("timed out", request=request)
            if clock is not None:
                clock.t += canary_s
            return httpx.Response(200 if canary == "ok" else 500, json={"choices": [{"text": "a b c d"}]})
        raise httpx.ReadTimeout("timed out", request=request)
    return httpx.MockTransport(handle)


def pinging_engine(clock: Clock, reader: str, first_token=lambda request: False):
    """A transport handler for a frozen engine behind a gateway that sends ': ping' every second
    (``clock`` advances 1 s per comment): /health 200, /metrics the gauges, every generation a 200
    SSE stream of keep-alive comments (after one token when ``first_token(request)``); 1000
    comments read means ``reader`` had no deadline (AssertionError)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS)
        first = first_token(request)

        class Pings(httpx.SyncByteStream):
            def __iter__(self):
                if first:
                    yield b'data: {"choices": [{"text": " a"}]}\n\n'
                for _ in range(1000):
                    clock.t += 1.0
                    yield b": ping\n\n"
                raise AssertionError(f"{reader} read 1000 keep-alive comments: no deadline")
        return httpx.Response(200, stream=Pings(), headers={"content-type": "text/event-stream"})
    return handle


def watched(transport: httpx.MockTransport, clock: Clock | None = None, **kw) -> tuple[EngineWatch, KvClient]:
    clock = clock or Clock()
    w = EngineWatch("m", canary_deadline_s=3.0, transport=transport, clock=clock, **kw)
    ep = Endpoint("http://llm.test")
    w.bind(ep.base_url, ep.route_prefix, ep.headers())
    w.gate = "p/requests/x"
    ep = Endpoint("http://llm.test", watch=w)
    # the client shares the injected clock: a waited_s read off the wall clock flaked (0.001 s in CI)
    return w, KvClient(ep, timeout_s=10.0, transport=transport, clock=clock)


def test_deadline_then_silent_canary_with_healthy_health_is_hung_once():
    seen: list[str] = []
    w, c = watched(server(seen=seen))
    r = c.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 64})
    assert r.status == 0 and "ReadTimeout" in r.text and "engine hung since p/requests/x" in r.text
    h = w.hung
    assert h is not None and h.gate == "p/requests/x" and h.request == "POST /v1/completions" and h.health == "200"
    assert (h.running, h.waiting) == (2.0, 5.0) and "no token within 3 s" in h.canary
    assert "running 2, waiting 5" in h.reason() and "/health answered 200" in h.reason()
    assert seen.count("/health") == 1 and seen.count("/v1/completions") == 2  # the request, then one canary
    # from now on nothing is sent, streamed or not, and the answer names the one reason
    w.gate = "p/latency/slo"
    n = len(seen)
    for reply in (c.post("/v1/completions", {"model": "m"}), c.stream("/v1/completions", {"model": "m"}),
                  c.get("/health")):
        assert reply.status == 0 and reply.text == f"not sent: {h.reason()}"
    assert len(seen) == n and w.refused == {"p/latency/slo": 3}
    assert w.suspect("POST /v1/completions", 10.0) is h  # classified once
    assert w.summary()["condition"] == "hung" and w.summary()["gate"] == "p/requests/x"


def test_engine_that_answers_the_canary_is_not_hung():
    clock = Clock()
    w, c = watched(server(canary="ok", clock=clock, canary_s=2.5), clock)  # recovered: 2.5 s < 3 s deadline
    r = c.post("/v1/completions", {"model": "m", "max_tokens": 64})
    assert r.status == 0 and "engine hung" not in r.text
    assert w.hung is None and w.refusal(stream=False) is None
    assert w.checks == [{"gate": "p/requests/x", "request": "POST /v1/completions", "waited_s": 0.0,
                         "health": "200", "canary_s": 2.5}]


def test_canary_answering_after_its_deadline_is_hung():
    clock = Clock()
    w, _ = watched(server(canary="ok", clock=clock, canary_s=3.5), clock)
    h = w.suspect("POST /v1/chat/completions", 10.0)
    assert h is not None and "its first token only after 3.5 s" in h.canary


def test_canary_answering_500_is_an_answer_not_a_hang():
    w, _ = watched(server(canary="500"))
    assert w.suspect("POST /v1/completions", 10.0) is None and w.checks[0]["canary_s"] == 0.0


def test_canary_judged_on_its_first_token_a_paused_generation_is_not_hung():
    """A server that pauses every generation mid-way (it stalls streams; non-streamed replies wait
    the pause too) gives the canary its first token at once: progress, not a hang."""
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)

        class Paused(httpx.SyncByteStream):
            def __iter__(self):
                yield b": ping\n\n"  # a gateway's keep-alive comment is not a token
                yield b'data: {"choices": [{"text": " a"}]}\n\n'
                raise httpx.ReadTimeout("paused", request=request)
        return httpx.Response(200, stream=Paused(), headers={"content-type": "text/event-stream"})

    w, _ = watched(httpx.MockTransport(handle))
    assert w.suspect("POST /v1/completions (stream)", 0.2) is None and w.hung is None
    assert w.checks[0]["canary_s"] == 0.0


def test_canary_with_only_keepalive_comments_is_hung():
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)

        class Pings(httpx.SyncByteStream):
            def __iter__(self):
                yield b": ping\n\n"
                raise httpx.ReadTimeout("frozen", request=request)
        return httpx.Response(200, stream=Pings(), headers={"content-type": "text/event-stream"})

    w, _ = watched(httpx.MockTransport(handle))
    h = w.suspect("POST /v1/completions", 10.0)
    assert h is not None and "no token within 3 s (ReadTimeout)" in h.canary


def test_canary_kept_open_by_endless_keepalive_comments_is_hung_at_its_deadline():
    """A gateway that sends ': ping' every second in front of a frozen engine resets the read
    timeout: the canary's deadline must be a total one, else the check never ends."""
    clock = Clock()
    handle = pinging_engine(clock, "the canary")  # "for ever": the check must stop after ~3 comments
    w, _ = watched(httpx.MockTransport(handle), clock)
    h = w.suspect("POST /v1/completions", 10.0)
    assert h is not None and "no token within 3 s (ReadTimeout)" in h.canary, h


def test_suspects_arriving_during_a_check_share_its_outcome():
    """A wave of timed-out requests costs one check: those that time out while a check runs wait
    for it and take its answer (here: the canary answers, so none is hung)."""
    import threading

    seen: list[str] = []
    late: list = []
    inner = server(canary="ok", seen=seen)
    holder: dict = {}

    def handle(request: httpx.Request) -> httpx.Response:
        if b'"max_tokens":4' in request.content.replace(b" ", b"") and not late:
            t = threading.Thread(target=lambda: late.append(holder["w"].suspect("POST /v1/chat/completions", 10.0)))
            late.append(t)
            t.start()  # times out while this check runs: blocks until it ends, then shares it
        return inner.handle_request(request)

    class Checking:  # the watch's one-check-at-a-time lock, telling when the late request waits on it
        def __init__(self) -> None:
            self.lock, self.waiting = threading.Lock(), threading.Event()

        def __enter__(self):
            if self.lock.locked():
                self.waiting.set()
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    w, _ = watched(httpx.MockTransport(handle))
    holder["w"] = w
    w._checking = checking = Checking()
    real_handle = handle

    def handle_then_wait(request: httpx.Request) -> httpx.Response:
        reply = real_handle(request)
        if late and request.url.path.endswith("/completions"):
            assert checking.waiting.wait(5.0)  # the late request timed out while this check runs
        return reply

    w.transport = httpx.MockTransport(handle_then_wait)
    assert w.suspect("POST /v1/completions", 10.0) is None
    late[0].join(timeout=5.0)
    assert late[1:] == [None] and seen.count("/health") == 1 and len(w.checks) == 1
    assert w.suspect("POST /v1/completions", 10.0) is None and seen.count("/health") == 2  # a later one checks


def test_unhealthy_health_is_not_a_hidden_hang():
    w, _ = watched(server(health=503))
    assert w.suspect("POST /v1/completions", 10.0) is None and w.hung is None


def test_hang_hooks_run_once_and_late_registrations_at_once():
    w, _ = watched(server())
    got: list[str] = []
    remove = w.on_hang(got.append)
    w.on_hang(lambda why: got.append("second"))()  # unregistered before the hang: never called
    w.suspect("POST /v1/completions", 10.0)
    w.suspect("POST /v1/completions", 10.0)
    assert got == [w.hung.reason()]
    w.on_hang(got.append)
    assert got == [w.hung.reason()] * 2
    remove()


def stalling_stream(request: httpx.Request) -> httpx.Response:
    class Body(httpx.SyncByteStream):
        def __iter__(self):
            for i in range(4):
                yield f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n'.encode()
            raise httpx.ReadTimeout("silent", request=request)
    return httpx.Response(200, stream=Body(), headers={"content-type": "text/event-stream"})


def test_stream_silent_after_its_first_events_is_cut_and_classifies_stalling():
    transport = httpx.MockTransport(stalling_stream)
    clock = Clock()
    w, c = watched(transport, clock, stream_idle_timeout_s=30.0)
    r = c.stream("/v1/completions", {"model": "m", "stream": True}, timeout_s=120.0)
    assert len(r.events) == 4 and r.idle_cut_s is not None and "idle timeout" in r.transport_error
    s = w.stalling
    assert s is not None and s.events == 4 and s.gate == "p/requests/x" and s.idle_timeout_s == 30.0
    assert "the gateway would cut it at its idle timeout 30 s" in s.reason()
    assert w.hung is None
    again = c.stream("/v1/completions", {"model": "m", "stream": True})  # streamed: refused at once
    assert again.status == 0 and again.text == f"not sent: {s.reason()}" and not again.events
    assert w.refusal(stream=False) is None  # non-streamed requests still go


def test_idle_cut_on_a_real_socket_after_the_first_event_classifies_stalling():
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    with FakeVLLM(FakeConfig(faults={"pause_streams"}, pause_s=5.0, pause_after_chunks=2)) as fake:
        w = EngineWatch("fake-model", stream_idle_timeout_s=0.2)
        ep = Endpoint(fake.url.removesuffix("/v1"))
        w.bind(ep.base_url, ep.route_prefix, ep.headers())
        with KvClient(Endpoint(ep.base_url, watch=w), timeout_s=10.0) as c:
            r = c.stream("/v1/completions", {"model": "fake-model", "prompt": "a b", "max_tokens": 8,
                                             "ignore_eos": True, "stream": True})
    assert len(r.events) == 2 and r.elapsed_s < 2.0 and r.idle_cut_s >= 0.2, r
    assert w.stalling is not None and w.stalling.events == 2 and w.hung is None


def test_stream_idle_watchdog_threads_end_with_their_streams():
    """One daemon thread per stream on a real socket, gone once the stream ends -- finished, hung up
    early, or cut -- so a run's hundreds of probes leave none behind; keep-alive reuse unharmed."""
    import threading

    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    def idle_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "kvgate-stream-idle"]

    before = set(idle_threads())
    body = {"model": "fake-model", "prompt": "a b", "max_tokens": 8, "ignore_eos": True, "stream": True}
    with FakeVLLM(FakeConfig()) as fake:
        w = EngineWatch("fake-model", stream_idle_timeout_s=5.0)
        ep = Endpoint(fake.url.removesuffix("/v1"))
        w.bind(ep.base_url, ep.route_prefix, ep.headers())
        with KvClient(Endpoint(ep.base_url, watch=w), timeout_s=10.0) as c:
            def ended() -> bool:  # every watchdog this test started has exited (joined, bounded)
                spawned = [t for t in idle_threads() if t not in before]
                for t in spawned:
                    t.join(timeout=2.0)
                return all(t.daemon and not t.is_alive() for t in spawned)

            replies = [c.stream("/v1/completions", body) for _ in range(20)]
            assert ended()
            during: list[int] = []
            replies.append(c.stream("/v1/completions", body,  # hung up early, counting threads mid-stream
                                    on_event=lambda t, d: during.append(sum(x not in before
                                                                            for x in idle_threads())) or True))
            replies.append(c.stream("/v1/completions", body, hang_up_after_headers=True))
            assert ended() and during == [1]  # one watchdog per stream while it is read, none after
    assert all(r.status == 200 and r.idle_cut_s is None and r.transport_error is None for r in replies), replies
    assert all(r.done for r in replies[:20]) and w.stalling is None and w.hung is None


def test_client_without_a_watch_is_unchanged():
    c = KvClient(Endpoint("http://llm.test"), transport=server())
    assert c.post("/v1/completions", {"model": "m"}).status == 0


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_load_transports_obey_the_watch(transport):
    """Both load clients (raw HTTP/1.1 and the https fallback): requests in flight are cut when the
    engine is classified hung (here by a check the canary of which is held), and later sends are
    refused without a connection, naming the one reason."""
    import threading

    from kvgate.load import HttpxTransport, closed_loop, completion_request
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"hang_after_generations"}, hang_after=0)) as fake:
        w = EngineWatch("fake-model", canary_deadline_s=1.0)
        base = fake.url.removesuffix("/v1")
        w.bind(base, "/v1", {})
        ep = Endpoint(base, watch=w)
        spec = completion_request(ep, model="fake-model", prompt="kv cache", max_tokens=8, temperature=0)
        check = threading.Thread(target=w.suspect, args=("POST /v1/completions", 10.0))
        check.start()  # its canary is held too: hung after canary_deadline_s, while the load waits
        kw = {"transport": HttpxTransport(ep)} if transport == "httpx" else {}
        cut = closed_loop(ep, spec, n=2, concurrency=2, deadline_s=30, request_timeout_s=20, **kw)
        check.join(timeout=10.0)
        kw = {"transport": HttpxTransport(ep)} if transport == "httpx" else {}
        refused = closed_loop(ep, spec, n=2, concurrency=2, deadline_s=30, **kw)
    reason = w.hung.reason()
    assert [r.error for r in cut.records] == [f"cut: {reason}"] * 2
    assert [r.error for r in refused.records] == [f"not sent: {reason}"] * 2
    assert all(r.end_s - r.sent_s < 5.0 for r in cut.records)  # cut at the hang (~1 s), not at 20 s


def test_stream_kept_open_by_keepalive_comments_ends_at_the_request_timeout_and_checks_the_engine():
    """A hung engine behind a gateway that sends ': ping' every second: the comments reset httpx's
    read timeout, so the stream's wait for its (first or next) event must be bounded by the request
    timeout itself -- then the watch checks the engine (here: hung, the canary too gets only pings)."""
    clock = Clock()
    # the probe with max_tokens 64 gets one token, then only pings
    handle = pinging_engine(clock, "the stream", first_token=lambda request: b"max_tokens\": 64" in request.content)
    w, _ = watched(httpx.MockTransport(handle), clock)
    c = KvClient(Endpoint("http://llm.test", watch=w), timeout_s=10.0, transport=httpx.MockTransport(handle),
                 clock=clock)
    for body in ({"model": "m", "max_tokens": 64, "stream": True}, {"model": "m", "max_tokens": 8, "stream": True}):
        w.hung = None
        t0 = clock.t
        r = c.stream("/v1/completions", body)
        assert r.status == 200 and "ReadTimeout: no event for 10 s" in r.transport_error, r.transport_error
        assert 10 <= clock.t - t0 <= 10 + 3 + 2, clock.t - t0  # the request timeout, then one 3 s canary check
        assert w.hung is not None and "engine hung since p/requests/x" in r.transport_error


def refusing(seen: list[str] | None = None, health_answers: bool = False):
    """A transport for a server whose process died: every connection refused (``/health`` too,
    unless ``health_answers``: then only the generation routes refuse)."""
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request.url.path)
        if request.url.path == "/health" and health_answers:
            return httpx.Response(200)
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    return httpx.MockTransport(handle)


def test_server_gone_mid_run_is_classified_once_and_later_sends_are_not_sent():
    """A connection refused mid-run, and /health refused too: GONE, once -- one reason, not one
    harness error per gate; nothing more is sent, streamed or not."""
    seen: list[str] = []
    w, c = watched(refusing(seen))
    r = c.post("/v1/completions", {"model": "m", "max_tokens": 8})
    assert r.status == 0 and "ConnectError: [Errno 111] Connection refused" in r.text
    gone = w.hung
    assert gone is not None and gone.condition == "gone" and gone.gate == "p/requests/x"
    assert gone.reason() == ("server gone since p/requests/x (POST /v1/completions: ConnectError: [Errno 111] "
                             "Connection refused; GET /health then got no answer (ConnectError): the server process "
                             "died or the endpoint went away)")
    assert seen == ["/v1/completions", "/health"]
    w.gate = "p/latency/slo"
    for reply in (c.post("/v1/completions", {"model": "m"}), c.get("/health")):
        assert reply.status == 0 and reply.text == f"not sent: {gone.reason()}"
    assert c.stream("/v1/completions", {"model": "m"}).text == f"not sent: {gone.reason()}"
    assert len(seen) == 2 and w.summary()["condition"] == "gone"


def test_a_refused_request_while_health_answers_is_its_own_error_not_gone():
    w, c = watched(refusing(health_answers=True))
    with pytest.raises(EndpointUnreachable, match="is unreachable"):
        c.post("/v1/completions", {"model": "m"})
    assert w.hung is None and w.summary() is None


def test_a_stream_refused_mid_run_carries_the_gone_reason():
    w, c = watched(refusing())
    s = c.stream("/v1/completions", {"model": "m", "max_tokens": 8})
    assert s.status == 0 and s.transport_error.startswith("ConnectError: [Errno 111] Connection refused; server gone since")
    assert w.hung is not None and w.hung.request == "POST /v1/completions (stream)"


def test_refusals_after_the_run_stopped_the_server_itself_are_not_gone():
    """The drain gate SIGTERMs the server: its refused connections are the measurement."""
    w, c = watched(refusing())
    w.exit_expected = True
    with pytest.raises(EndpointUnreachable):
        c.post("/v1/completions", {"model": "m"})
    assert w.hung is None
