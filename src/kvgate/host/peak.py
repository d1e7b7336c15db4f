"""The peak memory of a server's process tree while something happens (its model load), sampled
cheaply and within a bound.

:class:`PeakWatch` keeps the largest reading of an injected ``read`` callable -- one synchronous
sample of the tree in the shape :meth:`kvgate.soak.sampling.ProcessTreeSampler.read` returns
(``memory``: PSS + swap summed over the tree, or RSS where smaps is denied; ``rss``;
``processes``; all bytes) -- taken each time :meth:`PeakWatch.sample` is called (the launchers call
it once per readiness poll), at most once a second and ``max_samples`` times. :meth:`PeakWatch.peak` is the
:class:`MemoryPeak` the deployment gate holds a container's memory limit to
(:func:`kvgate.gates.deployment.memory_peak_verdict`).

What it cannot see: a peak shorter than a second between two samples, and page cache the container's cgroup is charged for (checkpoint files read, not mapped):
the limit needs the margin (``limits.memory_peak_margin``) for both.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

#: [bytes] one GiB
GiB = 1 << 30
#: [samples] Most samples one watch takes (a 240 s start-up at one a second is 240).
MAX_SAMPLES = 2000
#: [s] Least time between two readings: one costs ~22-42 ms of /proc/PID/smaps per process (measured
#: 2026-12-06 here on a 590 MiB torch process), so at most one a second, ~3% of a core while loading.
MIN_INTERVAL_S = 1.0


def fmt_gib(n: float) -> str:
    """``3.20 GiB`` (two decimals: a limit and a peak 1% apart must read apart)."""
    return f"{n / GiB:,.2f} GiB"


@dataclass(frozen=True)
class MemoryPeak:
    """The largest memory reading of a process tree.

    ``bytes``: the peak of ``quantity`` (``"PSS + swap"`` summed over the tree: each page once, as a
    cgroup charges it; or ``"RSS"`` where smaps is denied: shared pages counted per process);
    ``rss_bytes``: the tree's RSS in the same sample; ``phase``: what was happening (``"model
    load"``); ``at_s``: seconds from the phase's start to the peak sample; ``samples``: readings
    taken; ``processes``: live processes in the peak sample (0: not counted); ``source``: where the numbers come
    from; ``lower_bound``: True when the reading covers part of the server only (the API server's
    ``process_resident_memory_bytes``), so it can prove a limit too small but never large enough."""

    bytes: int
    quantity: str
    rss_bytes: int | None
    phase: str
    at_s: float
    samples: int
    processes: int
    source: str
    lower_bound: bool = False

    def words(self) -> str:
        """``'3.20 GiB (PSS + swap of 2 processes, during model load, 14.2 s in, peak of 57 samples)'``."""
        who = (f"{self.quantity} of {self.processes} process{'es' * (self.processes != 1)}" if self.processes
               else self.quantity)
        if self.samples == 1:
            return f"{fmt_gib(self.bytes)} ({who}, {self.phase}, one reading)"
        return (f"{fmt_gib(self.bytes)} ({who}, {self.phase}, {self.at_s:.1f} s in, peak of {self.samples} "
                f"samples)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PeakWatch:
    """Keep the largest of up to ``max_samples`` readings of ``read`` (see the module doc).

    ``read``: one synchronous sample, ``{"memory": bytes | None, "rss": bytes | None,
    "processes": n}``; ``phase``: words for :attr:`MemoryPeak.phase`; ``source``: where ``read``
    reads; ``quantity``: a callable giving the reader's quantity now (it may fall back to RSS);
    ``clock``: monotonic seconds; ``t0``: when the phase started on it (default: the watch's creation);
    ``min_interval_s``: the least seconds between two readings (:data:`MIN_INTERVAL_S`). :meth:`sample` never
    raises: a failed read is counted in ``errors`` (``last_error`` says why)."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], *, phase: str, source: str,
                 quantity: Callable[[], str] = lambda: "PSS + swap", clock: Callable[[], float] = time.monotonic,
                 max_samples: int = MAX_SAMPLES, t0: float | None = None, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.read, self.phase, self.source, self.quantity = read, phase, source, quantity
        self.clock, self.max_samples, self.min_interval_s = clock, max_samples, min_interval_s
        self.t0 = clock() if t0 is None else t0
        self._last: float | None = None
        self.samples = 0
        self.errors = 0
        self.last_error: str | None = None
        self._best: tuple[int, int | None, float, int] | None = None  # bytes, rss, at_s, processes

    def sample(self, force: bool = False) -> None:
        """Take one reading -- unless ``max_samples`` are taken, or (``force`` False) the last one is
        less than ``min_interval_s`` old -- and keep it when it is the largest."""
        now = self.clock()
        if self.samples >= self.max_samples or (not force and self._last is not None
                                                 and now - self._last < self.min_interval_s):
            return
        self._last = now
        self.samples += 1
        try:
            r = self.read()
        except Exception as exc:  # a tree gone or unreadable mid start-up: counted, never raised
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        mem = r.get("memory")
        if mem is None:
            self.errors += 1
            self.last_error = "no process of the tree alive"
            return
        if self._best is None or mem > self._best[0]:
            rss = r.get("rss")
            self._best = (int(mem), int(rss) if rss is not None else None, self.clock() - self.t0,
                          int(r.get("processes") or 0))

    def peak(self) -> MemoryPeak | None:
        """The largest reading as a :class:`MemoryPeak`; None when no reading succeeded."""
        if self._best is None:
            return None
        b, rss, at, n = self._best
        return MemoryPeak(b, self.quantity(), rss, self.phase, round(at, 2), self.samples, n, self.source)

