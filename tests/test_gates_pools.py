"""The pools gates: routing read from each pool's own /metrics and isolation through the router.

Two fake vLLMs (tests/fakes/fake_vllm.py) are the pools; in front of them the fault-injecting fake
router (tests/fakes/fake_router.py) -- everything to one pool, the threshold on the wrong side,
long requests dropped -- or real nginx rendered from ci/nginx-pools.conf. Each fault FAILs naming
the counts; the healthy router and nginx PASS. Also: the nginx renderer, the landing counters,
the pool endpoints and the pools profile's wiring (other gates deselected, pool profiles loaded).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvgate.http.client import Endpoint
from kvgate.gates.pools import isolation_decide, isolation_plan, isolation_verdict, judge_ratio, routing_verdict
from kvgate.http.metrics import MetricsTrace
from kvgate.load import LoadResult
from kvgate.load.scenarios import LoadObservation
from kvgate.launch.pools import NginxRouter, PoolsLauncher, above_regex, pool_cpus, render_nginx
from kvgate.pools.routing import (PoolsError, PoolTargets, Routed, RoutingObservation, completion_body, isolation_view,
                          landing_counts, pool_endpoints, run_isolation, run_routing)
from kvgate.profile.models import ProfileError, load_profile, pool_profiles
from kvgate.verdict import Status
from tests.fakes.fake_router import FakeRouter
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured, read_summary
from .test_gates_load import tagged

pytest_plugins = ["pytester"]
DATA = REPO / "tests" / "data" / "pools"
PROFILE = load_profile(str(DATA / "fake-pools.yaml"))
POOLS = pool_profiles(PROFILE)
THRESHOLD = PROFILE.pools.routing.threshold
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


# ------------------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("n", [0, 7, 9, 10, 99, 1024, 2048, 1999, 90909])
def test_above_regex_matches_exactly_the_larger_numbers(n):
    rx = re.compile(f"^({above_regex(n)})$")
    for k in list(range(0, 3000)) + [n - 1, n, n + 1, 10 * n + 5, 10**7]:
        if k >= 0:
            assert bool(rx.match(str(k))) == (k > n), (n, k)


def test_nginx_template_renders_every_placeholder(tmp_path):
    text = render_nginx((REPO / "ci" / "nginx-pools.conf").read_text(), listen=4321, short="127.0.0.1:1",
                        long="127.0.0.1:2", threshold=2048, prefix=tmp_path)
    assert "{{" not in text and "listen 127.0.0.1:4321;" in text
    assert "server 127.0.0.1:1;" in text and "server 127.0.0.1:2;" in text
    assert f'"~^({above_regex(2048)})$" kvgate_long;' in text
    with pytest.raises(ValueError, match=r"placeholder kvgate does not fill: \{\{upstream_x\}\}"):
        render_nginx("server {{upstream_x}};", listen=1, short="a", long="b", threshold=1, prefix=tmp_path)


def test_pool_cpus_keep_the_pools_apart_and_the_last_cpu_for_the_client():
    assert pool_cpus([0]) == (None, None)
    assert pool_cpus([0, 1]) == ({0}, {1})
    assert pool_cpus([0, 1, 2]) == ({0}, {1})
    assert pool_cpus([0, 1, 2, 3, 4]) == ({0, 1}, {2, 3})


def test_landing_counts_read_served_and_rejected_requests():
    text = ('vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0\n'
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0\n'
            'http_requests_total{handler="/v1/completions",method="POST",status="4xx"} 1.0\n'
            'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 5.0\n'
            'http_requests_total{handler="/tokenize",method="POST",status="4xx"} 7.0\n')
    assert landing_counts(text) == {"served": 5.0, "rejected": 1.0}
    assert landing_counts(None) is None and landing_counts("process_cpu_seconds_total 1\n") is None
    assert landing_counts("not prometheus {{{") is None


def test_padded_bodies_have_exactly_the_bytes_asked():
    assert len(completion_body("m", "hello there", pad_to=300)) == 300
    assert completion_body("m", "x", pad_to=300).endswith(b" }")
    with pytest.raises(PoolsError, match="routing threshold"):
        completion_body("m", "x" * 400, pad_to=300)


def test_pool_endpoints_come_from_the_option_the_launch_or_the_profile():
    eps = pool_endpoints(PROFILE, POOLS, ["short=http://127.0.0.1:1/v1"], {"long": "http://127.0.0.1:2"})
    assert eps["short"].base_url == "http://127.0.0.1:1" and eps["long"].base_url == "http://127.0.0.1:2"
    with pytest.raises(PoolsError, match=r"pool 'long' has no endpoint: give --pool-endpoint=long=URL"):
        pool_endpoints(PROFILE, POOLS, ["short=http://127.0.0.1:1/v1"])
    with pytest.raises(PoolsError, match="expected NAME=URL"):
        pool_endpoints(PROFILE, POOLS, ["middle=http://x"])


def test_a_pool_profile_that_does_not_load_is_the_pools_profiles_error(write_profile):
    bad = write_profile("p", "extends: " + str(DATA / "fake-pool-long.yaml") + "\n"
                        "pools:\n  short: {profile: nowhere}\n  long: {profile: fake-pool-long}\n"
                        "  routing: {by: request_bytes, threshold: 100}\n")
    with pytest.raises(ProfileError, match=r"field 'pools.short.profile': unknown profile 'nowhere'"):
        load_profile(str(bad))


def test_the_launcher_says_why_it_cannot_launch_a_pools_profile():
    assert "not kvgate's embedded tiny model" in PoolsLauncher.unavailable(PROFILE)
    tokens = PROFILE.model_copy(update={"pools": PROFILE.pools.model_copy(
        update={"routing": PROFILE.pools.routing.model_copy(update={"by": "prompt_tokens"})})})
    assert "nginx routes by request size only" in PoolsLauncher.unavailable(tokens)
    assert PoolsLauncher.unavailable(load_profile("tiny-cpu")) == "profile 'tiny-cpu' has no pools: section to launch"


def test_a_request_that_moved_both_pools_makes_the_run_invalid():
    rule = PROFILE.pools.routing
    both = Routed("at threshold", "short", 16, THRESHOLD, 200, None, {"short": "served", "long": "served"})
    v = routing_verdict(RoutingObservation(rule, [], [both], [], {}))
    assert v.status is Status.INVALID and "1 moved both pools' counters at once" in v.message


def test_isolation_view_puts_the_short_pools_workload_beside_the_long_load():
    view = isolation_view(POOLS["short"], POOLS["long"])
    assert view.engine.max_model_len == 2048 and view.slo.workload == "chat"
    assert view.workloads["batch"].prompt_tokens == 1000 and view.slo.short_ttft_p95_ms == 300


# ------------------------------------------------------------------------------ isolation, pure
#: The pure verdicts at the defaults: 95% confidence, ratio at most 3x, short SLO 300 ms.
SPEC = PROFILE.pools.model_copy(update={"isolation": PROFILE.pools.isolation.model_copy(update={"ttft_ratio_max": 3})})
# the unit tests judge strictly (no floor: fake-pool-short.yaml declares one for the suite run on the fakes)
SHORT = POOLS["short"].model_copy(update={"slo": POOLS["short"].slo.model_copy(update={"confidence": 0.95,
                                                                              "pass_confidence_floor": None})})


def runs(alone_ms, mixed_ms, spw=4):
    """Hand-built (alone, mixed) observations from short TTFTs (ms): alone sequential; mixed in waves
    of 2 longs (first token at 0.9 s, ending 1 s after the wave) with ``spw`` shorts just after, so
    no short is head-of-line blocked."""
    a = [tagged(i, "short", i * 1.0, i * 1.0 + t / 1e3, i * 1.0 + 0.5) for i, t in enumerate(alone_ms)]
    m = []
    for w in range(-(-len(mixed_ms) // spw)):
        t0 = w * 2.0
        m += [tagged(len(m), "long", t0, t0 + 0.9, t0 + 1.0) for _ in range(2)]
        m += [tagged(len(m), "short", t0 + 0.01, t0 + 0.01 + t / 1e3, t0 + 0.5) for t in mixed_ms[w * spw:(w + 1) * spw]]
    trace = MetricsTrace(samples=[])
    extra = {"long_per_wave": 2, "long_prompt_tokens": 1000, "waves": -(-len(mixed_ms) // spw)}
    return (LoadObservation("alone", LoadResult("closed", a, len(a), 10.0, 60.0), trace, 16, 8, 1),
            LoadObservation("mixed", LoadResult("open", m, len(m), 10.0, 60.0), trace, 16, 8, 6, extra=extra))


def spread(n, lo, hi):
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def test_isolation_passes_only_when_both_upper_bounds_are_within():
    alone, mixed = runs(spread(100, 20, 40), spread(100, 40, 90))  # SLO 300 ms, ratio <= 3x
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.PASS, v.message
    assert "short SLO: short TTFT p95 88 ms, 95% upper bound 89 ms (n=100) <= 300 ms -> PASS" in v.message
    assert ("TTFT p95 ratio 2.2x (allowed 3x); 97.5% bounds of each run: with the long load upper 90 ms (n=100) "
            "<= 3x alone lower 38 ms (n=100) = 114 ms -> PASS") in v.message
    ev = v.evidence["confidence"]
    assert ev["slo"]["decision"] == "PASS" and ev["ratio"]["alone"]["n"] == 100


def test_isolation_lock_step_waves_are_judged_at_their_effective_n_both_ways():
    """100 mixed shorts in 25 waves of 4 identical TTFTs (ICC 1): worth 25, not 100. Judged as 100
    independent ones the SLO would PASS at 95%; at the effective n no PASS is possible and the
    verdict names the 236 shorts that would decide; a profile declaring a 60% floor PASSes, stating
    the 72.3% the samples give. A broken SLO FAILs at the effective n all the same."""
    mixed_ms = [t for t in spread(25, 40, 90) for _ in range(4)]
    alone, mixed = runs(spread(100, 20, 40), mixed_ms)
    mixed.extra.update(short_waves=[4] * 25, shorts_per_wave=4)
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert ("100 short requests in 25 waves, ICC within waves (one-way ANOVA) 1.00: effective n 25.0; a PASS at 95% "
            "needs about 236 short requests at this dependence (effective n 59); these samples give 72.3%") in v.message
    assert v.evidence["dependence"]["slo"]["n_eff"] == 25
    floored = SHORT.model_copy(update={"slo": SHORT.slo.model_copy(update={"pass_confidence_floor": 0.6})})
    v = isolation_verdict(alone, mixed, SPEC, floored, 0.25)
    assert v.status is Status.PASS, v.message
    assert ("short TTFT p95 88 ms, 60% upper bound 90 ms (n=25) <= 300 ms -> PASS; 100 short requests in 25 waves"
            in v.message and "a PASS at the 60% the profile declares for too few independent samples (the short "
            "pool's slo.pass_confidence_floor): these samples give 72.3%, 95% would need about 236 short requests"
            in v.message), v.message
    alone, mixed = runs(spread(100, 20, 40), [t + 400 for t in mixed_ms])
    mixed.extra.update(short_waves=[4] * 25, shorts_per_wave=4)
    v = isolation_verdict(alone, mixed, SPEC, floored, 0.25)
    assert v.status is Status.FAIL and "short SLO 300 ms broken" in v.message and "(n=25; 100 over)" in v.message


def test_isolation_with_too_few_samples_is_inconclusive_with_both_bounds():
    alone, mixed = runs(spread(16, 20, 40), spread(16, 40, 90))  # 16 samples: no p95 upper bound exists
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "short SLO: short TTFT p95 88 ms, 95% bounds 83 ms..none (fewer than 59 samples: no PASS possible) " \
           "(n=16; 0 over) straddle 300 ms -> undecided" in v.message
    assert "with the long load 80 ms..none (n=16), 3x alone 108 ms..none (n=16) overlap -> undecided" in v.message
    assert v.message.endswith("undecided after 16 short requests (sampling bounded by the short pool's "
                              "slo.max_requests and slo.max_duration_s); no ratio FAIL was possible: the alone run's "
                              "97.5% upper bound on a p95 needs at least 72 requests, it had 16 (raise the short "
                              "pool's slo.max_requests) -> INCONCLUSIVE"), v.message


def test_isolation_fails_on_the_slo_lower_bound_and_on_the_ratio_bounds():
    alone, mixed = runs(spread(16, 20, 30), spread(16, 320, 400))
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.FAIL, v.message
    assert re.search(r"short TTFT p95 39\d ms, 95% lower bound 3\d\d ms \(n=16; 16 over\) > 300 ms -> FAIL", v.message)
    assert "short SLO 300 ms broken" in v.message
    # 16 alone samples have no p95 upper bound: the ratio cannot FAIL yet, though 13x; the SLO decides
    assert "TTFT p95 ratio 13.4x" in v.message and "3x alone 84 ms..none (n=16) overlap -> undecided" in v.message
    assert "the split does not isolate" not in v.message
    alone, mixed = runs(spread(100, 20, 30), spread(100, 150, 200))  # under the SLO, 6.7x the alone p95
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.FAIL, v.message
    assert "with the long load lower 195 ms (n=100) > 3x alone upper 30 ms (n=100) = 90 ms -> FAIL" in v.message
    assert "the split does not isolate: short requests 6.7x slower" in v.message


def test_the_isolation_plan_is_spaced_for_the_ratio_and_judged_at_the_slo_level():
    p = isolation_plan(16, load_profile("tiny-cpu"))  # 95%, cap 256: the ratio's per-run bounds at 99.375%
    assert p.looks == (16, 99, 198, 256) and p.per_look == pytest.approx(1 - 0.05 / 4) and p.max_s == 120.0
    p = isolation_plan(16, load_profile("tiny-cpu-pool-short"))  # its cap of 86: two looks
    assert p.looks == (16, 86) and p.per_look == pytest.approx(0.975)
    assert judge_ratio([10.0] * 86, [20.0] * 86, 3, p.per_look).decision == "PASS"  # 86 can PASS


def test_isolation_fail_side_at_the_false_alarm_budget_share():
    # verdicts.false_alarm_budget 0.01 -> the FAIL side at 1 - 0.01/9 = 99.89% (the ratio's per-run bounds at 99.94%)
    fc = 1 - 0.01 / 9
    near = runs(spread(200, 100, 120), spread(200, 200, 309))  # SLO 300 ms: p95 304 ms, 95% lower bound 301 ms
    assert isolation_verdict(*near, SPEC, SHORT, 0.25).status is Status.FAIL
    v = isolation_verdict(*near, SPEC, SHORT, 0.25, fail_confidence=fc)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "bounds (99.89% lower, 95% upper) 297 ms..307 ms (n=200; 17 over) straddle 300 ms" in v.message
    assert (v.evidence["confidence"]["per_look"], v.evidence["confidence"]["per_look_pass"]) == (fc, 0.95)
    ratio = runs(spread(200, 20, 30), spread(200, 60, 93))  # 3.1x against 3x: FAIL at 97.5% a run, not at 99.94%
    assert isolation_verdict(*ratio, SPEC, SHORT, 0.25).status is Status.FAIL
    v = isolation_verdict(*ratio, SPEC, SHORT, 0.25, fail_confidence=fc)
    assert v.status is Status.INCONCLUSIVE and v.evidence["confidence"]["ratio"]["fail_confidence"] == fc
    assert "bounds of each run at 99.94% (with the load lower, alone upper) and 97.5% (with the load upper" in v.message
    few = isolation_verdict(*runs(spread(100, 20, 30), spread(100, 60, 93)), SPEC, SHORT, 0.25, fail_confidence=fc)
    assert few.status is Status.INCONCLUSIVE and ("no ratio FAIL was possible: the alone run's 99.94% upper bound "
                                                  "on a p95 needs at least 147 requests, it had 100") in few.message, \
        few.message
    bad = isolation_verdict(*runs(spread(200, 20, 30), spread(200, 150, 200)), SPEC, SHORT, 0.25, fail_confidence=fc)
    assert bad.status is Status.FAIL and "99.94% bounds of each run: with the long load lower 195 ms (n=200) > 3x " \
        "alone upper 30 ms" in bad.message  # 6.7x still FAILs
    ok = runs(spread(100, 20, 40), spread(100, 40, 90))  # the PASS side keeps slo.confidence: the same verdict
    assert isolation_verdict(*ok, SPEC, SHORT, 0.25, fail_confidence=fc).message == \
        isolation_verdict(*ok, SPEC, SHORT, 0.25).message
    # the plan: the same looks, per_look the FAIL side's, per_look_pass the old per-look level
    p = isolation_plan(16, load_profile("tiny-cpu"), fail_confidence=fc)
    assert p.looks == (16, 99, 198, 256) and p.per_look == pytest.approx(1 - (1 - fc) / 4)
    assert p.pass_level == pytest.approx(1 - 0.05 / 4) and p.fail_confidence == fc
    assert isolation_plan(16, load_profile("tiny-cpu"), fail_confidence=0.95) == isolation_plan(16, load_profile("tiny-cpu"))
    assert isolation_decide(*near, SPEC, SHORT, 0.25, 0.95) == "FAIL"
    assert isolation_decide(*near, SPEC, SHORT, 0.25, fc, 0.95) == "UNDECIDED"
    alone, mixed = runs(spread(200, 20, 30), spread(200, 150, 200))
    mixed.extra["sampling"] = {**p.to_dict(), "history": [{"n": 200}] * 3, "why_stopped": "decided"}
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.FAIL and "[3 of 4 planned looks, each at 99.97% for a FAIL (the run's false-alarm " \
        "budget share), 98.75% for a PASS, stopped: decided]" in v.message, v.message


# ------------------------------------------------------------------------------ against fakes
@pytest.fixture
def pools():
    # a first token 20 ms in, 5 ms per token after: a long request outlasts a short one's TTFT, as on vLLM
    timing = dict(ttft_s=0.02, itl_s=0.005)
    with FakeVLLM(FakeConfig(max_model_len=256, **timing)) as short, \
            FakeVLLM(FakeConfig(max_model_len=2048, **timing)) as long:
        yield short, long


def targets(router_url: str, short: FakeVLLM, long: FakeVLLM) -> PoolTargets:
    return PoolTargets(Endpoint(router_url.removesuffix("/v1")),
                       pool_endpoints(PROFILE, POOLS, [f"short={short.url}", f"long={long.url}"]), POOLS)


def route(pools, fault):
    short, long = pools
    with FakeRouter(short.base_url, long.base_url, THRESHOLD, fault) as router:
        obs = run_routing(targets(router.url, short, long), PROFILE.pools.routing, PROFILE.pools.requests_per_case,
                          settle_s=0.3)  # the fake counts a request before answering it
    return obs, routing_verdict(obs)


def test_healthy_router_passes_and_every_landing_was_read_from_the_pools(pools):
    obs, v = route(pools, None)
    assert v.status is Status.PASS, v.message
    assert [(c.name, c.expect) for c in obs.cases] == [("short workload (chat)", "short"), ("at threshold", "short"),
                                                       ("above threshold", "long"), ("long workload (batch)", "long")]
    assert [c.size for c in obs.cases][1:3] == [THRESHOLD, THRESHOLD + 1]
    assert v.message.startswith("8 requests through the router (rule: at most 1,024 bytes -> short pool, more -> "
                                "long pool; read from each pool's request_success_total): 4/4 short on the short "
                                "pool, 4/4 long on the long pool, all answered 200 (1,024 bytes -> short, "
                                "1,025 bytes -> long) -> PASS")
    assert all(r.where == r.expect for r in obs.routed) and v.measured == 0
    short, long = pools
    assert len([r for r in short.state.requests if r.endpoint == "completions"]) == 4


def test_router_sending_everything_to_one_pool_fails_with_the_counts(pools):
    _, v = route(pools, "all_short")
    assert v.status is Status.FAIL
    assert "4 of 4 long requests reached the short pool (above threshold x2, long workload (batch) x2); 2 of them " \
           "rejected there (400: " in v.message
    assert "(4/4 short on the short pool, 0/4 long on the long pool)" in v.message and v.measured == 4
    _, v = route(pools, "all_long")
    assert v.status is Status.FAIL
    assert "4 of 4 short requests reached the long pool (short workload (chat) x2, at threshold x2)" in v.message
    assert "long requests reached the short pool" not in v.message


def test_threshold_on_the_wrong_side_fails_both_ways(pools):
    _, v = route(pools, "inverted")
    assert v.status is Status.FAIL and v.measured == 8
    assert "4 of 4 short requests reached the long pool" in v.message
    assert "4 of 4 long requests reached the short pool" in v.message and "rejected there (400" in v.message


def test_router_dropping_long_requests_fails_naming_what_reached_no_pool(pools):
    _, v = route(pools, "drop_long")
    assert v.status is Status.FAIL
    assert "4 request(s) reached neither pool (above threshold x2, long workload (batch) x2; the router answered " \
           "502" in v.message


def test_pool_without_metrics_makes_the_routing_run_invalid(pools):
    pools[1].config.faults.add("no_metrics")
    _, v = route(pools, None)
    assert v.status is Status.INVALID and "pool(s) long serve no vllm:request_success_total" in v.message


def test_a_rule_that_sends_a_pools_own_workload_elsewhere_fails(pools):
    short, long = pools
    rule = PROFILE.pools.routing.model_copy(update={"threshold": 100_000})  # above the 1000-token batch body
    with FakeRouter(short.base_url, long.base_url, 100_000) as router:
        v = routing_verdict(run_routing(targets(router.url, short, long), rule, 1))
    assert v.status is Status.FAIL
    assert re.search(r"the rule itself sends the long pool's own workload \(\d,\d{3} bytes\) to the short pool", v.message)
    assert "1 request(s) reached the right pool but were answered [400] (long workload (batch) x1)" in v.message


def isolation(short: FakeVLLM, long: FakeVLLM, fault: str | None, profile=POOLS["short"], spw: int = 8):
    pools = {**POOLS, "short": profile}
    lag = profile.limits.schedule_lag_max_s
    with FakeRouter(short.base_url, long.base_url, THRESHOLD, fault) as router:
        t = PoolTargets(Endpoint(router.url.removesuffix("/v1")),
                        pool_endpoints(PROFILE, pools, [f"short={short.url}", f"long={long.url}"]), pools)
        alone, mixed = run_isolation(t, 2, spw, plan=isolation_plan(2 * spw, profile),
                                     decide=lambda a, m, c: isolation_decide(a, m, PROFILE.pools, profile, lag, c))
    return isolation_verdict(alone, mixed, PROFILE.pools, profile, lag), alone, mixed


#: Short pool: TTFT 40 ms (well above the in-process fakes' scheduling noise, which would move the
#: ratio); long pool: a 1,000-token prefill takes 0.1 s and 8 tokens 160 ms more, so the shorts'
#: first tokens come long before any long completes (no head-of-line coincidence); a wave ~0.3 s.
SHORT_POOL = dict(max_model_len=2048, prefill_s_per_token=0.0001, ttft_s=0.04, itl_s=0.001)
LONG_POOL = dict(SHORT_POOL, itl_s=0.02)


def test_isolation_samples_more_waves_until_the_bounds_pass(monkeypatch):
    import kvgate.load.scenarios as scenarios
    import kvgate.pools.routing as routing

    built: list[list[str]] = []  # the prompts of every batch of requests built, first look and later

    def spy(real):
        def specs(*a, **kw):
            out = real(*a, **kw)
            built.append([s.body["prompt"] for s in out])
            return out
        return specs
    monkeypatch.setattr(scenarios, "_specs", spy(scenarios._specs))
    monkeypatch.setattr(scenarios, "_specs_of", spy(scenarios._specs_of))  # the interference run's long prompts
    monkeypatch.setattr(routing, "_specs", spy(routing._specs))
    base = POOLS["short"]
    floored = base.model_copy(update={"slo": base.slo.model_copy(update={"pass_confidence_floor": 0.6})})
    with FakeVLLM(FakeConfig(**SHORT_POOL)) as short, FakeVLLM(FakeConfig(**LONG_POOL, faults={"hol_blocking"})) as long:
        # waves of 2 shorts: at any ICC the 64 are worth 32 or more, enough for a PASS at the 60% floor
        v, alone, mixed = isolation(short, long, None, profile=floored, spw=2)
    assert v.status is Status.PASS, v.message
    # the mixed shorts are judged at the effective n of their 32 waves (the ICC within waves measured and
    # stated); at 90% when they are worth enough, else at the declared 60% floor, said so
    assert re.search(r"short-request TTFT p95 through the router \d+ ms alone, \d+ ms while the long pool serves 2 "
                    r"long 1,000-token requests at a time \(32 waves\); short SLO: short TTFT p95 \d+ ms, (90|60)% upper "
                    r"bound \d+ ms \(n=\d+\) <= 300 ms -> PASS; 64 short requests in 32 waves, ICC within waves "
                    r"\(one-way ANOVA\) -?[\d.]+: effective n [\d.]+", v.message), v.message
    assert ("90% upper" in v.message) != ("a PASS at the 60% the profile declares" in v.message), v.message
    dep = v.evidence["dependence"]["slo"]
    assert dep["unit"] == "short request" and dep["clusters"] == 32 and dep["n_eff"] >= 32
    assert "TTFT p95 ratio" in v.message and "95% bounds of each run: with the long load upper" in v.message
    assert re.search(r"\[2 of 2 planned looks, each at 90%, stopped: (decided|cap)\]", v.message)
    s = v.evidence["confidence"]["sampling"]
    assert [h["n"] for h in s["history"]] == [4, 64] and s["history"][0]["decisions"] == {"isolation": "UNDECIDED"}
    shorts = [r for r in alone.result.records if r.tag == "short"]
    assert len(shorts) == 64 and len([r for r in mixed.result.records if r.tag == "long"]) == 64
    # the extra looks' waves follow the first look's on one time base, in send order
    sent = [r.sent_s for r in mixed.result.records]
    assert sent == sorted(sent) and [r.index for r in mixed.result.records] == list(range(len(sent)))
    # fresh prompts per look: no prompt of a later look repeats one of an earlier look (the prefix
    # cache would serve it), and within a look each request has its own
    prompts = [p for batch in built for p in batch]
    # first look: longs and shorts a batch a wave (2 + 2), the alone shorts their own (1); the next look: 2
    assert len(built) == 7 and len(prompts) == 4 + 4 + 4 + 60 + 60 and len(set(prompts)) == len(prompts)


def test_isolation_fails_when_long_requests_share_the_short_pool():
    cfg = dict(LONG_POOL, prefill_s_per_token=0.0004, faults={"hol_blocking"})
    with FakeVLLM(FakeConfig(**cfg)) as short, FakeVLLM(FakeConfig(**cfg)) as long:
        v, _, mixed = isolation(short, long, "all_short")
    assert v.status is Status.FAIL, v.message
    # judged at the effective n of the waves (the shorts at random offsets across the prefill window:
    # some land after it and are not held up, so fewer are head-of-line blocked than with four shorts
    # 5-42 ms after the longs, and a look may not decide at 16)
    assert "short SLO 300 ms broken" in v.message and re.search(r"90% lower bound [\d,]+ ms \(n=\d+; \d+ over\) > 300 ms "
                                                                r"-> FAIL; \d+ short requests in \d+ waves, ICC within "
                                                                r"waves", v.message), v.message
    assert "TTFT p95 ratio" in v.message and len(mixed.extra["sampling"]["history"]) <= 2


# ------------------------------------------------------------------------------ nginx, for real
def nginx_router(tmp_path: Path, pools, threshold: int = THRESHOLD) -> NginxRouter:
    router = NginxRouter(REPO / "ci" / "nginx-pools.conf", tmp_path / "nginx")
    router.start(pools[0].base_url, pools[1].base_url, threshold)
    return router


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install -y nginx; .ci/run installs it)")
def test_nginx_from_the_shipped_config_routes_by_size_and_passes(tmp_path, pools):
    router = nginx_router(tmp_path, pools)
    try:
        v = routing_verdict(run_routing(targets(router.base_url + "/v1", *pools), PROFILE.pools.routing, 2))
    finally:
        router.stop()
    assert v.status is Status.PASS, v.message
    assert router.proc.poll() is not None  # stopped
    log = (tmp_path / "nginx" / "access.log").read_text()
    assert "pool=kvgate_long" in log and "pool=kvgate_short" in log


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install -y nginx; .ci/run installs it)")
def test_nginx_with_its_threshold_off_from_the_profile_fails(tmp_path, pools):
    router = nginx_router(tmp_path, pools, threshold=THRESHOLD * 8)  # nginx keeps 8 KiB bodies on the short pool
    try:
        v = routing_verdict(run_routing(targets(router.base_url + "/v1", *pools), PROFILE.pools.routing, 1))
    finally:
        router.kill()
    assert v.status is Status.FAIL
    assert "2 of 2 long requests reached the short pool (above threshold x1, long workload (batch) x1); 1 of them " \
           "rejected there (400" in v.message


# ------------------------------------------------------------------------------ the suite, wired
def run_pools_suite(pytester, router_url, short, long):
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--profile={DATA / 'fake-pools.yaml'}", f"--endpoint={router_url}", f"--kvgate-reports={reports}",
        f"--pool-endpoint=short={short.url}", f"--pool-endpoint=long={long.url}",
        str(REPO / "suites" / "test_pools.py"), str(REPO / "suites" / "test_deployment.py"))
    summary = read_summary(reports)
    return result, summary, {g["id"]: g for g in summary["gates"]}


def test_pools_suite_through_a_healthy_router_passes_and_runs_only_the_pools_gates(pytester, pools):
    short, long = pools
    with FakeRouter(short.base_url, long.base_url, THRESHOLD) as router:
        result, summary, gates = run_pools_suite(pytester, router.url, short, long)
    assert sorted(gates) == ["fake-pools/pools/isolation", "fake-pools/pools/routing"], gates
    assert summary["overall"] == "PASS", [g["message"] for g in gates.values()]
    assert "pools profile: the pools gates only" in result.stdout.str()
    result.assert_outcomes(passed=2, deselected=6)  # test_deployment.py's six cases (memory-peak the sixth)
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_pools_suite_through_an_inverted_router_fails_routing(pytester, pools):
    short, long = pools
    with FakeRouter(short.base_url, long.base_url, THRESHOLD, "inverted") as router:
        result, summary, gates = run_pools_suite(pytester, router.url, short, long)
    routing = gates["fake-pools/pools/routing"]
    assert routing["status"] == "FAIL" and "4 of 4 short requests reached the long pool" in routing["message"]
    assert summary["overall"] == "FAIL"


def test_isolation_ratio_takes_the_mixed_shorts_at_the_effective_n_of_their_waves():
    """The ratio's mixed side (pools.judge_ratio): 100 mixed shorts in 25 waves of 4 identical TTFTs
    (ICC 1) are worth 25 -- judged as 100 independent ones the ratio PASSed (upper 90 ms <= 3 x 38 ms);
    at the effective n no upper bound exists at 97.5% (undecided, n=25 stated); at the last look a
    declared 60% floor PASSes it, stated; a ratio clearly over FAILs at the effective n all the same.
    The evidence states the unit, ICC and effective n."""
    from kvgate.gates.pools import judge_ratio
    alone_ms = spread(100, 20, 40)
    mixed_ms = [t for t in spread(25, 40, 90) for _ in range(4)]
    assert judge_ratio(alone_ms, mixed_ms, 3.0, 0.95).decision == "PASS"  # as independent: the old rule
    dep = judge_ratio(alone_ms, mixed_ms, 3.0, 0.95, mixed_n_eff=25.0)
    assert dep.decision == "UNDECIDED" and dep.mixed.n == 25 and dep.mixed.upper is None, dep.to_dict()
    floored = judge_ratio(alone_ms, mixed_ms, 3.0, 0.95, mixed_n_eff=25.0, floor=0.6, at_end=True)
    assert floored.decision == "PASS" and floored.floor == 0.6
    assert "upper at the 60% the profile declares" in floored.text() and "(n=25 effective)" in floored.text()
    over = judge_ratio(alone_ms, [3.0 * t for t in mixed_ms], 1.5, 0.95, mixed_n_eff=25.0, floor=0.6, at_end=True)
    assert over.decision == "FAIL" and over.floor is None, over.to_dict()
    alone, mixed = runs(alone_ms, mixed_ms)
    mixed.extra.update(short_waves=[4] * 25, shorts_per_wave=4)
    v = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert v.status is Status.INCONCLUSIVE, v.message
    rd = v.evidence["dependence"]["ratio"]
    assert rd["unit"] == "short request" and rd["cluster"] == "wave" and rd["n_eff"] == pytest.approx(25.0), rd
    assert v.evidence["confidence"]["ratio"]["mixed"]["n"] == 25


def test_isolation_identical_waves_at_icc_1_take_the_floor_as_the_ratios_level_both_ways():
    """Lock-step waves of 4 identical TTFTs (ICC 1.0 exactly: no within-wave variance) are measured as
    ICC 1 and worth one value per wave. Strict (no floor): no PASS (INCONCLUSIVE). With the short pool's
    60% floor the PASS is the *ratio's* 60%: the mixed side at 62.5% (60% + alone's 2.5%), not at 60%
    (which left the ratio at 57.5%: the pools/isolation row's wrong PASS of 9.7% at ICC 1.0 were all
    such floor PASSes), the confidence the samples give stated. A ratio over its limit FAILs all the same."""
    from kvgate.gates.pools import judge_ratio
    from kvgate.stats.dependence import wave_dependence
    alone_ms = spread(100, 20, 40)
    mixed_ms = [t for t in spread(25, 40, 90) for _ in range(4)]
    dep = wave_dependence([mixed_ms[i:i + 4] for i in range(0, 100, 4)])
    assert dep.value == 1.0 and dep.n_eff == pytest.approx(25.0)
    floored = judge_ratio(alone_ms, mixed_ms, 3.0, 0.95, mixed_n_eff=dep.n_eff, floor=0.6, at_end=True)
    assert floored.decision == "PASS" and floored.mixed.upper_level == pytest.approx(0.625), floored.to_dict()
    assert floored.achieved is not None and 0.6 <= floored.achieved < 0.95 and floored.stated == 0.95
    assert "mixed side at 62.5%, alone at 97.5%" in floored.text(), floored.text()
    alone, mixed = runs(alone_ms, mixed_ms)
    mixed.extra.update(short_waves=[4] * 25, shorts_per_wave=4)
    strict = isolation_verdict(alone, mixed, SPEC, SHORT, 0.25)
    assert strict.status is Status.INCONCLUSIVE, strict.message
    fl = SHORT.model_copy(update={"slo": SHORT.slo.model_copy(update={"pass_confidence_floor": 0.6})})
    v = isolation_verdict(alone, mixed, SPEC, fl, 0.25)
    assert v.status is Status.PASS and v.message.startswith("PASS at "), v.message
    pc = v.evidence["pass_confidence"]
    assert pc["floor"] == 0.6 and pc["achieved"] >= 0.6, pc
    assert v.evidence["confidence"]["ratio"]["pass_confidence_achieved"] == pytest.approx(floored.achieved)
    alone, mixed = runs(alone_ms, [4.0 * t for t in mixed_ms])  # ratio ~8x against 3x
    mixed.extra.update(short_waves=[4] * 25, shorts_per_wave=4)
    for prof in (SHORT, fl):
        bad = isolation_verdict(alone, mixed, SPEC.model_copy(update={"isolation": SPEC.isolation.model_copy(
            update={"ttft_ratio_max": 3})}), prof.model_copy(update={"slo": prof.slo.model_copy(
                update={"short_ttft_p95_ms": 10_000})}), 0.25)
        assert bad.status is Status.FAIL and "the split does not isolate" in bad.message, bad.message
