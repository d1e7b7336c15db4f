"""The soak gate's pure verdicts on hand-built round rows, and the choice of memory source."""

from __future__ import annotations

import re

import pytest

from kvgate.http.client import Endpoint
from kvgate.gates.soak import analyze, gpu_verdict, latency_verdict, memory_verdict
from kvgate.profile.models import SoakSpec, VerdictsSpec, load_profile
from kvgate.soak.sampling import MetricsMemorySampler, PrometheusSampler, ProcessTreeSampler
from kvgate.soak.runner import ROUND_FIELDS, SoakPlan, SoakResult, build_samplers
from kvgate.verdict import Status
from tests.fakes.soak_fakes import FakeNVML

from .conftest import REPO

GIB = 2**30
SPEC = SoakSpec(duration="1h", round="5m", warmup="10m", rate_rps=1, memory_slope_max_mb_per_h=20,
                ttft_p95_slope_max_ms_per_h=100)
PLAN = SoakPlan(rounds=12, round_s=300, warmup_rounds=2, rate_rps=1, mix=())


def profile(**engine):
    p = load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml"))
    return p.model_copy(update={"engine": p.engine.model_copy(update=engine)}) if engine else p


def rows(mem=lambda k: 500.0, ttft=lambda k: 40.0, errors=lambda k: 0, requests=30, kept_up=True, pre=lambda k: 0):
    out = []
    for k in range(PLAN.rounds):
        r = {f: None for f in ROUND_FIELDS}
        r.update(round=k, warmup=k < PLAN.warmup_rounds, t_start_s=k * 300.0, t_end_s=(k + 1) * 300.0,
                 requests=requests, errors=errors(k), ok=requests - errors(k), ttft_p95_ms=ttft(k),
                 mem_min_mb=mem(k), mem_max_mb=None if mem(k) is None else mem(k) + 30, client_kept_up=kept_up,
                 lag_p99_ms=1.0, loop_lag_p99_ms=1.0, preemptions=pre(k), waiting_max=0.0, kvgate_rss_mb=150.0)
        out.append(r)
    return out


def result(rs, **kw):
    samplers = {"server-memory": {"source": "psutil, process tree of pid 1 (server)", "quantity": "PSS + swap",
                                  "reads": 720, "last_error": None}}
    base = dict(plan=PLAN, rows=rs, complete=True, stopped=None, samplers=samplers, ticks=720, wall_s=3600.0,
                files={"rounds_csv": "reports/soak-rounds.csv"})
    return SoakResult(**{**base, **kw})


def test_memory_growth_message_reads_as_a_verdict_with_its_numbers():
    a = analyze(result(rows(mem=lambda k: 500 + k * 5.0)), SPEC)  # 5 MB per 5 min = 60 MB/h
    v = memory_verdict(a)
    assert v.status is Status.FAIL and v.unit == "MB/h" and v.limit == 20
    assert v.measured == pytest.approx(60.0)
    assert v.message.startswith("retained server memory 555.0 MB, slope +60.0 MB/h (95% CI +60.0..+60.0;")
    assert "ceiling 20 MB/h; a ramp: rose in 9 of 9 round-to-round steps (largest two +5.0, +5.0 MB of +45.0 MB; no " \
           "one or two rounds explain it), still rising in the last part -> FAIL (memory growth: retained memory " \
           "rising; TTFT p95 not (yet) following" in v.message
    assert "source: psutil, process tree of pid 1 (server) [PSS + swap]" in v.message
    assert v.evidence["analysis"]["memory_mb_per_h"]["slope"] == pytest.approx(60.0)
    assert v.evidence["analysis"]["classification"] == "memory growth"


def test_memory_growth_with_ttft_following_says_so():
    a = analyze(result(rows(mem=lambda k: 500 + k * 5.0, ttft=lambda k: 40 + 20 * k)), SPEC)
    assert "TTFT p95 follows (+240.0 ms/h" in memory_verdict(a).message
    lat = latency_verdict(a, profile())
    assert lat.status is Status.FAIL and "memory growth" in lat.message


def test_bounded_cache_passes_and_says_why():
    a = analyze(result(rows(mem=lambda k: 500 + min(k, 6) * 8.0)), SPEC)
    v = memory_verdict(a)
    assert v.status is Status.PASS and "-> PASS (bounded cache: retained memory rose" in v.message
    assert "then plateaued (last part +0.0 MB/h" in v.message


# tiny-cpu's soak: 80 s, rounds of 8 s, 2 warm-up, ceiling 40 MB/h. The healthy floor under the
# injected patterns is 10 measured rounds of the embedded server's own low envelope
# (benchmarks/results/soak_leak-20261130T081212.json, rounds 8-17: creeps of 0.01-0.03 MB a round).
TINY = SoakSpec(duration="80s", round="8s", warmup="16s", rate_rps=2, memory_slope_max_mb_per_h=40,
                ttft_p95_slope_max_ms_per_h=12000, lagged_rounds_max=0.15)
TINY_PLAN = SoakPlan(rounds=10, round_s=8, warmup_rounds=2, rate_rps=2, mix=())
HEALTHY = [1667.95, 1667.97, 1667.98, 1668.0, 1668.03, 1668.04, 1668.05, 1668.06, 1668.07, 1668.1]
LONGS = [5, 3, 4, 6, 2, 4, 5, 3, 4, 6]  # long requests per round: Poisson(4) draws, ~64 in the soak


def tiny(extra):
    """Rows of a tiny-cpu soak whose retained memory is :data:`HEALTHY` + ``extra(k)`` (MB)."""
    out = []
    for k in range(10):
        r = {f: None for f in ROUND_FIELDS}
        m = HEALTHY[k] + extra(k)
        r.update(round=k, warmup=k < 2, t_start_s=k * 8.0, t_end_s=(k + 1) * 8.0, requests=16, errors=0, ok=16,
                 ttft_p95_ms=300.0 + (k % 3) * 40, mem_min_mb=m, mem_max_mb=m + 30, client_kept_up=True,
                 lag_p99_ms=1.0, loop_lag_p99_ms=1.0, preemptions=0, waiting_max=0.0, kvgate_rss_mb=150.0)
        out.append(r)
    return memory_verdict(analyze(result(out, plan=TINY_PLAN), TINY))


def test_a_2_mb_a_minute_leak_fails_an_80_s_soak_as_a_ramp():
    # the issue-33 leak the 128 MB floor passed: /metrics RSS growing linearly, 2 MB/min = 0.27 MB a round
    v = tiny(lambda k: 2.0 * k * 8 / 60)
    assert v.status is Status.FAIL and v.measured == pytest.approx(120 + 8, abs=8)  # MB/h: 120 + the creep
    assert "ceiling 40 MB/h; a ramp: rose in 7 of 7 round-to-round steps (largest two +0.3, +0.3 MB of +2.0 MB; " \
           "no one or two rounds explain it), still rising in the last part -> FAIL (memory growth:" in v.message
    assert v.evidence["analysis"]["memory_mb_per_h"]["kind"] == "growth"


def test_a_leak_that_grows_only_with_long_requests_fails():
    # 2 MB per long request (the proxy): the rise per round follows that round's long requests
    leaked = [2.0 * sum(LONGS[:k + 1]) for k in range(10)]
    v = tiny(lambda k: leaked[k])
    assert v.status is Status.FAIL, v.message
    assert "a ramp: rose in 7 of 7 round-to-round steps (largest two +12.0, +12.0 MB of +60.1 MB" in v.message
    # a one-off step on top of it does not hide it: the rest still ramps, never a PASS (undecided in 8
    # rounds: flat, jump, ramp leaves the straight line's residuals autocorrelated, which widens it)
    on_top = tiny(lambda k: leaked[k] + (60.0 if k >= 5 else 0.0))
    assert on_top.status in (Status.FAIL, Status.INCONCLUSIVE) and "-> PASS" not in on_top.message


@pytest.mark.parametrize("size", [40.0, 60.0, 68.0])
def test_a_single_step_with_flat_rounds_around_it_passes_naming_the_step(size):
    v = tiny(lambda k: size if k >= 5 else 0.0)  # the embedded server's +40..+68 MB step, once, in round 5
    a = v.evidence["analysis"]
    # a slope far above the ceiling (its interval widened: flat, jump, flat is autocorrelated around a line)
    assert a["memory_mb_per_h"]["slope"] > 1000 and a["memory_mb_per_h"]["kind"] == "step"
    assert a["memory_mb_per_h"]["unit"] == "round" and a["memory_mb_per_h"]["rho_used"] > 0
    # the PASS rests on an upper bound: the series without the step's round shown under the ceiling
    assert a["memory_mb_per_h"]["step"]["rest"]["full"]["ci_high"] <= 40
    assert v.status is Status.PASS, v.message
    assert f"-> PASS (one-off step: retained memory stepped +{size:,.1f} MB in round 5 (" in v.message
    assert "flat before and after: without the step +" in v.message and "4 flat round(s) after it" in v.message
    assert a["classification"] == "one-off step" and a["memory_mb_per_h"]["step"]["points"] == [3]
    split = tiny(lambda k: (0.0, 25.0, 60.0)[min(max(k - 4, 0), 2)])  # the step spread over rounds 5 and 6
    assert split.status is Status.PASS and "+25.0 MB in round 5 and +35.0 MB in round 6" in split.message


def test_a_step_still_rising_at_the_end_is_not_a_step():
    # three rounds of +20 MB at the end: growth in the last part, no flat rounds after it
    v = tiny(lambda k: 20.0 * max(0, k - 6))
    assert v.status is Status.FAIL and "still rising in the last part" in v.message, v.message


def test_estimate_above_the_ceiling_but_not_shown_is_inconclusive_never_pass():
    noise = [0, 9, -7, 12, -10, 8, -9, 11, -6, 10, -8, 9]  # MB around a 2 MB/round (24 MB/h) rise
    a = analyze(result(rows(mem=lambda k: 500 + 2.0 * k + noise[k], ttft=lambda k: 40 + (9 if k % 2 else -9) + 9 * k)),
                SPEC)
    assert a.memory.full.slope > 20 and a.memory.full.ci_low < 20  # the premise: estimate over, bound under
    v = memory_verdict(a)
    assert v.status is Status.INCONCLUSIVE and "healthy" not in v.message and v.measured == pytest.approx(a.memory.full.slope, abs=1e-3)
    lo, hi = a.memory.full.ci_low, a.memory.full.ci_high
    assert f"-> INCONCLUSIVE (the 95% interval {lo:+,.1f}..{hi:+,.1f} MB/h straddles the 20 MB/h ceiling: neither " \
           "growth above it nor its absence is shown)" in v.message
    assert v.cause.startswith(f"the soak is too short to decide: the 95% interval is {hi - lo:,.0f} MB/h wide at 10 rounds "
                              "(retained memory scatters ")
    lat = latency_verdict(a, profile())
    assert a.ttft.full.slope > 100 and a.ttft.full.ci_low < 100
    assert lat.status is Status.INCONCLUSIVE and lat.limit == 100 and lat.unit == "ms/h", lat.message
    assert "straddles the 100 ms/h ceiling: neither TTFT drift above it nor its absence is shown" in lat.message
    assert "TTFT p95 scatters " in lat.cause and " ms round to round around the fit" in lat.cause
    steady = memory_verdict(analyze(result(rows()), SPEC))
    assert "-> PASS (healthy)" in steady.message and steady.cause is None


def ttft_rows(slope_ms_per_round, scatter_ms, rounds=10):
    """tiny-cpu rows (8 s rounds, 2 warm-up) whose TTFT p95 rises ``slope_ms_per_round`` a round with
    a scatter of +-``scatter_ms`` around the line, signed + - - + in every 4 measured rounds (each
    block orthogonal to the line, so the fit finds the slope over a multiple of 4 rounds; over 8
    measured rounds its residual spread is ``scatter_ms x sqrt(8/6)``; its lag-1 autocorrelation
    is about 0, as independent rounds' is: a scatter in long same-signed stretches would be read as
    dependence and widen the interval)."""
    n = rounds - 2
    out = []
    for k in range(rounds):
        r = {f: None for f in ROUND_FIELDS}
        r.update(round=k, warmup=k < 2, t_start_s=k * 8.0, t_end_s=(k + 1) * 8.0, requests=16, errors=0, ok=16,
                 ttft_p95_ms=300.0 + slope_ms_per_round * k + (scatter_ms if (k - 2) % 4 in (0, 3) else -scatter_ms),
                 mem_min_mb=HEALTHY[k % 10], mem_max_mb=HEALTHY[k % 10] + 30, client_kept_up=True, lag_p99_ms=1.0,
                 loop_lag_p99_ms=1.0, preemptions=0, waiting_max=0.0, kvgate_rss_mb=150.0)
        out.append(r)
    return out


def soak_latency(rs):
    plan = SoakPlan(rounds=len(rs), round_s=8, warmup_rounds=2, rate_rps=2, mix=())
    return analyze(result(rs, plan=plan), TINY), latency_verdict(analyze(result(rs, plan=plan), TINY), profile())


def test_soak_latency_passes_only_below_fails_only_above_and_straddling_is_inconclusive_with_the_rounds_to_decide():
    # the issue: +23,965 ms/h (95% CI -15,396..+63,326) against 12,000 read PASS. 400 ms a minute
    # (53.3 ms a round of 8 s = 24,000 ms/h) in a scatter of +-100 ms: the interval straddles the ceiling
    a, v = soak_latency(ttft_rows(400 * 8 / 60, 100.0))
    t = a.ttft.full
    assert t.slope == pytest.approx(24000) and t.ci_low < 12000 < t.ci_high
    assert v.status is Status.INCONCLUSIVE and v.measured == pytest.approx(t.slope, abs=1e-3) and v.limit == 12000
    assert "-> INCONCLUSIVE (the 95% interval " in v.message and "straddles the 12000 ms/h ceiling" in v.message
    # the cause, from the measured scatter: rounds that would decide if the slope held
    m = re.match(r"the soak is too short to decide: the 95% interval is ([\d,]+) ms/h wide at 8 rounds \(TTFT p95 "
                 r"scatters ([\d.]+) ms round to round around the fit; unit round, lag-1 autocorrelation [-+][\d.]+ "
                 r"\(allowed for [\d.]+: n_eff [\d.]+ of 8\)\); at this noise ~(\d+) measured rounds \(([\d,]+) s; "
                 r"--soak-duration=(\d+)s with the 2 warm-up rounds\) would put it on one side of the ceiling if the "
                 r"slope held at \+[\d,.]+ ms/h$", v.cause)
    assert m, v.cause
    width, sd, need, secs, dur = float(m[1].replace(",", "")), float(m[2]), int(m[3]), m[4], int(m[5])
    assert width == pytest.approx(t.ci_high - t.ci_low, abs=1) and sd == pytest.approx(100 * (8 / 6) ** 0.5, rel=0.02)
    assert need > 8 and dur == (need + 2) * 8 and secs == f"{need * 8:,}"
    # ... and a soak of that many rounds, same slope and scatter, decides: the whole interval above -> FAIL
    longer, fail = soak_latency(ttft_rows(400 * 8 / 60, 100.0, rounds=need + 2 + (-need) % 4))  # whole blocks
    assert longer.ttft.full.ci_low > 12000 and fail.status is Status.FAIL, fail.message
    assert fail.cause is None or "too short" not in fail.cause
    # a flat TTFT: PASS only when the interval's upper bound is under the ceiling, else INCONCLUSIVE
    flat, ok = soak_latency(ttft_rows(0.0, 10.0))
    assert flat.ttft.full.ci_high < 12000 and ok.status is Status.PASS and ok.cause is None
    # ... over 8 rounds its last part's interval (+-23,413 ms/h) straddles the ceiling: the PASS says so
    assert flat.ttft.last.ci_low < 12000 < flat.ttft.last.ci_high
    assert "-> PASS (no linear TTFT drift: the whole run's interval is below the ceiling; the last part's interval " \
           "-23,412.8..+23,412.8 ms/h straddles it, so a late onset is neither shown nor ruled out" in ok.message
    noisy, unsure = soak_latency(ttft_rows(0.0, 200.0))
    assert noisy.ttft.full.slope < 12000 < noisy.ttft.full.ci_high and unsure.status is Status.INCONCLUSIVE


def late_ramp(rounds, ms_per_round, last_third=True, frac=0.88):
    """Flat TTFT p95 (+-1 ms) whose last measured third (or the rounds from ``frac`` of the run on)
    climbs ``ms_per_round`` a round (x 450 = ms/h at 8 s rounds)."""
    rs = ttft_rows(0.0, 1.0, rounds=rounds)
    start = len(rs) - (len(rs) - 2) // 3 if last_third else int(len(rs) * frac)
    for i, r in enumerate(rs[start:]):
        r["ttft_p95_ms"] += ms_per_round * (i + 1)
    return rs


def test_soak_latency_pass_says_whether_the_last_part_is_below_or_undecided_and_a_late_drift_fails():
    """The whole run's upper bound tests a linear drift and carries the PASS; the last part checks a
    late onset. The issue: a PASS read "no TTFT drift: the whole interval is below the ceiling" while
    its last part's interval (-86,638..+60,978 ms/h) straddled the 30,000 ceiling."""
    # healthy, long and quiet: both intervals below -> PASS saying both
    a, v = soak_latency(ttft_rows(0.0, 1.0, rounds=26))
    assert a.ttft.full.ci_high < 12000 and a.ttft.last.ci_high < 12000
    assert v.status is Status.PASS and "-> PASS (no TTFT drift: the whole interval is below the ceiling, and " \
        "the last part's too)" in v.message and "straddles" not in v.message
    # a ramp of +45,000 ms/h over the last 12 of 98 rounds: the whole run's interval below, the last
    # part's straddling -> PASS on the linear test, the late onset named undecided, never "no drift"
    a, v = soak_latency(late_ramp(100, 100.0, last_third=False))
    lo, hi = a.ttft.last.ci_low, a.ttft.last.ci_high
    assert a.ttft.full.ci_high < 12000 and lo < 12000 < hi and not a.ttft_shown
    assert v.status is Status.PASS and "no TTFT drift" not in v.message
    assert (f"-> PASS (no linear TTFT drift: the whole run's interval is below the ceiling; the last part's interval "
            f"{lo:+,.1f}..{hi:+,.1f} ms/h straddles it, so a late onset is neither shown nor ruled out") in v.message
    # +13,500 ms/h over the last third: the whole run's interval still below (-48..+6,986), the last
    # part's lower bound above the ceiling -> FAIL (late drift), not PASS
    a, v = soak_latency(late_ramp(100, 30.0))
    assert a.ttft.full.ci_high < 12000 < a.ttft.last.ci_low and a.ttft_shown
    assert v.status is Status.FAIL and "PASS" not in v.message and "TTFT p95 rising" in v.message, v.message


def test_preemption_placement_names_the_preemptions():
    a = analyze(result(rows(ttft=lambda k: 40 + 30 * k, pre=lambda k: 3 + k)), SPEC)
    v = latency_verdict(a, profile())
    assert v.status is Status.FAIL and v.unit == "ms/h" and v.measured == pytest.approx(360.0)
    assert "(preemption/placement: TTFT p95 rising while retained memory flat (+0.0 MB/h); preemptions climbing " \
           "(+95 over the measured rounds, rising per round))" in v.message
    assert v.cause == ("preemption/placement: TTFT p95 rising while retained memory flat (+0.0 MB/h); preemptions "
                       "climbing (+95 over the measured rounds, rising per round)")
    assert memory_verdict(a).status is Status.PASS
    assert "soak classified preemption/placement" in memory_verdict(a).message


def test_errors_fail_the_latency_half():
    a = analyze(result(rows(errors=lambda k: 3 if k == 7 else 0)), SPEC)
    v = latency_verdict(a, profile())
    assert v.status is Status.FAIL and "3 of 300 requests failed (1.0% > 0.0%" in v.message
    # the tally is the measured rounds' (the mix beside it counts the warm-up's requests too)
    assert "; errors 3/300 in the measured rounds (the mix's counts include the warm-up); preemptions" in v.message


def test_too_few_requests_for_a_p95_is_invalid_not_pass():
    a = analyze(result(rows(ttft=lambda k: None)), SPEC)
    v = latency_verdict(a, profile())
    assert v.status is Status.INVALID and "only 0 of 10 measured rounds have a TTFT p95" in v.message


def test_absent_memory_is_invalid_with_the_source_and_reason():
    res = result(rows(mem=lambda k: None))
    res.samplers["server-memory"].update(last_error="/metrics has no process_resident_memory_bytes",
                                         source="process_resident_memory_bytes in GET http://h/metrics",
                                         quantity="RSS of the API-server process", covers="the API-server process only")
    v = memory_verdict(analyze(res, SPEC))
    assert v.status is Status.INVALID and v.measured is None
    assert v.message == ("server memory not measurable: /metrics has no process_resident_memory_bytes (0 of 10 measured "
                         "rounds had a reading); the memory half is not judged (never a PASS) -> INVALID; source: "
                         "process_resident_memory_bytes in GET http://h/metrics [RSS of the API-server process], "
                         "covering the API-server process only")
    assert v.cause == "no memory reading to fit: /metrics has no process_resident_memory_bytes"


def test_a_memory_gauge_that_never_moved_is_invalid_naming_whose_memory_it_read():
    # the issue: --endpoint's process_resident_memory_bytes read 834 MB in every sample of a 40 s soak
    rs = rows(mem=lambda k: 834.0)
    for r in rs:
        r.update(mem_max_mb=834.0, samples=60, sample_errors=0)
    res = result(rs)
    res.samplers["server-memory"].update(source="process_resident_memory_bytes in GET http://h/metrics",
                                         quantity="RSS of the API-server process", covers="the API-server process only")
    v = memory_verdict(analyze(res, SPEC))
    assert v.status is Status.INVALID, v.message
    assert v.message.startswith("server memory never moved in 3,000 s: 600 samples over 10 measured rounds all 834.000 MB "
                                "(zero variance) -> INVALID")
    assert "source: process_resident_memory_bytes in GET http://h/metrics [RSS of the API-server process], covering " \
           "the API-server process only" in v.message
    assert v.cause.startswith("a frozen memory source: all 600 samples read 834.000 MB")
    # one sample moving by one page (4 KB) is a live gauge: judged as usual, naming the source
    rs[7]["mem_max_mb"] = 834.004
    live = memory_verdict(analyze(result(rs, samplers=res.samplers), SPEC))
    assert live.status is Status.PASS and "covering the API-server process only" in live.message


def test_a_process_tree_that_worked_while_its_memory_held_still_is_judged_not_frozen():
    """psutil's PSS + swap of the launched tree, one value in every sample (the embedded tiny vLLM on short
    requests, 2026-12-05: 1,548.863 MB over 5 rounds): the tree's CPU time grew, so the reads were of
    working processes -- a measured flat line (PASS), said so; without that growth the same reads are
    INVALID (nothing shows the source is live)."""
    rs = rows(mem=lambda k: 1548.863)
    for k, r in enumerate(rs):
        r.update(mem_max_mb=1548.863, samples=60, sample_errors=0, server_cpu_s=100.0 + 12.5 * k)
    v = memory_verdict(analyze(result(rs), SPEC))
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("retained server memory 1,548.9 MB, slope +0.0 MB/h"), v.message
    assert v.message.endswith("; memory held one value (1,548.863 MB) in every sample while the process tree used "
                              "112.5 s of CPU serving the soak (read from the processes themselves: not a frozen "
                              "gauge)"), v.message
    for r in rs:
        r["server_cpu_s"] = 100.0  # the tree did nothing, or kvgate could not read its CPU time
    idle = memory_verdict(analyze(result(rs), SPEC))
    assert idle.status is Status.INVALID and idle.message.startswith("server memory never moved"), idle.message


def test_cut_short_soak_is_incomplete_in_every_half():
    res = result(rows()[:5], complete=False, stopped="SIGTERM")
    a = analyze(res, SPEC)
    for v in (memory_verdict(a), latency_verdict(a, profile())):
        assert v.status is Status.INCOMPLETE and v.measured == 5 and v.limit == 12 and v.unit == "rounds"
        assert "soak stopped (SIGTERM) after 5 of 12 rounds; the completed rounds are written to " \
               "reports/soak-rounds.csv -> INCOMPLETE" in v.message


def test_lagging_client_is_invalid():
    a = analyze(result(rows(kept_up=False)), SPEC)
    assert memory_verdict(a).status is Status.INVALID and latency_verdict(a, profile()).status is Status.INVALID


def gpu_result(peaks, totals=(80 * GIB,)):
    gpu = [{"index": i, "name": "H100", "total_bytes": t, "peak_used_bytes": p} for i, (p, t) in
           enumerate(zip(peaks, totals))]
    return result(rows(), gpu=gpu)


def test_gpu_headroom_passes_within_the_budget_and_fails_beyond():
    prof = profile(gpu_memory_utilization=0.9)
    ok = gpu_verdict(analyze(gpu_result([70 * GIB]), SPEC), prof)
    assert ok.status is Status.PASS and ok.unit == "MiB" and ok.measured == 70 * 1024
    assert ok.limit == round(0.9 * 80 * 1024 + 256)
    assert "GPU0 peak 71,680 of 81,920 MiB (87.5%) within gpu_memory_utilization 0.9 + 256 MiB slack" in ok.message
    bad = gpu_verdict(analyze(gpu_result([75 * GIB]), SPEC), prof)
    assert bad.status is Status.FAIL and "GPU0 peak 76,800 of 81,920 MiB (93.8%) > 0.9 x total + 256 MiB" in bad.message
    assert "headroom outside vLLM's budget is gone" in bad.message
    default = gpu_verdict(analyze(gpu_result([70 * GIB]), SPEC), profile(gpu_memory_utilization=None))
    assert "0.92 (vLLM default)" in default.message


def test_gpu_half_skips_with_the_reason():
    v = gpu_verdict(analyze(result(rows(), gpu_skip="NVML is not available here: NVMLError: Driver Not Loaded"),
                            SPEC), profile())
    assert v.status is Status.SKIP and "NVML is not available here" in v.message


def test_memory_source_choice():
    ep = Endpoint("http://127.0.0.1:9")
    prof = load_profile("tiny-cpu")
    spec = prof.soak
    local = build_samplers(prof, spec, ep, [1])
    assert isinstance(local.memory, ProcessTreeSampler) and "runs on CPU" in local.gpu_skip
    remote = build_samplers(prof, spec, ep, [])
    assert isinstance(remote.memory, MetricsMemorySampler) and "API-server process only" in remote.memory.covers
    q = SoakSpec.model_validate({**spec.model_dump(), "memory_query": {
        "url": "http://127.0.0.1:9090", "query": "sum(x)", "covers": "the pod", "api_key_env": "PROM_TOKEN"}})
    prom = build_samplers(prof, q, ep, [1], token_env=lambda name: "tok" if name == "PROM_TOKEN" else None)
    assert isinstance(prom.memory, PrometheusSampler) and prom.memory.covers == "the pod"
    forced = SoakSpec.model_validate({**spec.model_dump(), "memory_source": "process_tree"})
    none = build_samplers(prof, forced, ep, [])
    assert none.memory is None and "kvgate did not launch this server" in none.memory_skip
    gpu_prof = prof.model_copy(update={"hardware": prof.hardware.model_copy(update={"gpu": "H100"})})
    on_gpu = build_samplers(gpu_prof, spec, ep, [1], nvml=FakeNVML())
    assert on_gpu.gpu is not None and on_gpu.gpu.available and on_gpu.gpu_skip is None
    no_nvml = build_samplers(gpu_prof, spec, ep, [1], nvml=FakeNVML(init_error="Driver Not Loaded"))
    assert no_nvml.gpu is None and "Driver Not Loaded" in no_nvml.gpu_skip
    far = build_samplers(gpu_prof, spec, ep, [])
    assert far.gpu is None and "the server is remote" in far.gpu_skip


def test_soak_spec_validation_messages():
    with pytest.raises(ValueError, match="leaves 2 measured round"):
        SoakSpec(duration="20m", round="5m", warmup="10m", rate_rps=1, memory_slope_max_mb_per_h=1,
                 ttft_p95_slope_max_ms_per_h=1)
    with pytest.raises(ValueError, match="memory_source prometheus needs memory_query"):
        SoakSpec(duration="1h", round="5m", rate_rps=1, memory_slope_max_mb_per_h=1, ttft_p95_slope_max_ms_per_h=1,
                 memory_source="prometheus")
    with pytest.raises(ValueError, match="not a duration: '5 minutes'"):
        SoakSpec(duration="5 minutes", round="5m", rate_rps=1, memory_slope_max_mb_per_h=1,
                 ttft_p95_slope_max_ms_per_h=1)
    with pytest.raises(ValueError, match="extra"):
        SoakSpec(duration="1h", rate_rps=1, memory_slope_max_mb_per_h=1, ttft_p95_slope_max_ms_per_h=1, ceiling=3)


def test_profile_soak_mix_must_name_declared_workloads(write_profile):
    from kvgate.profile.models import ProfileError

    from .conftest import MINIMAL

    path = write_profile("p", MINIMAL + """\
workloads:
  chat: {prompt_tokens: 16, output_tokens: 8}
soak:
  duration: 10m
  round: 1m
  rate_rps: 1
  mix: {chat: 3, batch: 1}
  memory_slope_max_mb_per_h: 20
  ttft_p95_slope_max_ms_per_h: 100
""")
    with pytest.raises(ProfileError, match=r"soak.mix names unknown workload\(s\) \['batch'\]; workloads: chat"):
        load_profile(str(path))


def f3a_rows(ys, round_s=60.0):
    """One warm-up round, then a round per value of ``ys`` (retained memory 1000 MB + it), ``round_s`` apart."""
    out = []
    for k in range(len(ys) + 1):
        r = {f: None for f in ROUND_FIELDS}
        m = 1000.0 + (ys[k - 1] if k else 0.0)
        r.update(round=k, warmup=k < 1, t_start_s=k * round_s, t_end_s=(k + 1) * round_s, requests=60, errors=0, ok=60,
                 ttft_p95_ms=40.0, mem_min_mb=m, mem_max_mb=m + 30, client_kept_up=True, lag_p99_ms=1.0,
                 loop_lag_p99_ms=1.0, preemptions=0, waiting_max=0.0, kvgate_rss_mb=150.0)
        out.append(r)
    return out


def test_the_reviews_leak_that_passed_as_a_bounded_cache_is_inconclusive_with_its_dependence_stated():
    # review F3a: 12 rounds of 60 s, a true 28 MB/h leak, ceiling 9.3 MB/h; it read "PASS (bounded cache
    # ... then plateaued)" with the last part still rising. A PASS needs an upper bound under the ceiling.
    ys = [-0.87, 0.97, 1.18, 3.27, 1.85, 0.99, 1.74, 4.71, 3.18, 2.08, 4.07, 5.12]
    spec = SoakSpec(duration="13m", round="60s", warmup="60s", rate_rps=1, memory_slope_max_mb_per_h=9.3,
                    ttft_p95_slope_max_ms_per_h=100)
    plan = SoakPlan(rounds=13, round_s=60, warmup_rounds=1, rate_rps=1, mix=())
    v = memory_verdict(analyze(result(f3a_rows(ys), plan=plan), spec))
    assert v.status is Status.INCONCLUSIVE and "bounded cache" not in v.message, v.message
    assert "slope +22.9 MB/h (95% CI " in v.message and "straddles the 9.3 MB/h ceiling" in v.message
    # the unit, the dependence measured and the effective n, in the message, the cause and the evidence
    assert re.search(r"unit round, lag-1 autocorrelation [-+]\d\.\d\d \(allowed for \d\.\d\d: n_eff [\d.]+ of 12\)",
                     v.message), v.message
    assert "unit round, lag-1 autocorrelation" in v.cause and "would put it on one side of the ceiling" in v.cause
    fit = v.evidence["analysis"]["memory_mb_per_h"]
    assert fit["unit"] == "round" and fit["n"] == 12 and fit["n_eff"] <= 12 and fit["rho"] is not None
    assert fit["kind"] != "bounded" and not fit["plateau"]
    # ... and the same rounds with the rise taken out PASS (the other way)
    flat = memory_verdict(analyze(result(f3a_rows([y - 0.38 * i for i, y in enumerate(ys)]), plan=plan), spec))
    assert flat.status in (Status.PASS, Status.INCONCLUSIVE)
    clean = memory_verdict(analyze(result(f3a_rows([0.01 * (i % 2) for i in range(12)]), plan=plan), spec))
    assert clean.status is Status.PASS and "-> PASS (healthy)" in clean.message, clean.message


def test_memory_whose_interval_reaches_the_ceiling_is_inconclusive_whatever_its_point_estimate():
    # F3b: a point estimate under the ceiling was a PASS whatever the interval; now the upper bound decides
    noisy = [500.0 + (12.0 if k % 3 == 0 else -6.0) + 0.5 * k for k in range(12)]  # +6 MB/h, scatter +-12 MB
    v = memory_verdict(analyze(result(rows(mem=lambda k: noisy[k])), SPEC))
    fit = v.evidence["analysis"]["memory_mb_per_h"]
    assert fit["slope"] < 20 < fit["ci_high"] and v.status is Status.INCONCLUSIVE, v.message
    assert "-> INCONCLUSIVE (the 95% interval" in v.message and "neither growth above it nor its absence" in v.message


# The real embedded main job's soak (pytest --profile smollm2-cpu, 2026-12-06): 28 measured rounds of
# 4 s (the sampling-until-decided cap, 120 s), retained memory in MB; residual lag-1 autocorrelation
# +0.63, allowed for 0.82. profiles/smollm2-cpu.yaml sizes its memory ceiling from it.
SMOLLM2_MEM = [2914.025, 2913.638, 2913.638, 2914.826, 2913.633, 2913.634, 2909.872, 2909.744, 2912.738,
               2919.437, 2919.424, 2919.398, 2919.398, 2914.482, 2913.588, 2919.357, 2919.347, 2915.191,
               2913.585, 2913.585, 2913.585, 2913.57, 2913.42, 2913.369, 2913.369, 2913.352, 2913.693, 2913.353]


def smollm2(extra):
    """The soak memory verdict on :data:`SMOLLM2_MEM` + ``extra(k)`` (MB, k the measured round) under the
    smollm2-cpu profile's own soak spec (two warm-up rounds before the measured ones)."""
    spec = load_profile(str(REPO / "profiles" / "smollm2-cpu.yaml")).soak
    plan = SoakPlan(rounds=30, round_s=4, warmup_rounds=2, rate_rps=1, mix=())
    out = []
    for k in range(30):
        m = (SMOLLM2_MEM[0] if k < 2 else SMOLLM2_MEM[k - 2] + extra(k - 2))
        r = {f: None for f in ROUND_FIELDS}
        r.update(round=k, warmup=k < 2, t_start_s=k * 4.0, t_end_s=(k + 1) * 4.0, requests=4, errors=0, ok=4,
                 ttft_p95_ms=200.0, mem_min_mb=m, mem_max_mb=m + 5, client_kept_up=True, lag_p99_ms=1.0,
                 loop_lag_p99_ms=1.0, preemptions=0, waiting_max=0.0, kvgate_rss_mb=150.0)
        out.append(r)
    return spec, memory_verdict(analyze(result(out, plan=plan), spec))


def test_the_real_smollm2_soak_memory_passes_its_gross_leak_ceiling():
    spec, v = smollm2(lambda k: 0.0)
    assert v.status is Status.PASS, v.message
    assert f"ceiling {spec.memory_slope_max_mb_per_h:g} MB/h -> PASS" in v.message and "allowed for 0.50" in v.message \
        and "assumed (soak.autocorrelation_max)" in v.message


def test_the_real_smollm2_soak_with_a_ramp_at_twice_its_ceiling_never_passes():
    spec, _ = smollm2(lambda k: 0.0)
    per_round = 2 * spec.memory_slope_max_mb_per_h * 4 / 3600  # MB a 4-s round at 2x the ceiling
    _, v = smollm2(lambda k: per_round * k)
    assert v.status in (Status.FAIL, Status.INCONCLUSIVE) and "-> PASS" not in v.message, v.message


# ----------------------------------------------------------------------------- the run's false-alarm budget

#: The FAIL side's overall level under a run's false-alarm budget of 1% (split over the 9 statistical
#: families: 1 - 0.01/9 = 0.99889); the PASS side keeps soak.confidence (95%).
BUDGET_FC = VerdictsSpec(false_alarm_budget=0.01).fail_confidence(0.95)


def budgeted(p):
    """``p`` with ``verdicts.false_alarm_budget: 0.01``."""
    return p.model_copy(update={"verdicts": VerdictsSpec(false_alarm_budget=0.01)})


def mem_ramp(mb_per_round, scatter_mb):
    """:func:`rows` whose retained memory rises ``mb_per_round`` a 5-min round (x 12 = MB/h) with a
    scatter of +-``scatter_mb`` signed + - - + in every 4 measured rounds (lag-1 about 0)."""
    return rows(mem=lambda k: 500 + mb_per_round * k + (scatter_mb if (k - 2) % 4 in (0, 3) else -scatter_mb))


def test_memory_barely_shown_above_its_ceiling_fails_without_a_budget_and_is_inconclusive_with_one():
    # 24 MB/h against 20: the 95% lower end +22.3 clears the ceiling; at 99.89% (the budget share) +19.7 does not
    plain, held = analyze(result(mem_ramp(2.0, 0.3)), SPEC), analyze(result(mem_ramp(2.0, 0.3)), SPEC, BUDGET_FC)
    assert plain.memory.full.ci_low > 20 > held.memory.full.ci_low
    assert held.memory.full.ci_high == plain.memory.full.ci_high  # the PASS side's end unchanged
    v0, v1 = memory_verdict(plain), memory_verdict(held)
    assert v0.status is Status.FAIL and "95% CI +22.3..+25.6" in v0.message and "budget" not in v0.message
    assert v1.status is Status.INCONCLUSIVE, v1.message
    assert ("CI +19.7..+25.6: lower end at 99.89% for a FAIL (the run's false-alarm budget share), upper at 95% "
            "for a PASS") in v1.message
    ev = v1.evidence["analysis"]
    assert ev["fail_confidence"] == pytest.approx(BUDGET_FC) and ev["fail_look_confidence"] == pytest.approx(BUDGET_FC)
    assert ev["memory_mb_per_h"]["lower_confidence"] == pytest.approx(BUDGET_FC)
    assert "fail_confidence" not in v0.evidence["analysis"] and "lower_confidence" not in \
        v0.evidence["analysis"]["memory_mb_per_h"]
    # a leak at 3x the ceiling with little noise still FAILs under the budget
    leak = memory_verdict(analyze(result(mem_ramp(5.0, 0.5)), SPEC, BUDGET_FC))
    assert leak.status is Status.FAIL and leak.measured == pytest.approx(60.0, rel=0.01), leak.message
    # no budget above soak.confidence: nothing changes
    assert memory_verdict(analyze(result(mem_ramp(2.0, 0.3)), SPEC, 0.95)).message == v0.message


def test_soak_latency_barely_shown_above_fails_without_a_budget_and_keeps_sampling_with_one():
    from kvgate.gates.soak import undecided

    rs = ttft_rows(30.0, 2.0)  # 13,500 ms/h against 12,000
    plan = SoakPlan(rounds=len(rs), round_s=8, warmup_rounds=2, rate_rps=2, mix=())
    p, pb = profile(), budgeted(profile())
    plain = analyze(result(rs, plan=plan), TINY)
    held = analyze(result(rs, plan=plan), TINY, pb.verdicts.fail_confidence(TINY.confidence))
    assert plain.ttft.full.ci_low > 12000 > held.ttft.full.ci_low and plain.ttft.full.ci_high == held.ttft.full.ci_high
    assert latency_verdict(plain, p).status is Status.FAIL
    v = latency_verdict(held, pb)
    assert v.status is Status.INCONCLUSIVE and "the interval (lower end at 99.89% for a FAIL" in v.message, v.message
    # the look's judge: decided (FAIL) without the budget, undecided (sample on) with it
    assert undecided(result(rs, plan=plan), TINY, p) == [] and undecided(result(rs, plan=plan), TINY, pb) == ["latency"]
    # a drift at 3x the ceiling still FAILs
    rs3 = ttft_rows(80.0, 2.0)
    plan3 = SoakPlan(rounds=len(rs3), round_s=8, warmup_rounds=2, rate_rps=2, mix=())
    assert latency_verdict(analyze(result(rs3, plan=plan3), TINY, BUDGET_FC), pb).status is Status.FAIL


@pytest.mark.parametrize("case", ["healthy", "bounded", "step", "ttft flat", "ttft late straddle"])
def test_soak_passes_are_the_same_with_and_without_a_budget(case):
    """A PASS rests on upper ends only (the whole run's, a plateau's, a step's flat rest's), which the
    budget leaves at soak.look_confidence: the same PASS, the same slopes and upper ends."""
    if case == "healthy":
        res, spec = result(rows()), SPEC
    elif case == "bounded":
        res, spec = result(rows(mem=lambda k: 500 + min(k, 6) * 8.0)), SPEC
    elif case == "step":
        out = [dict(r) for r in rows(mem=lambda k: 500.0 + (0.01 if k % 2 else 0.0) + (60.0 if k >= 6 else 0.0))]
        res, spec = result(out), SPEC
    else:
        rs = ttft_rows(0.0, 10.0) if case == "ttft flat" else late_ramp(100, 100.0, last_third=False)
        res, spec = result(rs, plan=SoakPlan(rounds=len(rs), round_s=8, warmup_rounds=2, rate_rps=2, mix=())), TINY
    a0, a1 = analyze(res, spec), analyze(res, spec, BUDGET_FC)
    judge = memory_verdict if not case.startswith("ttft") else (lambda a: latency_verdict(a, profile()))
    v0, v1 = judge(a0), judge(a1)
    assert v0.status is Status.PASS and v1.status is Status.PASS, (v0.message, v1.message)
    assert v1.measured == v0.measured and a1.classification == a0.classification
    for g0, g1 in ((a0.memory, a1.memory), (a0.ttft, a1.ttft)):
        assert g1.kind == g0.kind and g1.full.ci_high == g0.full.ci_high and g1.full.ci_low <= g0.full.ci_low
    assert "lower end at 99.89% for a FAIL" in v1.message and "lower end" not in v0.message


def test_an_extended_soak_states_both_per_look_levels_under_a_budget():
    from kvgate.gates.soak import ran
    from kvgate.soak.runner import Extension

    spec = TINY.model_copy(update={"max_duration": "160s"})  # 11 looks: 99.55% a look, the FAIL side 99.99%
    rs = ttft_rows(0.0, 1.0, rounds=12)
    plan = SoakPlan(rounds=10, round_s=8, warmup_rounds=2, rate_rps=2, mix=())
    res = result(rs, plan=plan, extension=Extension(planned=10, cap=20, looks=[(10, ("latency",)), (11, ("latency",)),
                                                                                 (12, ())]))
    assert ran(analyze(res, spec)) == ("decided after 10 measured rounds (96 s of at most 160 s; 8 planned, extended "
                                       "2 rounds while soak/latency's interval straddled its ceiling; each look judged "
                                       "at 99.55%: 95% split over 11 looks)")
    a = analyze(res, spec, BUDGET_FC)
    assert a.fail_look == pytest.approx(1 - (1 - BUDGET_FC) / 11)
    assert ran(a).endswith("each look judged at 99.55% for a PASS and 99.99% for a FAIL: 95% and 99.89% (the run's "
                           "false-alarm budget share) split over 11 looks)"), ran(a)
