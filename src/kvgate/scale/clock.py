"""A worker's clock against the coordinator's: an NTP-style exchange over HTTP.

One exchange: the worker notes ``t0`` (its wall clock) and asks the coordinator, which notes
``t1`` on receipt and ``t2`` on reply; the worker notes ``t3`` on the answer. With ``theta`` =
coordinator clock - worker clock and symmetric paths::

    theta = ((t1 - t0) + (t2 - t3)) / 2        delay = (t3 - t0) - (t2 - t1)

and the true offset lies within ``theta +- delay / 2`` whatever the asymmetry. :func:`measure`
takes several exchanges and keeps the one with the smallest delay (the least queueing: the
tightest bound). All times are wall-clock seconds (``time.time``), injectable.

The worker corrects by ``theta`` (it starts at the shared instant on the coordinator's clock) and
measures again after its batch: what a verdict cannot correct is the uncertainty (``delay / 2``)
plus the drift between the two readings (:func:`residual_s`); that is what the timing budget
holds (:mod:`kvgate.gates.scale`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

#: Exchanges per :func:`measure` (the smallest delay is kept).
DEFAULT_EXCHANGES = 8

Wall = Callable[[], float]


@dataclass(frozen=True)
class Exchange:
    """One exchange's four wall-clock times, seconds: worker send ``t0``, coordinator receive
    ``t1``, coordinator send ``t2``, worker receive ``t3``."""

    t0: float
    t1: float
    t2: float
    t3: float

    @property
    def offset_s(self) -> float:
        """Coordinator clock minus worker clock, seconds."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    @property
    def delay_s(self) -> float:
        """Round trip without the coordinator's own time, seconds (never below 0)."""
        return max(0.0, (self.t3 - self.t0) - (self.t2 - self.t1))


@dataclass(frozen=True)
class ClockOffset:
    """A measured offset: ``offset_s`` (coordinator - worker, seconds), ``error_s`` (half the
    best exchange's delay: the true offset is within ``offset_s +- error_s``), ``exchanges`` taken
    and ``measured_at`` (the worker's wall clock at the best exchange's ``t0``, seconds)."""

    offset_s: float
    error_s: float
    exchanges: int
    measured_at: float = 0.0

    def text(self) -> str:
        """``+3,200.0 ms +- 0.4 ms``."""
        return f"{self.offset_s * 1e3:+,.1f} ms +- {self.error_s * 1e3:,.1f} ms"

    def to_dict(self) -> dict[str, Any]:
        return {"offset_s": self.offset_s, "error_s": self.error_s, "exchanges": self.exchanges,
                "measured_at": self.measured_at}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClockOffset":
        return cls(float(d["offset_s"]), float(d["error_s"]), int(d.get("exchanges", 1)), float(d.get("measured_at", 0.0)))


def best(exchanges: list[Exchange]) -> ClockOffset:
    """The offset of the exchange with the smallest delay. Raises ValueError on none."""
    if not exchanges:
        raise ValueError("no clock exchange")
    e = min(exchanges, key=lambda x: x.delay_s)
    return ClockOffset(e.offset_s, e.delay_s / 2, len(exchanges), e.t0)


def measure(ask: Callable[[], tuple[float, float]], wall: Wall = time.time, n: int = DEFAULT_EXCHANGES) -> ClockOffset:
    """``n`` exchanges: ``ask()`` sends one request to the coordinator and returns its ``(t1, t2)``
    (coordinator wall seconds); ``wall`` is this worker's clock. Exceptions of ``ask`` propagate."""
    got = []
    for _ in range(max(1, n)):
        t0 = wall()
        t1, t2 = ask()
        got.append(Exchange(t0, float(t1), float(t2), wall()))
    return best(got)


def residual_s(before: ClockOffset, after: ClockOffset | None) -> float:
    """What correcting by ``before`` leaves unknown, seconds: the larger uncertainty plus the drift
    between the readings before and after the batch (``after`` None: ``before``'s uncertainty)."""
    if after is None:
        return before.error_s
    return max(before.error_s, after.error_s) + abs(after.offset_s - before.offset_s)
