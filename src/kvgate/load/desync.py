"""A closed loop whose workers do not move in lock-step: a random think time before every send.

A closed loop at concurrency ``c`` whose workers all start at once sends ``c`` requests of one
length together; the engine batches them, they finish together and the workers send again
together -- lock-step waves for the whole run (measured on the embedded smollm2-cpu at
concurrency 4, 2026-12-06: lag-4 autocorrelation of TTFT in send order 0.99, each wave one
request at ~320 ms and three identical at ~900 ms). :class:`ThinkTransport` wraps a run's
:class:`~kvgate.load.transport.LoadTransport` and waits a random think time before each send,
drawn uniformly from ``[0, share x the median e2e of the requests finished so far]`` (before any
finished: ``[0, first_s]``) with an injected :class:`numpy.random.Generator`, so the workers'
phases drift apart and stay apart. The request's ``scheduled_s`` is moved to the end of its think
time: the think is the design, not the client falling behind (the schedule-lag check stays what
it was). The throughput cost is about half of ``share`` (mean think = ``share / 2`` x e2e): 12.5%
at the default 0.25.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import numpy as np

from kvgate.load.record import RequestRecord

#: Most think time before a send, as a share of the median e2e of the requests finished so far.
THINK_SHARE = 0.25
#: [s] Most think time before any request finished (the workers' first sends: their start offsets).
FIRST_THINK_S = 0.25


class ThinkTransport:
    """``inner`` (a :class:`~kvgate.load.transport.LoadTransport`) with a random think time
    before every send (module docstring). ``rng``: the draws (injected; same seed, same thinks);
    ``sleep``: an ``async (seconds)`` (tests inject one that advances a fake clock). ``thinks_s``:
    every think drawn, seconds, in send order."""

    def __init__(self, inner: Any, rng: np.random.Generator, share: float = THINK_SHARE,
                 first_s: float = FIRST_THINK_S, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.inner, self.rng, self.share, self.first_s, self.sleep = inner, rng, share, first_s, sleep
        self.name = getattr(inner, "name", type(inner).__name__)
        self.thinks_s: list[float] = []
        self._e2e: list[float] = []
        self._clock: Callable[[], float] | None = None
        self._t0 = 0.0

    @property
    def opened(self) -> Any:
        return getattr(self.inner, "opened", None)

    def bind(self, clock: Callable[[], float], t0: float, max_connections: int) -> None:
        self._clock, self._t0 = clock, t0
        self.inner.bind(clock, t0, max_connections)

    def prepare(self, spec: Any) -> Any:
        return self.inner.prepare(spec)

    def most_s(self) -> float:
        """The current upper end of the think time, seconds."""
        if not self._e2e:
            return self.first_s
        xs = sorted(self._e2e)
        return self.share * xs[len(xs) // 2]

    async def send(self, prepared: Any, rec: RequestRecord, timeout_s: float) -> None:
        think = float(self.rng.uniform(0.0, self.most_s()))
        if think >= timeout_s / 2:  # near the run's deadline: no think that would eat the request's time
            think = 0.0
        self.thinks_s.append(think)
        if think > 0:
            await self.sleep(think)
            if self._clock is not None:
                rec.scheduled_s = self._clock() - self._t0
        await self.inner.send(prepared, rec, timeout_s - think)
        if rec.end_s is not None and rec.sent_s is not None and rec.error is None:
            self._e2e.append(rec.end_s - rec.sent_s)

    async def aclose(self) -> None:
        await self.inner.aclose()


__all__ = ["FIRST_THINK_S", "THINK_SHARE", "ThinkTransport"]
