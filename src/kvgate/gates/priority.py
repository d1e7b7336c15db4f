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

from kvgate.profile.models import PrioritySpec, Profile
from kvgate.load.scenarios import LoadObservation
from kvgate.stats import summarize
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.health import canary_verdict

GATE = "priority/short-over-long"


def not_asked(profile: Profile) -> Verdict | None:
    """The SKIP verdict when the profile neither sets ``engine.scheduling_policy: priority`` nor a
    ``priority:`` section (nothing to check, nothing sent); None when the gate applies."""
    policy = profile.engine.scheduling_policy
    if profile.priority is None and policy != "priority":
        return Verdict(GATE, SKIP, "profile does not use priority scheduling (engine.scheduling_policy is "
                       f"{policy or 'unset: fcfs'}, no priority: section) -> SKIP")
    return None


def priority_verdict(without: LoadObservation, with_: LoadObservation, profile: Profile) -> Verdict:
    """FAIL when the short requests' TTFT p95 with priority is not at least ``priority.min_gain``
    times better than without ("priority ignored"), breaks ``slo.short_ttft_p95_ms``, when
    requests fail, or when the canary after the run fails. ``measured``: short TTFT p95 with
    priority (ms); the message shows both runs, the gain, and preemptions (vllm:num_preemptions
    delta) in each. SKIP when the profile neither sets ``engine.scheduling_policy: priority`` nor a
    ``priority:`` section."""
    skip = not_asked(profile)
    if skip is not None:
        return skip
    spec = profile.priority or PrioritySpec()
    for obs in (without, with_):
        # the longs all go out at 0 s and queue in the client's send path by design; what must
        # leave on time are the short requests whose TTFT is judged
        r = obs.result
        shorts = dataclasses.replace(r, records=[x for x in r.records if x.tag == "short"])
        inv = shorts.invalid_verdict(GATE, profile.limits.schedule_lag_max_s)
        if inv is not None:
            return dataclasses.replace(inv, message=inv.message + f" (short requests of the run {obs.name})")
    runs = {}
    for key, obs in (("without", without), ("with", with_)):
        runs[key] = {"short": summarize([r for r in obs.result.records if r.tag == "short"]),
                     "long": summarize([r for r in obs.result.records if r.tag == "long"]),
                     "preemptions": obs.trace.delta("preemptions"), "peak_waiting": obs.trace.peak("waiting")}
    p_without, p_with = runs["without"]["short"]["ttft_ms"]["p95"], runs["with"]["short"]["ttft_ms"]["p95"]
    gain = p_without / p_with if p_without and p_with else None
    ex = with_.extra or {}
    limit = profile.slo.short_ttft_p95_ms

    def pre(key: str) -> str:
        v = runs[key]["preemptions"]
        return "n/a" if v is None else f"{v:g}"

    what = (f"{ex.get('shorts')} short requests (priority {spec.high}) arriving while {ex.get('longs')} long "
            f"{ex.get('long_prompt_tokens', 0):,}+{ex.get('long_output_tokens')}-token requests (priority {spec.low}) fill "
            f"the server (max_num_seqs {ex.get('max_num_seqs') or 'default'}): short TTFT p95 "
            f"{_ms(p_without)} without priority, {_ms(p_with)} with it"
            + (f" ({gain:.1f}x better)" if gain else "")
            + f"; preemptions {pre('without')} / {pre('with')}")
    can = canary_verdict(with_.canary, profile.limits.canary_deadline_s, after="the priority run") \
        if with_.canary is not None else None
    ev: dict[str, Any] = {"runs": runs, "gain": gain, "min_gain": spec.min_gain, "plan": ex,
                          "canary": can.to_dict() if can else None}
    problems = []
    for key in ("without", "with"):
        for tag in ("short", "long"):
            s = runs[key][tag]
            if s["errors"]:
                problems.append(f"{s['errors']} {tag} requests failed {key} priority ({s['error_samples'][:2]})")
    if gain is None or gain < spec.min_gain:
        problems.append(f"priority ignored: short TTFT p95 {_ms(p_with)} with priority vs {_ms(p_without)} without "
                        f"({'n/a' if gain is None else f'{gain:.2f}x'}; need >= {spec.min_gain:g}x) -- the server runs "
                        "FCFS (start vLLM with --scheduling-policy priority) or a gateway drops the 'priority' field")
    if limit is not None and (p_with is None or p_with > limit):
        problems.append(f"short-request SLO {limit:,.0f} ms broken even with priority")
    if can is not None and can.status is FAIL:
        problems.append(can.message.removesuffix(" -> FAIL"))
    if problems:
        return Verdict(GATE, FAIL, f"{what}; " + "; ".join(problems) + " -> FAIL", measured=p_with, limit=limit,
                       unit="ms", evidence=ev)
    slo = f"; short-request SLO {limit:,.0f} ms" if limit is not None else ""
    return Verdict(GATE, PASS, f"{what} (need >= {spec.min_gain:g}x){slo}; canary after -> PASS", measured=p_with,
                   limit=limit, unit="ms", evidence=ev)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f} ms"


__all__ = ["GATE", "not_asked", "priority_verdict"]
