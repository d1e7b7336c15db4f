"""One request: what is sent (:class:`RequestSpec`) and what happened to it (:class:`RequestRecord`).

Times are **seconds since the run started**, on the run's monotonic clock (default
:func:`time.perf_counter`): scheduled, sent (request handed to the kernel), first response byte,
every SSE event's arrival, end. The transports fill only what the hot path can afford —
timestamps, the status line and ``(t, bytes)`` body pieces with the HTTP framing removed; no JSON
and no SSE parsing. After the run, :meth:`RequestRecord.finalize` splits the pieces into SSE events
(:func:`split_sse`: an event's time is the arrival of the piece that completed it), has
:func:`kvgate.http.sse.classify` decide what each event is, and derives first-token time, tokens,
finish reason, usage and errors from that.

Client-side disconnects for the disconnect gate: :attr:`RequestSpec.hangup_after_chunks` (hang up
after k SSE events) and :attr:`RequestSpec.hangup_after_s` (hang up t seconds after sending, also
before any byte came back); such records have ``hung_up=True`` and no error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvgate.http.client import Endpoint, KvClient
from kvgate.http.extensions import PROBE_TIMEOUT_S
from kvgate.http.sse import DONE, ERROR, MALFORMED, classify, error_text, split_sse  # the one SSE framer

_BODY_TEXT_CAP = 1024 * 1024  # chars of a non-SSE body kept as text


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``path``: full request path (``/v1/completions``, with the endpoint's route prefix).
    ``body``: the JSON body (serialised before the run starts). ``headers``: extra headers for
    this request (e.g. ``x-request-id``). ``tag``: a workload label copied to the record
    (``"short"``, ``"long"``). ``hangup_after_chunks``: close the connection after this many SSE
    events. ``hangup_after_s``: close it this many seconds after sending. ``idle_timeout_s``: cut
    the request, as the gateway in front would, once no byte has arrived for this many seconds
    (before the first byte included); it then counts as failed with error ``"idle timeout: ..."``
    (the profile's ``limits.stream_idle_timeout_s``; None: no idle cut).
    """

    path: str
    body: Mapping[str, Any]
    headers: Mapping[str, str] | None = None
    tag: str = ""
    hangup_after_chunks: int | None = None
    hangup_after_s: float | None = None
    idle_timeout_s: float | None = None


def _api(endpoint: Endpoint, route: str) -> str:
    return endpoint.route_prefix.rstrip("/") + route


def _body(body: dict[str, Any], stream: bool, include_usage: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
    body["stream"] = stream
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def _portable(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as this server takes it: a vLLM extension it refuses left out where the request has a
    portable form (``ignore_eos``: the load is judged on what came back; :mod:`kvgate.http.extensions`)."""
    ext = endpoint.extensions
    return ext.portable(body, lambda: KvClient(endpoint, timeout_s=PROBE_TIMEOUT_S)) if ext is not None else body


def completion_request(endpoint: Endpoint, *, model: str, prompt: str | list[int], max_tokens: int,
                       stream: bool = True, include_usage: bool = True, tag: str = "",
                       headers: Mapping[str, str] | None = None, hangup_after_chunks: int | None = None,
                       hangup_after_s: float | None = None, **extra: Any) -> RequestSpec:
    """A ``/completions`` request (streaming with usage by default). ``extra``: more body fields
    (``temperature=0``, ``ignore_eos=True``, ``min_tokens=N``...)."""
    body = _body({"model": model, "prompt": prompt, "max_tokens": max_tokens}, stream, include_usage, extra)
    return RequestSpec(_api(endpoint, "/completions"), _portable(endpoint, body), headers, tag, hangup_after_chunks,
                       hangup_after_s)


def chat_request(endpoint: Endpoint, *, model: str, messages: list[dict[str, Any]], max_tokens: int,
                 stream: bool = True, include_usage: bool = True, tag: str = "",
                 headers: Mapping[str, str] | None = None, hangup_after_chunks: int | None = None,
                 hangup_after_s: float | None = None, **extra: Any) -> RequestSpec:
    """A ``/chat/completions`` request (streaming with usage by default)."""
    body = _body({"model": model, "messages": messages, "max_tokens": max_tokens}, stream, include_usage, extra)
    return RequestSpec(_api(endpoint, "/chat/completions"), _portable(endpoint, body), headers, tag,
                       hangup_after_chunks, hangup_after_s)


# ----------------------------------------------------------------------------- records


@dataclass(eq=False)
class RequestRecord:
    """What happened to one request. All ``*_s`` times: seconds since run start (monotonic).

    Filled on the hot path: ``scheduled_s`` (when it was due), ``sent_s`` (request written to the
    socket), ``connect_s`` (seconds spent opening a new connection; 0 on reuse), ``first_byte_s``
    (first response byte, status line included), ``end_s`` (response complete, error, or hang-up),
    ``status`` (HTTP status; 0 when none came), ``error`` (one line; None when fine),
    ``hung_up`` (the client hung up on purpose), ``censored`` (cut by kvgate's own time bound -- the
run's deadline, not the request's own timeout nor the server: neither ok nor an error; its
``error`` says what was cut, and the latency samples treat it as right-censored at its elapsed
time, :func:`kvgate.load.sampling.slo_samples`).

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
    censored: bool = False
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

    def shift(self, dt_s: float) -> "RequestRecord":
        """Move every time of this record by ``dt_s`` seconds (to put records of runs started at
        different moments on one time base: the time since the first run's start). Returns self."""
        for name in ("scheduled_s", "sent_s", "first_byte_s", "end_s", "first_token_s"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, v + dt_s)
        for name in ("chunk_s", "content_s", "piece_s"):
            setattr(self, name, [t + dt_s for t in getattr(self, name)])
        return self

    @property
    def lag_s(self) -> float | None:
        """Schedule lag, seconds: ``sent_s - scheduled_s - connect_s`` (None if never sent)."""
        if self.sent_s is None:
            return None
        return self.sent_s - self.scheduled_s - self.connect_s

    @property
    def ok(self) -> bool:
        """HTTP 200, no error, not hung up by the client (a censored record is not ok)."""
        return self.status == 200 and self.error is None and not self.hung_up and not self.censored

    @property
    def failed(self) -> bool:
        """An error the server (or the path to it) is answerable for: not ok, not hung up on
        purpose, not censored by kvgate's own deadline."""
        return not self.ok and not self.hung_up and not self.censored

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
        """Fold the events (:func:`kvgate.http.sse.classify` says what each is): ``[DONE]`` sets
        ``done``; an error event fails the record (the first one's text); a malformed event counts
        in ``undecodable``; a chunk that is a decode step (text, even empty; not chat's role
        announcement) adds its arrival to ``content_s``. Events after ``[DONE]`` are decoded too."""
        parts: list[str] = []
        stream_error: str | None = None
        content_s = self.content_s
        for t, data in zip(self.chunk_s, self.events):
            ev = classify(data)
            kind = ev.kind
            if kind == DONE:
                self.done = True
                continue
            if kind == MALFORMED:
                self.undecodable += 1
                continue
            if kind == ERROR:
                stream_error = stream_error or ev.error_text
                continue
            if ev.usage is not None:
                self.usage = ev.usage
            step = False
            for ch in ev.choices:
                if ch.finish_reason:
                    self.finish_reason = ch.finish_reason
                piece = ch.piece
                if piece:
                    parts.append(piece)
                step = step or ch.step
            if step:
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
            msg = error_text(obj if isinstance(obj, dict) else self.body)  # one line, cut at a word
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
            "done": self.done, "hung_up": self.hung_up, "censored": self.censored, "error": self.error,
        }


