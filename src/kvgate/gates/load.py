"""Pure verdicts of the load gates: concurrent long sequences, latency SLO, mixed-workload
interference. Inputs are :class:`~kvgate.load.scenarios.LoadObservation`; no I/O here.

Every verdict first asks whether the client kept up (:meth:`kvgate.load.LoadResult.invalid_verdict`
with the profile's ``limits.schedule_lag_max_s``): a run whose client fell behind is INVALID, not
PASS or FAIL.

A run that replayed a traffic sample (``obs.traffic``, :class:`~kvgate.load.scenarios.Traffic`)
says which (file, SHA-256 prefix, requests drawn, open/closed loop, speed-up) and its length
percentiles beside the profile's declared ones; its evidence carries the plan's provenance and the
per-turn cache effect (:func:`later_turns`). A sample that does not fit the deployment FAILs
before anything is sent (:func:`overlong_verdict`). An open-loop replay whose SLO breaks where its
arrivals bunch names the burst (:func:`busiest_window`, :func:`burst_share`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from collections.abc import Sequence
from typing import Any

from kvgate.stats.confidence import (FAIL as C_FAIL, PASS as C_PASS, UNDECIDED, LookPlan, Sampling, judge,
                                     min_samples_to_pass)
from kvgate.profile.models import Profile
from kvgate.load.sampling import Q, SLO_METRICS, errors_pass_level, judge_errors, judge_slo, slo_levels, slo_samples
from kvgate.load.scenarios import (LoadObservation, ScenarioError, Traffic, interference_judgement,
                                   latency_judgements, long_workload, short_workload)
from kvgate.stats import percentile, request_metrics, summarize
from kvgate.traffic.sample import BYTES_PER_TOKEN
from kvgate.verdict import Status, Verdict, floor_pass
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.health import canary_verdict


def _invalid(obs: LoadObservation, gate: str, bound_s: float, profile: Profile | None = None) -> Verdict | None:
    """INVALID when the client fell behind its schedule; with a traffic replay (and ``profile``)
    the message names what was replayed, and for an open loop sped up past 1x suggests a lower
    ``traffic.speedup`` (a schedule no client can keep) beside running kvgate on other CPUs.
    (A contended host is judged after the verdict: :func:`_on_contended_host`.)"""
    v = obs.result.invalid_verdict(gate, bound_s)
    if v is None:
        return None
    t = obs.traffic
    what, cure = "", "run kvgate on CPUs the server does not use, e.g. taskset the server off one core"
    if t is not None and profile is not None:
        what = f"; {replay_text(t, profile)}"
        if t.plan.mode == "open" and t.plan.speedup > 1:
            cure = (f"lower workloads.{t.workload}.traffic.speedup ({t.plan.speedup:g}x) or " + cure)
    return Verdict(gate, Status.INVALID, v.message + f" ({obs.name}{what}; the server was not judged: {cure})",
                   measured=v.measured, limit=v.limit, unit=v.unit, limit_unit=v.limit_unit,
                   evidence={**(v.evidence or {}), **({"traffic": traffic_evidence(obs)} if t is not None else {})})


def contended(obs: LoadObservation, gate: str, profile: Profile | None) -> Verdict | None:
    """INVALID for a latency verdict whose window ran on a contended host: more than
    ``limits.host_contention_max`` of the launched server's CPUs went to other processes
    (:meth:`kvgate.host.contention.HostContention.invalid_verdict`, naming the share and the
    CPUs); the scenario and what the client saw are added. None otherwise -- also when contention
    was not measured (``--endpoint``): that is evidence (:func:`host_evidence`), never INVALID."""
    host = obs.trace.host
    if host is None or profile is None:
        return None
    v = host.invalid_verdict(gate, profile.limits.host_contention_max)
    if v is None:
        return None
    lag = obs.result.invalid_verdict(gate, profile.limits.schedule_lag_max_s)
    also = f"; the client also fell behind: {lag.message}" if lag is not None else ""
    s = summarize(obs.result.records)
    p95 = s["ttft_ms"]["p95"]
    seen = "" if p95 is None else f": TTFT p95 {p95:,.0f} ms over {s['requests']} requests measured, not judged"
    return Verdict(gate, Status.INVALID, f"{v.message} ({obs.name}{seen}{also})", measured=v.measured, limit=v.limit,
                   unit=v.unit, evidence={"host_contention": host_evidence(obs), "scenario": obs.name, "summary": s})


def _on_contended_host(v: Verdict, observations: Sequence[LoadObservation], profile: Profile) -> Verdict:
    """A latency verdict ``v`` whose window ran on a contended host (:func:`contended`): a PASS
    stands -- other processes can only have made the server slower, and the bound held anyway
    (said in the message) -- anything else (FAIL, INCONCLUSIVE) becomes the INVALID naming the
    share, with the verdict it would have been in its message and evidence. Not contended (or
    not measured): ``v`` unchanged."""
    for obs in observations:
        busy = contended(obs, v.gate, profile)
        if busy is None:
            continue
        host = obs.trace.host
        if v.status is PASS:
            note = (f"; measured on a contended host ({host.share:.0%} of the server's CPUs went to other processes, "
                    f"limit {profile.limits.host_contention_max:.0%}): the bound held anyway")
            msg = v.message[:-len(" -> PASS")] + note + " -> PASS" if v.message.endswith(" -> PASS") else v.message + note
            return replace(v, message=msg)
        return replace(busy, message=f"{busy.message}; would have been {v.status.value}: {v.message}",
                       evidence={**(busy.evidence or {}), "verdict_if_judged": v.to_dict()})
    return v


def host_evidence(*observations: LoadObservation) -> dict[str, Any]:
    """Each observation's host contention for a latency verdict's evidence: ``{scenario name:
    HostContention.to_dict()}`` -- the share and per-CPU shares, or ``host contention not measured:
    <why>`` (``--endpoint``, no psutil access) -- so every latency verdict carries it, under the
    threshold too."""
    from kvgate.host.contention import unmeasured

    return {o.name: (o.trace.host or unmeasured("no contention sampler ran with this measurement")).to_dict()
            for o in observations}


# ------------------------------------------------------------------------------------------------
# traffic replays


def _num(x: int | float) -> str:
    return f"{x:,.0f}"


def replay_text(t: Traffic, profile: Profile, how: str | None = None) -> str:
    """What was replayed, for a verdict's message: ``replayed 32 of 300 requests of
    traffic/tiny-chat.jsonl (sha256 3f2a..., open loop at 1x): prompt p50/p99 412/1,530 tokens
    (declared 400/1,500), output p50/p99 30/120 tokens (declared 32); the 32 replayed: prompt
    p50/p99 380/1,210, output p50/p99 28/96 tokens``. Percentiles (tokens, nearest rank) are the
    whole sample's, then the replayed requests' when they are fewer; declared: the workload's ``prompt_tokens`` /
    ``prompt_tokens_p99`` and ``output_tokens``. ``how``: instead of the plan's loop (a gate that
    sends the drawn lengths on a schedule of its own)."""
    plan, sample = t.plan, t.sample
    wl = profile.workloads[t.workload]
    how = how or (f"open loop at {plan.speedup:g}x" if plan.mode == "open" else f"closed loop at concurrency {plan.concurrency}")
    p, o = sample.percentiles("prompt_tokens", (50, 99)), sample.percentiles("output_tokens", (50, 99))
    d99 = _num(wl.prompt_tokens_p99) if wl.prompt_tokens_p99 else "-"
    capped = f"; sent with at most {t.outputs_capped_at} output tokens" if t.outputs_capped_at else ""
    drawn = ""
    if plan.items and len(plan.items) < len(sample.requests):
        dp = _percentiles([it.trace.prompt_tokens for it in plan.items])
        do = _percentiles([it.trace.output_tokens for it in plan.items])
        drawn = (f"; the {len(plan.items):,} replayed: prompt p50/p99 {_num(dp[0])}/{_num(dp[1])}, output p50/p99 "
                 f"{_num(do[0])}/{_num(do[1])} tokens")
    if any("estimated as UTF-8 bytes" in n for n in sample.notes):
        capped += f"; lengths estimated at UTF-8 bytes / {BYTES_PER_TOKEN}, the file has no token counts"
    of = (f"{len(sample.requests):,} requests" if sample.represents is None else
          f"{len(sample.requests):,} quantile rows (standing for {sample.represents:,.0f} requests)")
    return (f"replayed {len(plan.items):,} of {of} of {sample.path} (sha256 "
            f"{sample.sha256[:12]}, {how}{capped}): prompt p50/p99 {_num(p['p50'])}/{_num(p['p99'])} tokens "
            f"(declared {_num(wl.prompt_tokens)}/{d99}), output p50/p99 {_num(o['p50'])}/{_num(o['p99'])} tokens "
            f"(declared {_num(wl.output_tokens)}){drawn}")


def _percentiles(xs: Sequence[int]) -> tuple[int, int]:
    """p50 and p99 (nearest rank, as :meth:`TrafficSample.percentiles`) of token counts ``xs``."""
    import numpy as np

    return tuple(int(np.percentile(np.asarray(xs, dtype=float), q, method="inverted_cdf")) for q in (50, 99))


def later_turns(turns: Sequence[dict[str, Any]], cache: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The cache effect of a multi-turn replay from its per-turn rows (``turn`` 0-based,
    ``requests``, ``cached_tokens_mean`` (tokens, None where the server reports none),
    ``ttft_p50_ms``): ``{"first": {...}, "later": {...}}`` with each group's requests,
    request-weighted mean cached tokens (rounded to 0.1) and TTFT p50 (ms): the p50 over the
    group's requests, ``cache["ttft_p50_ms_first"]`` / ``["ttft_p50_ms_later"]`` of the replay's
    cache summary when given; without it, the median of the rows' p50s (an estimate: a turn of one
    request weighs as much as one of twenty). None without a later turn. vLLM reports
    ``cached_tokens`` only with ``--enable-prompt-tokens-details``
    (``engine.enable_prompt_tokens_details``)."""
    def group(rows: list[dict[str, Any]]) -> dict[str, Any]:
        n = sum(int(r.get("requests") or 0) for r in rows)
        cached = [(r.get("cached_tokens_mean", r.get("cached_tokens")), int(r.get("requests") or 0)) for r in rows]
        known = [(c, k) for c, k in cached if c is not None]
        ttfts = sorted(r["ttft_p50_ms"] for r in rows if r.get("ttft_p50_ms") is not None)
        mean = sum(c * k for c, k in known) / max(1, sum(k for _, k in known)) if known else None
        return {"requests": n, "cached_tokens_mean": None if mean is None else round(mean, 1),
                "ttft_p50_ms": ttfts[(len(ttfts) - 1) // 2] if ttfts else None}

    rows = [dict(r) for r in turns or () if isinstance(r, dict)]
    later = [r for r in rows if (r.get("turn") or 0) > 0]
    if not later:
        return None
    out = {"first": group([r for r in rows if (r.get("turn") or 0) == 0]), "later": group(later)}
    for key in ("first", "later"):
        pooled = (cache or {}).get(f"ttft_p50_ms_{key}")
        if pooled is not None:
            out[key]["ttft_p50_ms"] = pooled
    return out


def _cache_text(effect: dict[str, Any] | None) -> str:
    if not effect:
        return ""
    f, lt = effect["first"], effect["later"]

    def one(g: dict[str, Any]) -> str:
        c = "cached_tokens n/a" if g["cached_tokens_mean"] is None else f"cached_tokens mean {_num(g['cached_tokens_mean'])}"
        t = "" if g["ttft_p50_ms"] is None else f", TTFT p50 {_num(g['ttft_p50_ms'])} ms"
        return f"{c}{t}"

    n = lt["requests"]
    return f"; later turns ({n:,} request{'' if n == 1 else 's'}): {one(lt)} (first turns: {one(f)})"


def traffic_evidence(obs: LoadObservation) -> dict[str, Any] | None:
    """The replay part of a verdict's evidence: ``plan`` (:meth:`ReplayPlan.provenance`), the
    drawn requests' length percentiles, ``turns`` (per-turn rows of the replay), ``cache`` (the
    replay's cache summary, if it has one) and ``later_turns`` (:func:`later_turns`); None
    without a replay."""
    t = obs.traffic
    if t is None:
        return None
    from kvgate.traffic.sample import TrafficSample

    drawn = TrafficSample(tuple(it.trace for it in t.plan.items), t.sample.path, t.sample.sha256, t.sample.format)
    rr = t.replay
    turns = list(getattr(rr, "turns", None) or [])
    return {"workload": t.workload, "plan": t.plan.provenance(),
            "drawn": {"prompt_tokens": drawn.percentiles("prompt_tokens"),
                      "output_tokens": drawn.percentiles("output_tokens")} if drawn.requests else None,
            "outputs_capped_at": t.outputs_capped_at, "overlong": t.overlong, "sent": rr is not None,
            "turns": turns, "cache": getattr(rr, "cache", None),
            "later_turns": later_turns(turns, getattr(rr, "cache", None))}


def overlong_verdict(gate: str, obs: LoadObservation) -> Verdict | None:
    """FAIL, before any request is sent, when the replayed sample has requests the deployment
    cannot serve as recorded (``obs.traffic.overlong``): its prompt p99 over ``max_model_len``
    minus the p99 output (capped at ``limits.max_tokens_cap``), or any request's prompt + output
    over ``max_model_len`` or output over the cap. Names the p99, the limit and the file."""
    t = obs.traffic
    if t is None or not t.overlong:
        return None
    o, s = t.overlong, t.sample
    out = t.max_model_len - o["limit"]
    where = f"traffic sample {s.path} (sha256 {s.sha256[:12]}, workloads.{t.workload}.traffic)"
    p99 = (f"prompt p99 {_num(o['prompt_p99'])} tokens > {_num(o['limit'])} (max_model_len "
           f"{_num(t.max_model_len)} - {_num(out)} p99 output tokens)" if o["prompt_p99"] > o["limit"] else
           f"prompt p99 {_num(o['prompt_p99'])} tokens within {_num(o['limit'])} (max_model_len "
           f"{_num(t.max_model_len)} - {_num(out)} p99 output tokens)")
    cap = f" or output over the max_tokens cap {_num(t.max_tokens_cap)}" if t.max_tokens_cap else ""
    bad = (f"; {o['requests']:,} of {len(s.requests):,} requests ({o['share']:.0%}) do not fit as recorded "
           f"(prompt + output over max_model_len {_num(t.max_model_len)}{cap}), the first on line {o['first_line']}"
           if o["requests"] else "")
    return Verdict(gate, FAIL, f"{where}: {p99}{bad} -> FAIL; nothing was sent (the deployment cannot serve this "
                   "traffic: raise max_model_len or cut the sample)", measured=o["prompt_p99"], limit=o["limit"],
                   unit="tokens", evidence={"scenario": obs.name, "traffic": traffic_evidence(obs)})


#: A burst: the busiest arrival window of an open-loop replay holding at least BURST_MIN_REQUESTS
#: requests at BURST_FACTOR times the arrival rate outside it or more. The window is
#: BURST_WINDOW_GAPS mean inter-arrival gaps wide, at most a quarter of the schedule's span (so
#: there is an outside to compare with), at least BURST_MIN_WINDOW_S. Measured on seeded steady
#: Poisson schedules (1,000 each): at factor 4 none of 30, 100, 300 or 1,000 requests is called a
#: burst, 18 of 1,000 16-request ones are (at factor 3: 28 of 1,000 30-request ones).
BURST_MIN_REQUESTS = 8
BURST_FACTOR = 4.0
BURST_WINDOW_GAPS = 10
BURST_MIN_WINDOW_S = 0.1
#: The over-SLO requests concentrate in the burst when at least this share of them arrived in it
#: (and a larger share than the burst's share of all requests).
BURST_SHARE = 0.5


def busiest_window(times_s: Sequence[float], window_s: float | None = None) -> dict[str, Any] | None:
    """The busiest arrival window of a schedule (``times_s``: arrival offsets, seconds, any order).

    Slides a window of ``window_s`` seconds (default: :data:`BURST_WINDOW_GAPS` mean gaps, at most a
    quarter of the span, at least :data:`BURST_MIN_WINDOW_S`) over the arrivals and keeps the one holding the most (the earliest
    of equals); it is a ``burst`` when it holds at least :data:`BURST_MIN_REQUESTS` at
    :data:`BURST_FACTOR` x the rate outside it. Its edges are then trimmed to the bunch: an edge
    arrival is dropped while its gap to the next one inside exceeds the schedule's mean gap.
    Returns ``{"start_s", "end_s", "requests"`` (the trimmed bunch), ``"rate_rps"`` (requests /
    (end - start); None when they arrived at once), ``"mean_rps"`` (all requests / the schedule's
    span), ``"outside_rps"``, ``"window_s"``, ``"burst"}``; None for fewer than two arrivals or a
    zero span. Pure: the latency gate reads it from the replayed records' ``scheduled_s``."""
    ts = sorted(float(t) for t in times_s)
    if len(ts) < 2 or ts[-1] <= ts[0]:
        return None
    span = ts[-1] - ts[0]
    gap = span / (len(ts) - 1)
    w = window_s if window_s is not None else max(BURST_MIN_WINDOW_S, min(BURST_WINDOW_GAPS * gap, span / 4))
    best_i, best_j, j = 0, 0, 0
    for i, t in enumerate(ts):
        j = max(j, i)
        while j + 1 < len(ts) and ts[j + 1] <= t + w:
            j += 1
        if j - i > best_j - best_i:
            best_i, best_j = i, j
    count = best_j - best_i + 1
    outside = (len(ts) - count) / max(span - min(w, span), w)
    burst = count >= BURST_MIN_REQUESTS and count / min(w, span) >= BURST_FACTOR * outside
    i, j = best_i, best_j
    while j - i >= BURST_MIN_REQUESTS and ts[i + 1] - ts[i] > gap:
        i += 1
    while j - i >= BURST_MIN_REQUESTS and ts[j] - ts[j - 1] > gap:
        j -= 1
    n, start, end = j - i + 1, ts[i], ts[j]
    return {"start_s": start, "end_s": end, "requests": n, "rate_rps": n / (end - start) if end > start else None,
            "mean_rps": len(ts) / span, "outside_rps": outside, "window_s": w, "burst": burst}


def burst_share(records: Sequence[Any], window: dict[str, Any], over: Sequence[Any]) -> dict[str, Any]:
    """How many of the ``over`` (over-SLO) records arrived (``scheduled_s``, seconds) in
    ``window`` (:func:`busiest_window`) among all ``records``: ``{"over", "over_in", "all",
    "all_in", "concentrated"}`` -- concentrated when at least :data:`BURST_SHARE` of the over-SLO
    requests, and a larger share than of all requests, arrived in it."""
    def inside(r: Any) -> bool:
        return window["start_s"] <= r.scheduled_s <= window["end_s"]

    over_in, all_in = sum(1 for r in over if inside(r)), sum(1 for r in records if inside(r))
    conc = bool(over) and over_in / len(over) >= BURST_SHARE and over_in / len(over) > all_in / max(1, len(records))
    return {"over": len(over), "over_in": over_in, "all": len(records), "all_in": all_in, "concentrated": conc}


def _burst_text(window: dict[str, Any], share: dict[str, Any]) -> str:
    w = window
    d = w["end_s"] - w["start_s"]
    rate = "at once" if w["rate_rps"] is None else f"in {d:.1f} s" if d >= 1 else f"in {d:.2f} s"
    rate += "" if w["rate_rps"] is None else f", {w['rate_rps']:.0f} req/s"
    return (f"{share['over_in']} of the {share['over']} over-SLO requests arrived in the burst at "
            f"{w['start_s']:.1f}-{w['end_s']:.1f} s ({w['requests']} requests {rate} vs {w['mean_rps']:.1f} req/s mean)")


def _over_slo(records: Sequence[Any], key: str, limit_ms: float) -> list[Any]:
    """Successful records over ``limit_ms`` in ``key`` (``ttft_ms``: TTFT; ``e2e_ms``: e2e;
    ``itl_ms``: the request's longest inter-token gap)."""
    out = []
    for r in records:
        if not r.ok:
            continue
        m = request_metrics(r)
        v = m.ttft_s if key == "ttft_ms" else m.e2e_s if key == "e2e_ms" else max(m.itl_s, default=None)
        if v is not None and v * 1e3 > limit_ms:
            out.append(r)
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def concurrent_long_verdict(obs: LoadObservation, profile: Profile) -> Verdict:
    """All declared long sequences complete 200 with the requested tokens, no 5xx; preemptions
    (``vllm:num_preemptions`` delta) within ``limits.preemptions_allowed``; a canary succeeds after.
    Peak KV usage and running/waiting recorded. Without ``/metrics`` preemptions are not
    observable: noted in the message, judged on client-side evidence only."""
    gate = "concurrency/long-sequences"
    if (refused := overlong_verdict(gate, obs)) is not None:
        return refused
    inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s, profile)
    if inv:
        return inv
    recs = obs.result.records
    n = obs.concurrency
    ok = [r for r in recs if r.ok]
    five = [r for r in recs if r.status >= 500]
    t = obs.traffic
    if t is None:
        bad_tokens = [r.tokens for r in ok if r.tokens != obs.output_tokens]
    else:  # each replayed request generates its recorded output (ignore_eos): compare the multisets
        n = len(t.plan.items)
        want = Counter(max(1, it.trace.output_tokens) for it in t.plan.items)
        bad_tokens = list((Counter(r.tokens for r in ok) - want).elements())
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
        problems.append(f"{len(bad_tokens)} completed with {sorted(set(bad_tokens))} tokens instead of "
                        f"{'their recorded output' if t is not None else obs.output_tokens}")
    if pre is not None and pre > allowed:
        problems.append(f"{pre:g} preemptions (allowed {allowed}): the KV pool could not hold {n} sequences")
    if can is not None and can.status is FAIL:
        problems.append(can.message.removesuffix(" -> FAIL"))
    what = f"{n} concurrent {obs.prompt_tokens:,}+{obs.output_tokens}-token sequences"
    if t is not None:
        what = f"{n} long sequences at concurrency {obs.concurrency}, {replay_text(t, profile)}"
    seen = (f"preemptions {'n/a (no /metrics)' if pre is None else f'{pre:g}'} (allowed {allowed}), "
            f"peak KV usage {_pct(kv)}, peak running {running if running is None else f'{running:g}'}, "
            f"peak waiting {waiting if waiting is None else f'{waiting:g}'}")
    ev = {"scenario": obs.name, "trace": trace.to_dict(), "records": obs.result.rows(),
          "canary": can.to_dict() if can else None, "wall_s": obs.result.wall_s, "transport": obs.result.transport}
    ev["peaks"] = {"kv_usage_ratio": kv, "running": running, "waiting": waiting}
    if t is not None:
        ev["traffic"] = traffic_evidence(obs)
    done_ok = len(ok) == n and not bad_tokens
    outs = "their recorded output tokens" if t is not None else f"{obs.output_tokens} tokens"
    parts = [Verdict(f"{gate}.completed", PASS if done_ok else FAIL,
                     f"{len(ok)}/{n} completed 200 with {outs} -> {'PASS' if done_ok else 'FAIL'}",
                     measured=len(ok) - len(bad_tokens) if t is not None else
                     len([r for r in ok if r.tokens == obs.output_tokens]), limit=n, unit="requests")]
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
    return Verdict(gate, PASS, f"{what}: {len(ok)}/{n} completed 200 with {outs} in "
                   f"{obs.result.wall_s:.2f} s; {seen} -> PASS", measured=parts[0].measured, limit=n, unit="requests",
                   evidence=ev, parts=tuple(parts))


SLO_FIELDS = SLO_METRICS
#: The wording of each judged metric in a verdict (ITL: the pooled-gap p95, as vllm bench serve; see latency_verdict).
_WHAT = {"TTFT": "TTFT", "ITL": "ITL", "e2e": "e2e"}
_STATUS = {C_PASS: PASS, C_FAIL: FAIL, UNDECIDED: Status.INCONCLUSIVE}


def _one_look(n: int, confidence: float) -> LookPlan:
    return LookPlan((max(1, n),), confidence, confidence)


def sampling_text(sampling: Sampling | None, unit: str = "requests", source_n: int | None = None,
                  cap_field: str | None = "slo.max_requests", floor_used: float | None = None) -> str:
    """How the percentile was sampled, for a verdict: ``looks planned at 32/86/172/256 requests
    (each at 98.75%: 95% over 4 looks); took 2 (n=86); stopped: decided``; looks whose errors are
    spent apart (:func:`kvgate.stats.confidence.split_levels`): ``looks planned at 32/80/160/256
    requests (a FAIL at 98.75% each: 95% over 4 looks; a PASS at 98.33%: 95% over the 3 that can
    PASS); ...``; ``floor_used``: a PASS was taken at ``slo.pass_confidence_floor`` instead, which the
    clause then says (``...; this PASS taken at the 60% floor instead ...``). ``why_stopped``: decided,
    the cap, the time bound (``slo.max_duration_s``) or the source (a traffic sample with only
    ``source_n`` requests). A cap below the fewest samples a p95 PASS needs at the per-look level
    says so (no PASS was ever possible; raise ``cap_field``). Empty without ``sampling`` (a single
    fixed-size run)."""
    if sampling is None:
        return ""
    p = sampling.plan
    cap = f"the cap ({p.looks[-1]:,} {unit}) reached"
    if (need := min_samples_to_pass(Q, p.pass_level)) > p.looks[-1]:
        cap += (f"; no PASS was possible: a p95 PASS at {p.pass_level * 100:.4g}% needs at least {need:,} {unit}, "
                f"more than the cap" + (f" (raise {cap_field})" if cap_field else ""))
    why = {"decided": "decided", "cap": cap,
           "time": f"the time bound ({p.max_s:g} s, slo.max_duration_s) reached",
           "source": (f"the traffic sample had only {source_n:,} requests" if source_n is not None
                      else "a batch ran into its deadline")}.get(sampling.why_stopped, sampling.why_stopped or "?")
    k, c = len(p.looks), f"{p.confidence * 100:.4g}%"
    cf = c if p.fail_confidence is None else (f"{p.fail_confidence * 100:.4g}% (the run's false-alarm budget "
                                              f"share, verdicts.false_alarm_budget)")
    levels = (f"each at {p.per_look * 100:.4g}%: {c} over {k} look{'s' if k != 1 else ''}"
              if p.per_look_pass is None or p.per_look_pass == p.per_look else
              f"a FAIL at {p.per_look * 100:.4g}% each: {cf} over {k} look{'s' if k != 1 else ''}; a PASS at "
              f"{p.per_look_pass * 100:.4g}%: {c} over the {p.pass_looks} that can PASS")
    if floor_used is not None:  # the PASS level actually used, not the plan's
        levels += (f"; this PASS taken at the {floor_used * 100:.4g}% floor instead (slo.pass_confidence_floor: "
                   f"too few independent samples for {(p.per_look_pass or p.per_look) * 100:.4g}%)")
    return (f"looks planned at {'/'.join(f'{n:,}' for n in p.looks)} {unit} ({levels}); took "
            f"{len(sampling.history)} (n={sampling.n:,}); stopped: {why}")


def latency_verdict(obs: LoadObservation, profile: Profile) -> Verdict:
    """:func:`_latency_verdict`, then :func:`_on_contended_host` (a contended host's FAIL or
    INCONCLUSIVE is INVALID; its PASS stands)."""
    return _on_contended_host(_latency_verdict(obs, profile), [obs], profile)


def _multiplicity(slo: Any, level: float, up: float | None) -> dict[str, Any]:
    """What latency/slo's FAIL side is corrected for (F11; :func:`kvgate.load.sampling.slo_levels`)."""
    fail, passed = slo_levels(slo, level, up)
    m = sum(1 for _, f, _ in SLO_METRICS if getattr(slo, f, None) is not None)
    return {"metrics": m, "method": "Bonferroni on the FAIL side (any one metric FAILs the gate)",
            "per_look_level": level, "fail_level": fail, "pass_level": passed,
            "pass_side": "uncorrected: every metric must PASS (intersection-union)"}


def _latency_verdict(obs: LoadObservation, profile: Profile) -> Verdict:
    """TTFT, ITL and e2e p95 (ms) at ``slo.concurrency`` judged with confidence
    (:func:`kvgate.stats.confidence.judge`) against ``slo.*_p95_ms``; error rate within ``slo.error_rate_max``.

    Each metric's p95 PASSes when its upper order-statistic bound (one-sided, exact binomial) is
    within the limit, FAILs when its lower bound is above it, else is undecided -- at the
    per-look level of the looks the scenario took (``obs.sampling``,
    :func:`kvgate.load.scenarios.run_latency`; without it, one look at ``slo.confidence``). The
    gate PASSes when every SLO'd metric PASSes and the error rate holds, FAILs when any FAILs or
    errors exceed, and is INCONCLUSIVE otherwise (sampling reached its cap, time bound or the end
    of a traffic sample undecided). The message gives per metric the sample size, the p95, the
    bound used and the limit, then the looks and why sampling stopped.

    ITL p95 is the field's: the p95 over all inter-token gaps pooled across requests, as
    ``vllm bench serve`` computes it (:func:`kvgate.load.sampling.slo_samples`,
    :func:`kvgate.stats.cluster.pooled_percentile`); its bounds come from a cluster bootstrap over
    waves (:func:`kvgate.stats.cluster.judge_pooled`: a request's gaps are correlated, and so are
    the requests of one closed-loop batch, so the unit is the wave of ``slo.concurrency`` requests
    sent together; the message states waves, requests, gaps, the ICC between requests in a wave
    and the effective n). TPOT per request stays in
    the evidence (``summary.tpot_ms``). TTFT and e2e are per request (order statistics).

    A replayed traffic sample (``obs.traffic``): FAIL before anything was sent when it does not fit
    (:func:`overlong_verdict`); the message says what was replayed (:func:`replay_text`) and the
    later turns' cache effect; an open-loop replay whose over-SLO requests concentrate in its
    busiest arrival window (:func:`busiest_window`, :func:`burst_share`) names that burst."""
    gate = "latency/slo"
    if (refused := overlong_verdict(gate, obs)) is not None:
        return refused
    inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s, profile)
    if inv:
        return inv
    s = summarize(obs.result.records)
    slo = profile.slo
    t = obs.traffic
    recs = obs.result.records
    sampling = obs.sampling
    level = sampling.plan.per_look if sampling is not None else profile.verdicts.fail_confidence(slo.confidence)
    up = sampling.plan.pass_level if sampling is not None else slo.confidence
    judged = judge_slo(recs, slo, level, up)
    # TTFT and e2e (one value per request) of the closed loop at the effective n of the requests in send
    # order (lag-1..c autocorrelation), as the sampling loop judged them; the profile's lower PASS level only
    # at the end. A replay keeps the recorded arrivals (its bursts are the sample's): judged per request
    at_end = (sampling is None or sampling.why_stopped in ("cap", "time", "source")
              or sampling.n >= sampling.plan.looks[-1])
    dependent = (latency_judgements(recs, slo, level, up, obs.concurrency, at_end,
                                    fail_worst=profile.verdicts.raises(profile.slo.confidence)) if t is None else {})
    judged = {**judged, **{label: dj.judgement for label, dj in dependent.items()}}

    def said(label: str, j: Any, final: bool = True) -> str:
        if label in dependent:
            return dependent[label].text(_WHAT[label], final=final, floor_field="slo.pass_confidence_floor")
        return j.text(_WHAT[label], final=final)
    xs = slo_samples(recs)
    window = busiest_window([r.scheduled_s for r in recs]) if t is not None and t.plan.mode == "open" else None
    bursts: dict[str, Any] = {}
    parts, problems, undecided = [], [], []
    checks = []
    for key, field_name, label in SLO_FIELDS:
        j = judged.get(label)
        if j is None:
            p95 = s[key]["p95"] if key != "itl_ms" else (percentile(xs[key], 95) if xs[key] else None)  # pooled
            shown = "n/a" if p95 is None else f"{p95:,.0f} ms"
            parts.append(f"{_WHAT[label]} p95 {shown} (no SLO)")
            checks.append(Verdict(f"{gate}.{label} p95", SKIP, f"no SLO for {label} p95 (slo.{field_name})",
                                  measured=p95, unit="ms"))
            continue
        text = said(label, j)
        if j.decision == C_FAIL and window is not None and window["burst"]:
            share = bursts[label] = burst_share(recs, window, _over_slo(recs, key, j.limit))
            if share["concentrated"]:
                text += f"; {_burst_text(window, share)}"
        (problems if j.decision == C_FAIL else undecided if j.decision == UNDECIDED else parts).append(
            said(label, j, final=False) if j.decision == UNDECIDED else text)
        checks.append(Verdict(f"{gate}.{label} p95", _STATUS[j.decision], said(label, j), measured=j.bound.point,
                              limit=j.limit, unit="ms",
                              evidence=dependent[label].to_dict() if label in dependent else j.to_dict()))
    rate = s["error_rate"]
    errs = f"errors {s['errors']}/{s['requests']} (max rate {slo.error_rate_max:g})"
    if slo.error_rate_max > 0:  # an allowance: judged on Clopper-Pearson bounds, not the point (F10)
        # the PASS side at the level it had before a false-alarm budget moved the FAIL side (errors_pass_level)
        ej = judge_errors(recs, slo, level, errors_pass_level(sampling.plan) if sampling is not None else up)
        (problems if ej.decision == C_FAIL else undecided if ej.decision == UNDECIDED else parts).append(
            ej.text("error rate", final=False) + (f" ({s['error_samples'][:2]})" if ej.decision == C_FAIL else ""))
        checks.append(Verdict(f"{gate}.error rate", _STATUS[ej.decision], ej.text("error rate"), measured=ej.rate,
                              limit=slo.error_rate_max, unit="ratio", evidence=ej.to_dict()))
    else:  # no allowance: any error FAILs, a measured fact
        if rate > slo.error_rate_max:
            problems.append(f"error rate {rate:.1%} > {slo.error_rate_max:.1%} ({s['error_samples'][:2]})")
        else:
            parts.append(errs)
        good = rate <= slo.error_rate_max
        checks.append(Verdict(f"{gate}.error rate", PASS if good else FAIL, f"error rate {rate:.1%}; max "
                              f"{slo.error_rate_max:.1%} -> {'PASS' if good else 'FAIL'}", measured=rate,
                              limit=slo.error_rate_max, unit="ratio"))
    what = f"{s['requests']} requests ({obs.prompt_tokens:,}+{obs.output_tokens} tokens) at concurrency {obs.concurrency}"
    ev = {"summary": s, "trace": obs.trace.to_dict(), "wall_s": obs.result.wall_s, "transport": obs.result.transport,
          "confidence": {label: (dependent[label].to_dict() if label in dependent else j.to_dict())
                         for label, j in judged.items()},
          "dependence": {label: dj.dependence.to_dict() for label, dj in dependent.items()},
          "multiplicity": _multiplicity(slo, level, up),
          "sampling": sampling.to_dict() if sampling is not None else _one_look(len(recs), level).to_dict(),
          "itl_basis": "pooled gaps across requests, as vllm bench serve (np.percentile over every gap); "
                       "bound: cluster bootstrap over waves (unit wave: slo.concurrency requests sent together, "
                       "send index // concurrency; ICC between requests in a wave and n_eff in confidence.ITL)",
          "host_contention": host_evidence(obs),
          "design": obs.extra}  # prompts one per request; the think before each send (kvgate.load.desync)
    tail = ""
    source_n = None
    if t is not None:
        what = replay_text(t, profile) + (f" ({s['requests']:,} sent)" if s["requests"] != len(t.plan.items) else "")
        ev["traffic"] = traffic_evidence(obs)
        ev["traffic"]["busiest_window"], ev["traffic"]["burst_share"] = window, bursts
        tail = _cache_text(ev["traffic"]["later_turns"])
        source_n = len(t.plan.items)
        if window is not None and window["burst"] and not problems:
            tail += (f"; the burst at {window['start_s']:.1f}-{window['end_s']:.1f} s ({window['requests']} requests, "
                     f"{window['mean_rps']:.1f} req/s mean) held the SLO")
    looks = sampling_text(sampling, source_n=source_n, floor_used=(floor_pass(ev) or {}).get("floor"))
    looks = f"; {looks}" if looks else ""
    order = (FAIL, Status.INCONCLUSIVE, PASS)
    lead = next((c for st in order for c in checks if c.status is st), checks[-1])
    shown = {"measured": lead.measured, "limit": lead.limit, "unit": lead.unit, "parts": tuple(checks)}
    if problems:
        return Verdict(gate, FAIL, f"{what}: " + "; ".join(problems + undecided + parts) + f"{tail}{looks} -> FAIL",
                       evidence=ev, **shown)
    if not judged:
        return Verdict(gate, SKIP, f"{what}: " + ", ".join(parts) + f"{tail}; profile sets no latency SLO", evidence=ev,
                       **shown)
    if undecided:
        short = ("; the traffic sample ran out before the percentiles were decided (replay more requests: "
                 "a larger sample or traffic.max_requests)" if sampling is not None and sampling.why_stopped == "source"
                 else "")
        undecided = [u.replace("-> undecided", "-> INCONCLUSIVE") for u in undecided]
        return Verdict(gate, Status.INCONCLUSIVE, f"{what}: " + "; ".join(undecided + parts) +
                       f"{tail}{looks}{short} -> INCONCLUSIVE", evidence=ev, **shown)
    return Verdict(gate, PASS, f"{what}: " + "; ".join(parts) + f"{tail}{looks} -> PASS", evidence=ev, **shown)


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
    """:func:`_interference_verdict`, then :func:`_on_contended_host` over both windows."""
    return _on_contended_host(_interference_verdict(alone, mixed, profile), [alone, mixed], profile)


def _interference_verdict(alone: LoadObservation, mixed: LoadObservation, profile: Profile) -> Verdict:
    """Short requests' TTFT p95 alone vs. while long prefills run; FAIL when the mixed p95 breaks
    ``slo.short_ttft_p95_ms`` with confidence (its lower order-statistic bound above the limit,
    :func:`kvgate.stats.confidence.judge` at the per-look level of ``mixed.sampling``; PASS needs the
    upper bound within it; undecided at the sampling cap -> INCONCLUSIVE), or short requests
    fail, and -- whatever the SLO -- when short requests consistently get their first token only
    after the long requests they queued behind completed (:func:`head_of_line`: at least
    ``HOL_SHARE`` of at least ``HOL_MIN_JUDGED`` judged shorts). The alone p95 is context (not
    judged). The message says which workload suffers and by how much -- the measurement behind
    splitting short and long pools.

    The samples are short requests, sent in waves of ``shorts_per_wave`` at random offsets across
    the long prefill window (:func:`kvgate.load.scenarios.run_interference`); the shorts of one
    wave queue behind the same long prefills, so the bound is taken at the effective n of the
    waves (:func:`kvgate.load.scenarios.interference_judgement`: the ICC within waves by one-way
    ANOVA, Kish's ``n / (1 + (m - 1) ICC)``), stated with its unit in the message and the evidence
    (``dependence``). Too few effective samples for a PASS at its level: INCONCLUSIVE naming the
    shorts that would decide and the confidence these give -- or, at the last look, a PASS at
    ``slo.pass_confidence_floor`` when the profile declares one, saying so."""
    gate = "latency/interference"
    if (refused := overlong_verdict(gate, mixed)) is not None:
        return refused
    for obs in (alone, mixed):
        inv = _invalid(obs, gate, profile.limits.schedule_lag_max_s, profile)
        if inv:
            return inv
    shorts = [r for r in mixed.result.records if r.tag == "short"]
    a = summarize([r for r in alone.result.records if r.tag == "short"])
    m = summarize(shorts)
    lm = summarize([r for r in mixed.result.records if r.tag == "long"])
    pa, pm = a["ttft_ms"]["p95"], m["ttft_ms"]["p95"]
    limit = profile.slo.short_ttft_p95_ms
    ex = mixed.extra or {}
    ratio = (pm / pa) if pa and pm else None
    what = (f"short-request TTFT p95 {pa:,.0f} ms alone, {pm:,.0f} ms while {ex.get('long_per_wave')} long "
            f"{ex.get('long_prompt_tokens', 0):,}-token prefills run ({ratio:.1f}x)") if pa and pm else \
        f"short-request TTFT p95 alone {pa}, mixed {pm}"
    sampling = mixed.sampling
    level = (sampling.plan.per_look if sampling is not None
             else profile.verdicts.fail_confidence(profile.slo.confidence))
    up = sampling.plan.pass_level if sampling is not None else profile.slo.confidence
    # judged at the effective n of the waves (ICC within waves), as the sampling loop judged it; the
    # profile's lower PASS level only once sampling is over (cap, time bound, one fixed run)
    at_end = (sampling is None or sampling.why_stopped in ("cap", "time", "source")
              or sampling.n >= sampling.plan.looks[-1])
    dj = (interference_judgement(mixed.result.records, ex.get("short_waves"), limit, level, up,
                                 profile.slo.pass_confidence_floor, at_end) if limit is not None else None)
    j = dj.judgement if dj is not None else None
    ev: dict[str, Any] = {"short_alone": a, "short_mixed": m, "long_mixed": lm, "mixed_plan": ex,
                          "trace_mixed": mixed.trace.to_dict(),
                          "short_ttft_p95_ms": {"alone": pa, "mixed": pm, "ratio": ratio},
                          "confidence": dj.to_dict() if dj is not None else None,
                          "dependence": dj.dependence.to_dict() if dj is not None else None,
                          "sampling": (sampling.to_dict() if sampling is not None else
                                       _one_look(len(shorts), level).to_dict()),
                          "host_contention": host_evidence(alone, mixed)}
    if mixed.traffic is not None:
        what = f"{what}; {replay_text(mixed.traffic, profile, how='prompt lengths sent in the waves')}"
        ev["traffic"] = traffic_evidence(mixed)
    waves = ex.get("waves")
    looks = sampling_text(sampling, unit="short requests", cap_field=None,
                          floor_used=dj.floor if dj is not None and dj.decision == C_PASS else None)
    looks = (f"; {waves} waves of {ex.get('shorts_per_wave', '?')} short requests, {looks}" if looks and waves
             else f"; {looks}" if looks else "")
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
    ttft = (dj.text("short-request TTFT while long prefills run", final=not problems,
                    floor_field="slo.pass_confidence_floor") if dj is not None else "")
    if j is not None and j.decision == C_FAIL:  # the SLO clause only on a shown FAIL, never on a point (F13)
        problems.append(f"{ttft}: short-request SLO {limit:,.0f} ms broken, the short workload suffers, "
                        f"{(pm or 0) - (pa or 0):,.0f} ms added by long prefills (split short/long pools or "
                        "limit max_num_batched_tokens)")
    if problems:
        return Verdict(gate, FAIL, f"{what}; " + "; ".join(problems) + f"{looks} -> FAIL", measured=measured,
                       limit=limit, unit="ms", evidence=ev)
    if pm is None and limit is not None:  # no short TTFT and nothing failed: nothing measured, no verdict (F13)
        return Verdict(gate, Status.INVALID, f"{what}; no short request got a first token ({m['requests']} sent, "
                       f"{m['errors']} failed): the short workload was not measured -> INVALID", measured=None,
                       limit=limit, unit="ms", evidence=ev)
    hol_s = (f"; no head-of-line blocking ({hol['blocked']} of {hol['judged']} short requests got their first token "
             "only after a long request queued ahead of them completed)" if hol["judged"] else "")
    if j is None:
        return Verdict(gate, SKIP, f"{what}{hol_s}; profile sets no slo.short_ttft_p95_ms", measured=measured,
                       unit="ms", evidence=ev)
    if j.decision == UNDECIDED:
        return Verdict(gate, Status.INCONCLUSIVE, f"{what}; {ttft}{hol_s}{looks} -> INCONCLUSIVE", measured=measured,
                       limit=limit, unit="ms", evidence=ev)
    return Verdict(gate, PASS, f"{what}; {ttft}{hol_s}{looks} -> PASS", measured=measured, limit=limit, unit="ms",
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

