"""kvgate.stats.dependence: ICC, lag-k autocorrelation, Kish's effective n, and the percentile
verdict at the effective n -- its error rates simulated on lock-step waves (seeded, < 5 s each)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from kvgate.stats.confidence import FAIL, PASS, UNDECIDED, judge, split_levels
from kvgate.stats.dependence import (icc_oneway, independent, judge_dependent, kish_n_eff, lag_autocorr, n_to_decide,
                                     one_per_cluster, pass_confidence, send_order_dependence, wave_dependence)

LIMIT = float(norm.ppf(0.95))  # the true marginal p95 of a standard normal: the limit at the boundary


def waves(rng: np.random.Generator, n_waves: int, m: int, rho: float) -> np.ndarray:
    """``n_waves`` lock-step waves of ``m`` standard-normal values with intraclass correlation ``rho``."""
    a = rng.standard_normal(n_waves) * rho ** 0.5
    return a[:, None] + rng.standard_normal((n_waves, m)) * (1 - rho) ** 0.5


def test_icc_by_one_way_anova_recovers_the_wave_correlation_and_the_measured_record():
    rng = np.random.default_rng(7)
    assert icc_oneway(waves(rng, 400, 4, 0.6)) == pytest.approx(0.6, abs=0.05)
    assert icc_oneway(waves(rng, 400, 4, 0.0)) == pytest.approx(0.0, abs=0.05)
    # the real record's shape (2026-12-06): within a wave the four TTFTs differ by the send offsets only
    rec = [[3662.4, 3649.9, 3637.1, 3624.7], [2801.0, 2788.2, 2776.0, 2763.1], [3300.5, 3288.0, 3275.9, 3263.0]]
    assert icc_oneway(rec) > 0.99
    assert icc_oneway([[1.0, 1.0], [2.0, 2.0]]) == 1.0
    assert icc_oneway([[1.0, 2.0]]) is None and icc_oneway([[1.0], [2.0]]) is None


def test_lag_autocorrelation_sees_the_lock_step_period():
    rng = np.random.default_rng(3)
    lock = np.tile([320.0, 900.0, 900.0, 900.0], 20) + rng.standard_normal(80)  # 1 fast + 3 slow per wave
    assert lag_autocorr(lock, 4) > 0.95
    assert abs(lag_autocorr(rng.standard_normal(2000), 4)) < 0.06
    assert lag_autocorr([1.0, 2.0], 1) is None
    with pytest.raises(ValueError):
        lag_autocorr([1.0, 2.0, 3.0], 0)


def test_kish_effective_n_and_the_dependence_stated():
    assert kish_n_eff(60, 4, 1.0) == 15 and kish_n_eff(60, 4, 0.0) == 60 and kish_n_eff(60, 4, 0.5) == 24
    dep = wave_dependence([[5.0] * 4, [6.0] * 4, [7.0] * 4])
    assert dep.n_eff == pytest.approx(3.0) and dep.design_effect == pytest.approx(4.0)
    assert "12 short requests in 3 waves, ICC within waves (one-way ANOVA) 1.00: effective n 3.0" == dep.text()
    assert dep.to_dict()["formula"].startswith("Kish")
    so = send_order_dependence(np.repeat(np.random.default_rng(2).standard_normal(200), 4), 4)  # 4 identical per wave
    assert 3.0 <= so.design_effect <= 4.2  # 4 at ICC 1 (the biased lag estimator and the noise allowance: 3.2)
    assert independent(15, "wave").n_eff == 15


def test_a_pass_is_impossible_below_the_effective_n_and_names_the_n_that_would_decide():
    xs = np.repeat(np.linspace(1, 2, 15), 4)  # 60 values, 15 identical waves, all under the limit 10
    dep = wave_dependence(xs.reshape(15, 4))
    assert judge(xs, 0.95, 10.0, 0.95).decision == PASS  # the old reading: 60 independent samples
    j = judge_dependent(xs, 0.95, 10.0, 0.95, None, dep)
    assert j.decision == UNDECIDED and j.bound.n == 15 and j.bound.upper is None
    assert n_to_decide(0.95, 0.95, dep) == 59 * 4
    assert pass_confidence(xs, 0.95, 10.0, dep.n_eff) == pytest.approx(1 - 0.95 ** 15)
    # and both ways: a clear FAIL stays a FAIL at the effective n
    assert judge_dependent(xs + 100, 0.95, 10.0, 0.95, None, dep).decision == FAIL


def test_independent_values_keep_the_order_statistic_ranks():
    rng = np.random.default_rng(11)
    xs = rng.standard_normal(100)
    a, b = judge(xs, 0.95, 3.0, 0.95), judge_dependent(xs, 0.95, 3.0, 0.95, None, independent(100))
    assert (a.bound.upper, a.bound.lower, a.decision) == (b.bound.upper, b.bound.lower, b.decision)


def test_one_value_per_wave_draws_one_member_of_each():
    rng = np.random.default_rng(0)
    got = one_per_cluster([[1.0, 2.0], [3.0], [], [4.0, 5.0, 6.0]], rng)
    assert len(got) == 3 and got[0] in (1.0, 2.0) and got[1] == 3.0 and got[2] in (4.0, 5.0, 6.0)


def _rates(rho: float, runs: int, looks_waves: tuple[int, ...], by_order: bool, dependent: bool = True,
           m: int = 4, seed: int = 1, fail_confidence: float | None = None,
           fail_worst: bool = False) -> tuple[float, float]:
    """(wrong PASS, wrong FAIL) of sampling in planned looks (FAIL and PASS errors spent apart,
    :func:`split_levels`; the FAIL side at ``fail_confidence`` when given) on lock-step waves of
    ``m`` at ICC ``rho``, the limit at the true p95. ``fail_worst``: the FAIL side at one value
    per wave (:func:`send_order_dependence`'s ``fail_worst``, what a run with a budget uses)."""
    rng = np.random.default_rng(seed)
    plan = split_levels([w * m for w in looks_waves], 0.95, 0.95, fail_confidence=fail_confidence)
    wp = wf = 0
    for _ in range(runs):
        x = waves(rng, looks_waves[-1], m, rho)
        for w in looks_waves:
            g = x[:w]
            if dependent:
                dep = (send_order_dependence(g.ravel(), m, fail_worst=fail_worst) if by_order
                       else wave_dependence(g))
                d = judge_dependent(g.ravel(), 0.95, LIMIT, plan.per_look, plan.pass_level, dep).decision
            else:
                d = judge(g.ravel(), 0.95, LIMIT, plan.per_look, plan.pass_level).decision
            if d != UNDECIDED:
                wp, wf = wp + (d == PASS), wf + (d == FAIL)
                break
    return wp / runs, wf / runs


def _mc(p: float, runs: int) -> float:
    """3 Monte-Carlo standard errors of a rate ``p`` over ``runs``."""
    return 3 * math.sqrt(p * (1 - p) / runs)


@pytest.mark.parametrize("rho", [0.9, 1.0])
def test_interference_waves_at_the_limit_err_within_the_stated_rate(rho):
    """Interference's plan (16/60 shorts, 4 per wave): with the ICC measured and the bound at the
    effective n, wrong PASS and wrong FAIL within 5% + MC error (simulated: 0.0% / 0.5-1.6% at
    2,000 runs); judged as 60 independent samples the same waves err 25-46% / 15-27%."""
    runs = 2000
    wp, wf = _rates(rho, runs, (4, 15), by_order=False)
    assert wp <= 0.05 + _mc(0.05, runs) and wf <= 0.05 + _mc(0.05, runs), (wp, wf)
    old_wp, old_wf = _rates(rho, 400, (4, 15), by_order=False, dependent=False)
    assert old_wp > 0.15 and old_wf > 0.08, (old_wp, old_wf)  # the defect the dependence removes


@pytest.mark.parametrize("rho", [0.9, 1.0])
def test_lock_step_closed_loop_at_the_limit_errs_within_the_stated_rate(rho):
    """latency/slo's plan (32/80/160/256 requests, concurrency 4) on lock-step waves in send
    order, dependence by lag-1..4 autocorrelation counted beyond its noise: within 5% + MC error
    (simulated at 1,000 runs: wrong PASS 0.9% / 2.3%, wrong FAIL 3.4% / 4.9% at ICC 0.9 / 1.0)."""
    runs = 800
    wp, wf = _rates(rho, runs, (8, 20, 40, 64), by_order=True)
    assert wp <= 0.05 + _mc(0.05, runs) and wf <= 0.05 + _mc(0.05, runs), (wp, wf)


def test_lock_step_closed_loop_at_a_budget_share_fails_wrongly_at_most_that_share():
    """The main job's false-alarm budget (1% over 9 families: the FAIL side at 99.89%, 0.028% a
    look over 4) on latency/slo's plan: the FAIL side's effective n is one value per wave of the
    concurrency (the worst a lock-step loop can be) -- wrong FAIL within 0.11% + MC error
    (simulated at 2,000 runs: 0.0% at ICC 1, 0.9 and 0). With the PASS side's estimate (the
    lag sum beyond its noise allowance, biased low at 32 requests) the same loop FAILs wrongly
    2.3% of 1,000 runs at ICC 1; counted whole without the allowance, still 0.47% of 3,000."""
    share = 0.01 / 9
    kw = dict(by_order=True, fail_confidence=1 - share, seed=7)
    _, wf = _rates(1.0, 1000, (8, 20, 40, 64), fail_worst=True, **kw)
    assert wf <= share + _mc(share, 1000), wf
    _, wf_allowance = _rates(1.0, 300, (8, 20, 40, 64), **kw)
    assert wf_allowance > share + _mc(share, 300), wf_allowance


@pytest.mark.parametrize("level, least", [(0.95, 0.3), (0.75, 0.9)])
def test_independent_waves_pass_a_healthy_server_at_the_level_their_effective_n_allows(level, least):
    """Power where there is no dependence (ICC 0) and the true p95 is 0.6x the limit, at the cap of
    15 waves of 4: a 95% PASS needs all 60 worth 59, so an ICC estimated a little above 0 leaves it
    undecided (simulated 43% PASS); a PASS side declared at 75% (28 effective) PASSes 90%+."""
    rng = np.random.default_rng(5)
    passes = 0
    for _ in range(300):
        x = waves(rng, 15, 4, 0.0)
        dep = wave_dependence(x)
        passes += judge_dependent(x.ravel(), 0.95, LIMIT / 0.6, 0.975, level, dep).decision == PASS
    assert passes / 300 > least, passes


def test_send_order_text_states_the_sum_and_its_part_beyond_the_noise_allowance():
    from kvgate.stats.dependence import send_order_dependence
    # lock-step waves of 4 identical values: a large sum, most of it beyond the noise allowance
    xs = [float(v) for v in np.random.default_rng(3).normal(100, 10, 40) for _ in range(4)]
    dep = send_order_dependence(xs, 4)
    beyond = dep.value - 1.645 * math.sqrt(4 / len(xs))
    assert dep.design_effect == pytest.approx(1 + 2 * beyond)
    text = dep.text()
    assert text.startswith(f"160 requests, lag-1..4 autocorrelation in send order: sum {dep.value:.2f} "
                           f"({beyond:.2f} beyond noise): effective n {dep.n_eff:,.1f}"), text
    d = dep.to_dict()
    assert d["autocorr_sum"] == dep.value and d["autocorr_sum_beyond_noise"] == pytest.approx(beyond)
    assert "1.645 * sqrt(K / n)" in d["formula"] and "beyond its noise allowance" in d["formula"]
    # independent values: the sum is within its noise, nothing beyond: n kept
    ind = send_order_dependence(list(np.random.default_rng(4).normal(100, 10, 400)), 4)
    assert "(0.00 beyond noise)" in ind.text() and ind.n_eff == 400


def test_the_fail_sides_worst_case_is_stated_where_a_budget_asks_for_it():
    """Under a false-alarm budget (``fail_worst``) the text names the FAIL side's effective n (one
    value per ``max_lag`` requests) beside the PASS side's; independent values keep both."""
    from kvgate.stats.dependence import send_order_dependence
    xs = list(np.random.default_rng(4).normal(100, 10, 400))
    dep = send_order_dependence(xs, 4, fail_worst=True)
    assert dep.n_eff == 400 and dep.n_eff_fail == 100 and dep.to_dict()["n_eff_fail"] == 100
    assert dep.text().endswith("effective n 400.0 (a FAIL: one value per 4 requests, the worst case: effective n 100.0)")
    plain = send_order_dependence(xs, 4)
    assert plain.n_eff_fail == 400 and "a FAIL" not in plain.text() and "n_eff_fail" not in plain.to_dict()
