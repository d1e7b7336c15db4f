"""A tiny fault-injecting router for kvgate's own tests: two upstream pools (fake vLLMs), routing
by request-body size, with the misconfigurations the pools gates must catch.

    with FakeVLLM(...) as short, FakeVLLM(...) as long, FakeRouter(short.base_url, long.base_url,
                                                                 threshold=2048, fault="inverted") as router:
        router.url   # http://127.0.0.1:PORT/v1

Faults (:data:`ROUTER_FAULTS`): ``all_short`` / ``all_long`` (everything to one pool),
``inverted`` (the threshold on the wrong side: small bodies to the long pool, large ones to the
short pool), ``drop_long`` (a body above the threshold is answered 502 by the router itself and
never forwarded), ``retrying`` (a gateway that retries: a request whose upstream answers 5xx, or
has not answered within ``try_timeout_s`` -- the try abandoned, its connection closed -- is sent
again, ``retries`` more times at most; the client gets the last try's answer, or 504), ``None`` =
healthy (at most ``threshold`` bytes -> short, more -> long; never retries; with ``try_timeout_s``
set a try that has not answered within it gets 504, not resent). Route one pool alone by passing its
URL as both; ``retried`` counts the resends. GET
requests (``/v1/models``, ``/metrics``) go to the short pool, as nginx's empty ``$content_length``
does. Responses are streamed through (SSE passes chunk by chunk).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .fake_vllm import _QuickStopServer

ROUTER_FAULTS = {
    "all_short": "every request goes to the short pool",
    "all_long": "every request goes to the long pool",
    "inverted": "the threshold on the wrong side: at most threshold bytes -> long pool, more -> short pool",
    "drop_long": "a body above the threshold is answered 502 by the router and never forwarded",
    "retrying": "a POST answered 5xx by its upstream, or not answered within try_timeout_s, is sent again "
    "(retries more times at most): the engine runs the same work twice",
}


class FakeRouter:
    """A reverse proxy on a free loopback port in a background thread (see module doc)."""

    def __init__(self, short_url: str, long_url: str, threshold: int, fault: str | None = None, *,
                 try_timeout_s: float | None = None, retries: int = 1) -> None:
        if fault is not None and fault not in ROUTER_FAULTS:
            raise ValueError(f"unknown router fault {fault!r}; known: {', '.join(ROUTER_FAULTS)}")
        self.upstreams = {"short": short_url.rstrip("/"), "long": long_url.rstrip("/")}
        self.threshold = threshold
        self.fault = fault
        self.sent: list[tuple[int, str]] = []  # (body bytes, pool) per forwarded request
        self.try_timeout_s, self.retries = try_timeout_s, retries
        self.retried = 0  # resends (retrying)
        self.app = Starlette(routes=[Route("/{path:path}", self._proxy, methods=["GET", "POST"])])
        self._server: _QuickStopServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url: str | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL (``base_url + "/v1"``)."""
        return f"{self.base_url}/v1"

    def pool_for(self, size: int | None) -> str | None:
        """The pool a body of ``size`` bytes goes to (None: dropped); ``size`` None = no body."""
        if size is None or self.fault == "all_short":
            return "short"
        if self.fault == "all_long":
            return "long"
        big = size > self.threshold
        if self.fault == "inverted":
            return "short" if big else "long"
        if self.fault == "drop_long" and big:
            return None
        return "long" if big else "short"

    async def _proxy(self, request: Request) -> Response:
        body = await request.body()
        pool = self.pool_for(len(body) if request.method == "POST" else None)
        if pool is None:
            return JSONResponse({"error": "no upstream for this request"}, status_code=502)
        self.sent.append((len(body), pool))
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(120.0))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        tries = 1 + (self.retries if self.fault == "retrying" and request.method == "POST" else 0)
        for attempt in range(tries):
            if attempt:
                self.retried += 1
            upstream = self._client.build_request(request.method, self.upstreams[pool] + request.url.path,
                                                  content=body, headers=headers)
            try:
                r = await asyncio.wait_for(self._client.send(upstream, stream=True), self.try_timeout_s)
            except asyncio.TimeoutError:  # the try abandoned: its connection closed, the engine sees a hang-up
                if attempt + 1 < tries:
                    continue
                return Response("<html><body>504 Gateway Time-out</body></html>", status_code=504,
                                media_type="text/html")
            if r.status_code >= 500 and attempt + 1 < tries:
                await r.aclose()
                continue
            break
        keep = {k: v for k, v in r.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")}
        return StreamingResponse(r.aiter_raw(), status_code=r.status_code, headers=keep,
                                 background=BackgroundTask(r.aclose))

    def start(self, timeout: float = 10.0) -> "FakeRouter":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                lifespan="off", ws="none")
        self._server = server = _QuickStopServer(config)  # stops in ms, not ~0.15 s (fake_vllm)
        self._thread = threading.Thread(target=server.run, name="fake-router", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake router did not start")
            time.sleep(0.005)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.request_exit()
            self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self) -> "FakeRouter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
