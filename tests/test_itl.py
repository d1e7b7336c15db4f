"""ITL as the field defines it: the p95 over all inter-token gaps pooled across requests, as
``vllm bench serve`` computes it, with its bound from a cluster bootstrap over waves (or requests)
(:mod:`kvgate.stats.cluster`, :func:`kvgate.load.sampling.judge_slo`). Seeded, no server, no sleeping."""

from __future__ import annotations

import numpy as np
import pytest

from kvgate.load import RequestRecord
from kvgate.load.sampling import judge_slo, slo_samples
from kvgate.profile.models import load_profile
from kvgate.stats import request_metrics, summarize
from kvgate.stats.cluster import MIN_REQUESTS, cluster_bound, icc, judge_pooled, pooled_percentile
from kvgate.stats.confidence import FAIL, PASS, UNDECIDED

PROFILE = load_profile("tests/data/fake-vllm.yaml")


def stream(i: int, gaps_s: list[float], ttft_s: float = 0.05, start_s: float = 0.0) -> RequestRecord:
    """A finished streamed request: content events at ``ttft_s`` then each of ``gaps_s`` later."""
    r = RequestRecord(index=i, scheduled_s=start_s, sent_s=start_s, first_byte_s=start_s + ttft_s / 2, status=200,
                      content_type="text/event-stream")
    r.finalized = True
    t = [start_s + ttft_s]
    for g in gaps_s:
        t.append(t[-1] + g)
    r.content_s, r.first_token_s, r.tokens, r.end_s = t, t[0], len(t), t[-1] + 0.001
    return r


def stall_set(n: int = 40, tokens: int = 8, seed: int = 3, stall_s: float = 2.0) -> list[RequestRecord]:
    """``n`` requests of ``tokens`` tokens, gaps ~ 20 ms lognormal; every 10th request stalls once
    (one gap of ``stall_s``: a long prefill joined its batch)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        gaps = list(rng.lognormal(np.log(0.020), 0.25, tokens - 1))
        if i % 10 == 9:
            gaps[tokens // 2] = stall_s
        out.append(stream(i, gaps, start_s=0.01 * i))
    return out


def vllm_bench_serve_itl_ms(records: list[RequestRecord], p: float = 95.0) -> float:
    """``vllm bench serve``'s ITL percentile (vllm/benchmarks/serve.py, calculate_metrics), redone:
    its request function appends ``timestamp - most_recent_timestamp`` for every chunk after the
    first token to ``output.itl`` (seconds); calculate_metrics extends one list over the successful
    outputs (``itls += outputs[i].itl``) and reports ``np.percentile(itls or 0, p) * 1000``."""
    itls: list[float] = []
    for r in records:
        if not r.ok:
            continue
        itl, most_recent = [], r.content_s[0]
        for ts in r.content_s[1:]:
            itl.append(ts - most_recent)
            most_recent = ts
        itls += itl
    return np.percentile(itls or 0, p) * 1000


def slo(itl_ms: float):
    return PROFILE.slo.model_copy(update={"itl_p95_ms": itl_ms, "ttft_p95_ms": None, "e2e_p95_ms": None})


def test_itl_p95_on_a_stall_set_equals_vllm_bench_serve_to_the_last_digit():
    recs = stall_set()
    theirs = vllm_bench_serve_itl_ms(recs)
    j = judge_slo(recs, slo(100.0), 0.95)["ITL"]
    assert j.bound.point == theirs  # exactly: same gaps, same np.percentile, same x 1000
    c = PROFILE.slo.concurrency  # the closed loop's waves: send index // concurrency
    assert j.bound.unit == "wave" and j.bound.requests == 40 and j.bound.n == -(-40 // c) and j.bound.gaps == 40 * 7
    # the old statistic (a p95 over each request's own p95 gap) reads the stalls as the p95
    per_request = float(np.percentile([np.percentile(request_metrics(r).itl_s, 95) for r in recs], 95)) * 1e3
    assert per_request > 10 * theirs  # 4 stalls in 40 requests of 7 gaps: per-request ~1.4 s, pooled ~30 ms
    assert summarize(recs)["itl_ms"]["p95"] == pytest.approx(theirs, rel=1e-12)
    assert float(np.percentile(slo_samples(recs)["itl_ms"], 95)) == pytest.approx(theirs, rel=1e-12)
    assert "ITL p95 (pooled gaps, as vllm bench serve)" in j.text("ITL")


def test_itl_verdict_both_ways_on_the_stall_set():
    recs = stall_set()
    point = vllm_bench_serve_itl_ms(recs)
    ok = judge_slo(recs, slo(point * 1.5), 0.95)["ITL"]
    assert ok.decision == PASS and ok.bound.upper <= point * 1.5, ok.text("ITL")
    bad = judge_slo(recs, slo(point / 1.5), 0.95)["ITL"]
    assert bad.decision == FAIL and bad.bound.lower > point / 1.5
    text = bad.text("ITL")
    assert "-> FAIL" in text and "waves (40 requests), 280 gaps; unit wave, ICC between requests in a wave" in text
    assert "effective n" in text and f"{point:,.1f} ms" in text
    assert "effective n" in text
    assert ok.to_dict()["unit"] == "wave" and ok.to_dict()["requests"] == 40 and "cluster bootstrap over waves" in ok.to_dict()["method"]


def test_the_bound_resamples_requests_and_widens_with_dependence():
    rng = np.random.default_rng(0)
    # independent gaps vs one level per request (ICC ~ 0.9): the same pooled marginal, wider bounds
    iid = [list(rng.lognormal(np.log(20), 0.3, 31)) for _ in range(60)]
    levels = rng.lognormal(np.log(20), 0.3, 60)
    dep = [list(lv * rng.lognormal(0, 0.1, 31)) for lv in levels]
    a, b = cluster_bound(iid, 0.95, 0.95), cluster_bound(dep, 0.95, 0.95)
    assert (a.upper - a.lower) * 2 < (b.upper - b.lower)
    assert icc(iid) < 0.05 and icc(dep) > 0.8 and b.design_effect > a.design_effect
    # seeded: the same records and seed give the same bound; another seed, close to it
    assert cluster_bound(dep, 0.95, 0.95, rng=1) == cluster_bound(dep, 0.95, 0.95, rng=1)
    assert cluster_bound(dep, 0.95, 0.95, rng=2).upper == pytest.approx(b.upper, rel=0.1)
    assert b.point == pooled_percentile(dep, 95)


def test_too_few_requests_give_no_bound():
    few = [[0.02] * 31 for _ in range(MIN_REQUESTS - 1)]
    j = judge_pooled(few, 0.95, 100.0, scale=1e3)
    assert j.decision == UNDECIDED and j.bound.upper is None and f"fewer than {MIN_REQUESTS} requests" in j.text("ITL")
    assert j.bound.point == pytest.approx(20.0)


def test_the_upper_bound_is_rarely_under_the_true_pooled_p95_under_dependence():
    """The one-sided 95% upper bound under within-request dependence (request levels and gaps
    lognormal, sd 0.25 each): in 200 seeded runs of 40 requests the bound falls under the true
    pooled p95 (from a very large draw) -- a wrong PASS at a limit there -- at most ~5% (binomial
    sd 1.5%; accepted to 9%). The plain percentile bootstrap alone missed 13% here (87% coverage):
    the design-effect side is what keeps it honest."""
    def draw(rng, n):
        lv = rng.lognormal(np.log(20), 0.25, n)
        return [list(v * rng.lognormal(0, 0.25, 15)) for v in lv]

    truth = pooled_percentile(draw(np.random.default_rng(99), 20000), 95)
    rng = np.random.default_rng(7)
    bounds = [cluster_bound(draw(rng, 40), 0.95, 0.95, replicates=400, rng=rng) for _ in range(200)]
    misses = sum(1 for b in bounds if b.upper is not None and b.upper < truth)
    boot_misses = sum(1 for b in bounds if b.boot_upper < truth)
    assert misses <= 18 and boot_misses > misses, (misses, boot_misses)


def test_latency_verdict_judges_the_pooled_itl_and_says_so():
    """latency/slo on the stall set (60 requests, 1 in 10 with one 2 s gap) against ITL 100 ms: the
    field's ITL p95 (~31 ms) PASSes; the old per-request statistic (~1.4 s) would have FAILed it."""
    from kvgate.gates.load import latency_verdict
    from kvgate.http.metrics import MetricsTrace
    from kvgate.load import LoadResult
    from kvgate.load.scenarios import LoadObservation
    from kvgate.verdict import Status

    recs = stall_set(n=60)
    prof = PROFILE.model_copy(update={"slo": slo(100.0)})
    obs = LoadObservation("latency", LoadResult("closed", recs, 60, 2.0, 60.0, concurrency=4), MetricsTrace(samples=[]),
                          16, 8, 4)
    v = latency_verdict(obs, prof)
    assert v.status is Status.PASS, v.message
    assert "ITL p95 (pooled gaps, as vllm bench serve)" in v.message and "unit wave" in v.message and "effective n" in v.message
    assert "pooled gaps across requests, as vllm bench serve" in v.evidence["itl_basis"]
    bad = PROFILE.model_copy(update={"slo": slo(20.0)})
    v = latency_verdict(obs, bad)
    assert v.status is Status.FAIL and "> 20 ms -> FAIL" in v.message, v.message


def _lockstep(rng, waves: int, c: int = 4, gaps: int = 7):
    """``waves`` closed-loop waves of ``c`` requests that share one latent (ICC 1 between the
    requests of a wave: a batch stalls together), each request's ``gaps`` log-gaps correlated 0.5
    with it; lognormal around 20 ms (the benchmark's lock-step design, verdict_sim)."""
    z = np.repeat(rng.standard_normal(waves), c)
    u = np.sqrt(0.5) * z[:, None] + np.sqrt(0.5) * rng.standard_normal((waves * c, gaps))
    return [list(20 * np.exp(0.3 * row)) for row in u]


def test_waves_as_the_unit_keep_the_upper_bound_honest_under_lockstep_where_requests_do_not():
    """Both ways, 200 seeded runs of 30 waves of 4 (120 requests): with the requests as clusters
    the 95% upper bound falls under the true pooled p95 (a wrong PASS at a limit there) in 26 runs
    (13%, stated 5%); with the waves as clusters (what judge_slo passes) in 7 (3.5%; accepted to
    18 = 9%). The ICC between requests in a wave is measured (~0.6 here) and stated."""
    truth = pooled_percentile(_lockstep(np.random.default_rng(99), 20000), 95)
    rng = np.random.default_rng(7)
    labels = [i // 4 for i in range(120)]
    wave_miss = req_miss = 0
    iccs = []
    for _ in range(200):
        g = _lockstep(rng, 30)
        w = cluster_bound(g, 0.95, 0.95, replicates=400, rng=rng, waves=labels)
        r = cluster_bound(g, 0.95, 0.95, replicates=400, rng=rng)
        wave_miss += w.upper is not None and w.upper < truth
        req_miss += r.upper is not None and r.upper < truth
        iccs.append(w.icc_requests)
    assert w.unit == "wave" and w.n == 30 and w.requests == 120 and r.unit == "request" and r.n == 120
    assert wave_miss <= 18 < req_miss, (wave_miss, req_miss)
    assert np.mean(iccs) > 0.3
    assert w.point == r.point == pooled_percentile(g, 95)  # the point is vllm bench serve's either way


def test_waves_of_independent_requests_measure_no_between_request_icc_and_still_bound():
    rng = np.random.default_rng(3)
    g = [list(rng.lognormal(np.log(20), 0.3, 7)) for _ in range(120)]
    w = cluster_bound(g, 0.95, 0.95, waves=[i // 4 for i in range(120)])
    assert w.icc_requests is not None and w.icc_requests < 0.1 and w.upper is not None and w.lower < w.point < w.upper
    d = w.to_dict()
    assert d["unit"] == "wave" and d["n"] == 30 and d["requests"] == 120 and d["n_eff_gaps"] > 0.8 * 840
    assert "icc_between_requests_in_wave" in d
    with pytest.raises(ValueError):
        cluster_bound(g, 0.95, 0.95, waves=[0, 1])
