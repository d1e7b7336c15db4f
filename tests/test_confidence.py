"""Order-statistic bounds of a percentile (exact binomial) and the planned looks: the numbers the
gates' confidence rests on, checked against hand-computed binomial tails."""

from __future__ import annotations

import numpy as np
import pytest

from kvgate.stats.confidence import (FAIL, PASS, UNDECIDED, judge, lower_rank, max_exceedances, min_samples_to_pass,
                                     plan_looks, sample_until_decided, split_levels, upper_rank)


def test_with_32_samples_no_p95_pass_is_possible_and_59_without_exceedance_pass():
    assert upper_rank(32, 0.95) is None  # 1 - 0.95**32 = 0.81 < 0.95: even the largest is no bound
    assert min_samples_to_pass(0.95) == 59  # 0.95**59 = 0.0485 <= 0.05 < 0.95**58 = 0.0510
    assert upper_rank(59, 0.95) == 59 and upper_rank(58, 0.95) is None
    assert judge([100.0] * 59, 0.95, 100.0).decision == PASS
    assert judge([100.0] * 32, 0.95, 1e9).decision == UNDECIDED  # however fast: the data cannot say
    assert "no PASS possible" in judge([100.0] * 32, 0.95, 1e9).text("TTFT")


def test_exceedances_allowed_grow_with_n_as_the_binomial_says():
    assert [max_exceedances(n, 0.95) for n in (59, 100, 300)] == [0, 1, 8]
    # 100 samples: P(Bin(100, .95) <= 98) = 1 - .95**100 - 100 * .05 * .95**99 = 0.963 >= 0.95
    assert upper_rank(100, 0.95) == 99
    assert lower_rank(32, 0.95) == 28  # P(Bin(32, .95) >= 28) = 0.96; >= 29: 0.92


def test_the_verdict_text_names_n_the_point_the_bound_and_the_limit():
    rng = np.random.default_rng(0)
    v = list(rng.lognormal(6.0, 0.3, 120))
    ok = judge(v, 0.95, 800.0)
    assert ok.decision == PASS and ok.text("TTFT").startswith("TTFT p95 650 ms, 95% upper bound 726 ms (n=120) <= 800 ms")
    bad = judge(v, 0.95, 500.0)
    assert bad.decision == FAIL and "95% lower bound 625 ms (n=120; 31 over) > 500 ms -> FAIL" in bad.text("TTFT")


def test_looks_are_planned_up_front_and_judged_at_a_corrected_level():
    p = plan_looks(32, 256, 0.95)
    assert p.looks == (32, 86, 172, 256) and p.per_look == pytest.approx(1 - 0.05 / 4)
    assert min_samples_to_pass(0.95, p.per_look) == 86  # the second look is the first that can PASS
    assert plan_looks(100, 100, 0.95).looks == (100,) and plan_looks(100, 100, 0.95).per_look == 0.95
    with pytest.raises(ValueError):
        plan_looks(0, 10, 0.95)


def test_plan_looks_never_plans_more_looks_than_max_looks():
    # the smallest passing size (59) is inserted after the first look: with max_looks 1 that made two
    assert plan_looks(32, 256, 0.95, max_looks=1).looks == (256,)
    assert plan_looks(32, 256, 0.95, max_looks=1).per_look == 0.95
    for m in range(1, 7):
        p = plan_looks(32, 256, 0.95, max_looks=m)
        assert len(p.looks) <= m and p.looks[-1] == 256 and p.per_look == pytest.approx(1 - 0.05 / len(p.looks))


def test_sampling_stops_at_the_first_decided_look_and_at_the_time_bound():
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731 -- injected clock, advanced by the take callback
    values: list[float] = []

    def take(k, left):  # 0.1 s per sample; stops when the time left runs out, as a load runner does
        k = k if left is None else min(k, int(left / 0.1 + 1e-9))
        values.extend([10.0] * k)
        t[0] += k * 0.1
        return k

    s = sample_until_decided(plan_looks(32, 256, 0.95), take, lambda c: {"x": judge(values, 0.95, 20.0, c).decision},
                             clock)
    assert (s.n, s.why_stopped, s.decisions) == (86, "decided", {"x": PASS}) and len(s.history) == 2
    values.clear()
    t[0] = 0.0
    timed = plan_looks(32, 256, 0.95, max_s=5.0)
    s = sample_until_decided(timed, take, lambda c: {"x": judge(values, 0.95, 20.0, c).decision}, clock)
    assert s.why_stopped == "time" and s.final and s.n == 50  # 32 x 0.1 s, then 18 more in the 1.8 s left


def test_a_fail_just_over_the_limit_does_not_read_as_equal_to_it():
    # every sample 0.4 ms over a 100 ms limit: FAIL, and the text must not say "100 ms > 100 ms"
    assert judge([100.4] * 100, 0.95, 100).text("TTFT").endswith("lower bound 100.4 ms (n=100; 100 over) > 100.0 ms -> FAIL")
    assert "lower bound 5,000.2 ms (n=100; 100 over) > 5,000.0 ms" in judge([5000.2] * 100, 0.95, 5000).text("TTFT")
    assert "lower bound 6,189 ms (n=100; 100 over) > 5,000 ms" in judge([6189.0] * 100, 0.95, 5000).text("TTFT")
    assert "lower bound 100.0001 ms" in judge([100.0001] * 100, 0.95, 100).text("TTFT")


def test_split_looks_spend_the_pass_error_only_where_a_pass_is_possible():
    # the SLO gate's looks: a FAIL can come at any of 4 looks, a PASS only at the 3 of 80 or more
    p = plan_looks(32, 256, 0.95, split=True)
    assert p.looks == (32, 80, 160, 256) and p.per_look == pytest.approx(1 - 0.05 / 4)
    assert p.pass_looks == 3 and p.pass_level == pytest.approx(1 - 0.05 / 3)
    assert min_samples_to_pass(0.95, p.pass_level) == 80 and min_samples_to_pass(0.95, p.per_look) == 86
    # the interference gate's: an early FAIL at 16, a PASS only at 60 (at 95%: the one look that can)
    i = split_levels([16, 60], 0.95)
    assert (i.per_look, i.per_look_pass, i.pass_looks) == (pytest.approx(0.975), 0.95, 1)
    assert i.to_dict()["per_look_pass_confidence"] == 0.95 and "that can PASS" in i.to_dict()["correction"]
    # no look can PASS at all: nothing to split; without split the plan is as before
    assert split_levels([8], 0.95).per_look_pass is None and split_levels([8], 0.95).pass_level == 0.95
    assert plan_looks(32, 256, 0.95).per_look_pass is None
    with pytest.raises(ValueError):
        split_levels([60, 16], 0.95)


def test_a_split_judgement_names_both_levels():
    j = judge([100.0] * 60, 0.95, 200.0, 0.975, pass_confidence=0.95)
    assert j.decision == PASS and "95% upper bound 100 ms (n=60)" in j.text("TTFT")
    assert j.bound.to_dict()["upper_confidence"] == 0.95
    bad = judge([300.0] * 16, 0.95, 200.0, 0.975, pass_confidence=0.95)
    assert bad.decision == FAIL and "97.5% lower bound 300 ms (n=16; 16 over)" in bad.text("TTFT")
    open_ = judge([100.0] * 40 + [300.0] * 4, 0.95, 200.0, 0.975, pass_confidence=0.95)
    assert open_.decision == UNDECIDED and "bounds (97.5% lower, 95% upper)" in open_.text("TTFT")


@pytest.mark.parametrize("plan", [plan_looks(32, 256, 0.95, split=True), split_levels([16, 60], 0.95),
                                  plan_looks(16, 120, 0.95, split=True)], ids=["slo", "interference", "capped"])
def test_split_looks_keep_each_error_within_one_minus_confidence(plan):
    """Simulated: samples whose true p95 sits exactly at the limit (each at or below it with
    probability 0.95), judged at every look as sample_until_decided does; a PASS is then wrong as
    soon as the true p95 is a hair above it, a FAIL wrong as soon as it is a hair below: each
    happens in at most 5% of 20,000 runs (Bonferroni per side)."""
    rng = np.random.default_rng(7)
    below = (rng.random((20_000, plan.looks[-1])) <= 0.95).cumsum(axis=1)  # samples <= limit so far
    passed = np.zeros(len(below), bool)
    failed = np.zeros(len(below), bool)
    for n in plan.looks:
        k, j = upper_rank(n, 0.95, plan.pass_level), lower_rank(n, 0.95, plan.per_look)
        live = ~(passed | failed)
        if k is not None:
            passed |= live & (below[:, n - 1] >= k)  # the k-th smallest <= limit
        if j is not None:
            failed |= live & ~passed & (below[:, n - 1] < j)  # the j-th smallest > limit
    assert passed.mean() <= 0.05 and failed.mean() <= 0.05


def test_plan_looks_never_plans_more_looks_than_max_looks():
    # F15: split=True with max_looks 1 planned 2 looks (32 and the smallest size that can PASS)
    from kvgate.stats.confidence import plan_looks as _plan
    one = _plan(32, 256, 0.95, 0.95, max_looks=1, split=True)
    assert one.looks == (256,) and one.per_look == 0.95
    rng = __import__("random").Random(7)
    for _ in range(1500):
        first, cap, k = rng.randint(1, 300), rng.randint(1, 600), rng.randint(1, 6)
        p = _plan(first, cap, 0.95, rng.choice([0.9, 0.95, 0.99]), max_looks=k, split=rng.random() < 0.5)
        assert len(p.looks) <= k, (first, cap, k, p)
    assert _plan(32, 256, 0.95, 0.95, split=True).looks == (32, 80, 160, 256)  # unchanged where it fitted


def test_a_false_alarm_budget_sets_the_fail_side_apart_and_leaves_the_pass_side():
    """verdicts.false_alarm_budget 0.01 over 9 families: a FAIL at 99.89% overall (0.028% a look
    over latency/slo's 4 looks, 0.056% over interference's 2), the PASS side and the looks as
    without a budget; no budget or one looser than the family's own level: unchanged."""
    from kvgate.stats.confidence import budget_level
    fc = budget_level(0.95, 0.01, 9)
    assert fc == pytest.approx(1 - 0.01 / 9)
    assert budget_level(0.95, None, 9) == 0.95 and budget_level(0.999, 0.1, 9) == 0.999
    with pytest.raises(ValueError):
        budget_level(0.95, 0.0, 9)
    plain, budgeted = plan_looks(32, 256, 0.95, 0.95, split=True), plan_looks(32, 256, 0.95, 0.95, split=True,
                                                                               fail_confidence=fc)
    assert budgeted.looks == plain.looks == (32, 80, 160, 256)
    assert budgeted.pass_level == plain.pass_level and budgeted.per_look == pytest.approx(1 - 0.01 / 9 / 4)
    assert budgeted.to_dict()["fail_confidence"] == fc and "fail_confidence" not in plain.to_dict()
    two = split_levels([16, 60], 0.95, 0.95, fail_confidence=fc)
    assert two.pass_level == 0.95 and two.per_look == pytest.approx(1 - 0.01 / 9 / 2)
    one = plan_looks(32, 256, 0.95, 0.975, fail_confidence=fc)  # one level for both sides without a budget
    assert one.looks == plan_looks(32, 256, 0.95, 0.975).looks and one.pass_level == plan_looks(32, 256, 0.95, 0.975).per_look
    # 60 values whose lower bound at 97.5% is just above the limit: FAIL without the budget, undecided with it
    xs = [float(v) for v in range(1, 61)]
    limit = judge(xs, 0.95, 0.0, 0.975).bound.lower - 0.5
    assert judge(xs, 0.95, limit, plain_level := 0.975).decision == FAIL, plain_level
    assert judge(xs, 0.95, limit, two.per_look, two.pass_level).decision == UNDECIDED
    assert judge(xs, 0.95, 10.0, two.per_look, two.pass_level).decision == FAIL  # far above: still FAIL
    assert judge(xs, 0.95, 100.0, two.per_look, two.pass_level).decision == PASS
