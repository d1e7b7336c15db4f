"""Before a probe whose timing a verdict reads: is the server running anything else?

pytest runs one gate at a time, but a server can still be working for an earlier gate when the
next begins -- a request kvgate gave up on (a deadline, a hang-up) that the engine has not yet
aborted, or a selection that puts a load gate's tail right before a timed probe. Then the probe's
TTFT and gaps are measured beside that work, and its verdict would depend on what else was selected
(issue 48). :func:`settle` waits, bounded, until ``vllm:num_requests_running`` reads 0, and says
what it saw: the overlap is measured and stated, never silent.

Used by suites/test_requests.py (the route-timeout stream), suites/test_security.py (the cache
case's timing look) and suites/test_features.py (the prefix-caching ladder's cold vs warm TTFT).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from kvgate.http.metrics import poll_gauge, scrape_value

#: [s] the longest :func:`settle` waits for the server to run nothing.
SETTLE_S = 10.0
#: [s] between two /metrics scrapes while waiting.
POLL_S = 0.2


@dataclass(frozen=True)
class Quiet:
    """``running``: ``vllm:num_requests_running`` at the first scrape (None: no /metrics, or the
    gauge absent); ``idle``: it read 0 within the wait (None: not measured); ``waited_s``: seconds
    waited; ``left``: the last value read when it did not reach 0."""

    running: float | None
    idle: bool | None
    waited_s: float
    left: float | None = None

    def words(self) -> str:
        """One clause for a verdict's evidence or message."""
        if self.idle is None:
            return "the server's own requests not measured (no vllm:num_requests_running)"
        if self.idle and not self.running:
            return "the server ran nothing else when it began (vllm:num_requests_running 0)"
        if self.idle:
            return (f"it began once the {self.running:g} requests the server was running had ended "
                    f"({self.waited_s:.1f} s)")
        return (f"measured beside {self.left:g} requests the server was still running after {self.waited_s:.1f} s "
                "(not this probe's)")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "words": self.words()}


def settle(metrics: Callable[[], str | None], *, deadline_s: float = SETTLE_S, interval_s: float = POLL_S,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Quiet:
    """Scrape ``metrics()`` (a ``/metrics`` body, or None) until ``vllm:num_requests_running`` reads
    0 or ``deadline_s`` passes (bounded: at most ``deadline_s / interval_s + 3`` scrapes). A server
    whose first scrape shows no such gauge is not waited on (``idle`` None)."""
    if scrape_value(metrics(), "running") is None:
        return Quiet(None, None, 0.0)
    poll = poll_gauge(metrics, "running", 0, deadline_s, interval_s=interval_s, clock=clock, sleep=sleep)
    first = poll.samples[0][1] if poll.samples else None
    return Quiet(first, poll.reached, round(poll.elapsed_s, 3), None if poll.reached else poll.last)


__all__ = ["POLL_S", "Quiet", "SETTLE_S", "settle"]
