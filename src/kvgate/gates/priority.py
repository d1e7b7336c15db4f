"""Pure verdict of the priority gate: do high-priority short requests overtake the low-priority
long ones that fill the server, as ``--scheduling-policy priority`` promises?

One pool serving interactive and batch traffic can protect the interactive side with vLLM's
priority scheduling: requests carry ``priority`` (lower is served first), the waiting queue is
ordered by it, and under KV pressure the lowest-priority running request is preempted
(vllm/v1/core/sched/scheduler.py). It fails silently: a server started FCFS accepts the field and
ignores it (vLLM 0.32 raises no error), a gateway may strip unknown fields. So the gate measures
the same run twice -- without the field and with it -- and requires a gain. Input: two
:class:`~kvgate.load.scenarios.LoadObservation` from :func:`kvgate.load.scenarios.run_priority`; no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvgate.stats.confidence import FAIL as C_FAIL, PASS as C_PASS, UNDECIDED, Judgement, LookPlan, judge, plan_looks
from kvgate.profile.models import PrioritySpec, Profile
from kvgate.load.scenarios import LoadObservation
from kvgate.stats import request_metrics, summarize
from kvgate.stats.twosample import ShiftRatio, shift_ratio
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.health import canary_verdict

GATE = "priority/short-over-long"
INCONCLUSIVE = Status.INCONCLUSIVE


def not_asked(profile: Profile) -> Verdict | None:
    """The SKIP verdict when the profile neither sets ``engine.scheduling_policy: priority`` nor a
    ``priority:`` section (nothing to check, nothing sent); None when the gate applies."""
    policy = profile.engine.scheduling_policy
    if profile.priority is None and policy != "priority":
        return Verdict(GATE, SKIP, "profile does not use priority scheduling (engine.scheduling_policy is "
                       f"{policy or 'unset: fcfs'}, no priority: section) -> SKIP")
    return None


#: The percentile the gate judges (TTFT p95).
Q = 0.95


def _shorts(obs: LoadObservation) -> list[Any]:
    """Short requests of every round of ``obs``."""
    return [r for r in obs.result.records if r.tag == "short"]


def _ttft_ms(records: list[Any]) -> list[float]:
    ms = (request_metrics(r).ttft_s for r in records if r.ok and not r.hung_up)
    return [t * 1e3 for t in ms if t is not None]


def priority_plan(profile: Profile) -> LookPlan:
    """The looks of the priority gate's short SLO check (in high-priority short requests): the
    first run's ``priority.shorts``, then more *with priority* rounds up to ``slo.request_cap``
    within ``slo.max_duration_s`` (at most 4 looks, :func:`kvgate.stats.confidence.plan_looks`)."""
    spec, slo = profile.priority or PrioritySpec(), profile.slo
    return plan_looks(spec.shorts, slo.request_cap, Q, slo.confidence, max_s=slo.max_duration_s)


def _checks(without: LoadObservation, with_: LoadObservation, profile: Profile,
            confidence: float) -> tuple[dict[str, Any], float | None, Judgement | None, list[str], str]:
    """``(runs, gain, slo judgement, problems, decision)`` of the runs so far at ``confidence``."""
    spec = profile.priority or PrioritySpec()
    runs = {}
    for key, obs in (("without", without), ("with", with_)):
        first = obs.result.records[:(obs.extra or {}).get("first_round_records") or None]
        runs[key] = {"short": summarize([r for r in first if r.tag == "short"]),
                     "long": summarize([r for r in first if r.tag == "long"]),
                     "preemptions": obs.trace.delta("preemptions"), "peak_waiting": obs.trace.peak("waiting")}
    runs["with"]["short_all_rounds"] = summarize(_shorts(with_))
    p_without, p_with = runs["without"]["short"]["ttft_ms"]["p95"], runs["with"]["short"]["ttft_ms"]["p95"]
    # the gain: TTFT without / with priority as a scale factor of the first rounds' shorts, Hodges-Lehmann on
    # logs with exact Mann-Whitney bounds (kvgate.stats.twosample.shift_ratio), one-sided at slo.confidence
    firsts = [[x for x in _ttft_ms([r for r in _first(o) if r.tag == "short"]) if x > 0] for o in (without, with_)]
    gj = shift_ratio(firsts[0], firsts[1], profile.slo.confidence) if all(firsts) else None
    gain = gj.point if gj is not None else None
    limit = profile.slo.short_ttft_p95_ms
    problems = []
    for key, obs in (("without", without), ("with", with_)):
        for tag in ("short", "long"):
            s = summarize([r for r in obs.result.records if r.tag == tag])
            if s["errors"]:
                problems.append(f"{s['errors']} {tag} requests failed {key} priority ({s['error_samples'][:2]})")
    if gj is None or (gj.upper is not None and gj.upper < spec.min_gain):
        problems.append(f"priority ignored: short TTFT p95 {_ms(p_with)} with priority vs {_ms(p_without)} without "
                        f"({_gain_text(gj)} < {spec.min_gain:g}x needed) -- the server runs "
                        "FCFS (start vLLM with --scheduling-policy priority) or a gateway drops the 'priority' field")
    sj = judge(_ttft_ms(_shorts(with_)), Q, limit, confidence) if limit is not None else None
    if sj is not None and sj.decision == C_FAIL:
        problems.append(f"short-request SLO {limit:,.0f} ms broken even with priority")
    shown = gj is not None and gj.lower is not None and gj.lower >= spec.min_gain
    decision = C_FAIL if problems else (C_PASS if shown and (sj is None or sj.decision == C_PASS) else UNDECIDED)
    return runs, gj, sj, problems, decision


def _first(obs: LoadObservation) -> list[Any]:
    """The records of ``obs``'s first round (``extra["first_round_records"]``; all when unset)."""
    return obs.result.records[:(obs.extra or {}).get("first_round_records") or None]


def _gain_text(gj: ShiftRatio | None) -> str:
    """``gain 6.7x (Hodges-Lehmann, 95% bounds 6.1x..7.2x, 4 and 4 requests)`` or ``gain n/a``."""
    if gj is None:
        return "gain n/a (no first-token time in a first round)"
    b = ("no bound at this size" if gj.lower is None else
         f"{gj.confidence * 100:.4g}% one-sided bounds {gj.lower:.2f}x..{gj.upper:.2f}x")
    return f"gain {gj.point:.2f}x (Hodges-Lehmann on log TTFT, {b}, {gj.m} and {gj.n} requests)"


def priority_decide(without: LoadObservation, with_: LoadObservation, profile: Profile, confidence: float) -> str:
    """The sampler's ``decide`` (:func:`kvgate.load.scenarios.run_priority`): PASS/FAIL/UNDECIDED
    of the runs so far at a look's ``confidence`` (the canary comes after the sampling); short
    requests that left late are decided (INVALID: more rounds cannot mend it)."""
    if _late(without, with_, profile) is not None:
        return C_FAIL
    return _checks(without, with_, profile, confidence)[4]


def _late(without: LoadObservation, with_: LoadObservation, profile: Profile) -> Verdict | None:
    for obs in (without, with_):
        # the longs all go out at 0 s and queue in the client's send path by design; what must
        # leave on time are the short requests whose TTFT is judged
        r = obs.result
        shorts = dataclasses.replace(r, records=[x for x in r.records if x.tag == "short"])
        inv = shorts.invalid_verdict(GATE, profile.limits.schedule_lag_max_s)
        if inv is not None:
            return dataclasses.replace(inv, message=inv.message + f" (short requests of the run {obs.name})")
    return None


def priority_verdict(without: LoadObservation, with_: LoadObservation, profile: Profile) -> Verdict:
    """FAIL when the short requests' TTFT p95 with priority is not at least ``priority.min_gain``
    times better than without ("priority ignored"), breaks ``slo.short_ttft_p95_ms``, when
    requests fail, or when the canary after the run fails. ``measured``: short TTFT p95 with
    priority (ms, all with-priority rounds); the message shows both runs, the gain, and
    preemptions (vllm:num_preemptions delta) in each. SKIP when the profile neither sets
    ``engine.scheduling_policy: priority`` nor a ``priority:`` section.

    Confidence (:mod:`kvgate.stats.confidence`): the **short SLO** is a percentile against a limit, judged
    on its order-statistic bounds over every with-priority short request (more rounds in planned
    looks, :func:`priority_plan`; PASS needs the upper bound within, FAIL the lower bound above;
    undecided at the cap: INCONCLUSIVE). The **gain** compares the first round of each run
    (``priority.shorts`` requests each, back to back) as a scale factor of their whole TTFT
    distributions, not two p95 points (at 8 requests a p95 has no upper bound): Hodges-Lehmann on
    log TTFT with exact Mann-Whitney bounds one-sided at ``slo.confidence``
    (:func:`kvgate.stats.twosample.shift_ratio`; 8 and 8: the 16th smallest and largest of the 64
    log ratios). "Priority ignored" (FAIL) when its upper bound is below ``min_gain``; shown when
    its lower bound is at or above it; else INCONCLUSIVE. Measured on tiny-cpu-priority: priority
    9-10x, FCFS 1.05-1.3x (1.9x on a contended host) against ``min_gain`` 3."""
    skip = not_asked(profile)
    if skip is not None:
        return skip
    spec = profile.priority or PrioritySpec()
    inv = _late(without, with_, profile)
    if inv is not None:
        return inv
    ex = with_.extra or {}
    sampling = ex.get("sampling")
    level = sampling["per_look_confidence"] if sampling else profile.slo.confidence
    runs, gj, sj, problems, decision = _checks(without, with_, profile, level)
    gain = gj.point if gj is not None else None
    p_without, p_with = runs["without"]["short"]["ttft_ms"]["p95"], runs["with"]["short"]["ttft_ms"]["p95"]
    limit = profile.slo.short_ttft_p95_ms

    def pre(key: str) -> str:
        v = runs[key]["preemptions"]
        return "n/a" if v is None else f"{v:g}"

    what = (f"{ex.get('shorts')} short requests (priority {spec.high}) arriving while {ex.get('longs')} long "
            f"{ex.get('long_prompt_tokens', 0):,}+{ex.get('long_output_tokens')}-token requests (priority {spec.low}) fill "
            f"the server (max_num_seqs {ex.get('max_num_seqs') or 'default'}): short TTFT p95 "
            f"{_ms(p_without)} without priority, {_ms(p_with)} with it"
            + (f"; {_gain_text(gj)}" if gj is not None else "")
            + f"; preemptions {pre('without')} / {pre('with')}")
    rounds = ex.get("rounds") or 1
    slo_text = ""
    if sj is not None:
        looks = (f" [{rounds} with-priority rounds, {len(sampling['history'])} of {len(sampling['looks'])} planned looks "
                 f"each at {level * 100:.4g}%, stopped: {sampling['why_stopped']}]") if sampling else ""
        slo_text = "; short-request SLO: " + sj.text("short TTFT with priority", final=False) + looks
    can = canary_verdict(with_.canary, profile.limits.canary_deadline_s, after="the priority run") \
        if with_.canary is not None else None
    ev: dict[str, Any] = {"runs": runs, "gain": gain, "min_gain": spec.min_gain, "plan": ex,
                          "canary": can.to_dict() if can else None,
                          "confidence": {"slo": sj.to_dict() if sj else None, "sampling": sampling,
                                         "level": profile.slo.confidence, "per_look": level,
                                         "gain": gj.to_dict() if gj is not None else None}}
    if can is not None and can.status is FAIL:
        problems.append(can.message.removesuffix(" -> FAIL"))
    measured = sj.bound.point if sj is not None else p_with
    if problems:
        return Verdict(GATE, FAIL, f"{what}{slo_text}; " + "; ".join(problems) + " -> FAIL", measured=measured,
                       limit=limit, unit="ms", evidence=ev)
    if decision == UNDECIDED:
        if gj is not None and not (gj.lower is not None and gj.lower >= spec.min_gain):
            why = (f"the gain's bounds straddle {spec.min_gain:g}x: the first rounds ({gj.m} and {gj.n} short "
                   "requests) cannot tell (raise priority.shorts)")
        else:
            why = (f"undecided after {sj.bound.n if sj else 0} short requests with priority (sampling bounded by "
                   "slo.max_requests and slo.max_duration_s)")
        return Verdict(GATE, INCONCLUSIVE, f"{what} (need >= {spec.min_gain:g}x){slo_text}; {why} -> INCONCLUSIVE",
                       measured=measured, limit=limit, unit="ms", evidence=ev)
    return Verdict(GATE, PASS, f"{what} (need >= {spec.min_gain:g}x){slo_text}; canary after -> PASS",
                   measured=measured, limit=limit, unit="ms", evidence=ev)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f} ms"


__all__ = ["GATE", "not_asked", "priority_decide", "priority_plan", "priority_verdict"]
