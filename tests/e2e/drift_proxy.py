"""A drifting TCP proxy for the soak-with-a-control proof (tests/e2e/test_served.py, 3e): it forwards
to a real server and holds every chunk the client sends for a delay that grows with time, the
replies passing straight back -- a network path (or an upstream) that slows down, in front of one
endpoint or of both.

``DriftProxy(upstream_url, s_per_s)``: each chunk from the client is forwarded ``s_per_s x t``
seconds after it arrived, ``t`` = seconds since the first chunk naming ``/completions`` (the soak's
first generation, or the run's 1-token extension probe just before it; the preflight's /v1/models
and the prompt sizing's /tokenize pass undelayed before that). Due times only grow, so a
connection's bytes keep their order; HTTP keep-alive and SSE streams pass through unparsed.
Bound to 127.0.0.1 port 0 (:attr:`url`), served by an event loop in a daemon thread of its own."""

from __future__ import annotations

import asyncio
import threading
import time
from urllib.parse import urlsplit


class DriftProxy:
    def __init__(self, upstream_url: str, s_per_s: float) -> None:
        parts = urlsplit(upstream_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path  # kept in :attr:`url` (e.g. /v1)
        self.s_per_s = float(s_per_s)
        self.t0: float | None = None
        self.chunks = 0
        self.max_delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._listen_port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listen_port}{self.path}"

    def delay(self, now: float) -> float:
        """Seconds a chunk arriving at ``now`` (monotonic) is held."""
        if self.t0 is None:
            return 0.0
        return self.s_per_s * (now - self.t0)

    def start(self) -> "DriftProxy":
        self._thread.start()
        if not self._ready.wait(10):  # bounded
            raise RuntimeError("drift proxy did not start")
        return self

    def stop(self) -> None:
        def close() -> None:
            if self._server is not None:
                self._server.close()
            for t in asyncio.all_tasks(self._loop):
                t.cancel()
            self._loop.call_later(0.1, self._loop.stop)

        self._loop.call_soon_threadsafe(close)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self._listen_port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        queue: asyncio.Queue[tuple[float | None, bytes]] = asyncio.Queue()

        async def from_client() -> None:
            while data := await reader.read(65536):
                now = time.monotonic()
                if self.t0 is None and b"/completions" in data:
                    self.t0 = now
                d = self.delay(now)
                self.chunks += 1
                self.max_delay_s = max(self.max_delay_s, d)
                queue.put_nowait((now + d, data))
            queue.put_nowait((None, b""))

        async def forward() -> None:
            while True:
                due, data = await queue.get()
                if due is None:
                    if up_w.can_write_eof():
                        up_w.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                up_w.write(data)
                await up_w.drain()

        async def to_client() -> None:
            while data := await up_r.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(from_client(), forward(), to_client())
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_w):
                w.close()
