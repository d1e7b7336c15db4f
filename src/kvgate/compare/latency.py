"""Latency of the new revision against the baseline's, measured in interleaved pairs.

One request is in flight at a time across both endpoints: pair ``i`` sends the same completions
request to the new endpoint and to the baseline, the order alternating pair by pair, so whatever
drifts on the machine (another tenant, thermal state, a cache warming) hits both alike. The
latency asked is the unloaded one -- loaded latency is the SLO gates' job at the profile's
concurrency. Per request: TTFT (first streamed chunk), ITL as the request's mean inter-chunk time
(TPOT: per-request values are independent samples; pooled gaps are not) and e2e (last byte).
Sampling follows the SLO gates' planned looks (:func:`kvgate.stats.confidence.sample_until_decided`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import KvClient
from kvgate.http.sse import DONE, classify
from kvgate.stats import percentile

#: The metrics compared, in order: name -> what a reader calls it.
METRICS = {"ttft": "TTFT", "itl": "ITL (per-request mean, TPOT)", "e2e": "e2e latency"}


@dataclass(frozen=True)
class Timing:
    """One streamed request: ``ttft_ms``, ``itl_ms`` (mean gap between the first and the last
    chunk; None with fewer than 2 chunks), ``e2e_ms`` (milliseconds, from the send), ``chunks`` and
    ``error`` (None when it streamed to ``[DONE]`` with HTTP 200)."""

    ttft_ms: float | None
    itl_ms: float | None
    e2e_ms: float | None
    chunks: int
    error: str | None = None
    #: No answer, or a stream that broke or timed out (a hung or gone endpoint): the sampling stops.
    unanswered: bool = False

    def value(self, metric: str) -> float | None:
        return {"ttft": self.ttft_ms, "itl": self.itl_ms, "e2e": self.e2e_ms}[metric]


def timed(client: KvClient, body: dict[str, Any], timeout_s: float) -> Timing:
    """Stream ``body`` to ``/completions`` and time it (:class:`Timing`)."""
    r = client.stream(client.api("/completions"), {**body, "stream": True}, timeout_s=timeout_s)
    if r.status != 200 or r.transport_error or not r.done:
        why = r.transport_error or (f"HTTP {r.status}: {r.error_message}" if r.status != 200 else "no [DONE]")
        # no answer, or a stream that broke or timed out: a hung or gone endpoint -- stop sampling
        return Timing(None, None, None, 0, why[:200], unanswered=r.status == 0 or r.transport_error is not None)
    times = []
    for t, data in r.events:
        ev = classify(data)
        if ev.kind == DONE or not isinstance(ev.obj, dict) or not ev.obj.get("choices"):
            continue  # [DONE], a usage-only chunk
        times.append(t)
    if not times:
        return Timing(None, None, None, 0, "200 without a token chunk")
    itl = (times[-1] - times[0]) / (len(times) - 1) * 1000 if len(times) > 1 else None
    return Timing(times[0] * 1000, itl, r.elapsed_s * 1000, len(times))


@dataclass
class Pairs:
    """The interleaved samples so far: ``new`` and ``base`` (:class:`Timing`, one per request, in
    send order), ``order`` (per pair, which endpoint went first)."""

    new: list[Timing] = field(default_factory=list)
    base: list[Timing] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def values(self, side: str, metric: str) -> list[float]:
        """The ``metric`` values (ms) of ``side`` (``new`` or ``base``) from requests that answered."""
        return [v for t in getattr(self, side) if t.error is None and (v := t.value(metric)) is not None]

    def errors(self, side: str) -> list[str]:
        return [t.error for t in getattr(self, side) if t.error is not None]

    def rows_csv(self) -> str:
        """``pair,side,first,ttft_ms,itl_ms,e2e_ms,chunks,error`` per request (the evidence)."""
        lines = ["pair,side,first,ttft_ms,itl_ms,e2e_ms,chunks,error"]
        for i, first in enumerate(self.order):
            for side in ("new", "base"):
                seq = getattr(self, side)
                if i >= len(seq):
                    continue
                t = seq[i]
                f = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
                lines.append(f"{i},{side},{first},{f(t.ttft_ms)},{f(t.itl_ms)},{f(t.e2e_ms)},{t.chunks},"
                             f"{(t.error or '').replace(',', ';')}")
        return "\n".join(lines) + "\n"


def take_pairs(pairs: Pairs, new: Callable[[], Timing], base: Callable[[], Timing], k: int,
               seconds_left: float | None, clock: Callable[[], float] = time.monotonic) -> int:
    """Add ``k`` pairs (fewer when ``seconds_left`` runs out, or once either side leaves a request
    unanswered -- a hung endpoint costs one timeout), alternating which endpoint goes first;
    returns how many were added. ``new``/``base`` send one request each (injected)."""
    t0 = clock()
    added = 0
    for _ in range(k):
        if seconds_left is not None and clock() - t0 >= seconds_left:
            break
        first = "new" if len(pairs.order) % 2 == 0 else "base"
        if first == "new":
            a = new()
            b = base()
        else:
            b = base()
            a = new()
        pairs.new.append(a)
        pairs.base.append(b)
        pairs.order.append(first)
        added += 1
        if a.unanswered or b.unanswered:
            break
    return added


def summary(pairs: Pairs) -> dict[str, Any]:
    """Per side and metric: n, p50, p95 (ms) -- the evidence beside the verdict."""
    out: dict[str, Any] = {}
    for side in ("new", "base"):
        out[side] = {}
        for m in METRICS:
            xs = pairs.values(side, m)
            out[side][m] = {"n": len(xs), "p50": round(percentile(xs, 50), 3) if xs else None,
                            "p95": round(percentile(xs, 95), 3) if xs else None}
        out[side]["errors"] = len(pairs.errors(side))
    return out


__all__ = ["METRICS", "Pairs", "Timing", "summary", "take_pairs", "timed"]
