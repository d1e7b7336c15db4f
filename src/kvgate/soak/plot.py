"""The soak's picture: retained server memory and TTFT p95 per round, with the fitted lines.

:func:`soak_png` draws two panels (matplotlib, Agg) from a
:class:`~kvgate.gates.soak.SoakAnalysis`: memory per round as the low envelope (points) inside
its min-max band, TTFT p95 per round; on each the least-squares line with its confidence band
(the band of the fitted mean), the Theil-Sen line, the last-part fit, and the warm-up shaded.
x is minutes (hours for soaks of 2 h and more) since the soak started; slopes are per hour. Pure: returns PNG bytes; the caller writes or attaches them.
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from kvgate.stats import Trend, t_quantile

if TYPE_CHECKING:  # pragma: no cover
    from kvgate.gates.soak import SoakAnalysis


def _low_level(f: Any) -> str:
    """``, lower end at 99.99%`` when the slope's lower end is at another level (the run's false-alarm
    budget share, :func:`kvgate.stats.linear_fit`'s ``lower_confidence``); else empty."""
    return "" if getattr(f, "lower_confidence", None) is None else f", lower end at {f.lower_confidence * 100:.4g}%"


def _band(tr: Trend, x: np.ndarray, xs: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fitted line and its two-sided confidence band of the mean at ``x`` (fit points ``xs``)."""
    f = tr.ols
    y = f.intercept + f.slope * x
    if f.n < 3 or math.isnan(f.stderr):
        return y, y, y
    xa = np.asarray(xs, dtype=float)
    xm = xa.mean()
    sxx = float(((xa - xm) ** 2).sum())
    s = f.stderr * math.sqrt(sxx)  # residual standard deviation
    half = t_quantile(f.confidence, f.n - 2) * s * np.sqrt(1.0 / f.n + (x - xm) ** 2 / sxx)
    return y, y - half, y + half


def _panel(ax: Any, rows: list[dict[str, Any]], key: str, band_keys: tuple[str, str] | None, growth: Any,
           x_of: Any, ylabel: str, unit: str, warm_end_h: float, color: str, scale: float) -> None:
    """One panel; x values are hours, drawn times ``scale`` (60: minutes)."""
    pts = [(x_of(r), r[key], r["warmup"]) for r in rows if r.get(key) is not None]
    if band_keys:
        lo_k, hi_k = band_keys
        bx = [x_of(r) for r in rows if r.get(lo_k) is not None and r.get(hi_k) is not None]
        lo = [r[lo_k] for r in rows if r.get(lo_k) is not None and r.get(hi_k) is not None]
        hi = [r[hi_k] for r in rows if r.get(lo_k) is not None and r.get(hi_k) is not None]
        if bx:
            ax.fill_between([b * scale for b in bx], lo, hi, color=color, alpha=0.12, step="mid", label="round min-max")
    if warm_end_h > 0:
        ax.axvspan(0, warm_end_h * scale, color="#999999", alpha=0.15, label="warm-up (not fitted)")
    if pts:
        ax.plot([p[0] * scale for p in pts if not p[2]], [p[1] for p in pts if not p[2]], "o", color=color, ms=4,
                label=ylabel.split(" (")[0])
        ax.plot([p[0] * scale for p in pts if p[2]], [p[1] for p in pts if p[2]], "o", color="#999999", ms=4)
    if growth is not None:
        xs = [p[0] for p in pts if not p[2]]
        if len(xs) >= 2:
            x = np.linspace(min(xs), max(xs), 50)
            y, lo, hi = _band(growth.full, x, xs)
            ax.plot(x * scale, y, "-", color="#c0392b", lw=1.5, label=f"least squares {growth.full.slope:+,.1f} {unit}")
            ax.fill_between(x * scale, lo, hi, color="#c0392b", alpha=0.15,
                            label=f"{growth.full.ols.confidence * 100:.4g}% band ({growth.full.ci_low:+,.1f}.."
                                  f"{growth.full.ci_high:+,.1f}{_low_level(growth.full.ols)})")
            ts = growth.full
            ax.plot(x * scale, ts.theil_intercept + ts.theil_sen * x, "--", color="#2c3e50", lw=1,
                    label=f"Theil-Sen {ts.theil_sen:+,.1f} {unit}")
            if growth.last is not None:
                lx = xs[-growth.last.n:]
                xx = np.linspace(min(lx), max(lx), 20)
                ax.plot(xx * scale, growth.last.ols.intercept + growth.last.slope * xx, ":", color="#8e44ad", lw=2,
                        label=f"last part {growth.last.slope:+,.1f} {unit}")
    ax.set_ylabel(ylabel)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def soak_png(a: "SoakAnalysis", title: str = "soak") -> bytes:
    """PNG of the soak (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = a.result.plan
    rows = a.result.rows

    def x_of(r: dict[str, Any]) -> float:
        return (r["t_start_s"] + p.round_s / 2) / 3600.0

    warm_end_h = p.warmup_rounds * p.round_s / 3600.0
    scale, xunit = (60.0, "minutes") if p.duration_s < 7200 else (1.0, "hours")
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    mem = a.result.samplers.get("server-memory") or {}
    _panel(axes[0], rows, "mem_min_mb", ("mem_min_mb", "mem_max_mb"), a.memory, x_of,
           "retained memory (MB, round low envelope)", "MB/h", warm_end_h, "#3b6ea5", scale)
    axes[0].set_title(f"memory: {mem.get('quantity', 'n/a')} - {mem.get('source', 'not measured')}"[:110], fontsize=8)
    _panel(axes[1], rows, "ttft_p95_ms", None, a.ttft, x_of, "TTFT p95 (ms)", "ms/h", warm_end_h, "#d35400", scale)
    axes[1].set_xlabel(f"{xunit} since the soak started (slopes per hour)")
    fig.suptitle(f"{title}: {a.classification} ({len(rows)} rounds of {p.round_s:g} s at {p.rate_rps:g} req/s)",
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


__all__ = ["soak_png"]
