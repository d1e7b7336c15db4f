"""The ``httpx.AsyncClient`` transport: the fallback for ``https://`` and anything else the raw
HTTP/1.1 client does not speak. Same records, coarser timestamps (taken when httpx hands bytes
over; :attr:`~kvgate.load.LoadResult.transport` says which client ran). The run's
:class:`~kvgate.http.watch.EngineWatch` is obeyed as by the raw client (:mod:`kvgate.load.raw_http`):
refused sends end at once with ``not sent: ...``, timeouts and idle cuts are reported to it, and
requests in flight are cut (``cut: engine hung ...``) when the engine is classified hung.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from kvgate.http.client import Endpoint
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.transport import DEFAULT_MAX_RESPONSE_BYTES, Clock, cut_on_hang, refused_by_watch, tell_watch


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
        self.watch = endpoint.watch
        self._unhook: Any = None
        self._in_flight: dict[asyncio.Future, RequestRecord] = {}

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
            idle = (httpx.Timeout(None, connect=self.connect_timeout_s, read=spec.idle_timeout_s)
                    if spec.idle_timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
            async with self.client.stream("POST", spec.path, content=body, headers=headers, timeout=idle) as r:
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

        stream = bool(spec.body.get("stream"))
        if refused_by_watch(self.watch, stream, rec, self.clock() - self.t0):
            return
        if self._unhook is None:
            self._unhook = cut_on_hang(self.watch, self._cut_in_flight)
        budget = timeout_s if spec.hangup_after_s is None else min(timeout_s, spec.hangup_after_s)
        task = asyncio.ensure_future(go())
        self._in_flight[task] = rec
        try:
            await _within(task, max(0.0, budget))
        except asyncio.TimeoutError:
            if spec.hangup_after_s is not None and spec.hangup_after_s <= timeout_s:
                rec.hung_up = True
            else:
                rec.error = f"timeout: no complete response within {timeout_s:.3g} s"
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            rec.error = f"connect failed: {type(exc).__name__}: {exc}"
        except httpx.ReadTimeout:  # httpx's read timeout is the idle timeout: no byte for that long
            rec.error = (f"idle timeout: no bytes for {spec.idle_timeout_s:g} s (stream idle timeout "
                         f"{spec.idle_timeout_s:g} s: the gateway in front would cut it here)")
        except httpx.HTTPError as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._in_flight.pop(task, None)
        rec.end_s = self.clock() - self.t0
        path = urlsplit(self.endpoint.base_url).path.rstrip("/") + spec.path
        await tell_watch(self.watch, f"POST {path}" + (" (stream)" if stream else ""), rec)

    def _cut_in_flight(self, reason: str) -> None:
        """The engine was classified hung: end every request in flight now (on the loop's thread)."""
        for task, rec in list(self._in_flight.items()):
            if not task.done():
                rec.error = f"cut: {reason}"
                task.cancel()

    async def aclose(self) -> None:
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        if self.client is not None:
            await self.client.aclose()


async def _within(task: asyncio.Future, budget_s: float) -> None:
    """Await ``task`` for at most ``budget_s`` seconds: its exception propagates; past the budget
    it is cancelled (and awaited) and ``asyncio.TimeoutError`` raised; a task cancelled from
    outside -- cut by the watch (:meth:`HttpxTransport._cut_in_flight`) -- just returns. Our own
    cancellation cancels it too."""
    try:
        done, _ = await asyncio.wait({task}, timeout=budget_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})
        raise asyncio.TimeoutError
    if not task.cancelled():
        task.result()

