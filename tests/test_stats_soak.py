"""Soak statistics on seeded synthetic series with known slopes and noise, both ways: a trend
above the ceiling is found, one below (or none) is not; a plateau is told from growth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.stats import (growth, linear_fit, low_envelope, points_to_decide, residual_sd, slope_half_width, theil_sen,
                          trend)


def series(slope: float, noise: float, n: int = 24, hours: float = 6.0, seed: int = 0, base: float = 1000.0):
    """``n`` rounds over ``hours``; y = base + slope * t + N(0, noise)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, hours, n)
    return t.tolist(), (base + slope * t + rng.normal(0, noise, n)).tolist()


def test_theil_sen_matches_a_hand_worked_example_and_shrugs_off_an_outlier():
    # pairwise slopes of (0,0) (1,1) (2,2) (3,9): 1, 1, 3, 1, 4, 7 -> median 2.0
    s, lo, hi, b = theil_sen([0, 1, 2, 3], [0, 1, 2, 9])
    assert s == pytest.approx(2.0) and lo <= s <= hi
    x = list(range(12))
    y = [2.0 * v for v in x]
    y[5] = 500.0  # one wild sample
    assert theil_sen(x, y)[0] == pytest.approx(2.0)
    assert linear_fit(x, y).slope != pytest.approx(2.0, rel=0.05)  # least squares is dragged


@pytest.mark.parametrize("seed", range(20))
def test_a_known_slope_lies_in_its_95_percent_interval_and_is_detected(seed):
    # 60 MB/h leak, 8 MB round-to-round noise, 24 rounds over 6 h, ceiling 20 MB/h
    x, y = series(60.0, 8.0, seed=seed)
    tr = trend(x, y)
    assert tr.ci_low < 60.0 < tr.ci_high or abs(tr.slope - 60.0) < 3 * tr.ols.stderr
    g = growth(x, y, ceiling=20.0)
    assert g.exceeds and g.kind == "growth"


def test_interval_coverage_is_close_to_95_percent_on_200_seeded_series():
    hits = 0
    for seed in range(200):
        x, y = series(30.0, 10.0, n=16, seed=seed)
        tr = trend(x, y)
        hits += tr.ci_low <= 30.0 <= tr.ci_high
    assert 0.90 <= hits / 200 <= 0.99


def test_flat_noisy_series_rarely_exceed_a_positive_ceiling():
    # the false-alarm side: no trend, heavy noise; a leak needs the lower bound above the ceiling
    alarms = sum(growth(*series(0.0, 15.0, seed=s), ceiling=20.0).exceeds for s in range(200))
    assert alarms <= 2  # expected well under 1 % (t-test at 2.5 % one-sided, plus Theil-Sen agreeing)
    # a slope just under the ceiling is not called either (point estimate alone is not enough)
    near = sum(growth(*series(15.0, 15.0, seed=s), ceiling=20.0).exceeds for s in range(100))
    assert near <= 5


def test_a_positive_point_estimate_inside_noise_is_not_a_leak():
    x = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]            # hours
    y = [1000, 1100, 980, 1120, 1010, 1090]       # MB: a +60 MB/h point estimate, noise +-60 MB
    g = growth(x, y, ceiling=20.0)
    assert g.full.slope > 0 and g.full.ci_low < 20.0 and not g.exceeds and g.kind == "flat"


def test_growth_then_plateau_is_a_bounded_cache_not_a_leak():
    rng = np.random.default_rng(7)
    t = np.linspace(0, 6, 30)
    y = 1000 + np.minimum(t, 3.0) * 200 + rng.normal(0, 5, t.size)  # fills for 3 h, then flat
    g = growth(t.tolist(), y.tolist(), ceiling=20.0)
    assert g.full.above(20.0)              # the whole run rose...
    assert g.last is not None and g.last.theil_sen <= 20.0  # ...the last part did not
    assert g.plateau and not g.exceeds and g.kind == "bounded"


def test_linear_growth_is_not_mistaken_for_a_plateau_even_with_a_short_noisy_last_part():
    for seed in range(20):
        x, y = series(100.0, 30.0, n=12, seed=seed)
        g = growth(x, y, ceiling=20.0)
        assert not g.plateau, seed
        assert g.kind == "growth", seed


def test_growth_that_starts_late_is_caught_by_the_last_part_fit():
    rng = np.random.default_rng(11)
    t = np.linspace(0, 6, 30)
    y = 1000 + np.maximum(t - 4.0, 0) * 400 + rng.normal(0, 3, t.size)
    g = growth(t.tolist(), y.tolist(), ceiling=20.0)
    assert g.last is not None and g.last.above(20.0) and g.exceeds and g.kind == "growth"


def test_last_part_needs_enough_points():
    g = growth([0, 1, 2, 3, 4], [1, 2, 3, 4, 5], ceiling=0.5)
    assert g.last is not None and g.last.n == 4  # max(4, ceil(5/3)) = 4 of 5 points
    assert growth([0, 1, 2, 3], [1, 2, 3, 4], ceiling=0.5).last is None  # all of them: no separate fit


def test_low_envelope_takes_each_windows_floor():
    times = [0.1, 0.5, 0.9, 1.2, 1.7, 2.5]
    values = [5.0, 3.0, None, 8.0, 7.5, 1.0]
    assert low_envelope(times, values, [0, 1, 2, 3, 4]) == [3.0, 7.5, 1.0, None]


def test_sawtooth_with_a_flat_floor_has_a_flat_envelope():
    t = np.arange(0, 3600, 5.0)  # 1 h of 5 s samples
    saw = 500 + 80 * ((t % 300) / 300)  # allocator sawtooth, 5 min period, floor 500
    edges = np.arange(0, 3601, 300.0)
    env = low_envelope(t.tolist(), saw.tolist(), edges.tolist())
    assert env == pytest.approx([500.0] * 12)
    # the peaks alone would wander with phase; the floor does not
    g = growth((edges[:-1] / 3600).tolist(), env, ceiling=20.0)
    assert g.kind == "flat" and not math.isnan(g.full.ci_low)


def test_a_single_allocator_step_is_not_growth():
    # measured on the embedded vLLM: a slow creep, then one +2.1 MB step near the end. The
    # least-squares slope is 143 MB/h and significantly positive; the last part alone would look
    # like a leak that started late, but its rank-based Theil-Sen interval reaches down to 9 MB/h.
    t = [i * 8 / 3600 for i in range(8)]
    y = [1668.13, 1668.14, 1668.16, 1668.16, 1668.18, 1668.20, 1670.33, 1670.35]
    g = growth(t, y, ceiling=20.0)
    assert g.full.ci_low > 20.0 and g.full.theil_sen < 20.0 and not g.full.above(20.0)
    assert g.last is not None and g.last.theil_sen > 20.0 and not g.last.sustained(20.0)
    assert not g.exceeds and g.kind == "flat"


def test_sustained_growth_needs_both_intervals_above_the_ceiling():
    x, y = series(60.0, 2.0, n=12, hours=2.0, seed=5)  # a clean 1 MB/min leak
    tr = trend(x, y)
    assert tr.above(40.0) and tr.sustained(40.0) and tr.theil_low > 40.0


@pytest.mark.parametrize("seed", range(5))
def test_slope_half_width_is_the_fits_own_interval_on_evenly_spaced_rounds(seed):
    # the projection soak/latency's INCONCLUSIVE cause rests on: at the measured scatter, the
    # formula gives exactly the interval linear_fit computes over evenly spaced points
    x, y = series(5.0, 12.0, n=8 + seed, hours=1.0, seed=seed)
    fit = linear_fit(x, y)
    sd = residual_sd(x, y, fit)
    assert sd == pytest.approx(math.sqrt(sum((b - fit.intercept - fit.slope * a) ** 2 for a, b in zip(x, y)) / (len(x) - 2)))
    assert slope_half_width(len(x), x[1] - x[0], sd) == pytest.approx(fit.ci_high - fit.slope)


def test_points_to_decide_is_the_fewest_rounds_whose_interval_clears_the_gap():
    spacing, sd, gap = 8 / 3600, 100.0, 12000.0
    n = points_to_decide(gap, spacing, sd, at_least=9)
    assert n is not None and n >= 9
    assert slope_half_width(n, spacing, sd) < gap <= slope_half_width(n - 1, spacing, sd)
    assert points_to_decide(gap, spacing, sd, at_least=n + 5) == n + 5  # already narrow enough there
    assert points_to_decide(0.0, spacing, sd) is None  # the slope sits on the ceiling: no length decides
    assert points_to_decide(1e-12, spacing, sd, most=10_000) is None
    assert points_to_decide(gap, spacing, float("nan")) is None
    # more scatter needs more rounds; a wider gap fewer
    assert points_to_decide(gap, spacing, 2 * sd) > n > points_to_decide(2 * gap, spacing, sd)
