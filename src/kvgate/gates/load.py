"""Pure verdicts of the load gates: concurrent long sequences, latency SLO, mixed-workload
interference. Inputs are :class:`~kvgate.load.scenarios.LoadObservation`; no I/O here.

Every verdict first asks whether the client kept up (:meth:`kvgate.load.LoadResult.invalid_verdict`
with the profile's ``limits.schedule_lag_max_s``): a run whose client fell behind is INVALID, not
PASS or FAIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvgate.profile.models import Profile
from kvgate.load.scenarios import LoadObservation, ScenarioError, long_workload, short_workload
from kvgate.stats import summarize
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.health import canary_verdict


def _invalid(obs: LoadObservation, gate: str, bound_s: float) -> Verdict | None:
    v = obs.result.invalid_verdict(gate, bound_s)
    if v is None:
        return None
    return Verdict(gate, Status.INVALID, v.message + f" ({obs.name}; the server was not judged: run kvgate on CPUs "
                   "the server does not use, e.g. taskset the server off one core)",
                   measured=v.measured, limit=v.limit, unit=v.unit, limit_unit=v.limit_unit, evidence=v.evidence)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def concurrent_long_verdict(obs: LoadObservation, profile: Profile) -> Verdict:
    """All declared long sequences complete 200 with the requested tokens, no 5xx; preemptions
    (``vllm:num_preemptions`` delta) within ``limits.preemptions_allowed``; a canary succeeds after.
    Peak KV usage and running/waiting recorded. Without ``/metrics`` preemptions are not
    observable: noted in the message, judged on client-side evidence only."""
    gate = "concurrency/long-sequences"
    inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s)
    if inv:
        return inv
    recs = obs.result.records
    n = obs.concurrency
    ok = [r for r in recs if r.ok]
    five = [r for r in recs if r.status >= 500]
    bad_tokens = [r.tokens for r in ok if r.tokens != obs.output_tokens]
    trace = obs.trace
    pre = trace.delta("preemptions")
    kv = trace.peak("kv_usage")
    running, waiting = trace.peak("running"), trace.peak("waiting")
    can = canary_verdict(obs.canary, profile.limits.canary_deadline_s, after=obs.name) if obs.canary else None
    allowed = profile.limits.preemptions_allowed
    problems = []
    if len(recs) < n:
        problems.append(f"only {len(recs)} of {n} requests were sent before the deadline")
    if len(ok) < len(recs):
        errs = sorted({(r.status, (r.error or "")[:80]) for r in recs if not r.ok})
        problems.append(f"{len(recs) - len(ok)} of {len(recs)} failed ({len(five)} 5xx): {errs[:3]}")
    if bad_tokens:
        problems.append(f"{len(bad_tokens)} completed with {sorted(set(bad_tokens))} tokens instead of {obs.output_tokens}")
    if pre is not None and pre > allowed:
        problems.append(f"{pre:g} preemptions (allowed {allowed}): the KV pool could not hold {n} sequences")
    if can is not None and can.status is FAIL:
        problems.append(can.message.removesuffix(" -> FAIL"))
    what = f"{n} concurrent {obs.prompt_tokens:,}+{obs.output_tokens}-token sequences"
    seen = (f"preemptions {'n/a (no /metrics)' if pre is None else f'{pre:g}'} (allowed {allowed}), "
            f"peak KV usage {_pct(kv)}, peak running {running if running is None else f'{running:g}'}, "
            f"peak waiting {waiting if waiting is None else f'{waiting:g}'}")
    ev = {"scenario": obs.name, "trace": trace.to_dict(), "records": obs.result.rows(),
          "canary": can.to_dict() if can else None, "wall_s": obs.result.wall_s, "transport": obs.result.transport}
    ev["peaks"] = {"kv_usage_ratio": kv, "running": running, "waiting": waiting}
    done_ok = len(ok) == n and not bad_tokens
    parts = [Verdict(f"{gate}.completed", PASS if done_ok else FAIL,
                     f"{len(ok)}/{n} completed 200 with {obs.output_tokens} tokens -> {'PASS' if done_ok else 'FAIL'}",
                     measured=len([r for r in ok if r.tokens == obs.output_tokens]), limit=n, unit="requests")]
    if pre is None:
        parts.append(Verdict(f"{gate}.preemptions", SKIP, "no /metrics; preemptions not observable",
                             limit=allowed, unit="preemptions"))
    else:
        parts.append(Verdict(f"{gate}.preemptions", PASS if pre <= allowed else FAIL,
                             f"{pre:g} preemptions (allowed {allowed}) -> {'PASS' if pre <= allowed else 'FAIL'}",
                             measured=pre, limit=allowed, unit="preemptions"))
    if can is not None:
        parts.append(can)
    if problems:
        return Verdict(gate, FAIL, f"{what}: " + "; ".join(problems) + f"; {seen} -> FAIL", measured=parts[0].measured,
                       limit=n, unit="requests", evidence=ev, parts=tuple(parts))
    return Verdict(gate, PASS, f"{what}: {len(ok)}/{n} completed 200 with {obs.output_tokens} tokens in "
                   f"{obs.result.wall_s:.2f} s; {seen} -> PASS", measured=parts[0].measured, limit=n, unit="requests",
                   evidence=ev, parts=tuple(parts))


SLO_FIELDS = (("ttft_ms", "ttft_p95_ms", "TTFT"), ("itl_ms", "itl_p95_ms", "ITL"), ("e2e_ms", "e2e_p95_ms", "e2e"))


def latency_verdict(obs: LoadObservation, profile: Profile) -> Verdict:
    """TTFT, ITL and e2e p95 (ms) at ``slo.concurrency`` within the profile's ``slo``; error rate
    within ``slo.error_rate_max``. p50/p95/p99 all recorded."""
    gate = "latency/slo"
    inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s)
    if inv:
        return inv
    s = summarize(obs.result.records)
    slo = profile.slo
    parts, problems = [], []
    for key, field_name, label in SLO_FIELDS:
        p95 = s[key]["p95"]
        limit = getattr(slo, field_name)
        shown = "n/a" if p95 is None else f"{p95:,.0f} ms"
        if limit is None:
            parts.append(f"{label} p95 {shown} (no SLO)")
            continue
        parts.append(f"{label} p95 {shown} (SLO {limit:,.0f})")
        if p95 is None or p95 > limit:
            problems.append(f"{label} p95 {shown} > SLO {limit:,.0f} ms")
    rate = s["error_rate"]
    parts.append(f"errors {s['errors']}/{s['requests']} (max rate {slo.error_rate_max:g})")
    if rate > slo.error_rate_max:
        problems.append(f"error rate {rate:.1%} > {slo.error_rate_max:.1%} ({s['error_samples'][:2]})")
    what = f"{s['requests']} requests ({obs.prompt_tokens:,}+{obs.output_tokens} tokens) at concurrency {obs.concurrency}"
    ev = {"summary": s, "trace": obs.trace.to_dict(), "wall_s": obs.result.wall_s, "transport": obs.result.transport}
    checks = []
    for key, field_name, label in SLO_FIELDS:
        p95, lim = s[key]["p95"], getattr(slo, field_name)
        if lim is None:
            checks.append(Verdict(f"{gate}.{label} p95", SKIP, f"no SLO for {label} p95 (slo.{field_name})",
                                  measured=p95, unit="ms"))
        else:
            good = p95 is not None and p95 <= lim
            checks.append(Verdict(f"{gate}.{label} p95", PASS if good else FAIL,
                                  f"{label} p95 {'n/a' if p95 is None else f'{p95:,.0f} ms'}; SLO {lim:,.0f} ms -> "
                                  f"{'PASS' if good else 'FAIL'}", measured=p95, limit=lim, unit="ms"))
    good = rate <= slo.error_rate_max
    checks.append(Verdict(f"{gate}.error rate", PASS if good else FAIL, f"error rate {rate:.1%}; max "
                          f"{slo.error_rate_max:.1%} -> {'PASS' if good else 'FAIL'}", measured=rate,
                          limit=slo.error_rate_max, unit="ratio"))
    lead = next((c for c in checks if c.status is FAIL), None) or next((c for c in checks if c.status is PASS))
    shown = {"measured": lead.measured, "limit": lead.limit, "unit": lead.unit, "parts": tuple(checks)}
    if problems:
        return Verdict(gate, FAIL, f"{what}: " + "; ".join(problems) + " -> FAIL", evidence=ev, **shown)
    if all(getattr(slo, f) is None for _, f, _ in SLO_FIELDS):
        return Verdict(gate, SKIP, f"{what}: " + ", ".join(parts) + "; profile sets no latency SLO", evidence=ev,
                       **shown)
    return Verdict(gate, PASS, f"{what}: " + ", ".join(parts) + " -> PASS", evidence=ev, **shown)


#: Share of judged short requests that must be head-of-line blocked for the gate to call it a
#: pattern (not chance), and the fewest judged short requests it decides on.
HOL_SHARE = 0.75
HOL_MIN_JUDGED = 4


def head_of_line(records: Sequence[Any]) -> dict[str, Any]:
    """Did short requests get their first token only after long requests *completed*?

    ``records``: one mixed run's :class:`~kvgate.load.RequestRecord` (tags ``short``/``long``;
    times in seconds since the run start). A short request is *judged* when it arrived behind at
    least one long request still waiting for its first token (sent before the short, first token
    after the short was sent: queued or in prefill); it is *blocked* when its first token arrived
    at or after the earliest completion among those longs. Longs already decoding when the short
    arrived are left out: one of them may finish any moment without blocking anyone. A server
    that batches prefills with running decodes (vLLM's continuous batching) gives shorts their
    first token while those longs still decode: measured on the embedded vLLM 0.32, 0 of 16
    blocked, first token 120-210 ms before the first such long completed. A server or gateway
    that serves one request per slot, or queues behind whole generations, blocks every one.

    Returns ``{"judged", "blocked", "share", "lead_ms"}``: ``lead_ms`` per judged short, the
    earliest in-flight long's completion minus the short's first token (ms; negative = blocked).
    """
    longs = [r for r in records if r.tag == "long" and r.sent_s is not None and r.end_s is not None]
    leads = []
    for r in records:
        if r.tag != "short" or r.sent_s is None or r.first_token_s is None:
            continue
        ends = [lg.end_s for lg in longs
                if lg.sent_s <= r.sent_s < lg.end_s and (lg.first_token_s is None or lg.first_token_s > r.sent_s)]
        if ends:
            leads.append(round((min(ends) - r.first_token_s) * 1e3, 1))
    blocked = sum(1 for x in leads if x <= 0)
    return {"judged": len(leads), "blocked": blocked, "share": blocked / len(leads) if leads else None,
            "lead_ms": leads}


def interference_verdict(alone: LoadObservation, mixed: LoadObservation, profile: Profile) -> Verdict:
    """Short requests' TTFT p95 alone vs. while long prefills run; FAIL when the mixed p95 breaks
    ``slo.short_ttft_p95_ms`` (or short requests fail), and -- whatever the SLO -- when short
    requests consistently get their first token only after the long requests they queued behind
    completed (:func:`head_of_line`: at least ``HOL_SHARE`` of at least ``HOL_MIN_JUDGED`` judged
    shorts). The message says which workload suffers and by how much — the measurement behind
    splitting short and long pools."""
    gate = "latency/interference"
    for obs in (alone, mixed):
        inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s)
        if inv:
            return inv
    a = summarize([r for r in alone.result.records if r.tag == "short"])
    m = summarize([r for r in mixed.result.records if r.tag == "short"])
    lm = summarize([r for r in mixed.result.records if r.tag == "long"])
    pa, pm = a["ttft_ms"]["p95"], m["ttft_ms"]["p95"]
    limit = profile.slo.short_ttft_p95_ms
    ex = mixed.extra or {}
    ratio = (pm / pa) if pa and pm else None
    what = (f"short-request TTFT p95 {pa:,.0f} ms alone, {pm:,.0f} ms while {ex.get('long_per_wave')} long "
            f"{ex.get('long_prompt_tokens', 0):,}-token prefills run ({ratio:.1f}x)") if pa and pm else \
        f"short-request TTFT p95 alone {pa}, mixed {pm}"
    ev: dict[str, Any] = {"short_alone": a, "short_mixed": m, "long_mixed": lm, "mixed_plan": ex,
                          "trace_mixed": mixed.trace.to_dict(),
                          "short_ttft_p95_ms": {"alone": pa, "mixed": pm, "ratio": ratio}}
    measured = pm
    problems = []
    if m["errors"] or a["errors"]:
        problems.append(f"short requests failed: {a['errors']} alone, {m['errors']} mixed ({(m['error_samples'] or a['error_samples'])[:2]})")
    if lm["errors"]:
        problems.append(f"{lm['errors']} long requests failed ({lm['error_samples'][:2]})")
    hol = head_of_line(mixed.result.records)
    ev["head_of_line"] = hol
    if hol["judged"] >= HOL_MIN_JUDGED and hol["share"] >= HOL_SHARE:
        late = sorted(-x for x in hol["lead_ms"] if x <= 0)
        problems.append(f"head-of-line blocking: {hol['blocked']} of {hol['judged']} short requests got their first "
                        f"token only after a long request queued ahead of them had completed (median "
                        f"{late[len(late) // 2]:,.0f} ms after it; allowed: under {HOL_SHARE:.0%}) -- the server or "
                        "gateway queues short requests behind whole long generations (max_num_seqs full of long "
                        "sequences, one request per connection/slot); continuous batching would start them at once")
    if limit is not None and (pm is None or pm > limit):
        problems.append(f"short-request SLO {limit:,.0f} ms broken: the short workload suffers, "
                        f"{(pm or 0) - (pa or 0):,.0f} ms added by long prefills (split short/long pools or "
                        "limit max_num_batched_tokens)")
    if problems:
        return Verdict(gate, FAIL, f"{what}; " + "; ".join(problems) + " -> FAIL", measured=measured, limit=limit,
                       unit="ms", evidence=ev)
    hol_s = (f"; no head-of-line blocking ({hol['blocked']} of {hol['judged']} short requests got their first token "
             "only after a long request queued ahead of them completed)" if hol["judged"] else "")
    if limit is None:
        return Verdict(gate, SKIP, f"{what}{hol_s}; profile sets no slo.short_ttft_p95_ms", measured=measured,
                       unit="ms", evidence=ev)
    return Verdict(gate, PASS, f"{what}; short-request SLO {limit:,.0f} ms{hol_s} -> PASS", measured=measured, limit=limit,
                   unit="ms",
                   evidence=ev)


#: load gate case -> (its gate id, the workloads it loads the server with: ``kvgate.load.scenarios``)
NEEDS = {"long-sequences": ("concurrency/long-sequences", ("long",)), "slo": ("latency/slo", ("short",)),
         "interference": ("latency/interference", ("long", "short"))}


def workloads_missing(profile: Profile, case: str) -> Verdict | None:
    """The SKIP verdict for load gate case ``case`` (``interference``) when the profile lacks a
    workload it needs -- a long one (``workloads.*.long: true``) or a short one (``slo.workload``,
    else the first without ``long``) -- else None. A profile that declares only one kind gates what
    it declares; the other gates say what they would need instead of a harness error."""
    gate, kinds = NEEDS[case]
    missing = []
    for kind in kinds:
        try:
            (long_workload if kind == "long" else short_workload)(profile)
        except ScenarioError as exc:
            missing.append(str(exc))
    if not missing:
        return None
    return Verdict(gate, Status.SKIP, f"{'; '.join(missing)}: nothing to load the server with -> SKIP")

