"""The decision procedures of kvgate.stats.proportion and kvgate.stats.twosample, and capacity's
three outcomes per step: exact numbers both ways, and each procedure's error rates simulated at
its limit with a seeded generator (a few hundred runs each, well under 5 s; the rates measured are
in the comments; the bound asserted is the stated rate plus three Monte-Carlo standard errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.gates.capacity import StepResult, capacity_verdict
from kvgate.profile.models import Profile, load_profile
from kvgate.stats.confidence import judge
from kvgate.stats.proportion import (interval, judge_at_least, judge_at_most, judge_not_worse, one_sided)
from kvgate.stats.twosample import judge_quantile_ratio, shift_ratio
from kvgate.verdict import Status

FAKE = __import__('pathlib').Path(__file__).parent / 'data' / 'fake-vllm.yaml'


def within(rate: float, stated: float, runs: int) -> bool:
    """``rate`` is within ``stated`` plus three Monte-Carlo standard errors of ``runs`` runs."""
    return rate <= stated + 3 * math.sqrt(stated * (1 - stated) / runs)


# ----------------------------------------------------------------------------- proportions

def test_clopper_pearson_one_sided_bounds_on_exact_numbers():
    lo, hi = one_sided(47, 65, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (0.6175, 0.8127)
    assert one_sided(0, 20, 0.95) == (0.0, pytest.approx(1 - 0.05 ** (1 / 20)))  # 13.9%: the rule of three's exact form
    assert one_sided(10, 10, 0.95)[0] == pytest.approx(0.05 ** (1 / 10))  # 74.1%
    assert interval(47, 65) == one_sided(47, 65, 0.975)  # two-sided 95% = each side one-sided 97.5%
    with pytest.raises(ValueError):
        one_sided(3, 2)


def test_error_rate_ceiling_both_ways_and_the_zero_allowance_is_a_count():
    assert judge_at_most(0, 80, 0.05).decision == "PASS"  # upper bound 3.7% <= 5%
    assert judge_at_most(0, 32, 0.05).decision == "UNDECIDED"  # upper bound 9.0%: 32 requests cannot show 5%
    one = judge_at_most(1, 32, 0.01)  # 3.1% on the point, lower bound 0.16%: not shown above 1%
    assert one.decision == "UNDECIDED" and "straddle 1.0% -> INCONCLUSIVE" in one.text("error rate")
    bad = judge_at_most(12, 80, 0.05)
    assert bad.decision == "FAIL" and bad.text("error rate").endswith("95% lower bound 8.89% > 5.0% -> FAIL")
    assert judge_at_most(1, 1000, 0.0).decision == "FAIL" and judge_at_most(0, 3, 0.0).decision == "PASS"
    assert judge_at_most(1, 1000, 0.0).text("error rate") == \
        "error rate 1/1000 requests = 0.1% (limit 0: any one counts) > 0 -> FAIL"


def test_accuracy_floor_and_non_inferiority_both_ways():
    assert judge_at_least(47, 65, 0.55).decision == "PASS"
    assert judge_at_least(42, 65, 0.55).decision == "UNDECIDED"
    assert judge_at_least(26, 65, 0.55).decision == "FAIL"
    assert judge_not_worse(395, 500, 400, 500, 0.08).decision == "PASS"
    assert judge_not_worse(47, 65, 47, 65, 0.058).decision == "UNDECIDED"  # 65 items cannot resolve 5.8 points
    assert judge_not_worse(20, 65, 47, 65, 0.058).decision == "FAIL"


def test_proportions_judge_the_fail_side_at_a_level_of_its_own():
    fc = 1 - 0.01 / 9  # a 1% false-alarm budget over 9 families
    assert judge_at_most(9, 80, 0.05).decision == "FAIL"  # 95% lower bound 6.0% > 5%
    two = judge_at_most(9, 80, 0.05, 0.95, fc)  # 99.89% lower bound 3.2%: not shown above 5%
    assert two.decision == "UNDECIDED" and two.upper == judge_at_most(9, 80, 0.05).upper
    assert "bounds 3.2% (99.89% lower)..18.8% (95% upper) straddle 5.0%" in two.text("error rate")
    assert two.to_dict()["fail_confidence"] == fc and two.fail_level == fc
    assert judge_at_most(20, 80, 0.05, 0.95, fc).text("error rate").endswith("99.89% lower bound 12.09% > 5.0% -> FAIL")
    assert judge_at_most(0, 80, 0.05, 0.95, fc).text("error rate") == judge_at_most(0, 80, 0.05).text("error rate")
    assert judge_at_most(9, 80, 0.05, 0.95, 0.95) == judge_at_most(9, 80, 0.05)  # the same level: as before
    assert "fail_confidence" not in judge_at_most(9, 80, 0.05).to_dict()
    assert (judge_at_least(28, 65, 0.55).decision, judge_at_least(28, 65, 0.55, 0.95, fc).decision) == ("FAIL", "UNDECIDED")
    assert judge_at_least(15, 65, 0.55, 0.95, fc).decision == "FAIL"
    assert judge_at_least(47, 65, 0.55, 0.95, fc).lower == judge_at_least(47, 65, 0.55).lower  # PASS side unchanged
    m = 0.08 * 47 / 65
    assert (judge_not_worse(30, 65, 47, 65, m).decision, judge_not_worse(30, 65, 47, 65, m, 0.95, fc).decision) == \
        ("FAIL", "UNDECIDED")
    assert judge_not_worse(15, 65, 47, 65, m, 0.95, fc).decision == "FAIL"
    assert judge_not_worse(30, 65, 47, 65, m, 0.95, fc).low == judge_not_worse(30, 65, 47, 65, m).low
    # at the ceiling (true 5%, 200 requests, 2,000 runs): wrong FAIL 0.0% at the budget's level (4.5% at 95%)
    ks = np.random.default_rng(10).binomial(200, 0.05, 2000)
    assert sum(judge_at_most(int(k), 200, 0.05, 0.95, fc).decision == "FAIL" for k in ks) / 2000 <= \
        (1 - fc) + 3 * math.sqrt((1 - fc) * fc / 2000)


def test_accuracy_floor_at_the_limit_passes_wrongly_within_its_rate():
    # true accuracy exactly at min_accuracy 0.6, 50 items, 400 runs: measured wrong PASS 2.0%, wrong FAIL 4.0%
    # (the point-estimate rule it replaced: 29% at a true 0.55, review F9); FAILs a true 0.35 in 96%
    rng = np.random.default_rng(48)
    runs = 400
    ks = rng.binomial(50, 0.6, runs)
    wrong_pass = sum(judge_at_least(int(k), 50, 0.6).decision == "PASS" for k in ks) / runs
    assert within(wrong_pass, 0.05, runs), wrong_pass
    wrong_fail = sum(judge_at_least(int(k), 50, 0.6).decision == "FAIL" for k in ks) / runs
    assert within(wrong_fail, 0.05, runs), wrong_fail
    power = sum(judge_at_least(int(k), 50, 0.6).decision == "FAIL" for k in rng.binomial(50, 0.35, runs)) / runs
    assert power > 0.8, power  # and it does FAIL a broken one (0.35 true)


def test_error_rate_at_its_ceiling_errs_within_its_rate_both_ways():
    # true error rate exactly 5%, 200 requests, 400 runs: measured wrong PASS 2.5%, wrong FAIL 4.5%
    rng = np.random.default_rng(10)
    runs = 400
    ds = [judge_at_most(int(k), 200, 0.05).decision for k in rng.binomial(200, 0.05, runs)]
    assert within(ds.count("PASS") / runs, 0.05, runs) and within(ds.count("FAIL") / runs, 0.05, runs), \
        (ds.count("PASS"), ds.count("FAIL"))


def test_non_inferiority_at_the_margin_passes_wrongly_within_its_rate():
    # new accuracy exactly 0.08 x 0.8 = 6.4 points below a recorded 0.8, 300 items each: wrong PASS measured 4.25%
    rng = np.random.default_rng(3)
    runs = 400
    k1, k0 = rng.binomial(300, 0.8 - 0.064, runs), rng.binomial(300, 0.8, runs)
    wrong = sum(judge_not_worse(int(a), 300, int(b), 300, 0.08 * b / 300).decision == "PASS"
                for a, b in zip(k1, k0)) / runs
    assert within(wrong, 0.05, runs), wrong


# ----------------------------------------------------------------------------- two samples

def test_quantile_ratio_both_ways_on_exact_numbers():
    base = [float(x) for x in range(1, 101)]
    assert judge_quantile_ratio(base, [x * 1.0 for x in base], 0.95, 1.25).decision == "PASS"
    assert judge_quantile_ratio(base, [x * 2.0 for x in base], 0.95, 1.25).decision == "FAIL"
    r = judge_quantile_ratio(base, [x * 1.1 for x in base], 0.95, 1.1)
    assert r.decision == "UNDECIDED" and r.point == pytest.approx(1.1) and r.side == 0.975


def test_quantile_ratio_at_the_allowance_fails_wrongly_within_its_rate():
    # compare's plan: new p95 exactly 1.10 x the baseline's (lognormal, sigma 0.5), 160 pairs, 400 runs:
    # measured wrong FAIL 0.0% and wrong PASS 0.25% at 95% (conservative: Bonferroni over the two samples) (the one-sample rule it replaced: 20-21% wrong FAIL,
    # review F6); a 2x regression FAILs in 90% of runs
    rng = np.random.default_rng(6)
    runs, n = 400, 160
    ds, power = [], 0
    for _ in range(runs):
        base = np.exp(rng.normal(0, 0.5, n))
        new = 1.10 * np.exp(rng.normal(0, 0.5, n))
        ds.append(judge_quantile_ratio(base, new, 0.95, 1.10, 0.95).decision)
        power += judge_quantile_ratio(base, 2.0 * np.exp(rng.normal(0, 0.5, n)), 0.95, 1.10, 0.95).decision == "FAIL"
    assert within(ds.count("FAIL") / runs, 0.05, runs), ds.count("FAIL")
    assert within(ds.count("PASS") / runs, 0.05, runs), ds.count("PASS")
    assert power / runs > 0.85, power  # measured 90% at 160 pairs


def test_shift_ratio_bounds_the_gain_and_errs_within_its_rate():
    # 8 and 8 (the priority gate's first rounds): one-sided 95% bounds = the 16th smallest/largest of 64
    fast = [100.0, 105, 110, 95, 98, 102, 107, 99]
    slow = [x * 9 for x in fast]
    r = shift_ratio(slow, fast)
    assert r.rank == 16 and r.lower > 3 and r.point == pytest.approx(9.0)
    same = shift_ratio(fast, fast)
    assert same.upper < 3 and same.lower < 1 < same.upper
    # at a true gain of exactly 3 (lognormal sigma 0.4): wrong "gain shown" (lower >= 3) and wrong "gain
    # refuted" (upper < 3) each within 5%; measured 4.5% and 4.5% of 400
    rng = np.random.default_rng(14)
    runs = 400
    lo = hi = 0
    for _ in range(runs):
        w, wo = np.exp(rng.normal(0, 0.4, 8)), 3 * np.exp(rng.normal(0, 0.4, 8))
        s = shift_ratio(wo, w)
        lo += s.lower >= 3
        hi += s.upper < 3
    assert within(lo / runs, 0.05, runs) and within(hi / runs, 0.05, runs), (lo, hi)
    with pytest.raises(ValueError):
        shift_ratio([1.0, 0.0], [1.0])


def test_ratio_over_units_bounds_on_exact_numbers_and_errs_within_its_rate_when_units_are_clusters():
    from kvgate.stats.twosample import ratio_over_units

    r = ratio_over_units([6.0, 7.0, 5.0, 8.0])
    assert r.point == pytest.approx(6.402, rel=1e-3) and r.n == 4 and r.unit == "pair of rounds"
    assert r.lower == pytest.approx(5.045, rel=1e-3) and r.upper == pytest.approx(8.124, rel=1e-3)  # t(3) 2.353
    one = ratio_over_units([6.0])
    assert one.lower is None and one.upper is None and one.point == 6.0
    two = ratio_over_units([6.0, 7.0, 5.0, 8.0], 0.95, upper_confidence=1 - 0.01 / 9)  # the FAIL side's own level
    assert two.lower == r.lower and two.upper == pytest.approx(17.36, rel=1e-3)  # t(3) at 99.89% 9.85
    assert two.to_dict()["upper_confidence"] == two.upper_level and "upper_confidence" not in r.to_dict()
    assert ratio_over_units([6.0, 7.0, 5.0, 8.0], 0.95, upper_confidence=0.95) == r
    # each unit a pair of rounds whose 43 shorts share one queue (ICC 1 within a round: a round is one
    # value): 4 pairs at a true gain of exactly 3 -- wrong "shown" and wrong "refuted" each within 5%
    # (the Mann-Whitney bounds over the 43 and 43 shorts of one pair: 46.5% and 51.2% of 1,000, measured)
    rng = np.random.default_rng(48)
    runs, lo, hi = 2000, 0, 0
    for _ in range(runs):
        per_pair = []
        for _ in range(4):
            w = np.full(43, np.exp(rng.normal(0, 0.4))) * np.exp(rng.normal(0, 0.05, 43))
            wo = 3 * np.full(43, np.exp(rng.normal(0, 0.4))) * np.exp(rng.normal(0, 0.05, 43))
            per_pair.append(shift_ratio(wo, w, 0.5).point)
        g = ratio_over_units(per_pair)
        lo += g.lower >= 3
        hi += g.upper < 3
    assert within(lo / runs, 0.05, runs) and within(hi / runs, 0.05, runs), (lo, hi)
    with pytest.raises(ValueError):
        ratio_over_units([1.0, 0.0])
    with pytest.raises(ValueError):
        ratio_over_units([])


# ----------------------------------------------------------------------------- capacity

def _profile() -> Profile:
    p = load_profile(str(FAKE))
    slo = p.slo.model_copy(update={"ttft_p95_ms": 1000.0, "peak_concurrency": 3})
    return p.model_copy(update={"slo": slo})


def _step(c: int, xs: list[float], limit: float) -> StepResult:
    j = judge(xs, 0.95, limit, 0.95)
    m = {"TTFT": {**j.to_dict(), "text": j.text("TTFT", final=False)}}
    return StepResult(concurrency=c, requests=len(xs), ok=len(xs), errors=0, wall_s=2.0, decision=j.decision,
                      metrics=m, throughput_rps=1.0, output_tokens_per_s=1.0, goodput_rps=1.0, good=len(xs))


def test_a_capacity_step_straddling_the_limit_is_inconclusive_not_fail():
    # the need step's true TTFT p98 sits at the 1,000 ms limit (p95 below it), 59 requests, 300 runs:
    # the old rule FAILed every one not PASSing, 74% of them (review F1: ~70%); now FAIL 0.0%, INCONCLUSIVE
    # 74%, PASS 26%
    rng = np.random.default_rng(1)
    prof = _profile()
    z98 = 2.0537489  # the standard normal's 98th percentile
    runs = 300
    out = {"PASS": 0, "FAIL": 0, "INCONCLUSIVE": 0}
    for _ in range(runs):
        steps = [_step(1, list(rng.normal(300, 50, 59)), 1000.0), _step(2, list(rng.normal(400, 50, 59)), 1000.0),
                 _step(4, list(1000 + 150 * (rng.standard_normal(59) - z98)), 1000.0)]
        v = capacity_verdict(steps, prof, {"why_stopped": "not met"})
        out[v.status.value] += 1
    assert within(out["FAIL"] / runs, 0.05, runs), out
    assert out["INCONCLUSIVE"] > out["PASS"], out
    # a need step whose p95 is far above the limit FAILs
    bad = [_step(1, list(rng.normal(300, 50, 59)), 1000.0), _step(2, list(rng.normal(400, 50, 59)), 1000.0),
           _step(4, list(rng.normal(2000, 100, 59)), 1000.0)]
    assert capacity_verdict(bad, prof, {"why_stopped": "not met"}).status is Status.FAIL
