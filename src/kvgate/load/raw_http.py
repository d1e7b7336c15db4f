"""The raw asyncio HTTP/1.1 client for ``http://`` endpoints (:class:`RawHttpTransport`) and the
event loop that stamps its data (:func:`new_event_loop`).

``asyncio.Protocol``, keep-alive, chunked decoding, one pool per run, no line-length limits so a
long-context SSE event of any size streams through. Generic HTTP stacks cost ~50 µs of CPU per
streamed chunk and add milliseconds of timestamp error at 64 streams; timing-accurate load is
what kvgate is for, so this one is hand-written. The hot path does no JSON and no SSE parsing:
``data_received`` takes a timestamp, undoes HTTP chunked framing and keeps ``(t, bytes)`` in the
record (``piece_s``/``pieces``); counting blank lines for ``hangup_after_chunks`` is all it looks
at. On the loops :func:`new_event_loop` makes (the sync :func:`~kvgate.load.closed_loop` /
:func:`~kvgate.load.open_loop` use one) the timestamp is the instant the poll that found the data
returned, so it does not grow with the number of sockets handled before it in the same batch.
Timeouts and hang-up timers run on the event loop's own clock.

With the run's :class:`~kvgate.http.watch.EngineWatch` on the endpoint (``Endpoint.watch``): a
request refused by the watch (engine hung; a streamed one to a server that stalls streams) ends at
once with ``not sent: ...`` as its error, without a connection; a request that times out (or is
idle-cut before its first byte) makes the watch check the engine once (in a worker thread, so the
loop goes on); an idle cut after body pieces classifies the server as stalling streams; and when
the engine is classified hung every request in flight is cut at once (``cut: engine hung ...``).
"""

from __future__ import annotations

import asyncio
import json
import selectors
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvgate.http.client import Endpoint
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.transport import DEFAULT_MAX_RESPONSE_BYTES, Clock, cut_on_hang, refused_by_watch, tell_watch


class _TimedSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform selector, plus the time its last ``select()`` returned (``t``, seconds on
    ``clock``). Data found ready in one poll is stamped with that instant, so a socket's timestamp
    does not depend on how many other sockets the loop handled before it in the same batch."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        super().__init__()
        self.clock = clock
        self.t = clock()

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(timeout)
        self.t = self.clock()
        return ready


_TIMED: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TimedSelector]" = weakref.WeakKeyDictionary()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio event loop whose raw-client timestamps are taken when the poll returns
    (see :class:`_TimedSelector`). :func:`closed_loop` and :func:`open_loop` run on one; use it
    to call :func:`run_closed_loop` / :func:`run_open_loop` with the same accuracy. On other loops
    each ``data_received`` reads the clock itself (adds the in-batch processing delay, ~µs per
    socket handled before it)."""
    sel = _TimedSelector(time.perf_counter)
    loop = asyncio.SelectorEventLoop(sel)
    _TIMED[loop] = sel
    return loop


_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _IDLE = range(5)


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time; parses responses incrementally."""

    def __init__(self, clock: Clock, t0: float, max_bytes: int, sel: _TimedSelector | None = None) -> None:
        self.clock, self.t0, self.max_bytes = clock, t0, max_bytes
        self.sel = sel  # when set, arrival time = when the poll that found the data returned
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.rec: RequestRecord | None = None
        self.fut: asyncio.Future[None] | None = None
        self.state = _IDLE
        self.keep_alive = True
        self.reusable = False
        self.lost_early = False
        self.timers: list[asyncio.TimerHandle] = []
        self._reset()

    def _reset(self) -> None:
        self.hbuf = bytearray()
        self.cbuf = b""
        self.need = 0        # chunked: >0 data bytes left; 0 size line; -2 CRLF; -1 trailers
        self.remaining = 0   # content-length bytes left
        self.nbytes = 0
        self.hang_k = 0
        self.seen = 0
        self.last_nl = False
        self.pt: list[float] = []
        self.pb: list[bytes] = []

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.rec is None:
            return
        t = self.clock() - self.t0
        if self.state == _UNTIL_CLOSE:
            self._finish(t, None)
        else:
            self.lost_early = self.rec.first_byte_s is None
            where = "before the response" if self.state == _HEAD and not self.hbuf else "mid-response"
            self._finish(t, f"connection closed {where}" + (f" ({exc})" if exc else ""))

    def data_received(self, data: bytes) -> None:
        sel = self.sel
        t = (sel.t if sel is not None else self.clock()) - self.t0
        rec = self.rec
        if rec is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.keep_alive = False
            if self.transport is not None:
                self.transport.abort()
            return
        if rec.first_byte_s is None:
            rec.first_byte_s = t
        st = self.state
        if st == _CHUNKED:
            self._chunked(data, t)
        elif st == _HEAD:
            self._head(data, t)
        elif st == _LENGTH:
            self._length(data, t)
        else:
            self._payload(data, t)

    # -- request lifecycle
    def start(self, rec: RequestRecord, wire: bytes, timeout_s: float, hang_k: int | None,
              hang_s: float | None, idle_s: float | None = None) -> asyncio.Future[None]:
        self._reset()
        self.rec = rec
        self.state = _HEAD
        self.keep_alive = True
        self.reusable = False
        self.lost_early = False
        self.pt, self.pb = rec.piece_s, rec.pieces
        self.hang_k = hang_k or 0
        self.fut = self.loop.create_future()
        self.timers = [self.loop.call_later(max(0.0, timeout_s), self._on_timeout, timeout_s)]
        if hang_s is not None:
            self.timers.append(self.loop.call_later(max(0.0, hang_s), self._hang_up))
        if idle_s is not None:
            self.timers.append(self.loop.call_later(max(0.0, idle_s), self._idle_check, idle_s))
        rec.sent_s = self.clock() - self.t0
        assert self.transport is not None
        self.transport.write(wire)
        return self.fut

    def _finish(self, t: float, error: str | None, *, hung_up: bool = False, complete: bool = False) -> None:
        rec = self.rec
        if rec is None:
            return
        self.rec = None
        self.state = _IDLE
        for h in self.timers:
            h.cancel()
        self.timers = []
        rec.end_s = t
        if error is not None and rec.error is None:
            rec.error = error
        rec.hung_up = rec.hung_up or hung_up
        self.reusable = complete and self.keep_alive and not self.closed and not self.cbuf
        if not self.reusable and self.transport is not None and not self.closed:
            self.transport.abort()
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    def abort(self, error: str) -> None:
        """Fail the current request (e.g. on cancellation) and drop the connection."""
        self.keep_alive = False
        self._finish(self.clock() - self.t0, error)

    def _on_timeout(self, timeout_s: float) -> None:
        self._finish(self.clock() - self.t0, f"timeout: no complete response within {timeout_s:.3g} s")

    def _idle_check(self, idle_s: float) -> None:
        """Cut the request when nothing has arrived for ``idle_s`` seconds (the last body piece,
        the response head, or the send); else check again when that much quiet would have passed.
        One timer per idle period, none per chunk: the hot path is untouched."""
        rec = self.rec
        if rec is None:
            return
        now = self.clock() - self.t0
        last = max(t for t in (rec.sent_s, rec.first_byte_s, self.pt[-1] if self.pt else None) if t is not None)
        quiet = now - last
        if quiet >= idle_s:
            what = "before the first byte" if rec.first_byte_s is None else f"after {len(self.pt)} body pieces"
            self._fail(now, f"idle timeout: no bytes for {quiet:.3g} s {what} (stream idle timeout {idle_s:g} s: "
                            "the gateway in front would cut it here)")
        else:
            self.timers.append(self.loop.call_later(idle_s - quiet, self._idle_check, idle_s))

    def _hang_up(self) -> None:
        self.keep_alive = False
        self._finish(self.clock() - self.t0, None, hung_up=True)

    def _fail(self, t: float, error: str) -> None:
        self.keep_alive = False
        self._finish(t, error)

    # -- response parsing (hot path)
    def _head(self, data: bytes, t: float) -> None:
        hb = self.hbuf
        hb += data
        i = hb.find(b"\r\n\r\n")
        if i < 0:
            if len(hb) > 65536:
                self._fail(t, "response head larger than 64 KiB")
            return
        head = bytes(hb[:i])
        rest = bytes(hb[i + 4:])
        hb.clear()
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise ValueError
            code = int(parts[1])
        except ValueError:
            self._fail(t, f"bad HTTP status line: {lines[0][:80]!r}")
            return
        if 100 <= code < 200:  # 100 Continue / 103 Early Hints: another head follows
            if rest:
                self._head(rest, t)
            return
        hdrs: dict[bytes, bytes] = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
        rec = self.rec
        assert rec is not None
        rec.status = code
        rec.content_type = hdrs.get(b"content-type", b"").decode("latin-1")
        conn = hdrs.get(b"connection", b"").lower()
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = b"keep-alive" in conn
        else:
            self.keep_alive = b"close" not in conn
        te = hdrs.get(b"transfer-encoding", b"").lower()
        if code in (204, 304):
            self._finish(t, None, complete=True)
        elif b"chunked" in te:
            self.state = _CHUNKED
            self.need = 0
            if rest:
                self._chunked(rest, t)
        elif b"content-length" in hdrs:
            try:
                self.remaining = int(hdrs[b"content-length"])
                if self.remaining < 0:
                    raise ValueError
            except ValueError:
                self._fail(t, f"bad Content-Length: {hdrs[b'content-length'][:40]!r}")
                return
            self.state = _LENGTH
            if self.remaining == 0:
                self._finish(t, None, complete=True)
            elif rest:
                self._length(rest, t)
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
            if rest:
                self._payload(rest, t)

    def _length(self, data: bytes, t: float) -> None:
        n = len(data)
        if n >= self.remaining:
            extra = n > self.remaining
            self._payload(data[: self.remaining] if extra else data, t)
            if self.rec is not None:
                if extra:
                    self.keep_alive = False
                self.remaining = 0
                self._finish(t, None, complete=True)
        else:
            self.remaining -= n
            self._payload(data, t)

    def _chunked(self, data: bytes, t: float) -> None:
        if self.cbuf:
            data = self.cbuf + data
            self.cbuf = b""
        pos, n = 0, len(data)
        while pos < n:
            need = self.need
            if need > 0:
                end = pos + need
                if end <= n:
                    self._payload(data if (pos == 0 and end == n) else data[pos:end], t)
                    self.need = -2
                    pos = end
                else:
                    self._payload(data[pos:] if pos else data, t)
                    self.need = need - (n - pos)
                    return
                if self.rec is None:  # hung up or failed inside _payload
                    return
            elif need == 0:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    self._keep_partial(data, pos, 1024, "chunk size line longer than 1 KiB", t)
                    return
                line = data[pos:i]
                semi = line.find(b";")
                if semi >= 0:
                    line = line[:semi]
                try:
                    size = int(line, 16)
                    if size < 0:
                        raise ValueError
                except ValueError:
                    self._fail(t, f"bad chunk size line: {data[pos:i][:40]!r}")
                    return
                pos = i + 2
                self.need = size if size else -1
            elif need == -2:
                if n - pos < 2:
                    self.cbuf = data[pos:]
                    return
                if data[pos] != 13 or data[pos + 1] != 10:
                    self._fail(t, "chunk not followed by CRLF")
                    return
                pos += 2
                self.need = 0
            else:  # trailers after the last chunk
                if data.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    j = data.find(b"\r\n\r\n", pos)
                    if j < 0:
                        self._keep_partial(data, pos, 65536, "chunked trailers larger than 64 KiB", t)
                        return
                    pos = j + 4
                if pos < n:
                    self.keep_alive = False  # bytes after the response: do not reuse
                self._finish(t, None, complete=True)
                return

    def _keep_partial(self, data: bytes, pos: int, limit: int, too_long: str, t: float) -> None:
        """Keep an incomplete framing line (``data[pos:]``) for the next read, or fail the request
        with ``too_long`` when it already exceeds ``limit`` bytes."""
        if len(data) - pos > limit:
            self._fail(t, too_long)
        else:
            self.cbuf = data[pos:]

    def _payload(self, b: bytes, t: float) -> None:
        self.pt.append(t)
        self.pb.append(b)
        self.nbytes += len(b)
        if self.nbytes > self.max_bytes:
            self._fail(t, f"response larger than {self.max_bytes} bytes")
            return
        if self.hang_k:
            c = b.count(b"\n\n") + b.count(b"\n\r\n")
            if self.last_nl and b[:1] == b"\n":
                c += 1
            self.last_nl = b[-1:] == b"\n"
            self.seen += c
            if self.seen >= self.hang_k:
                self._hang_up()


@dataclass
class _Wire:
    wire: bytes
    hang_k: int | None
    hang_s: float | None
    idle_s: float | None = None
    stream: bool = False
    what: str = ""


class RawHttpTransport:
    """Raw asyncio HTTP/1.1 client for ``http://`` endpoints: one keep-alive pool per run.

    ``connect_timeout_s``: seconds to open a TCP connection. ``max_response_bytes``: body bytes
    per response before the request is failed. A request on a reused connection that the server
    had closed (nothing came back) is retried once on a fresh connection (``rec.retried``).
    """

    name = "raw-http1.1"

    def __init__(self, endpoint: Endpoint, *, connect_timeout_s: float = 10.0,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        u = urlsplit(endpoint.base_url)
        if u.scheme != "http":
            raise ValueError(f"RawHttpTransport speaks plain http only, not {u.scheme!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.path_prefix = u.path.rstrip("/")
        hdrs = {k.lower(): v for k, v in endpoint.headers().items()}
        host = hdrs.pop("host", None) or (u.netloc.rsplit("@", 1)[-1])
        self.base_headers = {"host": host, **hdrs}
        self.connect_timeout_s = connect_timeout_s
        self.max_response_bytes = max_response_bytes
        self.idle: list[_Conn] = []
        self.conns: set[_Conn] = set()
        self.opened = 0
        self.clock: Clock = time.perf_counter
        self.t0 = 0.0
        self.watch = endpoint.watch
        self._unhook: Any = None

    def bind(self, clock: Clock, t0: float, max_connections: int) -> None:
        self.clock, self.t0 = clock, t0

    def prepare(self, spec: RequestSpec) -> _Wire:
        body = json.dumps(spec.body, separators=(",", ":")).encode()
        hdrs = dict(self.base_headers)
        for k, v in (spec.headers or {}).items():
            hdrs[k.lower()] = v
        hdrs["content-type"] = "application/json"
        hdrs["content-length"] = str(len(body))
        hdrs.setdefault("accept", "text/event-stream, application/json")
        head = f"POST {self.path_prefix}{spec.path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        stream = bool(spec.body.get("stream"))
        return _Wire(head.encode("latin-1") + body, spec.hangup_after_chunks, spec.hangup_after_s, spec.idle_timeout_s,
                     stream, f"POST {self.path_prefix}{spec.path}" + (" (stream)" if stream else ""))

    def _cut_in_flight(self, reason: str) -> None:
        """The engine was classified hung: end every request in flight now (on the loop's thread)."""
        for c in list(self.conns):
            if c.rec is not None:
                c.abort(f"cut: {reason}")

    async def _connect(self, timeout_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        sel = _TIMED.get(loop)
        if sel is not None and sel.clock is not self.clock:
            sel = None  # an injected clock: read it per event
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(self.clock, self.t0, self.max_response_bytes, sel),
                                   self.host, self.port),
            timeout_s)
        self.opened += 1
        self.conns.add(conn)
        return conn

    async def send(self, prepared: _Wire, rec: RequestRecord, timeout_s: float) -> None:
        if refused_by_watch(self.watch, prepared.stream, rec, self.clock() - self.t0):
            return
        if self._unhook is None:
            self._unhook = cut_on_hang(self.watch, self._cut_in_flight)
        await self._send(prepared, rec, timeout_s)
        await tell_watch(self.watch, prepared.what, rec)

    async def _send(self, prepared: _Wire, rec: RequestRecord, timeout_s: float) -> None:
        for attempt in (0, 1):
            conn: _Conn | None = None
            while self.idle:
                c = self.idle.pop()
                if not c.closed:
                    conn = c
                    break
                self.conns.discard(c)
            reused = conn is not None
            if conn is None:
                c0 = self.clock()
                try:
                    conn = await self._connect(max(0.0, min(self.connect_timeout_s, timeout_s)))
                except (OSError, asyncio.TimeoutError) as exc:
                    rec.error = f"connect failed: {type(exc).__name__}: {exc}".rstrip(": ")
                    rec.end_s = self.clock() - self.t0
                    return
                rec.connect_s = self.clock() - c0
            rec.reused_connection = reused
            fut = conn.start(rec, prepared.wire, timeout_s, prepared.hang_k, prepared.hang_s, prepared.idle_s)
            try:
                await fut
            except asyncio.CancelledError:
                conn.abort("cancelled: run deadline passed")
                self.conns.discard(conn)
                raise
            if conn.reusable:
                self.idle.append(conn)
            else:
                self.conns.discard(conn)
            if reused and attempt == 0 and conn.lost_early and not rec.hung_up and rec.status == 0:
                rec.error, rec.end_s, rec.sent_s, rec.retried = None, None, None, True
                rec.piece_s.clear()
                rec.pieces.clear()
                continue
            return

    async def aclose(self) -> None:
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        for c in list(self.conns):
            if c.transport is not None and not c.closed:
                c.transport.close()
        self.conns.clear()
        self.idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

