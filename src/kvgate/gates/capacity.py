"""Pure verdict of the capacity gate (``capacity/knee``): how far the deployment is from breaking
its SLO -- the *knee*, the most concurrent requests that still meet the TTFT/ITL/e2e p95 SLO --
against the peak it must carry (``slo.peak_concurrency``) times ``capacity.margin``.

**Each step** (:func:`judge_step`, from a :class:`~kvgate.load.scenarios.LoadObservation` of
:func:`kvgate.load.capacity.run_step`): TTFT, ITL and e2e p95 are judged with confidence
(:func:`kvgate.stats.confidence.judge` at ``slo.confidence``; one look per step): the step meets the SLO
(PASS) only when every limited percentile's upper bound is within its limit and the error rate
within ``slo.error_rate_max`` (an allowance above 0: its Clopper-Pearson upper bound within, failed
requests counted as exceedances in TTFT and e2e; 0: no error at all); FAIL when a lower bound is
above its limit or the error rate is shown over; otherwise UNDECIDED -- the knee is the last step *shown* to meet it, and an undecided step
at or below the need gives INCONCLUSIVE naming its bounds (not FAIL: nothing showed it misses). A step whose client fell behind is INVALID (:func:`step_invalid`:
the place for further rules that make a step's measurement untrustworthy, e.g. a contended host).
A step is a closed loop at its concurrency, judged as latency/slo judges its own (issue 48: lock-step
waves had wrong PASS 49% / wrong FAIL 24% at the limit when judged as independent requests): TTFT and
e2e at the effective n of the requests in send order
(:func:`kvgate.load.scenarios.latency_judgements`, lag-1..concurrency autocorrelation; a step whose
effective n is too small to PASS is UNDECIDED, its text naming the n that would decide; a PASS at
``slo.pass_confidence_floor`` only at the step's last look, stated); the FAIL side corrected over
the SLO'd metrics (:func:`kvgate.load.sampling.slo_levels`).
ITL p95 is the pooled-gap p95 (as ``vllm bench serve``), its bounds from a cluster bootstrap over
the step's waves (send index // concurrency; :func:`kvgate.stats.cluster.judge_pooled`).
Each step's metrics state their unit, dependence and effective n (evidence and message).

Besides: goodput (requests per second that met every SLO by themselves: TTFT <= limit, e2e <=
limit, the request's own TPOT -- its mean gap -- <= the ITL limit), throughput (requests/s, output tokens/s, over the
step's wall time), and the scheduler gauges (peak running and waiting, preemptions, peak KV usage).

**The knee** (:func:`knee_of`): the highest concurrency that PASSed with every lower step
PASSing too. A wrong knee needs the first step past the true knee to PASS wrongly: at most
``1 - slo.confidence`` per metric, as for the latency gate (the knee ends at the first step that
is not a PASS; the search goes on past an UNDECIDED step until one is shown to miss,
:func:`kvgate.load.capacity.search`).

**The verdict** (:func:`capacity_verdict`): ``need = ceil(slo.peak_concurrency x capacity.margin)``
(a step of the search when at least its first); PASS when the knee >= need; FAIL when a step at or
below need is FAIL (shown to miss the SLO) -- naming the knee, the first failing step and its
limiting cause from the gauges (:func:`limiting_causes`); INCONCLUSIVE when the first step at or
below need that is not a PASS is UNDECIDED, naming its bounds (three outcomes per step: the knee
search is an intersection-union test on the PASS side, no correction across steps). INVALID when
the step that decided it was INVALID, INCONCLUSIVE when the search ran out of time before reaching
need or need lies between the knee and the first step not met without being measured (steps judged
again for another peak: the search itself always measures need when it is >= the first step). No
declared peak: SKIP (nothing was gated), the knee in the message. Both compare the knee
with ``max_num_seqs`` and with the full-length sequences the fit arithmetic says the KV pool holds
(:func:`kvgate.gates.fit.plan`, ``pool.sequences_at_once``).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from kvgate.stats.confidence import FAIL as C_FAIL, PASS as C_PASS, UNDECIDED, min_samples_to_pass
from kvgate.load.sampling import error_rate, slo_levels, slo_samples
from kvgate.stats.proportion import judge_at_most
from kvgate.stats.cluster import judge_pooled
from kvgate.stats.dependence import Dependence
from kvgate.load.scenarios import LoadObservation, ScenarioError, latency_judgements, short_workload
from kvgate.profile.models import Profile
from kvgate.stats import percentile, request_metrics
from kvgate.verdict import Status, Verdict
from kvgate.gates.load import contended

GATE = "capacity/knee"
#: The percentile the SLO limits are (``slo.*_p95_ms``).
Q = 0.95
#: (label, the profile's ``slo`` field) of the judged percentiles.
METRICS = (("TTFT", "ttft_p95_ms"), ("ITL", "itl_p95_ms"), ("e2e", "e2e_p95_ms"))
#: KV usage (fraction) from which the pool counts as full.
KV_FULL = 0.95
#: A knee below this share of the full-length sequences the KV pool holds is "far below" it.
FAR_BELOW = 0.5
INVALID = "INVALID"


@dataclass
class StepResult:
    """One search step, judged (plain data: survives summary.json and comes back with
    :meth:`from_dict`). Times in ms, rates per second; ``metrics``: label -> the
    :meth:`kvgate.stats.confidence.Judgement.to_dict` plus ``text`` (limited) or ``{"point", "n"}``
    (no limit); ``decision``: PASS / FAIL / UNDECIDED / INVALID; gauges None without /metrics."""

    concurrency: int
    requests: int
    ok: int
    errors: int
    wall_s: float
    decision: str
    metrics: dict[str, dict[str, Any]]
    throughput_rps: float
    output_tokens_per_s: float
    goodput_rps: float
    good: int
    peak_running: float | None = None
    peak_waiting: float | None = None
    preemptions: float | None = None
    peak_kv_usage: float | None = None
    deadline_hit: bool = False
    invalid: str | None = None
    phase: str = "ladder"
    error_samples: list[str] = field(default_factory=list)
    #: The step's host contention (:meth:`kvgate.host.contention.HostContention.to_dict`: the share
    #: other processes took of the server's CPUs, or ``measured: false`` with the reason), or None
    #: when no sampler ran with it. signoff.md's host-contention row reads it with the latency windows'.
    host_contention: dict[str, Any] | None = None

    def p95(self, label: str) -> float | None:
        return (self.metrics.get(label) or {}).get("point")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepResult":
        return cls(**d)

    def row(self) -> dict[str, Any]:
        """The step as one CSV row (capacity-steps.csv)."""
        out: dict[str, Any] = {"concurrency": self.concurrency, "phase": self.phase, "decision": self.decision,
                               "requests": self.requests, "ok": self.ok, "errors": self.errors,
                               "wall_s": round(self.wall_s, 3), "throughput_rps": round(self.throughput_rps, 3),
                               "output_tokens_per_s": round(self.output_tokens_per_s, 1),
                               "goodput_rps": round(self.goodput_rps, 3), "good": self.good}
        for label, _ in METRICS:
            m = self.metrics.get(label) or {}
            for k in ("point", "lower", "upper", "limit"):
                v = m.get(k)
                out[f"{label.lower()}_p95_{k}_ms" if k != "point" else f"{label.lower()}_p95_ms"] = \
                    None if v is None else round(v, 1)
            out[f"{label.lower()}_decision"] = m.get("decision", "")
        out.update({"peak_running": self.peak_running, "peak_waiting": self.peak_waiting,
                    "preemptions": self.preemptions, "peak_kv_usage": self.peak_kv_usage,
                    "deadline_hit": self.deadline_hit, "invalid": self.invalid or ""})
        return out


def not_applicable(profile: Profile) -> Verdict | None:
    """SKIP when the profile sets no TTFT/ITL/e2e p95 limit (no SLO to search against) or declares
    no short workload to load with; None when the gate applies."""
    if all(getattr(profile.slo, f) is None for _, f in METRICS):
        return Verdict(GATE, Status.SKIP, "profile sets no latency SLO (slo.ttft_p95_ms, slo.itl_p95_ms, "
                       "slo.e2e_p95_ms): no knee to search for -> SKIP")
    try:
        short_workload(profile)
    except ScenarioError as exc:
        return Verdict(GATE, Status.SKIP, f"{exc}: nothing to load the capacity search with -> SKIP")
    return None


def need_of(profile: Profile) -> int | None:
    """The concurrency the knee must reach: ``ceil(slo.peak_concurrency x capacity.margin)``
    (requests), None without a declared peak."""
    peak = profile.slo.peak_concurrency
    return None if peak is None else math.ceil(peak * profile.capacity.margin - 1e-9)


def min_samples(profile: Profile) -> int:
    """The fewest samples with which a p95 can PASS at ``slo.confidence`` (59 at 95%)."""
    return min_samples_to_pass(Q, profile.slo.confidence)


def step_invalid(obs: LoadObservation, profile: Profile) -> str | None:
    """Why a step's measurement cannot be trusted, or None: the client fell behind its schedule
    (:meth:`kvgate.load.LoadResult.invalid_verdict`, ``limits.schedule_lag_max_s``). Further
    rules: a step on a contended host that did not PASS is INVALID (:func:`judge_step`,
    :func:`kvgate.gates.load.contended`)."""
    v = obs.result.invalid_verdict(GATE, profile.limits.schedule_lag_max_s)
    return None if v is None else v.message.removesuffix(" -> INVALID")


def _step_metrics(recs: Sequence[Any], slo: Any, conf: float, up: float | None, concurrency: int,
                  at_end: bool = False, fail_worst: bool = False) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each SLO'd metric of a step's records judged at ``conf`` (the PASS side at ``up`` when given),
    as latency/slo judges its closed loop (issue 48: a step is the same closed loop at the step's
    ``concurrency``): TTFT and e2e at the effective n of the requests in send order
    (:func:`kvgate.load.scenarios.latency_judgements`: lag-1..``concurrency`` autocorrelation beyond
    its noise allowance, failed requests as exceedances under an error allowance, the profile's
    ``slo.pass_confidence_floor`` only ``at_end``); ITL the pooled-gap p95 (vllm bench serve) with a
    cluster bootstrap over the loop's waves (send index // ``concurrency``). The FAIL side is
    corrected over the SLO'd metrics (:func:`kvgate.load.sampling.slo_levels`), as latency/slo's.
    Returns (label -> the judgement's dict with its text -- TTFT/e2e with ``dependence``: unit,
    measure, n_eff --, the decisions of the SLO'd metrics). ``fail_worst`` (a run with a false-alarm
    budget): TTFT/e2e's FAIL side at one value per ``concurrency`` requests."""
    c = max(1, int(concurrency or 1))
    per = slo_samples(recs, slo)
    fail_level, pass_level = slo_levels(slo, conf, up)
    dependent = latency_judgements(recs, slo, conf, up, c, at_end, fail_worst)
    metrics: dict[str, dict[str, Any]] = {}
    decisions = []
    for label, fname in METRICS:
        limit = getattr(slo, fname)
        if limit is None:
            xs = per["itl_ms"] if label == "ITL" else per["ttft_ms" if label == "TTFT" else "e2e_ms"]
            metrics[label] = {"point": percentile(xs, Q * 100) if xs else None, "n": len(xs), "limit": None}
            continue
        if label == "ITL":
            pj = judge_pooled(per["itl_gaps_s"], Q, limit, fail_level, pass_level, rng=0, scale=1e3,
                              waves=[i // c for i in per["itl_index"]])
            metrics[label] = {**pj.to_dict(), "text": pj.text(label, final=False)}
            decisions.append(pj.decision)
        else:
            dj = dependent[label]
            metrics[label] = {**dj.to_dict(), "text": dj.text(label, final=False,
                                                              floor_field="slo.pass_confidence_floor")}
            decisions.append(dj.decision)
    return metrics, decisions


def step_decisions(records: Sequence[Any], profile: Profile, level: float, pass_level: float | None, *,
                   concurrency: int) -> dict[str, str]:
    """A step's decisions at one planned look (:func:`kvgate.load.capacity.run_step`'s ``decide``):
    each SLO'd metric's at ``level`` (PASS side at ``pass_level``; TTFT/e2e at the effective n of the
    step's closed loop at ``concurrency``, ITL over its waves) and ``errors`` (the server's errors,
    censored records left out; PASS while none is judged) -- the numbers :func:`judge_step` judges
    at the same look's level, so the step's sampling never stops on what its verdict reads
    otherwise (the profile's ``slo.pass_confidence_floor`` is for the last look only, where the
    sampling stops anyway)."""
    metrics, _ = _step_metrics(records, profile.slo, level, pass_level, concurrency,
                               fail_worst=profile.verdicts.raises(profile.slo.confidence))
    out = {label: m["decision"] for label, m in metrics.items() if m.get("limit") is not None}
    errors, judged = error_rate(records)
    out["errors"] = judge_at_most(errors, judged, profile.slo.error_rate_max, level).decision if judged else C_PASS
    return out


def judge_step(obs: LoadObservation, profile: Profile, phase: str = "ladder") -> StepResult:
    """Judge one step (see the module docstring): the percentiles with confidence, errors,
    goodput, throughput and the gauges. A step sampled in planned looks (``obs.sampling``,
    :func:`kvgate.load.capacity.run_step` with ``decide``) is judged at its plan's per-look level
    (PASS side at the plan's PASS level), as its looks were; else at ``slo.confidence``."""
    slo = profile.slo
    sampling = getattr(obs, "sampling", None)
    conf = sampling.plan.per_look if sampling is not None else profile.verdicts.fail_confidence(slo.confidence)
    up = sampling.plan.pass_level if sampling is not None else slo.confidence
    recs = obs.result.records
    ms = [(r, request_metrics(r)) for r in recs]
    good_recs = [(r, m) for r, m in ms if r.ok]
    # the floor PASS (slo.pass_confidence_floor) only at the step's last look, as latency/slo
    at_end = (sampling is None or sampling.why_stopped in ("cap", "time", "source")
              or sampling.n >= sampling.plan.looks[-1])
    metrics, decisions = _step_metrics(recs, slo, conf, up, obs.concurrency, at_end,
                                       profile.verdicts.raises(profile.slo.confidence))
    n = len(recs)
    # the server's errors (RequestRecord.failed): a request cut by kvgate's own deadline (the step's time
    # bound) is censored, not an error, and is left out of the rate's denominator (load.sampling.error_rate)
    errors, judged = error_rate(recs)
    wall = obs.result.wall_s or 0.0

    def met(m: Any) -> bool:
        if slo.ttft_p95_ms is not None and (m.ttft_s is None or m.ttft_s * 1e3 > slo.ttft_p95_ms):
            return False
        if slo.e2e_p95_ms is not None and (m.e2e_s is None or m.e2e_s * 1e3 > slo.e2e_p95_ms):
            return False
        if slo.itl_p95_ms is not None and m.tpot_s is not None and m.tpot_s * 1e3 > slo.itl_p95_ms:
            return False  # per request: its TPOT (mean gap), as vllm bench serve's goodput reads "tpot"
        return True

    good = sum(1 for _, m in good_recs if met(m))
    tokens = sum(m.tokens or 0 for _, m in good_recs)
    invalid = step_invalid(obs, profile)
    # the error rate on its Clopper-Pearson bounds when an allowance is set; 0: any error FAILs (F10)
    errs = judge_at_most(errors, judged, slo.error_rate_max, conf) if judged else None
    if errs is not None and not errs.exact:
        metrics["errors"] = {**errs.to_dict(), "text": errs.text("error rate", final=False)}
    if invalid is not None:
        decision = INVALID
    elif n == 0 or (errs is not None and errs.decision == C_FAIL) or C_FAIL in decisions:
        decision = C_FAIL
    elif decisions and all(d == C_PASS for d in decisions) and errs is not None and errs.decision == C_PASS:
        decision = C_PASS
    else:
        decision = UNDECIDED
    if decision in (C_FAIL, UNDECIDED) and (busy := contended(obs, GATE, profile)) is not None:
        # a contended host can only have slowed the server: its PASS stands, its FAIL is no measurement
        invalid, decision = busy.message.split(" -> INVALID")[0], INVALID
    tr = obs.trace
    return StepResult(
        concurrency=obs.concurrency, requests=n, ok=len(good_recs), errors=errors, wall_s=wall, decision=decision,
        metrics=metrics, throughput_rps=len(good_recs) / wall if wall else 0.0,
        output_tokens_per_s=tokens / wall if wall else 0.0, goodput_rps=good / wall if wall else 0.0, good=good,
        peak_running=tr.peak("running"), peak_waiting=tr.peak("waiting"), preemptions=tr.delta("preemptions"),
        peak_kv_usage=tr.peak("kv_usage"), deadline_hit=obs.result.deadline_hit, invalid=invalid, phase=phase,
        error_samples=[str(r.error or r.status)[:120] for r, _ in ms if r.failed][:3],
        host_contention=tr.host.to_dict() if getattr(tr, "host", None) is not None else None)


def knee_of(steps: Sequence[StepResult]) -> tuple[int, StepResult | None]:
    """``(knee, first step not meeting the SLO)``: the knee is the highest concurrency that PASSed
    below every step that did not (0 when the lowest did not); the step is None when all PASSed."""
    ordered = sorted(steps, key=lambda s: s.concurrency)
    first_bad = next((s for s in ordered if s.decision != C_PASS), None)
    passed = [s.concurrency for s in ordered if s.decision == C_PASS
              and (first_bad is None or s.concurrency < first_bad.concurrency)]
    return (max(passed) if passed else 0), first_bad


def fit_capacity(profile: Profile) -> tuple[int | None, int | None, int | None, str]:
    """``(max_num_seqs, full-length sequences the KV pool holds, SLO-workload sequences it holds,
    max_model_len)`` from the fit arithmetic (:func:`kvgate.gates.fit.plan`); None where the
    arithmetic cannot say (no architecture, llama.cpp). The last item is why, or ``""``."""
    from kvgate.gates.fit import plan

    try:
        p = plan(profile)
    except Exception as exc:  # a profile the arithmetic cannot size: the knee stands alone (fit/kv-pool may not run)
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        return profile.engine.max_num_seqs, None, None, f"the fit arithmetic cannot size the KV pool ({why})"
    if p.pool is None:
        return p.max_num_seqs, None, None, "no vLLM KV pool (llama.cpp)"
    try:
        _, wl = short_workload(profile)
        per_wl = p.pool.sequences_of(min(wl.prompt_tokens + wl.output_tokens, p.max_model_len))
    except ScenarioError:
        per_wl = None
    return p.max_num_seqs, p.pool.sequences_at_once, per_wl, ""


def limiting_causes(step: StepResult, ref: StepResult | None, max_num_seqs: int | None) -> list[str]:
    """What the gauges say limits ``step`` (the first step not meeting the SLO), most specific
    first: queueing (requests waiting, running at ``max_num_seqs``), preemptions, a full KV pool
    (usage >= :data:`KV_FULL`), prefill interference (TTFT over its limit while no request waited:
    new prefills share the engine's steps with the running decodes), decode slowdown (ITL or e2e
    over with TTFT within and nothing waiting), errors. ``ref``: the step at the knee (the last
    that met the SLO), whose TTFT p95 the message compares with. Never empty."""
    causes = []
    run, wait = step.peak_running, step.peak_waiting
    if wait and wait > 0 and run is not None and max_num_seqs and run >= max_num_seqs:
        causes.append(f"queueing: up to {wait:.0f} requests waiting with running at max_num_seqs {max_num_seqs}")
    elif wait and wait > 0:
        causes.append(f"queueing: up to {wait:.0f} requests waiting (running peaked at "
                      f"{'n/a' if run is None else f'{run:.0f}'}, max_num_seqs {max_num_seqs or 'not known'})")
    if step.preemptions:
        causes.append(f"preemptions: {step.preemptions:.0f} (the KV pool ran out and running requests were evicted)")
    if step.peak_kv_usage is not None and step.peak_kv_usage >= KV_FULL:
        causes.append(f"KV cache usage peaked at {step.peak_kv_usage:.0%}")
    failed = {label for label, m in step.metrics.items() if m.get("limit") is not None and m.get("decision") != C_PASS}
    nothing_waits = run is not None and not wait and (not max_num_seqs or run < max_num_seqs)
    if nothing_waits and not causes and failed:
        below = (f"running peaked at {run:.0f}, below max_num_seqs {max_num_seqs}" if max_num_seqs else
                 f"running peaked at {run:.0f}; max_num_seqs not known")
        t0, t1 = (ref.p95("TTFT") if ref else None), step.p95("TTFT")
        rise = f"TTFT p95 {t0:,.0f} ms at concurrency {ref.concurrency} -> {t1:,.0f} ms at {step.concurrency}" \
            if t0 is not None and t1 is not None and ref is not None else f"TTFT p95 over its limit at {step.concurrency}"
        if "TTFT" in failed:
            causes.append(f"prefill interference: {rise} with no request waiting ({below})")
        else:
            which = "/".join(sorted(failed))
            causes.append(f"decode slowdown: {which} p95 over the SLO with TTFT within it and no request waiting "
                          f"({below}): each engine step of the larger batch takes longer")
    if step.errors:
        causes.append(f"errors: {step.errors}/{step.requests} requests failed ({'; '.join(step.error_samples[:2])})")
    if step.invalid:
        causes.append(f"measurement INVALID: {step.invalid}")
    if not causes:
        causes.append("/metrics gave no scheduler gauges: the cause is not known" if run is None and wait is None
                      else "no queueing, preemption or KV pressure in the gauges")
    return causes


def _step_text(s: StepResult) -> str:
    bits = [m["text"] for m in s.metrics.values() if m.get("text")]
    if s.errors:
        bits.append(f"{s.errors}/{s.requests} failed")
    return "; ".join(bits)


def _failing_text(s: StepResult) -> str:
    """The clauses that kept a step from meeting the SLO (FAIL or undecided ones; all when none)."""
    bad = [m["text"] for m in s.metrics.values() if m.get("text") and m.get("decision") != C_PASS]
    if s.errors:
        bad.append(f"{s.errors}/{s.requests} requests failed")
    if s.decision == UNDECIDED:
        bad.append("undecided at the step's sample size: not shown to meet the SLO (nor to miss it)")
    return "; ".join(bad) or _step_text(s)


def dependence_text(s: StepResult) -> str:
    """What a step's limited metrics were worth (unit, dependence measured, effective n):
    ``TTFT: 72 requests, lag-1..4 autocorrelation in send order: sum 0.05 (0.00 beyond noise):
    effective n 72.0; ITL: unit wave (send index // 4), ICC 0.10 ...`` -- "" when none is judged."""
    bits = []
    for label, m in s.metrics.items():
        if m.get("limit") is None or label == "errors":
            continue
        d = m.get("dependence")
        dep = Dependence.from_dict(d) if isinstance(d, dict) else None
        if dep is not None:
            bits.append(f"{label}: {dep.text()}")
        elif label == "ITL":
            icc = m.get("icc")
            neff = m.get("n_eff_gaps")
            bits.append(f"ITL: {m.get('n', '?')} {m.get('unit', 'wave')}s (send index // {s.concurrency}), "
                        "cluster bootstrap"
                        + (f", ICC {icc:.2f}" if isinstance(icc, (int, float)) else "")
                        + (f", effective n {neff:,.0f} gaps" if isinstance(neff, (int, float)) else ""))
    return "; ".join(bits)


def _undecided_text(s: StepResult | None) -> str:
    """The bounds of an undecided step's open metrics (``TTFT p95 ..., 95% bounds 700..1,400 ms ...``)
    and an error rate still open."""
    if s is None:
        return "not measured"
    bits = [m["text"] for m in s.metrics.values() if m.get("text") and m.get("decision") == UNDECIDED]
    if s.errors:
        bits.append(f"{s.errors}/{s.requests} requests failed")
    return "; ".join(bits) or _step_text(s)


def capacity_verdict(steps: Sequence[StepResult], profile: Profile, search: dict[str, Any] | None = None) -> Verdict:
    """The gate's verdict on the judged ``steps`` of one search (``search``: the
    :meth:`kvgate.load.capacity.Search.to_dict`, for the stop reason and the seconds). ``measured``:
    the knee (requests); ``limit``: ``need`` (:func:`need_of`); part ``capacity/knee.supported peak``:
    ``floor(knee / margin)``, the largest ``slo.peak_concurrency`` this knee carries (what record
    mode writes)."""
    search = search or {}
    skip = not_applicable(profile)
    if skip is not None:
        return skip
    need = need_of(profile)
    margin = profile.capacity.margin
    knee, bad = knee_of(steps)
    if search.get("why_stopped") == "interrupted":
        done = ", ".join(f"{s.concurrency} {s.decision}" for s in steps) or "none"
        return Verdict(GATE, Status.INCOMPLETE,
                       f"the capacity search was interrupted after {len(steps)} finished step(s) (concurrency: {done}"
                       + (f"; the knee so far {knee}" if steps else "") + "); the finished steps are in "
                       "capacity-steps.csv and capacity.png -> INCOMPLETE (a search cut short is never a verdict)",
                       measured=knee if steps else None, limit=need, unit="requests",
                       evidence={"steps": [s.to_dict() for s in steps], "search": search})
    ordered = sorted(steps, key=lambda s: s.concurrency)
    at_knee = next((s for s in ordered if s.concurrency == knee), None)
    mns, full_seqs, wl_seqs, why_no_fit = fit_capacity(profile)
    try:
        wname, wl = short_workload(profile)
        shape = f"{wname} {wl.prompt_tokens:,}+{wl.output_tokens} tokens"
    except ScenarioError:
        shape = "the SLO workload"
    why = search.get("why_stopped", "")
    ladder = ", ".join(str(s.concurrency) for s in steps)
    wall = search.get("wall_s")
    head = (f"knee {knee} concurrent requests ({shape}; steps {ladder}"
            + (f" in {wall:.0f} s" if isinstance(wall, (int, float)) else "") + ")")
    if bad is None:
        head += f"; every step met the SLO up to the search cap {knee}: the knee is at least that"
    elif bad.decision == INVALID:  # not shown to miss the SLO either: what it measured is no verdict
        measured = _failing_text(bad).replace(" -> FAIL", ": would have been FAIL").replace(
            " -> undecided", ": would have been undecided")
        head += (f"; first step not shown to meet the SLO: concurrency {bad.concurrency} (INVALID, its measurement "
                 f"not trusted: see the cause below; as measured: {measured})")
    else:
        head += (f"; first step not meeting the SLO: concurrency {bad.concurrency} ({bad.decision}: "
                 f"{_failing_text(bad)})")
    shown = next((s for s in ordered if s.decision == C_FAIL), None)
    if shown is not None and bad is not None and shown is not bad:  # the search went on past an undecided step
        head += f"; first step shown to miss it: concurrency {shown.concurrency} (FAIL: {_failing_text(shown)})"
    if at_knee is not None and (deps := dependence_text(at_knee)):
        head += f"; at the knee judged at the effective n of its closed loop ({deps})"
    if at_knee is not None:
        head += (f"; at the knee goodput {at_knee.goodput_rps:.2f} req/s, throughput {at_knee.throughput_rps:.2f} req/s "
                 f"({at_knee.output_tokens_per_s:,.0f} output tokens/s)")
    causes = limiting_causes(bad, at_knee, mns) if bad is not None else []
    compare = []
    if mns:
        compare.append(f"max_num_seqs {mns}" + (" (the knee is past it: requests beyond it wait, and the SLO still "
                                                 "holds)" if knee > mns else ""))
    if full_seqs is not None:
        compare.append(f"the KV pool holds {full_seqs} full-length ({profile.engine.max_model_len:,}-token) sequences"
                       + (f", {wl_seqs:,} of the SLO workload's length" if wl_seqs else ""))
        if bad is not None and knee < FAR_BELOW * full_seqs:
            compare.append(f"the knee is far below what the KV pool holds: limited by {causes[0].split(':')[0]}")
    elif why_no_fit:
        compare.append(why_no_fit)
    if causes:
        head += "; limiting cause: " + "; ".join(causes)
    if compare:
        head += "; " + "; ".join(compare)
    supported = math.floor(knee / margin + 1e-9)
    ev = {"steps": [s.to_dict() for s in steps], "search": search, "knee": knee, "need": need, "margin": margin,
          "peak_concurrency": profile.slo.peak_concurrency, "supported_peak": supported,
          "first_not_met": bad.concurrency if bad else None, "first_failed": shown.concurrency if shown else None,
          "causes": causes, "max_num_seqs": mns,
          "kv_pool_full_length_sequences": full_seqs, "kv_pool_workload_sequences": wl_seqs,
          "confidence": profile.slo.confidence,
          "dependence": {str(s.concurrency): {label: m["dependence"] for label, m in s.metrics.items()
                                              if isinstance(m.get("dependence"), dict)} for s in steps},
          "note": "the knee is the last step shown to meet the SLO below the first that was not; an undecided step "
          "ends the knee, not the search (first_failed: the first step shown to miss); TTFT/e2e judged per request at "
          "the effective n of the step's closed loop (lag-1..concurrency autocorrelation in send order, as latency/slo); "
          "ITL p95 over pooled gaps (vllm bench serve), bound by a cluster bootstrap over the step's waves "
          "(send index // concurrency)"}
    if need is None:
        part = Verdict(f"{GATE}.supported peak", Status.SKIP, f"knee {knee} / margin {margin:g} = {supported}; "
                       "no slo.peak_concurrency declared", measured=supported, unit="requests")
        return Verdict(GATE, Status.SKIP, f"{head}; profile declares no slo.peak_concurrency: nothing gated "
                       f"(a peak up to {supported} would pass at margin {margin:g}) -> SKIP", measured=knee,
                       unit="requests", evidence=ev, parts=(part,))
    decided = next((s for s in ordered if s.concurrency <= need and s.decision != C_PASS), None)
    failed = next((s for s in ordered if s.concurrency <= need and s.decision == C_FAIL), None)
    if knee >= need:
        status, tail = Status.PASS, (f"declared peak {profile.slo.peak_concurrency} x margin {margin:g} = {need} <= "
                                     f"knee {knee} -> PASS")
    elif decided is None and why == "time":
        status, tail = Status.INCONCLUSIVE, (
            f"the search ran out of time (capacity.max_duration_s {profile.capacity.max_duration_s:g} s) before "
            f"reaching the declared peak {profile.slo.peak_concurrency} x margin {margin:g} = {need} -> INCONCLUSIVE")
    elif decided is None and bad is not None and bad.decision == INVALID:
        status, tail = Status.INVALID, (f"step {bad.concurrency} cannot be trusted ({bad.invalid}); the declared "
                                        f"peak x margin = {need} was not judged -> INVALID")
    elif decided is None and bad is not None:  # need lies between the knee and the first step not met
        status, tail = Status.INCONCLUSIVE, (
            f"the declared peak {profile.slo.peak_concurrency} x margin {margin:g} = {need} lies between the knee "
            f"{knee} and the first step not meeting the SLO ({bad.concurrency}) and was not measured -> INCONCLUSIVE")
    elif failed is not None:  # a step at or below need shown to miss the SLO: need cannot be carried either
        status, tail = Status.FAIL, (f"declared peak {profile.slo.peak_concurrency} x margin {margin:g} = {need} > "
                                     f"knee {knee} -> FAIL")
    elif decided is not None and decided.decision == INVALID:
        status, tail = Status.INVALID, (f"step {decided.concurrency} cannot be trusted ({decided.invalid}); the "
                                        f"declared peak x margin = {need} was not judged -> INVALID")
    else:  # UNDECIDED at or below need: its bounds straddle the limit -- neither shown to meet nor to miss it
        status, tail = Status.INCONCLUSIVE, (
            f"declared peak {profile.slo.peak_concurrency} x margin {margin:g} = {need}: step "
            f"{decided.concurrency if decided else '?'} is undecided ({_undecided_text(decided)}), neither shown to "
            f"meet the SLO nor to miss it -> INCONCLUSIVE")
    part = Verdict(f"{GATE}.supported peak", Status.PASS if status is Status.PASS else status,
                   f"knee {knee} / margin {margin:g} = {supported}; declared {profile.slo.peak_concurrency}",
                   measured=supported, limit=profile.slo.peak_concurrency, unit="requests")
    return Verdict(GATE, status, f"{head}; {tail}", measured=knee, limit=need, unit="requests", evidence=ev,
                   parts=(part,))


def steps_csv(steps: Sequence[StepResult]) -> str:
    """The steps as CSV (capacity-steps.csv), one row per step in the order measured."""
    rows = [s.row() for s in steps]
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


__all__ = ["GATE", "METRICS", "StepResult", "capacity_verdict", "dependence_text", "fit_capacity", "judge_step", "knee_of", "step_decisions",
           "limiting_causes", "min_samples", "need_of", "not_applicable", "step_invalid", "steps_csv"]
