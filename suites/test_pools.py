"""Gates: pools. Short and long requests sent through the router land on the pool the routing rule
names (read from each pool's own /metrics); short requests keep their TTFT through the router while
the long pool serves its declared long load (the p95 judged with confidence: more waves until its
bounds decide, up to the short pool's slo.max_requests / slo.max_duration_s)."""

import pytest

from kvgate.gates.pools import (ISOLATION, ROUTING, isolation_decide, isolation_plan, isolation_verdict, routing_verdict,
                                short_slo_ms)
from kvgate.report.plots import interference_png
from kvgate.pools.routing import run_isolation, run_routing
from kvgate.report.record import records_csv
from kvgate.verdict import Status, Verdict

NO_POOLS = "profile declares no pools section (short/long pools behind a router) -> SKIP"


def no_pools(config, profile, case):
    """The SKIP verdict when the profile declares no pools (the gate's ``not_applicable``)."""
    return Verdict(f"pools/{case}", Status.SKIP, NO_POOLS) if profile.pools is None else None


@pytest.mark.pools
@pytest.mark.gate("pools", cases=["routing"], not_applicable=no_pools)
def test_each_request_lands_on_the_pool_the_rule_names(case, kvgate_profile, kvgate_pools, kvgate_gate):
    if kvgate_pools is None:
        assert kvgate_gate(Verdict(ROUTING, Status.SKIP, NO_POOLS)).passed
        return
    spec = kvgate_profile.pools
    obs = run_routing(kvgate_pools, spec.routing, spec.requests_per_case)
    assert kvgate_gate(routing_verdict(obs), attachments={"routing.csv": records_csv(obs.rows())}).passed


@pytest.mark.pools
@pytest.mark.load
@pytest.mark.gate("pools", cases=["isolation"], not_applicable=no_pools)
def test_short_requests_keep_their_ttft_while_the_long_pool_is_loaded(case, kvgate_profile, kvgate_pools,
                                                                       kvgate_gate):
    if kvgate_pools is None:
        assert kvgate_gate(Verdict(ISOLATION, Status.SKIP, NO_POOLS)).passed
        return
    spec, short = kvgate_profile.pools, kvgate_pools.profiles["short"]
    iso, lag = spec.isolation, short.limits.schedule_lag_max_s
    # the FAIL side at the run's false-alarm budget share (the run's profile: verdicts.false_alarm_budget)
    fc = kvgate_profile.verdicts.fail_confidence(short.slo.confidence)
    plan = isolation_plan(iso.waves * iso.shorts_per_wave, short, fail_confidence=fc)
    alone, mixed = run_isolation(kvgate_pools, iso.waves, iso.shorts_per_wave, plan=plan,
                                 decide=lambda a, m, c: isolation_decide(a, m, spec, short, lag, c, plan.pass_level))
    verdict = isolation_verdict(alone, mixed, spec, short, lag, fail_confidence=fc)
    # the short SLO, not verdict.limit: an INVALID verdict's limit is text
    picture = interference_png(alone.result.records, mixed.result.records, short_slo_ms(short),
                               f"{kvgate_profile.name}: short-request TTFT through the router, alone vs long pool busy")
    assert kvgate_gate(verdict, attachments={"isolation.png": picture,
                                             "short alone.csv": records_csv(alone.result.rows()),
                                             "with long load.csv": records_csv(mixed.result.rows())}).passed
