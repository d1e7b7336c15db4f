"""The interface between a load run and whatever sends its requests.

:class:`RawHttpTransport` (:mod:`kvgate.load.raw_http`) serves ``http://``,
:class:`HttpxTransport` (:mod:`kvgate.load.httpx_fallback`) anything else; tests inject their own
(see ``tests/test_load.py``). A transport never parses JSON or SSE while the run is on: it fills
the hot-path fields of a :class:`~kvgate.load.record.RequestRecord` and the run decodes them after.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Protocol

from kvgate.load.record import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from kvgate.http.watch import EngineWatch

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



# ------------------------------------------------------------------------------------------
# the run's EngineWatch (kvgate.http.watch), the same for every transport


def refused_by_watch(watch: "EngineWatch | None", stream: bool, rec: RequestRecord, now_s: float) -> bool:
    """When the watch refuses the send (engine hung; a streamed one to a server that stalls
    streams): fill ``rec`` as ended at ``now_s`` with ``not sent: ...`` as its error and return True."""
    refused = watch.refusal(stream=stream) if watch is not None else None
    if not refused:
        return False
    rec.sent_s = rec.end_s = now_s
    rec.error = refused
    return True


async def tell_watch(watch: "EngineWatch | None", what: str, rec: RequestRecord) -> None:
    """Tell the watch what a finished request met: an idle cut after body pieces -> a stall; a
    timeout (or an idle cut before the first byte) -> one engine check, in a worker thread so the
    event loop goes on."""
    err = rec.error or ""
    if watch is None:
        return
    if err.startswith("idle timeout") and rec.first_byte_s is not None and rec.piece_s:
        watch.stalled(what, len(rec.piece_s), (rec.end_s or 0.0) - rec.piece_s[-1])
    elif err.startswith(("timeout", "idle timeout")):
        waited = (rec.end_s or 0.0) - (rec.sent_s or 0.0)
        await asyncio.get_running_loop().run_in_executor(None, watch.suspect, what, waited)


def cut_on_hang(watch: "EngineWatch | None", cut: Callable[[str], None]) -> Callable[[], None] | None:
    """Register ``cut(reason)`` to run on the calling event loop's thread when the engine is
    classified hung (at once if it already is); returns the unregister function, or None."""
    if watch is None:
        return None
    loop = asyncio.get_running_loop()
    return watch.on_hang(lambda why: loop.call_soon_threadsafe(cut, why))
