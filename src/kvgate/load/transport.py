"""The interface between a load run and whatever sends its requests.

:class:`RawHttpTransport` (:mod:`kvgate.load.raw_http`) serves ``http://``,
:class:`HttpxTransport` (:mod:`kvgate.load.httpx_fallback`) anything else; tests inject their own
(see ``tests/test_load.py``). A transport never parses JSON or SSE while the run is on: it fills
the hot-path fields of a :class:`~kvgate.load.record.RequestRecord` and the run decodes them after.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from kvgate.load.record import RequestRecord, RequestSpec

#: A monotonic clock, seconds.
Clock = Callable[[], float]

#: Body bytes kept per response before the request is failed (guards against a runaway server).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024


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

