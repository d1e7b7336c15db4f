"""The sampling rule of the latency gates on seeded synthetic latencies (no server, no sleeping:
the closed loop and the clock are injected): a true p95 5% under the limit PASSes, 5% over
FAILs, at the limit stays INCONCLUSIVE within the cap; and the verdict texts of each."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvgate.stats.confidence import plan_looks
from kvgate.gates.load import interference_verdict, latency_verdict
from kvgate.http.metrics import MetricsTrace
from kvgate.load import LoadResult, RequestRecord
from kvgate.load.sampling import merge_results, sample_batches, sample_latency, slo_decisions, slo_samples
from kvgate.load.scenarios import LoadObservation, interference_plan, latency_plan
from kvgate.profile.models import load_profile
from kvgate.verdict import Status

PROFILE = load_profile("tests/data/fake-vllm.yaml")
#: TTFT ~ Normal(100 ms, 10 ms): true p95 116.4 ms
MEAN_MS, SD_MS = 100.0, 10.0
P95_MS = MEAN_MS + 1.6448536 * SD_MS


def rec(i, ttft_ms, gaps_ms=(10.0,) * 7, ok=True):
    r = RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, first_byte_s=ttft_ms / 2e3, end_s=0.0,
                      status=200 if ok else 500, content_type="text/event-stream")
    r.finalized = True
    t = [ttft_ms / 1e3]
    for g in gaps_ms:
        t.append(t[-1] + g / 1e3)
    r.first_token_s, r.content_s, r.chunk_s, r.tokens = t[0], t, [], len(t)
    r.end_s = t[-1] + 0.001
    if not ok:
        r.error = "HTTP 500"
    return r


class Synthetic:
    """A closed loop that 'sends' ``n`` requests with seeded Normal TTFTs; every batch advances the
    injected clock by 1 s per request (so the time bound can be exercised)."""

    def __init__(self, seed, per_request_s=0.0):
        self.rng = np.random.default_rng(seed)
        self.now, self.per, self.calls = 0.0, per_request_s, []

    def clock(self):
        return self.now

    def loop(self, endpoint, specs, *, n, concurrency, deadline_s, **kw):
        self.calls.append((n, deadline_s))
        k = n if not self.per else min(n, max(0, int(deadline_s / self.per)))
        self.now += k * self.per
        recs = [rec(i, float(x)) for i, x in enumerate(self.rng.normal(MEAN_MS, SD_MS, k))]
        return LoadResult("closed", recs, n, 0.1, deadline_s, concurrency=concurrency)


def slo_profile(limit_ms, requests=32, cap=1024, max_s=120.0):
    slo = PROFILE.slo.model_copy(update={"ttft_p95_ms": limit_ms, "requests": requests, "max_requests": cap,
                                         "max_duration_s": max_s, "concurrency": 4,
                                         "pass_confidence_floor": None})  # the plan's own levels (no floor)
    return PROFILE.model_copy(update={"slo": slo})


def decider(prof, plan):
    """run_latency's decide: each look's FAIL level from the loop, the plan's PASS level."""
    return lambda recs, c: slo_decisions(recs, prof.slo, c, plan.pass_level)


def sampled(limit_ms, seed, **kw):
    prof = slo_profile(limit_ms, **kw)
    syn = Synthetic(seed)
    plan = latency_plan(prof)
    got = sample_latency(None, ["spec"], 4, plan, decider(prof, plan), clock=syn.clock, loop=syn.loop)
    obs = LoadObservation("latency (chat)", got.result, MetricsTrace(samples=[]), 16, 8, 4, sampling=got.sampling)
    return prof, got, obs, syn


SEEDS = range(5)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_true_p95_5_percent_under_the_limit_passes(seed):
    prof, got, obs, _ = sampled(P95_MS / 0.95, seed)
    assert got.sampling.decisions["TTFT"] == "PASS" and got.sampling.why_stopped == "decided", got.sampling.history
    v = latency_verdict(obs, prof)
    assert v.status is Status.PASS, v.message
    n = got.sampling.n
    assert f"TTFT p95 " in v.message and f"% upper bound " in v.message and f"(n={n}) <= 123 ms -> PASS" in v.message
    assert ("looks planned at 32/80/160/1,024 requests (a FAIL at 98.75% each: 95% over 4 looks; a PASS at 98.33%: "
            "95% over the 3 that can PASS); took ") in v.message
    assert v.message.endswith("stopped: decided -> PASS"), v.message
    assert v.evidence["confidence"]["TTFT"]["decision"] == "PASS" and v.evidence["sampling"]["n"] == n


@pytest.mark.parametrize("seed", SEEDS)
def test_a_true_p95_5_percent_over_the_limit_fails_naming_the_lower_bound(seed):
    prof, got, obs, _ = sampled(P95_MS / 1.05, seed)
    assert got.sampling.decisions["TTFT"] == "FAIL", got.sampling.history
    v = latency_verdict(obs, prof)
    assert v.status is Status.FAIL and "% lower bound " in v.message, v.message
    # the limit is 110.87 ms: the bound and the limit are printed so that one reads above the other
    lo, lim = re.search(r"lower bound ([\d,.]+) ms \(n=\d+; \d+ over\) > ([\d,.]+) ms -> FAIL", v.message).groups()
    assert float(lo.replace(",", "")) > float(lim.replace(",", "")) and lim.startswith("11"), v.message
    assert v.parts[0].gate == "latency/slo.TTFT p95" and v.parts[0].status is Status.FAIL


@pytest.mark.parametrize("seed", SEEDS)
def test_a_true_p95_at_the_limit_is_inconclusive_within_the_cap(seed):
    prof, got, obs, syn = sampled(P95_MS, seed)
    assert got.sampling.why_stopped == "cap" and got.sampling.n == 1024, got.sampling.history
    assert [n for n, _ in syn.calls] == [32, 48, 80, 864]  # each look's batch, bounded in count
    v = latency_verdict(obs, prof)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "TTFT p95 " in v.message and "bounds (98.75% lower, 98.33% upper) " in v.message and "(n=1024; " in v.message
    assert "straddle 116 ms -> INCONCLUSIVE" in v.message and "stopped: the cap (1,024 requests) reached" in v.message
    assert v.parts[0].status is Status.INCONCLUSIVE and v.parts[0].measured == pytest.approx(P95_MS, rel=0.03)


def test_a_cap_too_small_for_any_pass_says_so_and_names_the_field():
    """slo.requests 20, slo.max_requests 40: looks 20/40 at 97.5%, where a p95 PASS needs 72 samples:
    even a fast server is INCONCLUSIVE at the cap, and the verdict says the cap is why."""
    prof, got, obs, _ = sampled(P95_MS * 10, 0, requests=20, cap=40)
    assert got.sampling.why_stopped == "cap" and got.sampling.plan.looks == (20, 40)
    v = latency_verdict(obs, prof)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert ("stopped: the cap (40 requests) reached; no PASS was possible: a p95 PASS at 97.5% needs at least 72 "
            "requests, more than the cap (raise slo.max_requests)") in v.message, v.message
    prof, got, obs, _ = sampled(P95_MS, 0)  # a cap that can PASS says nothing of the kind
    assert "no PASS was possible" not in latency_verdict(obs, prof).message


def test_the_time_bound_stops_sampling_and_is_named():
    prof = slo_profile(P95_MS, max_s=100.0)
    syn = Synthetic(0, per_request_s=1.0)  # 1 s a request: the first look (32 s) leaves 68 s
    plan = latency_plan(prof)
    got = sample_latency(None, ["spec"], 4, plan, decider(prof, plan), clock=syn.clock, loop=syn.loop, deadline_s=300.0)
    assert got.sampling.why_stopped == "time" and syn.calls[0] == (32, 300.0) and syn.calls[1] == (48, 68.0)
    obs = LoadObservation("latency (chat)", got.result, MetricsTrace(samples=[]), 16, 8, 4, sampling=got.sampling)
    v = latency_verdict(obs, prof)
    assert v.status is Status.INCONCLUSIVE and "stopped: the time bound (100 s, slo.max_duration_s) reached" in v.message


def test_errors_fail_at_the_first_look_without_more_sampling():
    prof = slo_profile(P95_MS / 0.95)

    def loop(endpoint, specs, *, n, concurrency, deadline_s, **kw):
        return LoadResult("closed", [rec(i, 50.0, ok=i != 3) for i in range(n)], n, 0.1, deadline_s)

    plan = latency_plan(prof)
    got = sample_latency(None, ["spec"], 4, plan, decider(prof, plan), loop=loop)
    assert got.sampling.n == 32 and got.sampling.why_stopped == "decided"
    assert got.sampling.decisions == {"TTFT": "UNDECIDED", "errors": "FAIL"}
    v = latency_verdict(LoadObservation("latency", got.result, MetricsTrace(samples=[]), 16, 8, 4,
                                        sampling=got.sampling), prof)
    assert v.status is Status.FAIL and "error rate 3.1% > 0.0%" in v.message
    assert "-> undecided" in v.message and "-> INCONCLUSIVE" not in v.message  # an open metric in a FAIL


def test_itl_pools_every_gap_of_the_succeeded_requests_and_tpot_stays_per_request():
    recs = [rec(0, 50.0, gaps_ms=(10,) * 19 + (200,)), rec(1, 60.0, gaps_ms=(10,) * 20), rec(2, 70.0, ok=False)]
    xs = slo_samples(recs)
    assert len(xs["itl_ms"]) == 40 and [len(g) for g in xs["itl_gaps_ms"]] == [20, 20]  # the failed one adds none
    assert float(np.percentile(xs["itl_ms"], 95)) == pytest.approx(10.0)  # pooled: 1 stall in 40 gaps is above p95
    assert len(xs["tpot_ms"]) == 2 and xs["tpot_ms"][1] == pytest.approx(10.0, rel=0.01)
    assert xs["ttft_ms"] == [50.0, 60.0]


def test_a_record_cut_by_the_deadline_is_censored_not_an_error():
    from kvgate.load.sampling import error_rate
    prof = slo_profile(100.0)
    slo = prof.slo.model_copy(update={"e2e_p95_ms": 300.0})
    done = [rec(i, 50.0) for i in range(3)]
    late = rec(3, 50.0)
    late.error, late.censored, late.end_s = "timeout: no complete response within 0.4 s", True, 0.4  # past 300 ms
    early = rec(4, 50.0)
    early.error, early.censored, early.first_token_s, early.content_s, early.end_s = "timeout: ...", True, None, [], 0.2
    assert not late.ok and not late.failed and error_rate(done + [late, early]) == (0, 3)
    xs = slo_samples(done + [late, early], slo)
    assert xs["e2e_ms"][-1] == pytest.approx(400.0) and len(xs["e2e_ms"]) == 4  # the one past the limit: exceedance
    assert xs["ttft_ms"] == [50.0] * 4 + [pytest.approx(200.0)]  # early: no TTFT seen, 200 ms > 100: exceedance
    assert len(xs["itl_gaps_ms"]) == 3  # a cut stream's gaps leave the ITL sample
    early.end_s = 0.09  # cut before its TTFT limit: leaves the TTFT sample (and e2e: below 300 ms)
    assert len(slo_samples(done + [early], slo)["ttft_ms"]) == 3 and len(slo_samples(done + [early], slo)["e2e_ms"]) == 3
    assert slo_decisions(done + [late, early], slo, 0.95)["errors"] == "PASS"
    broken = rec(5, 50.0, ok=False)  # a server error stays one
    assert error_rate(done + [late, broken]) == (1, 4)


def test_merged_batches_share_one_time_base():
    a = LoadResult("closed", [rec(0, 50.0)], 1, 0.1, 10.0, loop_lag_s=[0.001])
    b = LoadResult("closed", [rec(0, 60.0)], 1, 0.1, 10.0, loop_lag_s=[0.002])
    m = merge_results([(0.0, a), (5.0, b)])
    assert [r.index for r in m.records] == [0, 1] and m.records[1].sent_s == 5.0 and m.loop_lag_s == [0.001, 0.002]
    assert m.n_requested == 2 and m.records[1].first_token_s == pytest.approx(5.06)


def test_hand_built_records_without_sampling_are_judged_in_one_look():
    prof = slo_profile(200.0)
    obs = LoadObservation("latency", LoadResult("closed", [rec(i, 50.0) for i in range(8)], 8, 0.1, 10.0),
                          MetricsTrace(samples=[]), 16, 8, 4)
    v = latency_verdict(obs, prof)
    assert v.status is Status.INCONCLUSIVE, v.message
    # 8 identical TTFTs at concurrency 4: their dependence in send order cannot be estimated, so the
    # worst case (waves of 4 alike) is assumed: worth 2 (issue 48, F2)
    assert "TTFT p95 50 ms, 95% bounds 50 ms..none (fewer than 59 samples: no PASS possible) (n=2; 0 over) " \
        "straddle 200 ms -> INCONCLUSIVE" in v.message, v.message
    assert "8 requests, lag-1..4 autocorrelation in send order not estimable (worst case assumed): effective n 2.0" \
        in v.message
    same = LoadObservation("latency", LoadResult("closed", [rec(i, 50.0) for i in range(60)], 60, 0.1, 10.0),
                           MetricsTrace(samples=[]), 16, 8, 4)
    assert latency_verdict(same, prof).status is Status.INCONCLUSIVE
    rng = np.random.default_rng(4)  # 240 independent TTFTs: their n kept, PASS in one look
    many = LoadObservation("latency", LoadResult("closed", [rec(i, 50.0 + 10 * rng.random()) for i in range(240)], 240,
                                                 0.1, 10.0), MetricsTrace(samples=[]), 16, 8, 4)
    v = latency_verdict(many, prof)
    assert v.status is Status.PASS and re.search(r"TTFT p95 \d+ ms, 95% upper bound \d+ ms \(n=2\d\d\) <= 200 ms -> PASS; "
                                                 r"240 requests, lag-1..4 autocorrelation in send order", v.message), \
        v.message


def test_interference_looks_count_waves_of_shorts():
    # an early FAIL at 4 waves, a PASS from the fewest whole waves that can (59 -> 60) at 95%: the one
    # look that can PASS spends the whole PASS error, the FAIL error is split over both looks
    one = interference_plan(PROFILE)
    assert one.looks == (16, 60) and one.per_look == pytest.approx(0.975) and one.pass_level == 0.95
    plan = interference_plan(PROFILE, max_waves=18)  # a cap of 18 waves: 16, then 72 (PASS at 95%, one look can)
    assert plan.looks == (16, 72) and plan.per_look == pytest.approx(0.975) and plan.pass_level == 0.95
    capped = interference_plan(PROFILE, max_waves=30)  # two looks that can PASS: each at 97.5%, from 18 waves
    assert capped.looks == (16, 72, 120) and capped.pass_level == pytest.approx(0.975)
    none = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": None})})
    assert interference_plan(none).looks == (16,)
    sent = []

    def send(k, left):  # one wave per 4 shorts asked for, rounded up
        waves = -(-k // 4)
        sent.append(waves)
        return LoadResult("open", [rec(i, 30.0) for i in range(4 * waves)], 4 * waves, 0.1, 10.0), 4 * waves

    def decide(recs, level):
        from kvgate.stats.confidence import judge
        return {"short TTFT": judge(slo_samples(recs)["ttft_ms"], 0.95, 100.0, level, plan.pass_level).decision}

    got = sample_batches(plan, send, decide)
    assert sent == [4, 14] and got.sampling.n == 72 and got.sampling.decisions == {"short TTFT": "PASS"}
    sent.clear()
    plan = one
    got = sample_batches(plan, send, decide)  # healthy: undecided at 16, PASS at 60 (15 waves), as one look was
    assert sent == [4, 11] and got.sampling.n == 60 and got.sampling.decisions == {"short TTFT": "PASS"}


def test_the_reviews_deadline_case_on_the_fake_is_not_a_fail_for_errors():
    """Review F4, live on the fault-injection fake: 16 tokens at 50 ms each (never an EOS),
    concurrency 2, looks (4, 40) within 2.5 s. The second look's batch has what is left of the
    2.5 s: what it cannot finish is censored (or not started), never a server error, so errors
    PASS and the sampling stops on time undecided -> INCONCLUSIVE. Robust to a slower host: a
    slower stream only means more censored (or fewer started) requests, still no error."""
    from kvgate.http.client import Endpoint
    from kvgate.load import completion_request
    from kvgate.stats.confidence import LookPlan
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    prof = slo_profile(1000.0)
    prof = prof.model_copy(update={"slo": prof.slo.model_copy(update={"e2e_p95_ms": 5000.0})})
    plan = LookPlan((4, 40), 0.95, 0.975, max_s=2.5)
    with FakeVLLM(FakeConfig(itl_s=0.05, eos_after=None)) as f:
        ep = Endpoint(f.base_url)
        spec = completion_request(ep, model=FakeConfig().served_name, prompt="hello",
                                  max_tokens=16, ignore_eos=True)
        got = sample_latency(ep, [spec], 2, plan, decider(prof, plan))
    recs = got.result.records
    assert recs and not any(r.failed for r in recs), [r.error for r in recs if r.failed]
    assert got.sampling.decisions["errors"] == "PASS" and got.sampling.why_stopped == "time", got.sampling.to_dict()
    obs = LoadObservation("latency", got.result, MetricsTrace(samples=[]), 16, 16, 2, sampling=got.sampling)
    v = latency_verdict(obs, prof)
    assert v.status is not Status.FAIL, v.message
    assert "error rate" not in v.message or "error rate 0.0%" in v.message


def test_error_rate_fail_side_at_the_budget_share_its_pass_side_not_stricter():
    # verdicts.false_alarm_budget 0.01: latency/slo's plan 32/80/160/256 FAILs at 1 - (1 - 0.99889)/4 a look;
    # the error rate's PASS side keeps the 1 - 0.05/4 = 98.75% both sides had (errors_pass_level)
    from types import SimpleNamespace
    from kvgate.load.sampling import errors_pass_level, judge_errors
    from kvgate.stats.confidence import plan_looks
    from .test_gates_load import rec
    fc = 1 - 0.01 / 9
    plan = plan_looks(32, 256, 0.95, split=True, fail_confidence=fc)
    assert errors_pass_level(plan) == 1 - 0.05 / 4 and plan.per_look == pytest.approx(1 - (1 - fc) / 4)
    assert errors_pass_level(plan_looks(32, 256, 0.95, split=True)) is None and errors_pass_level(None) is None
    slo = SimpleNamespace(ttft_p95_ms=None, itl_p95_ms=None, e2e_p95_ms=None, error_rate_max=0.05)
    old = 1 - 0.05 / 4

    def errors(k, n=256):
        return [rec(i, status=500 if i < k else 200) for i in range(n)]
    # 5 of 256: upper bound 4.91% at 98.75% PASSes; at the FAIL side's 99.97% it would be 6.93%
    assert judge_errors(errors(5), slo, old).decision == "PASS"
    assert judge_errors(errors(5), slo, plan.per_look, errors_pass_level(plan)).decision == "PASS"
    assert judge_errors(errors(5), slo, plan.per_look).decision == "UNDECIDED"
    # 23 of 256 (9.0%): lower bound 5.41% at 98.75% FAILs; 3.98% at the budget's level does not
    assert judge_errors(errors(23), slo, old).decision == "FAIL"
    near = judge_errors(errors(23), slo, plan.per_look, errors_pass_level(plan))
    assert near.decision == "UNDECIDED" and near.fail_confidence == plan.per_look and near.confidence == old
    assert judge_errors(errors(60), slo, plan.per_look, errors_pass_level(plan)).decision == "FAIL"  # 23%: clear
    assert slo_decisions(errors(23), slo, plan.per_look, plan.pass_level, errors_pass_level(plan)) == \
        {"errors": "UNDECIDED"}
    # no budget: the same judgement as before
    assert judge_errors(errors(23), slo, old, None) == judge_errors(errors(23), slo, old, old)


def test_slo_decisions_judge_an_error_allowance_on_its_bounds():
    # F10: with slo.error_rate_max 0.05, 1 error in 40 is undecided (bounds 0.1%..11.3%), not a PASS on its 2.5%
    from types import SimpleNamespace
    from kvgate.load.sampling import slo_decisions
    from .test_gates_load import rec
    recs = [rec(i, status=500 if i == 0 else 200) for i in range(40)]
    slo = SimpleNamespace(ttft_p95_ms=None, itl_p95_ms=None, e2e_p95_ms=None, error_rate_max=0.05)
    assert slo_decisions(recs, slo, 0.95) == {"errors": "UNDECIDED"}
    assert slo_decisions(recs, SimpleNamespace(**{**vars(slo), "error_rate_max": 0.0}), 0.95) == {"errors": "FAIL"}
    clean = [rec(i) for i in range(80)]
    assert slo_decisions(clean, slo, 0.95) == {"errors": "PASS"}  # upper bound 3.7% <= 5%
