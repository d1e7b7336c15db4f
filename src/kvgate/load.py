"""Timing-accurate load against an OpenAI-compatible endpoint: closed loop and open loop.

Two ways to offer load, both bounded in request count **and** total time (``deadline_s``); both
stop by themselves:

- **closed loop** (:func:`run_closed_loop`): ``concurrency`` workers, each sends its next request
  as soon as its previous one ends, until ``n`` requests were sent or the deadline passed. In
  flight never exceeds ``concurrency``.
- **open loop** (:func:`run_open_loop`): requests are sent at scheduled offsets (Poisson arrivals
  at ``rate_rps`` from a seeded :class:`numpy.random.Generator`, or an explicit schedule),
  whatever the server does. ``max_in_flight`` bounds sockets; when it is reached the schedule
  slips, which shows up as schedule lag.

Every request becomes a :class:`RequestRecord`. Times are **seconds since the run started**, on
the injected monotonic ``clock`` (default :func:`time.perf_counter`): scheduled, sent (request
handed to the kernel), first response byte, every SSE event's arrival, end. The hot path does no
JSON and no SSE parsing: ``data_received`` takes a timestamp, undoes HTTP chunked framing and
keeps ``(t, bytes)``. On the loops :func:`new_event_loop` makes (the sync :func:`closed_loop` /
:func:`open_loop` use one) the timestamp is the instant the poll that found the data returned, so
it does not grow with the number of sockets handled before it in the same batch. After the run,
:meth:`RequestRecord.finalize` splits SSE events, decodes the JSON, and derives first-token time,
tokens, finish reason, usage and errors.

**Schedule lag** is ``sent_s - scheduled_s - connect_s`` (opening a TCP connection is the
server's/network's time, not the client's). A run whose client could not keep its schedule is not
evidence about the server: :meth:`LoadResult.client_kept_up` compares the p99 schedule lag and
the p99 event-loop lag (a ticker that measures how late the loop wakes up; in a closed loop this
is the only starvation signal) with a bound; :meth:`LoadResult.invalid_verdict` turns a miss
into an INVALID :class:`~kvgate.verdict.Verdict`.

Transport: for ``http://`` a small raw asyncio HTTP/1.1 client (:class:`RawHttpTransport`:
``asyncio.Protocol``, keep-alive, chunked decoding, one pool per run, no line-length limits so a
long-context SSE event of any size streams through). Generic HTTP stacks cost ~50 µs of CPU per
streamed chunk and add milliseconds of timestamp error at 64 streams; timing-accurate load is
what kvgate is for, so this one is hand-written. ``https://`` falls back to
:class:`HttpxTransport` (``httpx.AsyncClient``; coarser timing, noted in
:attr:`LoadResult.transport`). A custom transport (tests) implements :class:`LoadTransport`.

Client-side disconnects for the disconnect gate: :attr:`RequestSpec.hangup_after_chunks` (hang up
after k SSE events) and :attr:`RequestSpec.hangup_after_s` (hang up t seconds after sending, also
before any byte came back); such records have ``hung_up=True`` and no error.

Clock and sleep are injectable (``clock=``, ``sleep=``) so scheduling is unit-tested without
sleeping. Timeouts and hang-up timers run on the event loop's own clock.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import json
import math
import re
import selectors
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence
from urllib.parse import urlsplit

import numpy as np

from .client import Endpoint
from .verdict import Status, Verdict

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]

#: A reasonable bound for :meth:`LoadResult.client_kept_up`, seconds. asyncio wakes timers up to
#: ~1 ms late (epoll has millisecond resolution), so bounds below ~3 ms flag healthy runs.
DEFAULT_LAG_BOUND_S = 0.010

#: Body bytes kept per response before the request is failed (guards against a runaway server).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024

_BODY_TEXT_CAP = 1024 * 1024  # chars of a non-SSE body kept as text


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``path``: full request path (``/v1/completions``, with the endpoint's route prefix).
    ``body``: the JSON body (serialised before the run starts). ``headers``: extra headers for
    this request (e.g. ``x-request-id``). ``tag``: a workload label copied to the record
    (``"short"``, ``"long"``). ``hangup_after_chunks``: close the connection after this many SSE
    events. ``hangup_after_s``: close it this many seconds after sending.
    """

    path: str
    body: Mapping[str, Any]
    headers: Mapping[str, str] | None = None
    tag: str = ""
    hangup_after_chunks: int | None = None
    hangup_after_s: float | None = None


def _api(endpoint: Endpoint, route: str) -> str:
    return endpoint.route_prefix.rstrip("/") + route


def completion_request(endpoint: Endpoint, *, model: str, prompt: str | list[int], max_tokens: int,
                       stream: bool = True, include_usage: bool = True, tag: str = "",
                       headers: Mapping[str, str] | None = None, hangup_after_chunks: int | None = None,
                       hangup_after_s: float | None = None, **extra: Any) -> RequestSpec:
    """A ``/completions`` request (streaming with usage by default). ``extra``: more body fields
    (``temperature=0``, ``ignore_eos=True``, ``min_tokens=N``...)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return RequestSpec(_api(endpoint, "/completions"), body, headers, tag, hangup_after_chunks, hangup_after_s)


def chat_request(endpoint: Endpoint, *, model: str, messages: list[dict[str, Any]], max_tokens: int,
                 stream: bool = True, include_usage: bool = True, tag: str = "",
                 headers: Mapping[str, str] | None = None, hangup_after_chunks: int | None = None,
                 hangup_after_s: float | None = None, **extra: Any) -> RequestSpec:
    """A ``/chat/completions`` request (streaming with usage by default)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return RequestSpec(_api(endpoint, "/chat/completions"), body, headers, tag, hangup_after_chunks, hangup_after_s)


# ----------------------------------------------------------------------------- records


@dataclass(eq=False)
class RequestRecord:
    """What happened to one request. All ``*_s`` times: seconds since run start (monotonic).

    Filled on the hot path: ``scheduled_s`` (when it was due), ``sent_s`` (request written to the
    socket), ``connect_s`` (seconds spent opening a new connection; 0 on reuse), ``first_byte_s``
    (first response byte, status line included), ``end_s`` (response complete, error, or hang-up),
    ``status`` (HTTP status; 0 when none came), ``error`` (one line; None when fine),
    ``hung_up`` (the client hung up on purpose).

    Filled by :meth:`finalize` (after the run): ``chunk_s`` (arrival of every SSE event, ``[DONE]``
    included), ``events`` (each event's raw ``data`` text), ``content_s`` (arrival of the events
    that carry generated text), ``first_token_s`` (= ``content_s[0]``), ``tokens`` (usage
    ``completion_tokens`` when the server sent usage, else the number of content events;
    ``tokens_from`` says which), ``finish_reason`` (last non-null), ``usage``, ``done`` (saw
    ``[DONE]``), ``text`` (concatenated deltas), ``body`` (text of a non-SSE response, capped).
    """

    index: int
    scheduled_s: float
    tag: str = ""
    sent_s: float | None = None
    connect_s: float = 0.0
    reused_connection: bool = False
    retried: bool = False
    first_byte_s: float | None = None
    end_s: float | None = None
    status: int = 0
    content_type: str = ""
    error: str | None = None
    hung_up: bool = False
    # derived by finalize()
    chunk_s: list[float] = field(default_factory=list, repr=False)
    events: list[str] = field(default_factory=list, repr=False)
    content_s: list[float] = field(default_factory=list, repr=False)
    first_token_s: float | None = None
    tokens: int | None = None
    tokens_from: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False
    text: str = field(default="", repr=False)
    body: str = field(default="", repr=False)
    undecodable: int = 0
    # hot-path storage: arrival time and bytes of each body piece (HTTP framing removed)
    piece_s: list[float] = field(default_factory=list, repr=False)
    pieces: list[bytes] = field(default_factory=list, repr=False)
    finalized: bool = field(default=False, repr=False)

    @property
    def lag_s(self) -> float | None:
        """Schedule lag, seconds: ``sent_s - scheduled_s - connect_s`` (None if never sent)."""
        if self.sent_s is None:
            return None
        return self.sent_s - self.scheduled_s - self.connect_s

    @property
    def ok(self) -> bool:
        """HTTP 200, no error, not hung up by the client."""
        return self.status == 200 and self.error is None and not self.hung_up

    def finalize(self, keep_pieces: bool = False) -> "RequestRecord":
        """Decode what the hot path stored (SSE events, JSON). Idempotent; returns self.

        ``keep_pieces``: keep the raw body pieces (otherwise dropped to save memory).
        """
        if self.finalized:
            return self
        self.finalized = True
        is_sse = "event-stream" in self.content_type.lower()
        if is_sse:
            # a cut-off last event (hang-up, broken connection) is not an event
            whole = self.error is None and not self.hung_up
            self.chunk_s, self.events = split_sse(self.piece_s, self.pieces, tail=whole)
            self._decode_events()
        else:
            raw = b"".join(self.pieces)
            self.body = raw[: _BODY_TEXT_CAP * 4].decode("utf-8", "replace")[:_BODY_TEXT_CAP]
            self._decode_body()
        if not keep_pieces:
            self.piece_s, self.pieces = [], []
        return self

    def _decode_events(self) -> None:
        parts: list[str] = []
        stream_error: str | None = None
        loads = json.loads
        content_s = self.content_s
        for t, data in zip(self.chunk_s, self.events):
            if data == "[DONE]" or data.strip() == "[DONE]":
                self.done = True
                continue
            try:
                obj = loads(data)
            except ValueError:
                self.undecodable += 1
                continue
            if not isinstance(obj, dict):
                self.undecodable += 1
                continue
            if "error" in obj:
                stream_error = stream_error or _error_text(obj)
                continue
            if isinstance(obj.get("usage"), dict):
                self.usage = obj["usage"]
            has_content = False
            for ch in obj.get("choices") or ():
                if not isinstance(ch, dict):
                    continue
                if ch.get("finish_reason"):
                    self.finish_reason = str(ch["finish_reason"])
                delta = ch.get("delta")
                # A decode step is an event whose choice carries a text field, even an empty one:
                # a byte-level tokenizer emits tokens that do not complete a character yet (vLLM
                # then streams "text": ""). Only chat's opening role announcement is not a token.
                if isinstance(delta, dict):
                    piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    step = isinstance(delta.get("content"), str) and not (delta.get("role") and not delta["content"])
                    if delta.get("tool_calls") or piece or step:
                        has_content = True
                else:
                    piece = ch.get("text")
                    if isinstance(piece, str):
                        has_content = True
                if isinstance(piece, str) and piece:
                    parts.append(piece)
                    has_content = True
            if has_content:
                content_s.append(t)
        self.text = "".join(parts)
        if self.content_s:
            self.first_token_s = self.content_s[0]
        self._set_tokens(len(self.content_s))
        if self.error is None and not self.hung_up:
            if self.status != 200:
                self.error = f"HTTP {self.status}"
            elif stream_error is not None:
                self.error = f"stream error: {stream_error}"
            elif self.undecodable:
                self.error = f"{self.undecodable} undecodable SSE event(s)"

    def _decode_body(self) -> None:
        obj: Any = None
        try:
            obj = json.loads(self.body) if self.body else None
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            if isinstance(obj.get("usage"), dict):
                self.usage = obj["usage"]
            parts = []
            for ch in obj.get("choices") or ():
                if isinstance(ch, dict):
                    if ch.get("finish_reason"):
                        self.finish_reason = str(ch["finish_reason"])
                    msg = ch.get("message")
                    piece = msg.get("content") if isinstance(msg, dict) else ch.get("text")
                    if isinstance(piece, str):
                        parts.append(piece)
            self.text = "".join(parts)
        self._set_tokens(None)
        if self.error is None and self.status and self.status != 200:
            msg = _error_text(obj) if isinstance(obj, dict) else self.body[:200]
            self.error = f"HTTP {self.status}: {msg}".strip()
        elif self.error is None and self.status == 200 and self.sent_s is not None and not self.hung_up \
                and obj is None:
            self.error = "HTTP 200 with a body that is neither SSE nor JSON"

    def _set_tokens(self, counted: int | None) -> None:
        u = self.usage
        if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
            self.tokens, self.tokens_from = u["completion_tokens"], "usage"
        elif counted is not None:
            self.tokens, self.tokens_from = counted, "chunks"

    def row(self) -> dict[str, Any]:
        """One flat, JSON/CSV-friendly row (times in seconds since run start)."""
        return {
            "index": self.index, "tag": self.tag, "scheduled_s": self.scheduled_s, "sent_s": self.sent_s,
            "lag_s": self.lag_s, "connect_s": self.connect_s, "first_byte_s": self.first_byte_s,
            "first_token_s": self.first_token_s, "end_s": self.end_s, "status": self.status,
            "chunks": len(self.chunk_s), "tokens": self.tokens, "finish_reason": self.finish_reason,
            "done": self.done, "hung_up": self.hung_up, "error": self.error,
        }


def _error_text(obj: Any) -> str:
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:200]
        if isinstance(err, str):
            return err[:200]
    return str(obj)[:200]


_SSE_BOUNDARY = re.compile(rb"\r?\n\r?\n")


def split_sse(piece_s: Sequence[float], pieces: Sequence[bytes],
              tail: bool = True) -> tuple[list[float], list[str]]:
    """Split body pieces into SSE events; return (arrival time of each event, its ``data``).

    An event's time is the arrival of the piece that completed it (its blank line). Multi-line
    ``data`` fields are joined with ``\\n``; events without data (comments, ``: ping``) are
    skipped; a trailing event without its blank line counts (at the last piece's time) when
    ``tail`` is true — pass False for a body that was cut off.
    """
    if not pieces:
        return [], []
    body = b"".join(pieces)
    ends: list[int] = []
    acc = 0
    for p in pieces:
        acc += len(p)
        ends.append(acc)
    times: list[float] = []
    datas: list[str] = []
    last = len(pieces) - 1

    def take(block: bytes, t: float) -> None:
        if block.startswith(b"data: ") and b"\n" not in block:  # the usual one-line event
            times.append(t)
            datas.append(block[6:].decode("utf-8", "replace"))
            return
        lines = [ln.rstrip(b"\r") for ln in block.split(b"\n")]
        data = [ln[6:] if ln.startswith(b"data: ") else ln[5:] for ln in lines if ln.startswith(b"data:")]
        if data:
            times.append(t)
            datas.append(b"\n".join(data).decode("utf-8", "replace"))

    if b"\r" not in body:  # fast path: split on blank lines, walk the pieces alongside
        blocks = body.split(b"\n\n")
        rest = blocks.pop()
        pos, i = 0, 0
        for block in blocks:
            pos += len(block) + 2
            while ends[i] < pos:  # the piece holding the boundary's last byte (offset pos - 1)
                i += 1
            if block:
                take(block, piece_s[i])
    else:
        start = 0
        for m in _SSE_BOUNDARY.finditer(body):
            i = bisect.bisect_right(ends, m.end() - 1)
            take(body[start:m.start()], piece_s[min(i, last)])
            start = m.end()
        rest = body[start:]
    if tail and rest.strip():
        take(rest, piece_s[last])
    return times, datas


# ----------------------------------------------------------------------------- event loop


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


def _run_sync(coro: Any) -> Any:
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(coro)
    loop = new_event_loop()  # pragma: no cover - Python 3.10
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# ----------------------------------------------------------------------------- transports


class LoadTransport(Protocol):
    """How a run sends requests. ``bind`` is called once before the run with the clock, the run's
    start (clock units) and the most connections the run will hold; ``prepare`` once per spec
    before the clock starts (serialise off the hot path); ``send`` fills ``rec`` and returns
    (never raises, except ``asyncio.CancelledError``); ``aclose`` after the run."""

    name: str

    def bind(self, clock: Clock, t0: float, max_connections: int) -> None: ...

    def prepare(self, spec: RequestSpec) -> Any: ...

    async def send(self, prepared: Any, rec: RequestRecord, timeout_s: float) -> None: ...

    async def aclose(self) -> None: ...


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
              hang_s: float | None) -> asyncio.Future[None]:
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
                    if n - pos > 1024:
                        self._fail(t, "chunk size line longer than 1 KiB")
                    else:
                        self.cbuf = data[pos:]
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
                        if n - pos > 65536:
                            self._fail(t, "chunked trailers larger than 64 KiB")
                        else:
                            self.cbuf = data[pos:]
                        return
                    pos = j + 4
                if pos < n:
                    self.keep_alive = False  # bytes after the response: do not reuse
                self._finish(t, None, complete=True)
                return

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
        return _Wire(head.encode("latin-1") + body, spec.hangup_after_chunks, spec.hangup_after_s)

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
            fut = conn.start(rec, prepared.wire, timeout_s, prepared.hang_k, prepared.hang_s)
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
        for c in list(self.conns):
            if c.transport is not None and not c.closed:
                c.transport.close()
        self.conns.clear()
        self.idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


class HttpxTransport:
    """Fallback for ``https://`` (and anything the raw client does not speak): ``httpx.AsyncClient``.

    Same records; timestamps are taken when httpx hands bytes over, which adds its own parsing
    delay (~ms at high concurrency). ``verify``: TLS verification (httpx semantics).
    """

    name = "httpx"

    def __init__(self, endpoint: Endpoint, *, connect_timeout_s: float = 10.0, verify: Any = True,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.verify = verify
        self.max_response_bytes = max_response_bytes
        self.client: Any = None
        self.clock: Clock = time.perf_counter
        self.t0 = 0.0

    def bind(self, clock: Clock, t0: float, max_connections: int) -> None:
        import httpx

        self.clock, self.t0 = clock, t0
        self.client = httpx.AsyncClient(
            base_url=self.endpoint.base_url.rstrip("/"), headers=self.endpoint.headers(), verify=self.verify,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(None, connect=self.connect_timeout_s))

    def prepare(self, spec: RequestSpec) -> tuple[RequestSpec, bytes]:
        return spec, json.dumps(spec.body, separators=(",", ":")).encode()

    async def send(self, prepared: tuple[RequestSpec, bytes], rec: RequestRecord, timeout_s: float) -> None:
        import httpx

        spec, body = prepared
        hang_k = spec.hangup_after_chunks or 0

        async def go() -> None:
            headers = {"content-type": "application/json", **(spec.headers or {})}
            rec.sent_s = self.clock() - self.t0
            async with self.client.stream("POST", spec.path, content=body, headers=headers) as r:
                t = self.clock() - self.t0
                rec.first_byte_s = t
                rec.status = r.status_code
                rec.content_type = r.headers.get("content-type", "")
                seen, nbytes = 0, 0
                async for b in r.aiter_bytes():
                    t = self.clock() - self.t0
                    rec.piece_s.append(t)
                    rec.pieces.append(b)
                    nbytes += len(b)
                    if nbytes > self.max_response_bytes:
                        rec.error = f"response larger than {self.max_response_bytes} bytes"
                        break
                    if hang_k:
                        seen += b.count(b"\n\n")
                        if seen >= hang_k:
                            rec.hung_up = True
                            break

        budget = timeout_s if spec.hangup_after_s is None else min(timeout_s, spec.hangup_after_s)
        try:
            await asyncio.wait_for(go(), max(0.0, budget))
        except asyncio.TimeoutError:
            if spec.hangup_after_s is not None and spec.hangup_after_s <= timeout_s:
                rec.hung_up = True
            else:
                rec.error = f"timeout: no complete response within {timeout_s:.3g} s"
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            rec.error = f"connect failed: {type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.end_s = self.clock() - self.t0

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


def make_transport(endpoint: Endpoint, **kw: Any) -> LoadTransport:
    """The raw HTTP/1.1 transport for ``http://``, httpx for anything else (``https://``)."""
    if urlsplit(endpoint.base_url).scheme == "http":
        return RawHttpTransport(endpoint, **kw)
    return HttpxTransport(endpoint, **kw)


# ----------------------------------------------------------------------------- results


@dataclass
class LoadResult:
    """A finished run.

    ``records``: one per request that was sent (in send order); ``n_requested``: how many were
    asked for (fewer are sent when the deadline passes first: ``deadline_hit``). ``wall_s``:
    seconds from run start to the last request's end. ``loop_lag_s``: event-loop lag samples,
    seconds (how late a periodic ticker woke up). ``cpu_s``: process CPU seconds during the run
    (all threads of this process). ``transport``: which client sent the requests.
    """

    mode: str
    records: list[RequestRecord]
    n_requested: int
    wall_s: float
    deadline_s: float
    deadline_hit: bool = False
    concurrency: int | None = None
    rate_rps: float | None = None
    loop_lag_s: list[float] = field(default_factory=list, repr=False)
    cpu_s: float = 0.0
    transport: str = ""
    connections_opened: int | None = None

    @property
    def lags_s(self) -> list[float]:
        """Schedule lag of every sent request, seconds."""
        return [lag for r in self.records if (lag := r.lag_s) is not None]

    @property
    def max_lag_s(self) -> float:
        return max(self.lags_s, default=0.0)

    @property
    def p99_lag_s(self) -> float:
        lags = self.lags_s
        return float(np.percentile(lags, 99)) if lags else 0.0

    @property
    def max_loop_lag_s(self) -> float:
        return max(self.loop_lag_s, default=0.0)

    @property
    def p99_loop_lag_s(self) -> float:
        return float(np.percentile(self.loop_lag_s, 99)) if self.loop_lag_s else 0.0

    @property
    def chunks(self) -> int:
        """SSE events received, all requests."""
        return sum(len(r.chunk_s) for r in self.records)

    def client_kept_up(self, bound_s: float = DEFAULT_LAG_BOUND_S, q: float = 99.0) -> bool:
        """True when the ``q``-th percentile of the schedule lag **and** of the event-loop lag are
        both within ``bound_s`` seconds (``q=100`` checks the maximum), and no request missed
        its slot because the deadline passed first."""
        lags = self.lags_s
        sched = float(np.percentile(lags, q)) if lags else 0.0
        loop = float(np.percentile(self.loop_lag_s, q)) if self.loop_lag_s else 0.0
        return sched <= bound_s and loop <= bound_s

    def invalid_verdict(self, gate: str, bound_s: float = DEFAULT_LAG_BOUND_S, q: float = 99.0) -> Verdict | None:
        """An INVALID verdict when the client fell behind (see :meth:`client_kept_up`), else None."""
        if self.client_kept_up(bound_s, q):
            return None
        lags = self.lags_s
        sched = float(np.percentile(lags, q)) if lags else 0.0
        loop = float(np.percentile(self.loop_lag_s, q)) if self.loop_lag_s else 0.0
        return Verdict(
            gate, Status.INVALID,
            f"client fell behind its schedule: p{q:g} schedule lag {sched * 1e3:.1f} ms, "
            f"event-loop lag {loop * 1e3:.1f} ms > bound {bound_s * 1e3:.1f} ms -> INVALID",
            measured=f"{max(sched, loop) * 1e3:.1f} ms", limit=f"{bound_s * 1e3:.1f} ms",
            evidence={"p_schedule_lag_s": sched, "p_loop_lag_s": loop, "max_schedule_lag_s": self.max_lag_s,
                      "max_loop_lag_s": self.max_loop_lag_s, "q": q, "mode": self.mode,
                      "n_sent": len(self.records), "n_requested": self.n_requested, "cpu_s": self.cpu_s})

    def rows(self) -> list[dict[str, Any]]:
        """Per-request rows (see :meth:`RequestRecord.row`)."""
        return [r.row() for r in self.records]


# ----------------------------------------------------------------------------- scheduling


def poisson_offsets(n: int, rate_rps: float, rng: np.random.Generator | int | None = 0) -> list[float]:
    """Arrival offsets (seconds from run start) of ``n`` Poisson arrivals at ``rate_rps`` req/s.

    The first request is due at 0; gaps are exponential with mean ``1/rate_rps``. ``rng``: a
    :class:`numpy.random.Generator` or a seed (same seed -> same schedule). ``rate_rps=inf``: all
    at 0 (a burst).
    """
    if n <= 0:
        return []
    if rate_rps <= 0:
        raise ValueError("rate_rps must be > 0")
    if math.isinf(rate_rps):
        return [0.0] * n
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    gaps = gen.exponential(1.0 / rate_rps, size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def _specs(requests: RequestSpec | Sequence[RequestSpec], n: int | None) -> list[RequestSpec]:
    if isinstance(requests, RequestSpec):
        if n is None:
            raise ValueError("n is required with a single RequestSpec")
        return [requests] * n
    reqs = list(requests)
    if not reqs:
        raise ValueError("no requests")
    if n is None:
        return reqs
    return [reqs[i % len(reqs)] for i in range(n)]


async def _monitor(interval_s: float, out: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(interval_s)
        out.append(max(0.0, loop.time() - t - interval_s))


async def _run(mode: str, endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec],
               n: int | None, *, concurrency: int | None, offsets: list[float] | None, rate_rps: float | None,
               max_in_flight: int, deadline_s: float, request_timeout_s: float | None, clock: Clock,
               sleep: Sleep, transport: LoadTransport | None, loop_monitor_s: float | None,
               freeze_gc: bool) -> LoadResult:
    specs = _specs(requests, n)
    if deadline_s <= 0:
        raise ValueError("deadline_s must be > 0")
    if transport is None:
        if endpoint is None:
            raise ValueError("endpoint or transport is required")
        transport = make_transport(endpoint)
    prepared: list[Any] = []
    cache: dict[int, Any] = {}
    for s in specs:  # serialise every body before the clock starts
        if id(s) not in cache:
            cache[id(s)] = transport.prepare(s)
        prepared.append(cache[id(s)])
    req_timeout = deadline_s if request_timeout_s is None else request_timeout_s
    width = concurrency if mode == "closed" else max_in_flight
    records: list[RequestRecord] = []
    lag_samples: list[float] = []
    state = {"deadline_hit": False}
    if freeze_gc:  # older objects out of the collector's way: no long gen-2 pauses mid-run
        gc.collect()
        gc.freeze()
    cpu0 = time.process_time()
    t0 = clock()
    deadline = t0 + deadline_s
    transport.bind(clock, t0, max(1, int(width or 1)))
    monitor = asyncio.ensure_future(_monitor(loop_monitor_s, lag_samples)) if loop_monitor_s else None

    async def one(i: int, rec: RequestRecord) -> None:
        left = deadline - clock()
        await transport.send(prepared[i], rec, min(req_timeout, left))
        if left < req_timeout and rec.error is not None and rec.error.startswith("timeout"):
            state["deadline_hit"] = True  # cut short by the run deadline, not by its own timeout

    async def closed_worker(it: Any) -> None:
        for i in it:
            now = clock()
            if now >= deadline:
                state["deadline_hit"] = True
                return
            rec = RequestRecord(index=i, scheduled_s=now - t0, tag=specs[i].tag)
            records.append(rec)
            await one(i, rec)

    async def open_dispatcher() -> None:
        assert offsets is not None
        sem = asyncio.Semaphore(max_in_flight)
        tasks: set[asyncio.Task[None]] = set()

        async def run_one(i: int, rec: RequestRecord) -> None:
            try:
                await one(i, rec)
            finally:
                sem.release()

        try:
            for i in range(len(specs)):
                due = t0 + offsets[i]
                delay = due - clock()
                if due >= deadline:
                    state["deadline_hit"] = True
                    break
                if delay > 0:
                    await sleep(delay)
                await sem.acquire()
                if clock() >= deadline:
                    sem.release()
                    state["deadline_hit"] = True
                    break
                rec = RequestRecord(index=i, scheduled_s=offsets[i], tag=specs[i].tag)
                records.append(rec)
                task = asyncio.ensure_future(run_one(i, rec))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(0)  # let it write its request before the next wait is computed
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    if mode == "closed":
        it = iter(range(len(specs)))
        jobs = [asyncio.ensure_future(closed_worker(it)) for _ in range(max(1, int(concurrency or 1)))]
    else:
        jobs = [asyncio.ensure_future(open_dispatcher())]
    try:
        # Safety net in real time: every request already carries a timeout within the deadline.
        _, pending = await asyncio.wait(jobs, timeout=deadline_s + 5.0)
        if pending:
            state["deadline_hit"] = True
            for j in pending:
                j.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for j in jobs:
            if not j.cancelled() and j.exception() is not None:
                raise j.exception()  # type: ignore[misc]
    finally:
        if monitor is not None:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
        t_end = clock()
        cpu_s = time.process_time() - cpu0
        await transport.aclose()
        if freeze_gc:
            gc.unfreeze()
    for r in records:  # off the hot path: decode SSE and JSON now
        if r.end_s is None:
            r.end_s = t_end - t0
            r.error = r.error or "not finished when the run ended"
        r.finalize()
    ends = [r.end_s for r in records if r.end_s is not None]
    return LoadResult(
        mode=mode, records=records, n_requested=len(specs), wall_s=max(ends, default=t_end - t0),
        deadline_s=deadline_s, deadline_hit=state["deadline_hit"], concurrency=concurrency, rate_rps=rate_rps,
        loop_lag_s=lag_samples, cpu_s=cpu_s, transport=getattr(transport, "name", type(transport).__name__),
        connections_opened=getattr(transport, "opened", None))


async def run_closed_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                          concurrency: int, n: int | None = None, deadline_s: float = 600.0,
                          request_timeout_s: float | None = None, clock: Clock = time.perf_counter,
                          sleep: Sleep = asyncio.sleep, transport: LoadTransport | None = None,
                          loop_monitor_s: float | None = 0.005, freeze_gc: bool = True) -> LoadResult:
    """Closed loop: ``concurrency`` workers send ``n`` requests in total (or one per spec).

    ``requests``: one spec (repeated ``n`` times) or a sequence (cycled to ``n``). A request's
    ``scheduled_s`` is when its worker became free. ``deadline_s``: the whole run's budget,
    seconds; no request starts after it and every request times out by it.
    ``request_timeout_s``: per request, seconds (default: the deadline). ``loop_monitor_s``:
    event-loop lag ticker period, seconds (None: off). ``freeze_gc``: collect, then
    :func:`gc.freeze` the heap for the run, so no long full collection pauses the timestamps.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return await _run("closed", endpoint, requests, n, concurrency=concurrency, offsets=None, rate_rps=None,
                      max_in_flight=concurrency, deadline_s=deadline_s, request_timeout_s=request_timeout_s,
                      clock=clock, sleep=sleep, transport=transport, loop_monitor_s=loop_monitor_s,
                      freeze_gc=freeze_gc)


async def run_open_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                        rate_rps: float | None = None, n: int | None = None,
                        rng: np.random.Generator | int | None = 0, offsets_s: Sequence[float] | None = None,
                        max_in_flight: int = 512, deadline_s: float = 600.0,
                        request_timeout_s: float | None = None, clock: Clock = time.perf_counter,
                        sleep: Sleep = asyncio.sleep, transport: LoadTransport | None = None,
                        loop_monitor_s: float | None = 0.005, freeze_gc: bool = True) -> LoadResult:
    """Open loop: requests sent at Poisson arrivals of ``rate_rps`` req/s (seeded by ``rng``), or
    at the explicit ``offsets_s`` (seconds from run start), whatever the server does.

    ``max_in_flight``: most requests outstanding at once (sockets); when reached, the schedule
    slips and the lag shows it. Other arguments as in :func:`run_closed_loop`.
    """
    specs_n = len(_specs(requests, n))
    if offsets_s is not None:
        offs = [float(x) for x in offsets_s]
        if len(offs) < specs_n:
            raise ValueError(f"offsets_s has {len(offs)} entries for {specs_n} requests")
        offs = offs[:specs_n]
    elif rate_rps is not None:
        offs = poisson_offsets(specs_n, rate_rps, rng)
    else:
        raise ValueError("rate_rps or offsets_s is required")
    return await _run("open", endpoint, requests, n, concurrency=None, offsets=offs, rate_rps=rate_rps,
                      max_in_flight=max_in_flight, deadline_s=deadline_s, request_timeout_s=request_timeout_s,
                      clock=clock, sleep=sleep, transport=transport, loop_monitor_s=loop_monitor_s,
                      freeze_gc=freeze_gc)


def closed_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], **kw: Any) -> LoadResult:
    """Synchronous :func:`run_closed_loop` on its own :func:`new_event_loop`."""
    return _run_sync(run_closed_loop(endpoint, requests, **kw))


def open_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], **kw: Any) -> LoadResult:
    """Synchronous :func:`run_open_loop` on its own :func:`new_event_loop`."""
    return _run_sync(run_open_loop(endpoint, requests, **kw))


__all__ = [
    "DEFAULT_LAG_BOUND_S", "HttpxTransport", "LoadResult", "LoadTransport", "RawHttpTransport", "RequestRecord",
    "RequestSpec", "chat_request", "closed_loop", "completion_request", "make_transport", "new_event_loop", "open_loop",
    "poisson_offsets", "run_closed_loop", "run_open_loop", "split_sse",
]
