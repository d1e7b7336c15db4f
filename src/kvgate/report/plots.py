"""Plots attached to the Allure report where a picture reads faster than the numbers:
:func:`interference_png` (short requests' TTFT alone vs while long prefills run) and
:func:`checks_png` (each sub-check's measured value against its limit -- for the fit gate, what the
KV pool holds against what the profile declares). PNG bytes via matplotlib's Agg backend.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

from kvgate.verdict import Status, Verdict

#: Bar colour per status.
COLOURS = {Status.PASS: "#3b8f5a", Status.FAIL: "#c0392b", Status.INVALID: "#b9770e", Status.SKIP: "#95a5a6",
           Status.INCOMPLETE: "#7f8c8d", Status.INCONCLUSIVE: "#8e44ad"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _short_ttft_ms(records: Sequence[Any]) -> list[float]:
    from kvgate.stats import request_metrics

    out = []
    for r in records:
        if getattr(r, "tag", None) == "short" and r.ok:
            m = request_metrics(r)
            if m.ttft_s is not None:
                out.append(m.ttft_s * 1e3)
    return out


def interference_png(alone: Sequence[Any], mixed: Sequence[Any], slo_ms: float | None, title: str) -> bytes:
    """PNG: the TTFT (ms) of short requests (records tagged ``short``; ``kvgate.load``'s
    RequestRecord) alone and while long prefills run, as two histograms on one axis with their
    p95 marked, and the SLO ``slo_ms`` when the profile sets one."""
    import numpy as np

    plt = _pyplot()
    a, m = _short_ttft_ms(alone), _short_ttft_ms(mixed)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    both = a + m
    bins = np.linspace(0, max(both) * 1.05, 40) if both else 10
    for data, name, colour in ((a, "alone", "#3b6ea5"), (m, "with long prefills", "#c0392b")):
        if data:
            p95 = float(np.percentile(data, 95))
            ax.hist(data, bins=bins, alpha=0.6, color=colour, label=f"short {name} (n={len(data)}, p95 {p95:,.0f} ms)")
            ax.axvline(p95, color=colour, linestyle="--", linewidth=1)
    if slo_ms:
        ax.axvline(slo_ms, color="black", linewidth=1.2, label=f"SLO short TTFT p95 {slo_ms:,.0f} ms")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("short requests")
    if a or m or slo_ms:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no successful short request", transform=ax.transAxes, ha="center")
    ax.set_title(title)
    return _png(fig)


def checks_png(verdict: Verdict, title: str) -> bytes:
    """PNG: one pair of horizontal bars per sub-check (``verdict.parts``, or the verdict itself)
    with a numeric measured value and limit in the same unit -- measured coloured by its status,
    limit in grey -- on a log axis when they span more than 100x. Checks without numbers are
    listed as not plotted."""
    plt = _pyplot()
    rows, skipped = [], []
    for p in verdict.parts or (verdict,):
        if isinstance(p.measured, (int, float)) and isinstance(p.limit, (int, float)) \
                and not isinstance(p.measured, bool) and (p.limit_unit in (None, p.unit)):
            rows.append(p)
        else:
            skipped.append(p.gate)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.75 * max(len(rows), 1)))
    for i, p in enumerate(rows):
        y = len(rows) - 1 - i
        ax.barh(y + 0.18, p.measured, height=0.34, color=COLOURS.get(p.status, "#555"))
        ax.barh(y - 0.18, p.limit, height=0.34, color="#bdc3c7")
        ax.text(p.measured, y + 0.18, f" {p.measured:,.6g} {p.unit or ''} ({p.status.value})", va="center", fontsize=8)
        ax.text(p.limit, y - 0.18, f" limit {p.limit:,.6g} {p.unit or ''}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [p.gate for p in reversed(rows)], fontsize=8)
    values = [v for p in rows for v in (p.measured, p.limit) if v > 0]
    if values and max(values) / min(values) > 100:
        ax.set_xscale("log")
    ax.set_title(title + (f"  (not plotted: {', '.join(skipped)})" if skipped else ""), fontsize=9)
    ax.margins(x=0.35)
    return _png(fig)
