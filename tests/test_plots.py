"""Report plots (kvgate.report.plots): which records and checks they draw, and that they are PNGs."""

from __future__ import annotations

import io
from types import SimpleNamespace

from kvgate.report import plots
from kvgate.verdict import Status, Verdict


def rec(tag: str, ttft_s: float, ok: bool = True) -> SimpleNamespace:
    return SimpleNamespace(tag=tag, ok=ok, sent_s=1.0, first_token_s=1.0 + ttft_s, end_s=2.0 + ttft_s,
                           content_s=[1.0 + ttft_s, 1.1 + ttft_s], tokens=2)


def size(png: bytes) -> tuple[int, int]:
    import matplotlib.image

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    h, w = matplotlib.image.imread(io.BytesIO(png)).shape[:2]
    return w, h


def test_interference_plot_draws_only_successful_short_requests():
    mixed = [rec("short", 0.5), rec("short", 0.7), rec("long", 9.0), rec("short", 0.1, ok=False)]
    assert plots._short_ttft_ms(mixed) == [500.0, 700.0]
    png = plots.interference_png([rec("short", 0.02)] * 8, mixed, 400, "tiny: short TTFT")
    assert size(png) == (810, 342)
    assert size(plots.interference_png([], [], None, "nothing measured")) == (810, 342)  # never raises


def test_checks_plot_has_one_row_per_numeric_check():
    v = Verdict("fit", Status.FAIL, "x -> FAIL", parts=(
        Verdict("fit.budget", Status.SKIP, "memory not declared -> SKIP"),
        Verdict("fit.long", Status.FAIL, "1 at once -> FAIL", 1, 8, unit="sequences"),
        Verdict("fit.max_num_seqs", Status.PASS, "10 fit -> PASS", 10, 8, unit="sequences")))
    two = size(plots.checks_png(v, "fit"))
    one = size(plots.checks_png(Verdict("t", Status.PASS, "ok", 20.0, 500, unit="ms"), "ttft"))
    assert two[1] > one[1]  # taller with more rows
    wide = Verdict("fit.budget", Status.PASS, "ok", 6_933_953_045, 1_000, unit="bytes")
    assert size(plots.checks_png(wide, "log axis")) == one


def test_capacity_ticks_leave_out_a_need_that_would_overlap_a_step():
    from kvgate.report.capacity_plot import x_ticks

    # tiny-cpu: need 12 x 1.25 = 15 beside the first step 16 printed as "1516" under the axis
    assert x_ticks([16, 32, 64], 15) == [16, 32, 64]
    assert x_ticks([16, 32, 64], 24) == [16, 24, 32, 64] and x_ticks([1, 2, 4], None) == [1, 2, 4]
    assert x_ticks([4, 8], 20) == [4, 8, 20] and x_ticks([4, 8], 8) == [4, 8]
