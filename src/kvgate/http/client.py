"""HTTP/SSE client for OpenAI-compatible servers, with per-chunk monotonic timestamps.

Everything the gates need from a server goes through :class:`KvClient`, which never raises on a
bad *answer* (status, body) — it returns :class:`Reply` / :class:`StreamReply` so a gate can turn
garbage into a conformance FAIL. It raises only :class:`EndpointUnreachable` when nothing answers
at all (connection refused, DNS, TLS, connect timeout), with a one-line message.

Transport and clock are injectable (``transport=`` an ``httpx.BaseTransport``, ``clock=`` a
function returning seconds), so unit tests run against ``httpx.MockTransport`` without sleeping.

An endpoint that carries the run's :class:`~kvgate.http.watch.EngineWatch` (``Endpoint.watch``)
gets the watch's rule (see :mod:`kvgate.http.watch`): a request that passes its deadline makes the
watch check the engine once; once it is classified hung every send returns at once with
``status 0`` and ``not sent: ...`` as its text, without touching the network; a stream silent for
``stream_idle_timeout_s`` after its first event is cut there and classifies the server as stalling
streams, after which streamed sends are refused the same way (the wait for the first event is the
TTFT the gates judge, bounded by the request's timeout).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import httpx

from kvgate.report.redact import redact_url
from kvgate.http.sse import DONE, classify, error_message, is_done
from kvgate.http.sse import iter_data as iter_sse_data  # the one SSE framer, by its old name
from kvgate.http.text import clip  # the one clipping rule; re-exported for the gates

if TYPE_CHECKING:
    from kvgate.http.extensions import Extensions
    from kvgate.http.watch import EngineWatch

Clock = Callable[[], float]


def _sent_bytes(request: httpx.Request) -> int | None:
    """Bytes of ``request``'s body as sent (None for a streamed body httpx has not kept)."""
    try:
        return len(request.content)
    except httpx.RequestNotRead:
        return None


class EndpointUnreachable(Exception):
    """No HTTP answer at all from the endpoint. ``str()`` is one line naming the URL and cause."""


@dataclass(frozen=True)
class Endpoint:
    """Where a server is and how to authenticate.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), ``route_prefix`` the OpenAI route
    prefix (``/v1``; KServe uses ``/openai/v1``). ``api_key`` is a secret: it is excluded from
    ``repr`` and never written to any report.
    """

    base_url: str
    route_prefix: str = "/v1"
    api_key: str | None = field(default=None, repr=False)
    host_header: str | None = None
    managed: bool = False  # True when kvgate launched the server itself
    #: A local Hugging Face tokenizer (the profile's ``model.tokenizer``) for servers without
    #: ``/tokenize`` (KServe's Hugging Face runtime): exact-length chat prompts are counted with it.
    tokenizer: str | None = None
    #: The run's record of the engine's condition (:class:`kvgate.http.watch.EngineWatch`), shared by
    #: every client of this endpoint; None outside a run (no watch, no refusals).
    watch: "EngineWatch | None" = field(default=None, repr=False, compare=False)
    #: The run's record of which vLLM request extensions the server refuses
    #: (:class:`kvgate.http.extensions.Extensions`), shared like ``watch``; None outside a run (sent as is).
    extensions: "Extensions | None" = field(default=None, repr=False, compare=False)
    #: Pids of the local process tree(s) serving this endpoint (the embedded vLLM kvgate launched,
    #: :mod:`kvgate.run.lifecycle`); empty for ``--endpoint``. The load gates measure host
    #: contention on their CPUs (:mod:`kvgate.host.contention`).
    server_pids: tuple[int, ...] = field(default=(), compare=False)
    #: The command line of the server kvgate launched, as its launcher rendered it
    #: (:func:`kvgate.launch.local.render_command`: the embedded vLLM's argv, the docker container's
    #: entrypoint); empty for ``--endpoint``. ``deployment/served-config`` reads it back.
    server_argv: tuple[str, ...] = field(default=(), compare=False)
    #: Which launcher started the server (``"embedded"``, ``"docker"``); None for ``--endpoint``.
    launched_by: str | None = None
    #: The memory peak of the launched server's process tree while it loaded the model
    #: (:class:`kvgate.host.peak.MemoryPeak`, sampled by its launcher); None for ``--endpoint`` or
    #: where no tree was visible. ``deployment/memory-peak`` holds the container's limit to it.
    load_peak: Any = field(default=None, compare=False)

    @property
    def display(self) -> str:
        """The URL as reports show it (credentials in the URL masked)."""
        return redact_url(self.base_url.rstrip("/") + self.route_prefix)

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if self.host_header:
            h["Host"] = self.host_header
        return h


@dataclass
class Reply:
    """A non-streamed answer. ``elapsed_s``: seconds from send to full body (monotonic)."""

    status: int
    text: str
    elapsed_s: float
    headers: dict[str, str] = field(default_factory=dict)
    #: The request body's size in bytes as sent (None: nothing was sent, or unknown).
    sent_bytes: int | None = None
    #: The response body's size in bytes as received (None: unknown). ``len(text.encode())`` is
    #: not it: bytes that are not UTF-8 decode to U+FFFD, 3 bytes each (a 512-byte binary body read
    #: as "970 bytes").
    body_bytes: int | None = None

    @property
    def json(self) -> Any:
        """Parsed body, or ``None`` when the body is not JSON."""
        try:
            return json.loads(self.text)
        except (ValueError, TypeError):
            return None

    @property
    def error_message(self) -> str:
        """``error.message`` of an OpenAI-style error body (whole), else the body on one line, cut
        at a word with an ellipsis after 200 characters (see :func:`clip`)."""
        msg = error_message(self.json)
        return msg if msg is not None else clip(self.text, 200)


@dataclass
class StreamReply:
    """A streamed (SSE) answer.

    ``events``: ``(t, data)`` pairs, ``t`` seconds since the request was sent (monotonic),
    ``data`` the text after ``data:`` (``"[DONE]"`` included as it came). ``first_byte_s``: time of
    the first body byte. ``status``/``text``: the HTTP status and, for non-200, the body.
    ``transport_error``: set when the connection broke mid-stream (then ``done`` is False).
    """

    status: int
    events: list[tuple[float, str]] = field(default_factory=list)
    text: str = ""
    first_byte_s: float | None = None
    elapsed_s: float = 0.0
    transport_error: str | None = None
    #: Seconds of silence when the stream was cut at the stream idle timeout, else None.
    idle_cut_s: float | None = None

    @property
    def done(self) -> bool:
        """Whether the stream ended with ``data: [DONE]`` (:func:`kvgate.http.sse.is_done`)."""
        return bool(self.events) and is_done(self.events[-1][1])

    def chunks(self) -> list[tuple[float, Any]]:
        """``(t, object)`` of each event as :func:`kvgate.http.sse.classify` decodes it
        (``[DONE]`` excluded); an event that is not a JSON object appears as its ``str`` data."""
        out: list[tuple[float, Any]] = []
        for t, data in self.events:
            ev = classify(data)
            if ev.kind != DONE:
                out.append((t, ev.obj if ev.obj is not None else data))
        return out

    @property
    def error_message(self) -> str:
        return Reply(self.status, self.text, self.elapsed_s).error_message


@dataclass
class RawStream:
    """A streamed answer's body as it came off the wire (HTTP framing removed, nothing else):
    ``pieces`` are ``(t, bytes)`` per read, ``t`` seconds since the request was sent (monotonic).
    ``status``/``content_type``: the answer's; ``text``: a non-200 answer's body. ``transport_error``:
    the connection broke or the total time ran out mid-stream (the pieces so far are kept)."""

    status: int
    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    content_type: str = ""
    text: str = ""
    elapsed_s: float = 0.0
    transport_error: str | None = None
    #: [bytes] the answer's ``Content-Length`` header (None: not sent, e.g. a chunked body).
    content_length: int | None = None

    @property
    def body(self) -> bytes:
        return b"".join(b for _, b in self.pieces)


#: Body bytes :meth:`KvClient.stream_bytes` keeps before it stops reading (a stream that never ends).
RAW_STREAM_MAX_BYTES = 16 * 1024 * 1024


#: Seconds an idle pooled connection is reused. Below the server's own keep-alive timeout: vLLM's
#: uvicorn closes an idle connection after 5 s (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, vllm/envs.py), and
#: httpx's default expiry is also 5 s, so a request sent ~5 s after the last one could go out on a
#: connection the server was closing: ``ReadError: Connection reset by peer`` (seen once in kvgate's
#: e2e, a canary right after the priority gate's run). 2 s leaves the race to servers that close
#: idle connections sooner than that.
KEEPALIVE_EXPIRY_S = 2.0


class KvClient:
    """Synchronous client for one endpoint (one connection pool for its lifetime).

    ``timeout_s``: default per-request timeout, seconds. ``chat_template_kwargs``: the chat
    template options the deployment's clients send (profile ``limits.chat_template_kwargs``, e.g.
    ``{"enable_thinking": false}``); :meth:`tokenize` with ``messages`` and every chat request
    sent through :func:`kvgate.http.probes.send` carry them, so a prompt counted by ``/tokenize`` is
    the prompt the chat route renders. Use as a context manager or ``close()``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
        clock: Clock = time.monotonic,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
        self._transport = transport
        self._http = httpx.Client(
            base_url=endpoint.base_url.rstrip("/"),
            headers=endpoint.headers(),
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S),
        )

    def __enter__(self) -> "KvClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------- plumbing
    def _unreachable(self, exc: Exception, path: str) -> EndpointUnreachable:
        cause = type(exc).__name__
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return EndpointUnreachable(
            f"endpoint {redact_url(self.endpoint.base_url)} is unreachable ({cause}: {detail}) on {path}"
        )

    @staticmethod
    def _gone(watch: Any, request: str, exc: Exception) -> str | None:
        """With the run's watch: a connection refused mid-run is asked once whether the server is
        gone (:meth:`kvgate.http.watch.EngineWatch.unreachable`); the reply's text when it is (or was
        already hung or gone), else None -- the caller raises :class:`EndpointUnreachable` as before."""
        if watch is None or isinstance(exc, httpx.UnsupportedProtocol):
            return None
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        down = watch.unreachable(request, detail)
        return f"{detail}; {down.reason()}" if down is not None else None

    def api(self, path: str) -> str:
        """Full path for an OpenAI route: ``api('/models')`` -> ``/v1/models``."""
        return self.endpoint.route_prefix.rstrip("/") + path

    def _own_connection(self) -> httpx.Client:
        """A one-request client on a new connection, configured as the pool's (an injected
        transport is shared: it has no connections of its own to be stale)."""
        shared = self._http
        return httpx.Client(base_url=shared.base_url, headers=shared.headers, timeout=shared.timeout,
                            transport=self._transport, limits=httpx.Limits(max_keepalive_connections=0))

    def request(self, method: str, path: str, *, json_body: Any = None, timeout_s: float | None = None,
                content: bytes | None = None, own_connection: bool = False) -> Reply:
        """Send one request; raise :class:`EndpointUnreachable` only when no answer comes.
        ``content``: send these bytes as the body (``Content-Type: application/json``) instead of
        ``json_body`` -- e.g. a body that is not JSON at all. ``own_connection``: on a new
        connection, not one from the pool -- for a health check after a request that may have
        crashed a handler: uvicorn closes the connection after an unhandled exception's 500 without
        saying ``Connection: close``, and a request reusing it reads ``Connection reset by peer``
        while the server serves fresh connections (llama-cpp-python 0.3.36 after a non-JSON body,
        measured 2026-12-05: pooled ReadError in 6 ms, a new connection 200)."""
        watch = self.endpoint.watch
        refused = watch.refusal(stream=False) if watch is not None else None
        if refused:
            return Reply(status=0, text=refused, elapsed_s=0.0)
        http = self._own_connection() if own_connection else self._http
        t0 = self.clock()
        try:
            r = http.request(
                method, path, json=json_body if content is None else None, content=content,
                headers={"Content-Type": "application/json"} if content is not None else None,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
            if (gone := self._gone(watch, f"{method} {path}", exc)) is not None:
                return Reply(status=0, text=gone, elapsed_s=self.clock() - t0)
            raise self._unreachable(exc, path) from None
        except httpx.HTTPError as exc:  # read timeout, protocol error: an answer that never finished
            waited = self.clock() - t0
            text = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, httpx.TimeoutException) and watch is not None:  # passed its deadline: check once
                hang = watch.suspect(f"{method} {path}", waited)
                text += f"; {hang.reason()}" if hang else ""
            return Reply(status=0, text=text, elapsed_s=waited)
        finally:
            if http is not self._http and self._transport is None:  # an injected transport is the caller's to close
                http.close()
        return Reply(r.status_code, r.text, self.clock() - t0, dict(r.headers), _sent_bytes(r.request), len(r.content))

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> Reply:
        return self.request("POST", path, json_body=body, **kw)

    def stream(self, path: str, body: Any, *, timeout_s: float | None = None,
               on_event: Callable[[float, str], bool | None] | None = None,
               hang_up_after_headers: bool = False) -> StreamReply:
        """POST with ``stream: true`` and record every SSE event with its arrival time.

        ``on_event(t, data)`` may return True to hang up early (client disconnect mid-stream);
        ``hang_up_after_headers`` closes the connection as soon as the 200 status line arrives,
        before any token (disconnect mid-request). Timestamps are taken as lines arrive; JSON
        decoding is left to the caller (off the hot path).
        """
        watch = self.endpoint.watch
        refused = watch.refusal(stream=True) if watch is not None else None
        if refused:
            return StreamReply(status=0, text=refused)
        total = self._http.timeout.read if timeout_s is None else timeout_s
        idle = watch.stream_idle_timeout_s if watch is not None else None
        idle = idle if idle is not None and (total is None or idle < total) else None
        t0 = self.clock()
        out = StreamReply(status=0)
        try:
            with self._http.stream(
                "POST", path, json=body,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
            ) as r, self._idle_cut(r, out, t0, idle):
                out.status = r.status_code
                if r.status_code != 200:
                    out.text = r.read().decode("utf-8", "replace")
                    out.first_byte_s = self.clock() - t0
                    out.elapsed_s = out.first_byte_s
                    return out
                if hang_up_after_headers:
                    out.elapsed_s = self.clock() - t0
                    return out
                for data in iter_sse_data(self._lines(r, out, t0, total)):
                    t = self.clock() - t0
                    out.events.append((t, data))
                    if on_event is not None and on_event(t, data):
                        break
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
            if (gone := self._gone(watch, f"POST {path} (stream)", exc)) is None:
                raise self._unreachable(exc, path) from None
            out.transport_error = gone
        except httpx.HTTPError as exc:
            out.transport_error = f"{type(exc).__name__}: {exc}"
            if watch is not None and (out.idle_cut_s is not None or isinstance(exc, httpx.TimeoutException)):
                self._stream_timed_out(watch, out, path, t0, idle)
        out.elapsed_s = self.clock() - t0
        return out

    def stream_bytes(self, path: str, body: Any, *, timeout_s: float | None = None) -> RawStream:
        """POST ``body`` (the caller sets ``stream: true``) and keep the body's bytes as each read
        returns them, timestamped (:class:`RawStream`): comments, ``id:`` lines and blank lines
        included, which :meth:`stream` frames away. ``timeout_s`` bounds each read and, checked after
        each read, the whole stream (a server sending keepalive comments for ever ends there, with
        ``transport_error``); at most :data:`RAW_STREAM_MAX_BYTES` are kept. Raises
        :class:`EndpointUnreachable` only when nothing answers; refused at once (status 0, ``not
        sent: ...``) when the run's watch found the engine hung or the server stalling streams."""
        watch = self.endpoint.watch
        refused = watch.refusal(stream=True) if watch is not None else None
        if refused:
            return RawStream(status=0, text=refused)
        total = self._http.timeout.read if timeout_s is None else timeout_s
        t0 = self.clock()
        out = RawStream(status=0)
        try:
            with self._http.stream("POST", path, json=body,
                                   timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s) as r:
                out.status, out.content_type = r.status_code, r.headers.get("content-type", "")
                declared = r.headers.get("content-length", "")
                out.content_length = int(declared) if declared.isdigit() else None
                if r.status_code != 200:
                    out.text = r.read().decode("utf-8", "replace")
                else:
                    kept = 0
                    for piece in r.iter_raw():
                        t = self.clock() - t0
                        out.pieces.append((t, piece))
                        kept += len(piece)
                        if kept > RAW_STREAM_MAX_BYTES:
                            out.transport_error = f"stopped reading after {kept:,} bytes"
                            break
                        if total is not None and t > total:
                            out.transport_error = f"stream still open after {total:g} s: stopped reading"
                            break
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
            raise self._unreachable(exc, path) from None
        except httpx.HTTPError as exc:
            out.transport_error = f"{type(exc).__name__}: {exc}"
        out.elapsed_s = self.clock() - t0
        return out

    @contextlib.contextmanager
    def _idle_cut(self, r: httpx.Response, out: StreamReply, t0: float, idle: float | None) -> Iterator[None]:
        """While the body is read: cut the stream once it has been silent for ``idle`` seconds
        after its first event (the gateway's idle timeout) -- a daemon thread shuts the socket
        down, which ends the blocked read. One thread per stream, started only for a 200 on a real
        socket (none for a mock transport or ``idle`` None) and ended when the body's reading ends
        (normally, early or by an error): it wakes at once and exits; a cut is decided under the
        same lock, so a socket handed back to the pool is never shut down. The wait for the first
        event is the TTFT the gates judge; it is bounded by the request's own timeout."""
        stream = r.extensions.get("network_stream") if idle is not None and r.status_code == 200 else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None or idle is None:
            yield
            return
        stop, guard = threading.Event(), threading.Lock()

        def watch() -> None:
            wait = idle
            while not stop.wait(wait):
                if not out.events:
                    continue
                quiet = self.clock() - t0 - out.events[-1][0]
                if quiet < idle:
                    wait = idle - quiet
                    continue
                with guard:
                    if stop.is_set():
                        return
                    out.idle_cut_s = quiet
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

        threading.Thread(target=watch, name="kvgate-stream-idle", daemon=True).start()
        try:
            yield
        finally:
            with guard:
                stop.set()

    def _stream_timed_out(self, watch: "EngineWatch", out: StreamReply, path: str, t0: float,
                          idle: float | None) -> None:
        """A stream's read timed out: after its first event with the idle timeout in force, a stall
        (cut here, the server classified as stalling streams); before it, a request that passed its
        deadline (the watch checks the engine once)."""
        now = self.clock() - t0
        last = out.events[-1][0] if out.events else out.first_byte_s
        request = f"POST {path} (stream)"
        if idle is not None and last is not None and out.events:
            out.idle_cut_s = out.idle_cut_s if out.idle_cut_s is not None else now - last
            stall = watch.stalled(request, len(out.events), out.idle_cut_s)
            out.transport_error = (f"idle timeout: no bytes for {out.idle_cut_s:.3g} s after {len(out.events)} events "
                                   f"(stream idle timeout {idle:g} s: the gateway in front would cut it here); "
                                   f"{stall.reason()}")
            return
        hang = watch.suspect(request, now)
        if hang is not None:
            out.transport_error += f"; {hang.reason()}"

    def hang_up_request(self, path: str, body: Any, after_s: float) -> Reply:
        """Send a non-streamed POST on a raw socket and close it ``after_s`` seconds later unless
        the answer has begun by then (a client that gives up mid-request).

        Returns ``Reply(status=0, text="hung up")`` when the client hung up first, else the
        status line the server managed to send. Plain http only (raises ``ValueError`` for https).
        The close does not depend on a read timeout firing, so the hang-up time is what was asked.
        """
        url = httpx.URL(self.endpoint.base_url.rstrip("/") + path)
        if url.scheme != "http":
            raise ValueError("hang_up_request needs a plain-http endpoint")
        payload = json.dumps(body).encode()
        head = [f"POST {url.raw_path.decode()} HTTP/1.1", f"Host: {self.endpoint.host_header or url.netloc.decode()}",
                "Content-Type: application/json", f"Content-Length: {len(payload)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in self.endpoint.headers().items() if k.lower() != "host"]
        t0 = self.clock()
        try:
            sock = socket.create_connection((url.host, url.port or 80), timeout=10)
        except OSError as exc:
            raise self._unreachable(exc, path) from None
        with sock:
            try:  # a server that dies mid-request resets the connection: unreachable, as a refused connect is
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
                readable, _, _ = select.select([sock], [], [], after_s)
                if not readable:
                    return Reply(status=0, text="hung up", elapsed_s=self.clock() - t0)
                first = sock.recv(4096).decode("latin-1").split("\r\n", 1)[0]
            except OSError as exc:
                raise self._unreachable(exc, path) from None
        try:
            status = int(first.split()[1])
        except (IndexError, ValueError):
            status = -1
        return Reply(status=status, text=first, elapsed_s=self.clock() - t0)

    def _lines(self, r: httpx.Response, out: StreamReply, t0: float, total: float | None = None) -> Iterator[str]:
        """The body's lines. ``total``: the longest wait for an event (the first one, or the next):
        a gateway's keep-alive comments (``: ping``) are bytes, so httpx's read timeout never fires
        while they come, and a hung engine behind such a gateway kept the stream open for ever;
        past ``total`` seconds without a ``data:`` event the read ends as a ``ReadTimeout``."""
        last_data = 0.0
        for line in r.iter_lines():
            now = self.clock() - t0
            if out.first_byte_s is None:
                out.first_byte_s = now
            if line.startswith("data:"):
                last_data = now
            elif total is not None and now - last_data >= total:
                raise httpx.ReadTimeout(f"no event for {total:g} s (only SSE comments or blank lines)")
            yield line

    # ---------------------------------------------------------------- vLLM routes
    def health(self) -> Reply:
        return self.get("/health", timeout_s=10.0)

    def version(self) -> str | None:
        """``GET /version`` -> version string, or None when the server has no such route."""
        r = self.get("/version", timeout_s=10.0)
        body = r.json
        return str(body["version"]) if r.status == 200 and isinstance(body, dict) and "version" in body else None

    def models(self) -> Reply:
        return self.get(self.api("/models"), timeout_s=10.0)

    def tokenize(self, *, model: str, prompt: str | None = None,
                 messages: list[dict[str, str]] | None = None) -> Reply:
        """``POST /tokenize`` (vLLM's extension; chat-template aware when given ``messages``)."""
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body["messages"] = messages
            body["add_generation_prompt"] = True
            if self.chat_template_kwargs:
                body["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            body["prompt"] = prompt
        return self.post("/tokenize", body, timeout_s=30.0)

    def metrics_text(self) -> str | None:
        """``GET /metrics`` body, or None when the server exposes no metrics."""
        r = self.get("/metrics", timeout_s=10.0)
        return r.text if r.status == 200 else None
