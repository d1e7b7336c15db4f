"""Pure verdicts of the pools gates: does the router send each request to the pool its rule
names (``pools/routing``), and does the split keep short requests fast while the long pool is
loaded (``pools/isolation``)? Inputs: :class:`~kvgate.pools.routing.RoutingObservation` and the
``(alone, mixed)`` :class:`~kvgate.load.scenarios.LoadObservation` pair; no I/O.

Splitting short chat and long-context batch into separate pools is the common cure for the
interference the latency gate measures; it fails silently when the router sends everything to one
pool, has its threshold on the wrong side, or drops what it cannot place -- the answers may even
be 200. Where a request landed is therefore read from each pool's own counters, never assumed.
"""

from __future__ import annotations

from typing import Any

from kvgate.pools.routing import RoutingObservation
from kvgate.profile.models import PoolsSpec, Profile
from kvgate.load.scenarios import LoadObservation
from kvgate.stats import summarize
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS
from kvgate.gates.load import HOL_MIN_JUDGED, HOL_SHARE, contended, head_of_line, host_evidence

ROUTING = "pools/routing"
ISOLATION = "pools/isolation"


def _unit(obs: RoutingObservation) -> str:
    return "tokens" if obs.rule.by == "prompt_tokens" else "bytes"


def routing_verdict(obs: RoutingObservation) -> Verdict:
    """FAIL when any request landed on the other pool than the rule names (counted both ways:
    short requests on the long pool, long requests on the short pool -- a long request the short
    pool rejected 400 included), reached no pool (the router dropped it or answered itself), or
    was not answered 200 by the right pool; also when the rule itself sends a pool's own workload
    to the other pool. INVALID when a pool serves no usable ``/metrics`` (nothing can be
    attributed) or a request moved both pools' counters (other traffic on the pools).
    ``measured``: misrouted requests, ``limit``: 0."""
    unit, thr = _unit(obs), obs.rule.threshold
    rule = f"rule: at most {thr:,} {unit} -> short pool, more -> long pool"
    rows = obs.rows()
    ev: dict[str, Any] = {"rule": obs.rule.model_dump(), "requests": rows, "workload_sizes": obs.workload_sizes,
                          "cases": [{"name": c.name, "expect": c.expect, "prompt_tokens": c.prompt_tokens,
                                     "size": c.size} for c in obs.cases]}
    n = len(obs.routed)
    if obs.no_metrics:
        return Verdict(ROUTING, Status.INVALID, f"pool(s) {', '.join(obs.no_metrics)} serve no "
                       "vllm:request_success_total on /metrics, so where a request lands cannot be read; no request "
                       f"sent ({rule}) -> INVALID (point --pool-endpoint at each pool's own server)",
                       limit=0, unit="requests", evidence=ev)
    ambiguous = [r for r in obs.routed if len(r.landed) > 1]
    if ambiguous:
        return Verdict(ROUTING, Status.INVALID, f"{n} requests through the router ({rule}); {len(ambiguous)} moved "
                       "both pools' counters at once -- other traffic reaches the pools, so landings cannot be told "
                       "apart -> INVALID (gate the pools before they take traffic)", limit=0, unit="requests",
                       evidence=ev)
    shorts = [r for r in obs.routed if r.expect == "short"]
    longs = [r for r in obs.routed if r.expect == "long"]
    s_on_long = [r for r in shorts if r.where == "long"]
    l_on_short = [r for r in longs if r.where == "short"]
    l_rejected = [r for r in l_on_short if r.landed.get("short") == "rejected"]
    lost = [r for r in obs.routed if r.where == "none"]
    bad_answer = [r for r in obs.routed if r.where == r.expect and r.status != 200]
    misrouted = len(s_on_long) + len(l_on_short) + len(lost)
    problems = []
    for pool, other in (("short", "long"), ("long", "short")):
        size = obs.workload_sizes.get(pool)
        if size is not None and (size <= thr) != (pool == "short"):
            problems.append(f"the rule itself sends the {pool} pool's own workload ({size:,} {unit}) to the {other} "
                            "pool (threshold on the wrong side of it)")
    if s_on_long:
        problems.append(f"{len(s_on_long)} of {len(shorts)} short requests reached the long pool "
                        f"({_cases(s_on_long)})")
    if l_on_short:
        rej = f"; {len(l_rejected)} of them rejected there ({l_rejected[0].status}: " \
              f"{(l_rejected[0].error or '')[:100]})" if l_rejected else ""
        problems.append(f"{len(l_on_short)} of {len(longs)} long requests reached the short pool "
                        f"({_cases(l_on_short)}){rej}")
    if lost:
        first = lost[0]
        problems.append(f"{len(lost)} request(s) reached neither pool ({_cases(lost)}; the router answered "
                        f"{first.status or 'nothing'}: {(first.error or '')[:100]})")
    if bad_answer:
        problems.append(f"{len(bad_answer)} request(s) reached the right pool but were answered "
                        f"{sorted({r.status for r in bad_answer})} ({_cases(bad_answer)})")
    where = (f"{len(shorts) - len(s_on_long)}/{len(shorts)} short on the short pool, "
             f"{len(longs) - len(l_on_short)}/{len(longs)} long on the long pool")
    what = f"{n} requests through the router ({rule}; read from each pool's request_success_total)"
    if problems:
        return Verdict(ROUTING, FAIL, f"{what}: " + "; ".join(problems) + f" -> FAIL ({where})", measured=misrouted,
                       limit=0, unit="requests", evidence=ev)
    at = [c for c in obs.cases if c.name in ("at threshold", "above threshold")]
    edge = ", ".join(f"{c.size:,} {unit} -> {c.expect}" for c in at)
    return Verdict(ROUTING, PASS, f"{what}: {where}, all answered 200 ({edge}) -> PASS", measured=0, limit=0,
                   unit="requests", evidence=ev)


def _cases(rows: list[Any]) -> str:
    names: dict[str, int] = {}
    for r in rows:
        names[r.case] = names.get(r.case, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in names.items())


def short_slo_ms(short: Profile) -> float | None:
    """The short pool's TTFT target under load: ``slo.short_ttft_p95_ms``, else ``slo.ttft_p95_ms`` (ms)."""
    return short.slo.short_ttft_p95_ms or short.slo.ttft_p95_ms


def isolation_verdict(alone: LoadObservation, mixed: LoadObservation, spec: PoolsSpec, short: Profile,
                      schedule_lag_max_s: float) -> Verdict:
    """Short requests' TTFT p95 through the router while the long pool serves its declared long
    load: FAIL when it breaks the short pool's SLO (:func:`short_slo_ms`), when it exceeds
    ``pools.isolation.ttft_ratio_max`` x the short-alone p95, when short or long requests failed,
    or when short requests consistently got their first token only after a long request queued
    ahead of them completed (:func:`kvgate.gates.load.head_of_line`: the router or a shared pool
    serialises them). INVALID when the client fell behind its schedule, or when either window ran on a
    contended host (:func:`kvgate.gates.load.contended`; the pools behind the router are not a
    process tree kvgate watches yet, so their evidence says "not measured"). ``measured``: the mixed
    p95 (ms); the ratio is in the message and the evidence."""
    for obs in (alone, mixed):
        if (busy := contended(obs, ISOLATION, short)) is not None:  # a contended host: not judged
            return busy
        v = obs.result.invalid_verdict(ISOLATION, schedule_lag_max_s)
        if v is not None:
            return Verdict(ISOLATION, Status.INVALID, v.message + f" ({obs.name})", measured=v.measured,
                           limit=v.limit, unit=v.unit, evidence=v.evidence)
    a = summarize([r for r in alone.result.records if r.tag == "short"])
    m = summarize([r for r in mixed.result.records if r.tag == "short"])
    lm = summarize([r for r in mixed.result.records if r.tag == "long"])
    pa, pm = a["ttft_ms"]["p95"], m["ttft_ms"]["p95"]
    ratio = pm / pa if pa and pm else None
    slo, ratio_max = short_slo_ms(short), spec.isolation.ttft_ratio_max
    ex = mixed.extra or {}
    hol = head_of_line(mixed.result.records)
    ev: dict[str, Any] = {"short_alone": a, "short_mixed": m, "long_mixed": lm, "mixed_plan": ex,
                          "short_ttft_p95_ms": {"alone": pa, "mixed": pm, "ratio": ratio}, "head_of_line": hol,
                          "ttft_ratio_max": ratio_max, "short_slo_ms": slo,
                          "host_contention": host_evidence(alone, mixed)}
    load = (f"{ex.get('long_per_wave')} long {ex.get('long_prompt_tokens', 0):,}-token requests at a time "
            f"({ex.get('waves')} waves)")
    if pa and pm:
        what = (f"short-request TTFT p95 through the router {pa:,.0f} ms alone, {pm:,.0f} ms while the long pool "
                f"serves {load} ({ratio:.1f}x; allowed {ratio_max:g}x)")
    else:
        what = f"short-request TTFT p95 through the router alone {pa}, with the long load {pm}"
    problems = []
    if a["errors"] or m["errors"]:
        problems.append(f"short requests failed: {a['errors']} alone, {m['errors']} with the long load "
                        f"({(m['error_samples'] or a['error_samples'])[:2]})")
    if lm["errors"]:
        problems.append(f"{lm['errors']} of {lm['requests']} long requests failed, so the long load did not run "
                        f"({lm['error_samples'][:2]})")
    if slo is not None and (pm is None or pm > slo):
        problems.append(f"short SLO {slo:,.0f} ms broken")
    if ratio is not None and ratio > ratio_max:
        problems.append(f"the split does not isolate: short requests {ratio:.1f}x slower with the long pool busy "
                        f"(allowed {ratio_max:g}x) -- the pools share compute, or the router sends long requests "
                        "to the short pool")
    if hol["judged"] >= HOL_MIN_JUDGED and hol["share"] >= HOL_SHARE:
        problems.append(f"head-of-line blocking: {hol['blocked']} of {hol['judged']} short requests got their first "
                        "token only after a long request sent ahead of them completed")
    slo_s = f"short SLO {slo:,.0f} ms" if slo is not None else "no short SLO declared"
    if problems:
        return Verdict(ISOLATION, FAIL, f"{what}; {slo_s}; " + "; ".join(problems) + " -> FAIL", measured=pm,
                       limit=slo, unit="ms", evidence=ev)
    return Verdict(ISOLATION, PASS, f"{what}; {slo_s}; {hol['blocked']} of {hol['judged']} short requests "
                   "head-of-line blocked -> PASS", measured=pm, limit=slo, unit="ms", evidence=ev)


__all__ = ["ISOLATION", "ROUTING", "isolation_verdict", "routing_verdict", "short_slo_ms"]
