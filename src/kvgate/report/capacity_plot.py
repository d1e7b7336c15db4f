"""The capacity gate's plot (``capacity.png``): per search step, TTFT/ITL/e2e p95 with their
confidence bounds against the SLO limits (left), and throughput and goodput in requests per second
(right), both over the step's concurrency, the knee and the concurrency the declared peak needs
marked. PNG bytes via matplotlib's Agg backend (:mod:`kvgate.report.plots`)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from kvgate.report.plots import _png, _pyplot

#: Line colour per judged percentile.
COLOURS = {"TTFT": "#1f77b4", "ITL": "#2ca02c", "e2e": "#d62728"}


#: A tick closer than this (log2 units: 2**0.2 = 1.15x) to another one is left out: the labels overlap.
TICK_GAP_LOG2 = 0.2


def x_ticks(xs: Sequence[int], need: int | None) -> list[int]:
    """The x ticks: every step's concurrency, and ``need`` unless it sits within
    :data:`TICK_GAP_LOG2` of a step (15 beside 16 printed as ``1516``; its line stays, labelled in
    the legend)."""
    ticks = sorted(set(xs))
    if need and need not in ticks and all(abs(math.log2(need) - math.log2(t)) >= TICK_GAP_LOG2 for t in ticks):
        ticks = sorted([*ticks, need])
    return ticks


def capacity_png(steps: Sequence[Any], knee: int, need: int | None, title: str) -> bytes:
    """PNG of the judged ``steps`` (:class:`kvgate.gates.capacity.StepResult`, any order; times in
    ms, rates per second); ``knee`` and ``need`` (requests) drawn as vertical lines (``need`` None:
    no declared peak)."""
    plt = _pyplot()
    ordered = sorted(steps, key=lambda s: s.concurrency)
    xs = [s.concurrency for s in ordered]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, colour in COLOURS.items():
        pts = [(s.concurrency, s.metrics.get(label) or {}) for s in ordered]
        pts = [(c, m) for c, m in pts if m.get("point") is not None]
        if not pts:
            continue
        cs = [c for c, _ in pts]
        ys = [m["point"] for _, m in pts]
        lo = [m["point"] - (m.get("lower") if m.get("lower") is not None else m["point"]) for _, m in pts]
        hi = [(m.get("upper") if m.get("upper") is not None else m["point"]) - m["point"] for _, m in pts]
        ax1.errorbar(cs, ys, yerr=[lo, hi], marker="o", capsize=3, color=colour, label=f"{label} p95 (bounds)")
        limit = next((m.get("limit") for _, m in pts if m.get("limit") is not None), None)
        if limit is not None:
            ax1.axhline(limit, color=colour, linestyle="--", linewidth=1, label=f"{label} SLO {limit:,.0f} ms")
    ax1.set_xlabel("concurrency (requests in flight)")
    ax1.set_ylabel("ms")
    ax1.set_yscale("log")
    ax1.set_title("latency p95 per step")
    ax2.plot(xs, [s.throughput_rps for s in ordered], marker="o", label="throughput (req/s)")
    ax2.plot(xs, [s.goodput_rps for s in ordered], marker="s", label="goodput (req/s meeting every SLO)")
    ax2.set_xlabel("concurrency (requests in flight)")
    ax2.set_ylabel("requests / s")
    ax2.set_title("throughput and goodput")
    for ax in (ax1, ax2):
        if xs:
            ax.set_xscale("log", base=2)
            ticks = x_ticks(xs, need)
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(t) for t in ticks])
            ax.set_xlim(min([*ticks, need or ticks[0]]) / 1.3, max([*ticks, need or ticks[0]]) * 1.3)
        if knee:
            ax.axvline(knee, color="#3b8f5a", linestyle=":", label=f"knee {knee}")
        if need:
            ax.axvline(need, color="#c0392b", linestyle="-.", label=f"peak x margin {need}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for s in ordered:
        if s.decision != "PASS":
            ax1.annotate(s.decision, (s.concurrency, (s.metrics.get("TTFT") or {}).get("point") or 1),
                         fontsize=7, color="#c0392b")
    fig.suptitle(title)
    return _png(fig)


__all__ = ["capacity_png"]
