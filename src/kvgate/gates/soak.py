"""Pure verdicts of the soak gate: retained server memory, TTFT-p95 drift, GPU headroom.

Input: a :class:`~kvgate.soak.runner.SoakResult` (one row per completed round) and the profile's
``soak:`` section; no I/O. :func:`analyze` fits the measured rounds (warm-up excluded; x in
hours since the soak started, at each round's midpoint):

- **memory**: the per-round *low envelope* of server memory (MB = 10**6 bytes; what the server
  retains, not its sawtooth peaks), least squares with its confidence interval and Theil-Sen
  beside it, the last part fitted separately, and a plateau test (:func:`kvgate.stats.growth`);
- **TTFT p95** per round (ms), rounds whose client fell behind left out;
- preemptions per round (the ``vllm:num_preemptions`` counter's increase), the waiting queue,
  and kvgate's own RSS (the harness must not be the leak).

A slope counts only when its lower confidence bound is above the ceiling (and Theil-Sen agrees):
a positive point estimate inside the noise is not a leak. Classification:

- ``memory growth``: retained memory rising above the ceiling (TTFT p95 following or not);
- ``preemption/placement``: TTFT p95 rising above its ceiling while memory is flat; preemptions
  climbing (or, without them, requests queueing) say which;
- ``bounded cache``: memory rose, then plateaued (the last part's upper bound at or below the
  ceiling): PASS;
- ``one-off step``: a slope shown above the ceiling, but all of its rise sits in one or two rounds
  with flat rounds before and after (:func:`kvgate.stats.find_step`: with those rounds' rises taken
  out, no growth is shown): PASS naming the step's rounds and size. A leak grows round after round
  and is still growing in the last part -- no two rounds explain it -- and FAILs whatever its total
  (issue 33: a floor on the total rise, 128 MB, let an 80 s soak pass leaks up to ~7 GB/h);
- ``healthy``.

A slope is judged as the latency gates judge a percentile: TTFT drift PASSes only when the slope's
whole-run interval is below its ceiling (the message says whether the last part's is below too or
straddles it: a late onset undecided), FAILs when the whole run's or the last part's is shown above
it (a linear or a late drift), and is INCONCLUSIVE when the whole run's
interval straddles it, naming as its cause the soak's length (its interval's width at the rounds
fitted, the rounds' scatter, and the rounds that would decide at that scatter); memory PASSes only
on an upper bound at or below its ceiling (:attr:`kvgate.stats.Growth.below`) and is INCONCLUSIVE
the same way otherwise. Every interval counts rounds as its unit and allows for their lag-1
autocorrelation (each verdict states it and the effective n: :func:`kvgate.stats.linear_fit`).

**Sample until decided** (``soak.max_duration`` above ``duration``): after the planned rounds the
runner takes a look after every round (:func:`undecided`: would either slope verdict be
INCONCLUSIVE?) and runs another round of the same load while one would, up to ``max_duration``;
the look that decides ends the soak, and the verdicts are judged on exactly its rounds. Looking
after every round and stopping at the first decision would, at a fixed level, err more often than
``1 - confidence`` (optional stopping); so every look -- the planned one included -- judges the
slopes' intervals at ``soak.look_confidence`` = ``1 - (1 - confidence) / looks``, ``looks =
(max_duration - duration) / round + 1`` (Bonferroni, as the latency gates split their planned
looks, :mod:`kvgate.stats.confidence`): the chance that any look PASSes a drift above the ceiling
(or FAILs one below it) stays within ``1 - confidence``. Without ``max_duration`` there is one look
at ``confidence``, as before. Every verdict says how long the soak ran and why (:func:`ran`); one
still undecided at ``max_duration`` is INCONCLUSIVE, its cause the rounds that would have decided.

**The run's false-alarm budget** (``verdicts.false_alarm_budget``; :func:`analyze`'s
``fail_confidence``, the suite passing ``profile.verdicts.fail_confidence(soak.confidence)``): a
wrong FAIL of a deployment sitting on its ceiling is a false alarm, so the FAIL side -- every slope
interval's lower end: least squares with its AR(1) critical value, Theil-Sen, the last part, the
rest of a one-off step -- is judged at ``1 - (1 - fail_confidence) / looks``
(:meth:`~kvgate.profile.models.SoakSpec.fail_look_confidence`; 99.89% over 21 looks -> 99.995% a
look), while the upper ends -- what a PASS, a plateau, a step's flat rest rest on -- stay at
``soak.look_confidence`` (:func:`kvgate.stats.growth`'s ``lower_confidence``). So a PASS is the same
with and without a budget; a slope barely shown above its ceiling reads INCONCLUSIVE under it. The
verdicts state both levels when they differ, and the evidence records them (``fail_confidence``,
``fail_look_confidence``). No budget: both ends at ``soak.look_confidence``, as before.

**A control** (``--soak-control URL``): the same rounds -- schedule, prompts, rate -- are offered to
a second endpoint alongside, whose state the gated deployment cannot touch, and its per-round TTFT
p95 is fitted as the gated endpoint's is (same ceiling, same confidence, unit round). The latency
verdict's status is the gated endpoint's as without a control; its message carries both slopes
and intervals and, with its cause, says where a drift comes from (:func:`drift_cause`): *local*
(the gated endpoint's drift shown above the ceiling, the control's interval below it), *shared*
(both shown above: the network, the client host, an upstream) or *undecided* (naming whose
interval straddles); with ``soak.max_duration`` a drift shown while the control straddles keeps
the soak sampling (``"latency cause"``). Without ``--soak-control`` nothing changes.

A cut-short soak (signal, deadline) is INCOMPLETE, never PASS; a soak whose client fell behind in
more than ``soak.lagged_rounds_max`` of its rounds is INVALID; memory that cannot be measured (no
reading: the source was absent) or that never moved (every sample one value: a frozen gauge) makes
the memory half INVALID with the reason (never PASS), and every memory verdict names its source and
whose memory that is (the launched server's process tree, the API-server process only, a query).

**Percentile confidence (issue 24, decided: nothing new judged here).** The soak judges the *slope*
of the per-round TTFT p95, never a p95 against a latency limit, so the order-statistic rule of
:mod:`kvgate.stats.confidence` has no limit to bound. Each round's p95 rests on few requests
(``rate_rps x round``: 16 a round on tiny-cpu, 10-21 measured) and has no upper order-statistic
bound at all (59 needed at 95%); it is a noisy point estimate, and that noise is what the slope's
own confidence interval (:func:`kvgate.stats.growth`, least squares over the rounds, Theil-Sen
beside it) already carries: the round-to-round scatter of the p95s is its residual. The
estimator's small-sample bias (a p95 of 16 interpolates near the max) is the same in every round
at a fixed offered rate, so it moves the level, not the slope. A round with very few requests adds
more scatter, which widens the interval rather than faking a slope; rounds whose client fell
behind are left out as before. So no round is judged on its own and no new verdict is added; the
latency-SLO gate judges the p95 against its limit with confidence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvgate.profile.models import Profile, SoakSpec
from kvgate.soak.runner import SoakResult
from kvgate.stats import Growth, Step, Trend, assumed_autocorrelation, growth, points_to_decide, residual_sd, trend
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP

INCOMPLETE = Status.INCOMPLETE
INVALID = Status.INVALID
INCONCLUSIVE = Status.INCONCLUSIVE
MIB = 2**20


@dataclass
class SoakAnalysis:
    """The fitted soak. Slopes: ``memory`` in MB/h, ``ttft`` in ms/h (None with a ``*_why``
    when there were fewer than 4 usable rounds). ``preemptions``: counter increase over the
    measured rounds (None without ``/metrics``); ``preemptions_rising``: the per-round count has
    a positive trend. ``own``: kvgate's own RSS trend (MB/h). ``lagged``: measured rounds whose
    client fell behind its schedule. ``classification`` and ``explanation``: see the module
    docstring."""

    spec: SoakSpec
    result: SoakResult
    n_measured: int
    memory: Growth | None
    memory_why: str | None
    memory_level_mb: float | None
    ttft: Growth | None
    ttft_why: str | None
    ttft_shown: bool
    preemptions: float | None
    preemptions_rising: bool
    waiting: Trend | None
    own: Trend | None
    lagged: int
    requests: int
    errors: int
    classification: str
    explanation: str
    #: ``--soak-control``: the control endpoint's TTFT-p95 slope (ms/h, fitted as ``ttft``), None
    #: without a control or with ``control_why`` when it could not be fitted.
    control: Growth | None = None
    control_why: str | None = None
    #: ``--soak-control``: where the gated endpoint's drift comes from (:func:`drift_cause`); None without.
    drift: "DriftCause | None" = None
    #: The FAIL side's overall level under the run's false-alarm budget (a fraction; each look's lower
    #: ends at :meth:`SoakSpec.fail_look_confidence` of it); None: no budget above ``soak.confidence``.
    fail_confidence: float | None = None

    @property
    def fail_look(self) -> float | None:
        """The level every slope interval's lower end is at, each look (None: ``soak.look_confidence``)."""
        return self.spec.fail_look_confidence(self.fail_confidence)

    def measured(self) -> dict[str, Any]:
        """The numbers for summary.json: slopes, intervals, classification, sources, counts."""
        r = self.result
        return {
            "classification": self.classification,
            "explanation": self.explanation,
            "rounds": {"planned": r.plan.rounds, "completed": len(r.rows), "warmup": r.plan.warmup_rounds,
                       "measured": self.n_measured, "round_s": r.plan.round_s, "lagged": self.lagged},
            "extension": r.extension.to_dict() if r.extension else None,
            "look_confidence": self.spec.look_confidence,
            **({} if self.fail_look is None else {"fail_confidence": self.fail_confidence,
                                                  "fail_look_confidence": self.fail_look}),
            "offered_rps": r.plan.rate_rps,
            "mix": mix_evidence(r),
            "memory_mb_per_h": _growth_dict(self.memory),
            "memory_level_mb": self.memory_level_mb,
            "memory_why_not": self.memory_why,
            "ttft_p95_ms_per_h": _growth_dict(self.ttft),
            "ttft_why_not": self.ttft_why,
            "preemptions": self.preemptions, "preemptions_rising": self.preemptions_rising,
            "waiting_per_h": self.waiting.to_dict() if self.waiting else None,
            "kvgate_rss_mb_per_h": self.own.to_dict() if self.own else None,
            "requests": self.requests, "errors": self.errors,
            "samplers": r.samplers, "sampling_ticks": r.ticks, "complete": r.complete, "stopped": r.stopped,
            "files": r.files,
            "control": None if r.control is None else {
                **r.control, "ttft_p95_ms_per_h": _growth_dict(self.control), "ttft_why_not": self.control_why,
                "requests": sum(c["requests"] for c in r.control_measured),
                "errors": sum(c["errors"] for c in r.control_measured),
                "drift_cause": self.drift.to_dict() if self.drift else None},
        }


def _growth_dict(g: Growth | None) -> dict[str, Any] | None:
    """The whole-run fit flat (slope, ci_low, ci_high, theil_sen, ...), the last part beside it."""
    if g is None:
        return None
    return {**g.full.to_dict(), "last_part": g.last.to_dict() if g.last else None, "plateau": g.plateau,
            "kind": g.kind, "ceiling": g.ceiling, "exceeds": g.exceeds, "step": g.step.to_dict() if g.step else None}


def _x_h(row: dict[str, Any], round_s: float) -> float:
    return (row["t_start_s"] + round_s / 2) / 3600.0


def _series(rows: list[dict[str, Any]], key: str, round_s: float,
            keep: Any = None) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)) or (keep is not None and not keep(r)):
            continue
        xs.append(_x_h(r, round_s))
        ys.append(float(v))
    return xs, ys


def _fit(xs: list[float], ys: list[float], ceiling: float, spec: SoakSpec,
         fail_look: float | None = None) -> Growth | None:
    """:func:`kvgate.stats.growth` at ``soak.look_confidence``, the lower ends at ``fail_look`` when set
    (the run's false-alarm budget share a look); None with fewer than 4 rounds."""
    if len(xs) < 4 or len(set(xs)) < 2:
        return None
    with assumed_autocorrelation(getattr(spec, "autocorrelation_max", None)):
        return growth(xs, ys, ceiling, spec.look_confidence, spec.last_part, lower_confidence=fail_look)


def _pct(level: float) -> str:
    return f"{level * 100:.4g}%"


def _ci(t: Trend, unit: str) -> str:
    """``+1.2 MB/h (95% CI -3.0..+5.4; Theil-Sen ...)``; with the lower end at another level (the run's
    false-alarm budget) ``(CI -3.0..+5.4: lower end at 99.99% for a FAIL, upper at 95% for a PASS; ...)``."""
    return (f"{t.slope:+,.1f} {unit} ({_ci_words(t)}; Theil-Sen {t.theil_sen:+,.1f}; {_dependence(t)})")


def _ci_words(t: Trend) -> str:
    """``95% CI -3.0..+5.4``, or ``CI -3.0..+5.4: lower end at 99.99% for a FAIL, upper at 95% for a
    PASS`` when the two ends are at different levels."""
    o = t.ols
    if o.lower_confidence is None:
        return f"{_pct(o.confidence)} CI {t.ci_low:+,.1f}..{t.ci_high:+,.1f}"
    return (f"CI {t.ci_low:+,.1f}..{t.ci_high:+,.1f}: {_ends(o)}")


def _ends(o: Any) -> str:
    """``lower end at 99.99% for a FAIL (the run's false-alarm budget share), upper at 95% for a PASS``."""
    return (f"lower end at {_pct(o.lower_confidence)} for a FAIL (the run's false-alarm budget share), upper at "
            f"{_pct(o.confidence)} for a PASS")


def _interval_name(t: Trend) -> str:
    """``the 95% interval``, or ``the interval (lower end at ..., upper at ...)``."""
    o = t.ols
    return f"the {_pct(o.confidence)} interval" if o.lower_confidence is None else f"the interval ({_ends(o)})"


def _dependence(t: Trend) -> str:
    """``unit round, lag-1 autocorrelation +0.34 (allowed for 0.61: n_eff 2.0 of 8)`` -- the unit the
    interval counts, the dependence measured between rounds and the effective n it left."""
    o = t.ols
    rho = "n/a" if math.isnan(o.rho) else f"{o.rho:+.2f}"
    used = f" (allowed for {o.rho_used:.2f}: n_eff {o.n_eff:.1f} of {o.n})" if o.rho_used > 0 else \
        f" (n_eff {o.n_eff:.0f})"
    if o.assumed is not None:
        used += f" -- at most {o.assumed:.2f} assumed (soak.autocorrelation_max), not contradicted"
    return f"unit round, lag-1 autocorrelation {rho}{used}"


def _step_words(step: Step, rounds: list[int]) -> str:
    """``retained memory stepped +60.0 MB in round 5 (93% of the +64.5 MB rise), flat before and
    after: without it +1.2 MB/h (95% CI ...), last part ... (3 rounds after it)``."""
    where = " and ".join(f"{r:+,.1f} MB in round {rounds[p]}" for p, r in zip(step.points, step.rises))
    share = f"{step.rise / step.total:.0%} of the {step.total:+,.1f} MB rise" if step.total > 0 else \
        f"the whole run {step.total:+,.1f} MB"
    rest = step.rest
    last = f", last part {_ci(rest.last, 'MB/h')}" if rest.last else ""
    return (f"retained memory stepped {where} ({share}), flat before and after: without the step "
            f"{_ci(rest.full, 'MB/h')}{last}; {step.after} flat round(s) after it -- an allocator or cache "
            "sizing itself once, not a leak (a leak rises round after round)")


def analyze(result: SoakResult, spec: SoakSpec, fail_confidence: float | None = None) -> SoakAnalysis:
    """Fit the measured rounds of ``result`` against ``spec``'s ceilings and classify.
    ``fail_confidence``: the FAIL side's overall level under the run's false-alarm budget
    (``profile.verdicts.fail_confidence(spec.confidence)``, a fraction): every slope interval's lower
    end at :meth:`SoakSpec.fail_look_confidence` of it, the upper ends at ``spec.look_confidence``;
    None (or not above ``spec.confidence``): both ends at ``spec.look_confidence``."""
    fail_look = spec.fail_look_confidence(fail_confidence)
    rs = result.plan.round_s
    rows = result.measured
    mx, my = _series(rows, "mem_min_mb", rs)
    memory = _fit(mx, my, spec.memory_slope_max_mb_per_h, spec, fail_look)
    mem_rounds = [r["round"] for r in rows if r.get("mem_min_mb") is not None and not (
        isinstance(r["mem_min_mb"], float) and math.isnan(r["mem_min_mb"]))]
    memory_why = None
    if memory is None:
        mem = result.samplers.get("server-memory") or {}
        why = result.memory_skip or mem.get("last_error") or "no memory sample in the measured rounds"
        memory_why = (f"server memory not measurable: {why} ({len(my)} of {len(rows)} measured rounds had a "
                      "reading)")
    tx, ty = _series(rows, "ttft_p95_ms", rs, keep=lambda r: r["client_kept_up"])
    ttft = _fit(tx, ty, spec.ttft_p95_slope_max_ms_per_h, spec, fail_look)
    ttft_why = None if ttft else (f"only {len(ty)} of {len(rows)} measured rounds have a TTFT p95 from a client "
                                  "that kept its schedule (need 4)")
    c = spec.ttft_p95_slope_max_ms_per_h
    ttft_shown = bool(ttft and (ttft.full.above(c) or (ttft.last is not None and ttft.last.above(c))))
    pre = [r["preemptions"] for r in rows if r.get("preemptions") is not None]
    preemptions = float(sum(pre)) if pre else None
    px, py = _series(rows, "preemptions", rs)
    rising = False
    if len(px) >= 3 and len(set(py)) > 1:
        pt = trend(px, py, spec.confidence)
        rising = not math.isnan(pt.ci_low) and pt.ci_low > 0
    wx, wy = _series(rows, "waiting_max", rs)
    waiting = trend(wx, wy, spec.confidence) if len(wx) >= 3 and len(set(wx)) > 1 and len(set(wy)) > 1 else None
    ox, oy = _series(rows, "kvgate_rss_mb", rs)
    own = trend(ox, oy, spec.confidence) if len(ox) >= 3 and len(set(ox)) > 1 else None
    lagged = sum(1 for r in rows if not r["client_kept_up"])
    requests = sum(r["requests"] for r in rows)
    errors = sum(r["errors"] for r in rows)
    level = my[-1] if my else None

    if memory is not None and memory.exceeds:
        cls = "memory growth"
        follows = f"TTFT p95 follows ({_ci(ttft.full, 'ms/h')})" if ttft_shown and ttft else \
            (f"TTFT p95 not (yet) following ({ttft.full.slope:+,.1f} ms/h)" if ttft else "TTFT p95 not measured")
        late = " (in the last part of the run)" if not memory.full.above(memory.ceiling) else ""
        expl = f"retained memory rising{late}; {follows}"
    elif ttft_shown:
        cls = "preemption/placement"
        mem_s = (f"retained memory flat ({memory.full.slope:+,.1f} MB/h)" if memory is not None
                 else "memory not measured")
        if preemptions:
            why = f"preemptions climbing (+{preemptions:,.0f} over the measured rounds{', rising per round' if rising else ''})"
        elif preemptions is None:
            why = "preemptions not observable (no /metrics)"
        else:
            w = f", waiting queue {waiting.slope:+,.1f}/h" if waiting is not None else ""
            why = f"no preemptions: scheduling/placement or contention outside the KV pool{w}"
        expl = f"TTFT p95 rising while {mem_s}; {why}"
    elif memory is not None and memory.kind == "step" and memory.step is not None:
        cls = "one-off step"
        expl = _step_words(memory.step, mem_rounds)
    elif memory is not None and memory.kind == "bounded" and memory.below:
        cls = "bounded cache"
        last = memory.last
        expl = (f"retained memory rose {memory.full.slope:+,.1f} MB/h, then plateaued (last part "
                f"{last.slope:+,.1f} MB/h, Theil-Sen {last.theil_sen:+,.1f})" if last else "rose, then plateaued")
    else:
        cls = "healthy"
        expl = "no memory growth or TTFT drift shown"
    control, control_why, drift = None, None, None
    if result.control is not None:
        crows = result.control_measured
        cx, cy = _series(crows, "ttft_p95_ms", rs, keep=lambda r: r["client_kept_up"])
        control = _fit(cx, cy, c, spec, fail_look)
        if control is None:
            bad = sum(r["errors"] for r in crows)
            control_why = (f"only {len(cy)} of {len(crows)} measured rounds at the control have a TTFT p95 from a "
                           f"client that kept its schedule (need 4; {bad} of {sum(r['requests'] for r in crows)} "
                           "control requests failed)")
        drift = drift_cause(ttft, control, c, result.control.get("endpoint") or "the control", control_why)
    return SoakAnalysis(spec, result, len(rows), memory, memory_why, level, ttft, ttft_why, ttft_shown, preemptions,
                        rising, waiting, own, lagged, requests, errors, cls, expl, control, control_why, drift,
                        None if fail_look is None else fail_confidence)


@dataclass(frozen=True)
class DriftCause:
    """Where the gated endpoint's TTFT drift comes from, told by a control endpoint offered the same
    rounds alongside (``--soak-control``; :func:`drift_cause`). ``kind``: ``local`` (only the gated
    endpoint drifts: its slope shown above the ceiling, the control's interval below it), ``shared``
    (both shown above: the network, the client host, an upstream), ``undecided`` (``straddles``
    names whose interval, ``"gated"`` and/or ``"control"``, lies across the ceiling -- or was not
    fitted) or ``none`` (no drift at the gated endpoint: its interval below the ceiling, nothing to
    attribute). ``short``: the finding in a clause; ``words``: it with both slopes and intervals."""

    kind: str
    short: str
    words: str
    straddles: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "short": self.short, "words": self.words, "straddles": list(self.straddles)}


def _shown(g: Growth, ceiling: float) -> bool:
    """The slope is shown above ``ceiling``: the whole run's interval or the last part's (as ``ttft_shown``)."""
    return g.full.above(ceiling) or (g.last is not None and g.last.above(ceiling))


def _interval(g: Growth, ceiling: float) -> str:
    """``+288,000.0 ms/h (95% CI +250,000.0..+326,000.0)``, the last part's beside it when only it is shown."""
    t = g.full
    out = f"{t.slope:+,.1f} ms/h ({_ci_words(t)})"
    if not t.above(ceiling) and g.last is not None and g.last.above(ceiling):
        out += f", last part {g.last.slope:+,.1f} ms/h (CI {g.last.ci_low:+,.1f}..{g.last.ci_high:+,.1f})"
    return out


def drift_cause(gated: Growth | None, control: Growth | None, ceiling: float, control_name: str = "the control",
                control_why: str | None = None) -> DriftCause:
    """Local, shared or undecided, from two TTFT-p95 slope fits (ms/h, :func:`kvgate.stats.growth` over
    the same measured rounds: unit round, each interval allowing for its lag-1 autocorrelation) and
    their common ``ceiling`` (ms/h). A slope is *shown* above the ceiling as the latency verdict shows
    it (the whole run's or the last part's lower bound above it, Theil-Sen agreeing) and *below* it
    when the whole run's upper bound is at or below it and nothing is shown above; otherwise it
    straddles. Gated shown, control below: ``local``; both shown: ``shared``; gated shown and the
    control straddling, or the gated straddling: ``undecided`` naming which; gated below: ``none``.
    A fit that is None (too few rounds; ``control_why`` says why for the control) straddles."""
    c = ceiling
    if gated is None:
        return DriftCause("undecided", "the gated endpoint's TTFT slope was not fitted",
                          "local or shared undecided: the gated endpoint's TTFT slope was not fitted", ("gated",))
    g_words = f"the gated endpoint's {_interval(gated, c)}"
    if control is None:
        why = control_why or "no control rounds"
        return DriftCause("undecided", f"the control {control_name} was not measured ({why})",
                          f"local or shared undecided: {g_words}; the control {control_name} was not measured: {why}",
                          ("control",))
    c_state = "above" if _shown(control, c) else ("below" if control.full.below(c) else "straddles")
    c_words = f"the control {control_name}'s {_interval(control, c)}"
    same = "on the same rounds, prompts and client"
    if _shown(gated, c):
        if c_state == "below":
            return DriftCause("local", "only the gated endpoint drifts; the control stays below the ceiling",
                              f"local: only the gated endpoint drifts -- {g_words} lies above the {c:g} ms/h ceiling, "
                              f"{c_words} below it, {same}: the decay is the gated deployment's own (its engine, "
                              "node or gateway), not the network, the client host or an upstream both share")
        if c_state == "above":
            return DriftCause("shared", "the control drifts too: a cause both endpoints share",
                              f"shared: both endpoints drift above the {c:g} ms/h ceiling -- {g_words}, {c_words}, "
                              f"{same}: a cause both share (the network, the client host, an upstream), not the "
                              "gated deployment's own state")
        return DriftCause("undecided", "the gated endpoint drifts; the control's interval straddles the ceiling",
                          f"local or shared undecided: {g_words} lies above the {c:g} ms/h ceiling, but {c_words} "
                          "straddles it: the control's drift is neither shown nor ruled out", ("control",))
    if gated.full.below(c):
        also = {"above": " (the control drifts on its own: its own decay, not the gated endpoint's)",
                "below": "", "straddles": " (the control's interval straddles the ceiling)"}[c_state]
        return DriftCause("none", "no drift at the gated endpoint to attribute",
                          f"no drift at the gated endpoint to attribute: {g_words} lies below the {c:g} ms/h "
                          f"ceiling; {c_words}{also}")
    both = ("gated", "control") if c_state == "straddles" else ("gated",)
    short = "the gated endpoint's interval straddles the ceiling"
    return DriftCause("undecided", short + (", and so does the control's" if len(both) > 1 else ""),
                      f"local or shared undecided: {g_words} straddles the {c:g} ms/h ceiling; {c_words} lies "
                      f"{'across' if c_state == 'straddles' else c_state} it", both)


# ----------------------------------------------------------------------------- verdicts


def mix_evidence(r: SoakResult) -> dict[str, Any]:
    """Which mix ran: its source (``soak.mix`` or the default) and per workload the planned share
    and lengths, what was sent (requests, ok, prompt tokens min/mean/max) and, for a ``traffic:``
    workload, the sample's provenance (path, sha256, percentiles, rows clamped)."""
    sent = r.workloads
    out = {}
    for m in r.plan.mix:
        out[m.name] = {"weight": m.weight, "prompt_tokens": m.prompt_tokens, "output_tokens": m.output_tokens,
                       "long": m.long, **(sent.get(m.name) or {}), **({"sample": m.sample} if m.sample else {})}
    return {"source": r.plan.mix_source, "warmup_burst_requests": r.plan.burst_requests, "workloads": out}


def _mix(a: SoakAnalysis) -> str:
    """``mix (source): chat 50% (16+8 tokens) 90 requests + batch 50% (...) 88 requests``."""
    r = a.result
    sh = r.plan.shares()
    parts = [f"{m.describe(sh[m.name])} {_sent(r.workloads.get(m.name) or {})}" for m in r.plan.mix]
    return f"mix ({r.plan.mix_source}): {' + '.join(parts)}"


def _sent(w: dict[str, Any]) -> str:
    """``90 requests``, or for a workload that drew sessions ``12 sessions (41 turns) + 9 single
    requests; later turns cached 180 tokens mean (95% with cached tokens > 0)``."""
    if "sessions" not in w:
        return f"{w.get('requests', 0):,} requests"
    out = f"{w['sessions']:,} sessions ({w['turns']:,} turns)"
    if w.get("single_requests"):
        out += f" + {w['single_requests']:,} single requests"
    if w.get("later_turns_cached_mean") is not None:
        out += (f"; later turns cached {w['later_turns_cached_mean']:,.0f} tokens mean "
                f"({w['later_turns_cached_share']:.0%} with cached tokens > 0)")
    elif w.get("later_turns"):
        out += "; later turns' cached tokens not reported by the server (vLLM: --enable-prompt-tokens-details)"
    return out


def _what(a: SoakAnalysis) -> str:
    p = a.result.plan
    n = p.burst_requests
    burst = f", the first opening with a burst of {n} requests at the declared concurrencies" if n else ""
    extended = ran(a)
    return (f"{a.n_measured} measured rounds of {p.round_s:g} s at {p.rate_rps:g} req/s "
            f"({a.n_measured * p.round_s / 3600:.2f} h; {p.warmup_rounds} warm-up round(s) not fitted{burst}; "
            f"{_mix(a)}){f'; {extended}' if extended else ''}")


def _evidence(a: SoakAnalysis) -> dict[str, Any]:
    keep = ("round", "warmup", "t_start_s", "requests", "errors", "ttft_p50_ms", "ttft_p95_ms", "itl_p95_ms",
            "mem_min_mb", "mem_max_mb", "swap_max_mb", "kv_usage_max", "preemptions", "running_max", "waiting_max",
            "gpu_used_max_mb", "kvgate_rss_mb", "client_kept_up", "lag_p99_ms")
    out = {"rounds": [{k: r.get(k) for k in keep} for r in a.result.rows], "analysis": a.measured()}
    if a.result.control is not None:  # --soak-control: the control's rounds beside the gated ones
        out["control_rounds"] = [dict(r) for r in a.result.control_rows]
    return out


def _precheck(gate: str, a: SoakAnalysis) -> Verdict | None:
    r = a.result
    if not r.complete:
        where = r.files.get("rounds_csv", "the rounds CSV")
        of = f"{r.plan.rounds}" if r.extension is None else \
            f"{r.plan.rounds} planned (at most {r.extension.cap} while undecided)"
        return Verdict(gate, INCOMPLETE,
                       f"soak stopped ({r.stopped}) after {len(r.rows)} of {of} rounds; the completed "
                       f"rounds are written to {where} -> INCOMPLETE (a cut-short soak is never a PASS)",
                       measured=len(r.rows), limit=r.plan.rounds, unit="rounds", evidence=_evidence(a))
    allowed = a.spec.lagged_rounds_max
    if a.n_measured and a.lagged / a.n_measured > allowed:
        worst = max((row["lag_p99_ms"] or 0) for row in r.measured)
        worst_loop = max((row["loop_lag_p99_ms"] or 0) for row in r.measured)
        return Verdict(gate, INVALID,
                       f"client fell behind its schedule in {a.lagged} of {a.n_measured} measured rounds (allowed "
                       f"{allowed:.0%}; p99 schedule lag up to {worst:.1f} ms, event-loop lag up to {worst_loop:.1f} ms, "
                       f"bound {r.plan.lag_bound_s * 1e3:.0f} ms) -> INVALID (the offered load was not the planned one; "
                       "run kvgate on CPUs the server does not use)",
                       measured=round(a.lagged / a.n_measured, 4), limit=allowed, unit="ratio", evidence=_evidence(a))
    return None


def _undecided(a: SoakAnalysis, g: Growth, key: str, series: str, y_unit: str, what: str,
               keep: Any = None) -> tuple[str, str]:
    """``(message tail, cause)`` of a slope whose interval straddles its ceiling: neither the drift
    above the ceiling nor its absence is shown at this length. The cause is measured: the
    interval's width at the rounds fitted, the rounds' scatter around the fit (:func:`residual_sd`)
    and the fewest rounds at which an interval of that scatter would lie on one side of the
    ceiling if the slope held (:func:`points_to_decide`), as a soak duration with the warm-up."""
    t, ceiling, p = g.full, g.ceiling, a.result.plan
    unit = f"{y_unit}/h"
    xs, ys = _series(a.result.measured, key, p.round_s, keep=keep)
    if t.ci_low > ceiling and g.kind != "step":  # least squares shows it, the robust slope does not sustain it
        head = (f"{_interval_name(t)} {t.ci_low:+,.1f}..{t.ci_high:+,.1f} {unit} lies above the ceiling but Theil-Sen "
                f"{t.theil_sen:+,.1f} {unit} (interval {t.theil_low:+,.1f}..{t.theil_high:+,.1f}) does not: inconclusive")
        cause = (f"one or two outlying rounds carry the least-squares slope: the robust Theil-Sen interval "
                 f"{t.theil_low:+,.1f}..{t.theil_high:+,.1f} {unit} reaches the {ceiling:g} {unit} ceiling, so the "
                 f"{what} is not shown (nor its absence); a longer soak decides")
        return head, cause
    lead = ""
    if g.kind == "step" and g.step is not None:  # the step explains the rise; the rest must be shown below
        lead = (f"a one-off step of {g.step.rise:+,.1f} {y_unit} explains the rise, but without it ")
        t = g.step.rest.full
        removed = [0.0] * len(ys)
        for i, r in zip(g.step.points, g.step.rises):
            for j in range(i, len(ys)):
                removed[j] += r
        ys = [v - d for v, d in zip(ys, removed)]
    sd = residual_sd(xs, ys, t.ols)
    width = t.ci_high - t.ci_low
    head = (f"{lead}{_interval_name(t)} {t.ci_low:+,.1f}..{t.ci_high:+,.1f} {unit} straddles the {ceiling:g} {unit} "
            f"ceiling: neither {what} above it nor its absence is shown")
    # the side that would decide: the lower end (FAIL) for a slope above the ceiling, else the upper (PASS)
    side = t.ols.low_level if t.slope > ceiling else t.ols.confidence
    need = points_to_decide(abs(t.slope - ceiling), p.round_s / 3600.0, sd, side, at_least=t.n + 1,
                            rho=t.ols.rho_used)
    spread = f"{series} scatters {sd:,.1f} {y_unit} round to round around the fit"
    if need is None:
        more = (f"no soak length decides at this noise while the slope sits on the ceiling ({t.slope:+,.1f} {unit})")
    else:
        dur = (need + p.warmup_rounds) * p.round_s
        knob = "soak.max_duration" if a.result.extension is not None else "--soak-duration"
        more = (f"at this noise ~{need:,} measured rounds ({_secs(need * p.round_s)} s; {knob}={dur:g}s with the "
                f"{p.warmup_rounds} warm-up round{'s' if p.warmup_rounds != 1 else ''}) would put it on one side of the "
                f"ceiling if the slope held at {t.slope:+,.1f} {unit}")
    ext = a.result.extension
    short = "the soak is too short to decide"
    if ext is not None:
        short += f" even extended to soak.max_duration ({_secs(ext.cap * p.round_s)} s, {ext.cap - p.warmup_rounds} measured rounds)"
    cause = (f"{short}: {_interval_name(t)} is {width:,.0f} {unit} wide at {t.n} rounds ({spread}; "
             f"{_dependence(t)}); {more}")
    return head, cause


#: What kept an extended soak going, per part (:func:`undecided`).
_WHY = {"latency": "soak/latency's interval straddled its ceiling",
        "memory": "soak/memory's interval reached its ceiling: neither growth above it nor its absence shown",
        "latency cause": "soak/latency's drift was shown but the control's interval straddled the ceiling "
                         "(local or shared undecided)"}


def ran(a: SoakAnalysis) -> str:
    """How long a soak that may extend ran and why (empty without ``soak.max_duration`` above
    ``duration``): ``decided after 12 measured rounds (112 s of at most 160 s; 8 planned, extended 4
    rounds while soak/latency's interval straddled its ceiling; each look judged at 99.67%: 95% split
    over 11 looks)``, ``decided at the planned 8 measured rounds (...)``, or ``undecided at
    soak.max_duration: ...``."""
    ext = a.result.extension
    if ext is None:
        return ""
    p, spec = a.result.plan, a.spec
    w = p.warmup_rounds
    n = len(a.result.rows)
    level = (f"each look judged at {spec.look_confidence * 100:.4g}%: {spec.confidence * 100:g}% split over "
             f"{spec.looks} looks")
    if a.fail_look is not None:
        level = (f"each look judged at {_pct(spec.look_confidence)} for a PASS and {_pct(a.fail_look)} for a FAIL: "
                 f"{spec.confidence * 100:g}% and {_pct(a.fail_confidence)} (the run's false-alarm budget share) "
                 f"split over {spec.looks} looks")
    why = " and ".join(_WHY.get(x, x) for x in ext.extended_for)
    of = f"{_secs(n * p.round_s)} s of at most {_secs(ext.cap * p.round_s)} s"
    if n <= ext.planned:
        return f"decided at the planned {ext.planned - w} measured rounds ({of}; {level})"
    grew = f"{ext.planned - w} planned, extended {n - ext.planned} round{'s' if n - ext.planned != 1 else ''}"
    if ext.decided:
        return f"decided after {n - w} measured rounds ({of}; {grew} while {why or 'undecided'}; {level})"
    return (f"undecided at soak.max_duration after {n - w} measured rounds ({of}; {grew} while "
            f"{why or 'undecided'}; {level})")


def undecided(result: SoakResult, spec: SoakSpec, profile: Profile) -> list[str]:
    """The parts of a soak whose verdict would be INCONCLUSIVE on ``result`` (``"memory"``,
    ``"latency"``; [] = both decided: PASS, FAIL or INVALID) -- the runner's judge for sample
    until decided (:class:`kvgate.soak.runner.SoakRunner`). Judged as the final verdicts are: at
    ``spec.look_confidence``, the confidence Bonferroni-split over the soak's looks, so stopping at
    the first look that decides keeps the chance of a wrong PASS (or FAIL) within
    ``1 - spec.confidence`` -- the FAIL side at the run's false-alarm budget share when
    ``profile.verdicts`` sets one (:func:`analyze`'s ``fail_confidence``)."""
    a = analyze(result, spec, profile.verdicts.fail_confidence(spec.confidence))
    out = []
    if memory_verdict(a).status is INCONCLUSIVE:
        out.append("memory")
    lat = latency_verdict(a, profile).status
    if lat is INCONCLUSIVE:
        out.append("latency")
    elif lat is FAIL and a.drift is not None and a.drift.kind == "undecided" and a.control is not None:
        out.append("latency cause")  # --soak-control: the control's interval straddles; more rounds may decide
    return out


def _secs(s: float) -> str:
    """Seconds as read: ``3,000``, ``88``, ``2.25``."""
    return f"{s:,.0f}" if s >= 10 else f"{s:.3g}"


def memory_source(a: SoakAnalysis) -> str:
    """Which memory the soak read and whose it is, from the sampler's own description
    (:func:`kvgate.soak.sampling.describe`): ``source: process_resident_memory_bytes in GET
    http://h/v1/metrics [RSS of the API-server process], covering the API-server process only (...)``;
    ``source: none`` with why when no sampler applied."""
    mem = a.result.samplers.get("server-memory") or {}
    if not mem:
        return f"source: none ({a.result.memory_skip or 'no memory sampler applies to this server'})"
    quantity = f" [{mem['quantity']}]" if mem.get("quantity") else ""
    covers = f", covering {mem['covers']}" if mem.get("covers") else ""
    return f"source: {mem.get('source', 'unnamed')}{quantity}{covers}"


def frozen_memory(a: SoakAnalysis) -> tuple[int, float] | None:
    """``(samples, MB)`` when every memory sample of the measured rounds read one value (each round's
    low and high equal, and equal across the rounds: zero variance) -- a gauge that never moved is
    not a measurement of a serving process (a cached ``/metrics``, a stale exporter); else None.
    Samples: the rounds' sampling ticks that had a reading (at least 2 needed).

    Not frozen: a process tree kvgate read itself (psutil, ``server_cpu_s``) whose CPU time grew over
    the measured rounds -- the reads were of live, working processes, and memory that held still
    while they served is a measurement (the embedded tiny vLLM on short requests: 40 samples of
    1,548.863 MB over 5 rounds, 2026-12-05)."""
    rows, value = _one_value(a)
    samples = sum(max(0, int(r.get("samples") or 0) - int(r.get("sample_errors") or 0)) for r in rows)
    if len(rows) < 2 or value is None or samples < 2 or working_s(a) is not None:
        return None
    return samples, value


def _one_value(a: SoakAnalysis) -> tuple[list[dict[str, Any]], float | None]:
    """``(the measured rounds with a memory reading, the one value all their lows and highs read or None)``."""
    rows = [r for r in a.result.measured if r.get("mem_min_mb") is not None and r.get("mem_max_mb") is not None]
    values = {v for r in rows for v in (r["mem_min_mb"], r["mem_max_mb"])}
    return rows, (next(iter(values)) if len(values) == 1 else None)


def _held_still(a: SoakAnalysis) -> str:
    """``; memory held one value ... while the tree used N s of CPU`` where every measured sample read
    one value and the tree's CPU time grew (:func:`working_s`); else empty."""
    _, value = _one_value(a)
    cpu = working_s(a)
    if value is None or cpu is None:
        return ""
    return (f"; memory held one value ({value:,.3f} MB) in every sample while the process tree used "
            f"{cpu:,.1f} s of CPU serving the soak (read from the processes themselves: not a frozen gauge)")


def working_s(a: SoakAnalysis) -> float | None:
    """Seconds of CPU the server's process tree used over the measured rounds (its ``server_cpu_s``
    at the last measured round less at the first), when kvgate read the tree itself and it grew; else
    None (another source, or no growth: nothing shows the reads were of working processes)."""
    cpu = [r["server_cpu_s"] for r in a.result.measured if r.get("server_cpu_s") is not None]
    if len(cpu) < 2 or cpu[-1] <= cpu[0]:
        return None
    return cpu[-1] - cpu[0]


def memory_verdict(a: SoakAnalysis) -> Verdict:
    """Retained server memory slope (MB/h) vs ``soak.memory_slope_max_mb_per_h``: FAIL only when
    the growth is shown (lower confidence bound above the ceiling, Theil-Sen agreeing), is not a
    plateau and no one-off step of one or two rounds explains it (a ramp: rising round after round,
    still rising in the last part); PASS only when its absence is shown (:attr:`Growth.below`: the
    whole run's upper bound at or below the ceiling; for a bounded cache the last part's, after a
    plateau; for a one-off step the series' without the step's rounds); INCONCLUSIVE otherwise,
    with the rounds that would decide (:func:`_undecided`); INVALID when the memory source was absent (no reading to fit) or never
    moved (:func:`frozen_memory`). Every verdict names the source and whose memory it is
    (:func:`memory_source`): the launched server's whole process tree (psutil), the API-server
    process only (``process_resident_memory_bytes`` in ``/metrics``), or a Prometheus query."""
    gate = "soak/memory"
    src = memory_source(a)
    pre = _precheck(gate, a)
    if pre:
        return dataclasses.replace(pre, message=f"{pre.message}; memory {src}")
    ceiling = a.spec.memory_slope_max_mb_per_h
    own_mb = [r["kvgate_rss_mb"] for r in a.result.measured if r.get("kvgate_rss_mb") is not None]
    own = (f"; kvgate's own RSS {own_mb[0]:,.1f} -> {own_mb[-1]:,.1f} MB, {_ci(a.own, 'MB/h')}"
           if a.own and own_mb else "")
    scrapes = f"; {a.result.ticks} sampling ticks ({sum(s.get('reads', 0) for s in a.result.samplers.values())} reads)"
    if a.memory is None:
        why = a.memory_why or "server memory not measurable"
        return Verdict(gate, INVALID, f"{why}; the memory half is not judged (never a PASS) -> INVALID; {src}",
                       limit=ceiling, unit="MB/h", evidence=_evidence(a),
                       cause=f"no memory reading to fit: {a.result.memory_skip or _sampler_error(a) or why}")
    frozen = frozen_memory(a)
    if frozen is not None:
        n, mb = frozen
        return Verdict(gate, INVALID,
                       f"server memory never moved in {_secs(a.n_measured * a.result.plan.round_s)} s: {n} samples over {a.n_measured} measured rounds all "
                       f"{mb:,.3f} MB (zero variance) -> INVALID (a gauge that never moves measures no serving "
                       f"process: the memory half is not judged); {src}{scrapes}",
                       measured=0.0, limit=ceiling, unit="MB/h", evidence=_evidence(a),
                       cause=(f"a frozen memory source: all {n} samples read {mb:,.3f} MB; the evidence cannot tell a "
                              "cached /metrics (a gateway or exporter in front) from a gauge the server never updates "
                              "-- give the soak another source (soak.memory_source: process_tree for a server kvgate "
                              "launches, or a Prometheus memory_query)"))
    g = a.memory
    last = f"; last part {_ci(g.last, 'MB/h')}" if g.last else ""
    head = (f"retained server memory {a.memory_level_mb:,.1f} MB, slope {_ci(g.full, 'MB/h')}{last} over "
            f"{_what(a)}; ceiling {ceiling:g} MB/h")
    tail = f"; {src}{scrapes}{own}{_held_still(a)}"
    slope = round(g.full.slope, 3)
    if g.exceeds:
        return Verdict(gate, FAIL, f"{head}; {_ramp_words(g, a.result.measured)} -> FAIL ({a.classification}: "
                       f"{a.explanation}){tail}",
                       measured=slope, limit=ceiling, unit="MB/h", evidence=_evidence(a))
    if not g.below:
        # neither the growth nor its absence shown: a PASS rests on an upper bound, never a point estimate
        why, cause = _undecided(a, g, "mem_min_mb", "retained memory", "MB", "growth")
        return Verdict(gate, INCONCLUSIVE, f"{head} -> INCONCLUSIVE ({why}){tail}", measured=slope, limit=ceiling,
                       unit="MB/h", evidence=_evidence(a), cause=cause)
    label = {"bounded": "bounded cache", "step": "one-off step"}.get(g.kind) or (
        "healthy" if a.classification == "healthy" else f"memory flat; soak classified {a.classification}")
    extra = f": {a.explanation}" if g.kind in ("bounded", "step") else ""
    return Verdict(gate, PASS, f"{head} -> PASS ({label}{extra}){tail}", measured=slope, limit=ceiling,
                   unit="MB/h", evidence=_evidence(a))


def _sampler_error(a: SoakAnalysis) -> str | None:
    return (a.result.samplers.get("server-memory") or {}).get("last_error")


def _ramp_words(g: Growth, rows: list[dict[str, Any]]) -> str:
    """Why no step explains the growth, from the per-round rises of the low envelope: ``rose in 6 of
    7 round-to-round steps (largest two +3.1, +2.9 MB of +18.4 MB), still rising in the last part``."""
    ys = [r["mem_min_mb"] for r in rows if r.get("mem_min_mb") is not None]
    rises = [b - a for a, b in zip(ys, ys[1:])]
    up = sorted((r for r in rises if r > 0), reverse=True)
    total = ys[-1] - ys[0] if ys else 0.0
    top = ", ".join(f"{r:+,.1f}" for r in up[:2]) or "none"
    late = ", still rising in the last part" if g.last is not None and g.last.sustained(g.ceiling) else ""
    return (f"a ramp: rose in {len(up)} of {len(rises)} round-to-round steps (largest two {top} MB of "
            f"{total:+,.1f} MB; no one or two rounds explain it){late}")


def latency_verdict(a: SoakAnalysis, profile: Profile) -> Verdict:
    """TTFT-p95 slope (ms/h) vs ``soak.ttft_p95_slope_max_ms_per_h`` (a step or a drift both
    FAIL when the interval shows it -- a short soak's step may stay INCONCLUSIVE, its residuals
    autocorrelated around the line; there is no plateau pass for latency) and the soak's error rate vs ``slo.error_rate_max``.
    As the latency gates judge a percentile: FAIL when the drift is shown (the whole run's or the
    last part's interval's lower bound above the ceiling, Theil-Sen agreeing: a linear drift or a
    late one), PASS only when the whole run's interval's upper bound is below it -- the PASS message
    then says whether the last part's interval is below too or straddles it (a late onset undecided),
    INCONCLUSIVE when it straddles it -- its cause the soak's length, with the rounds that would
    decide at the scatter measured (:func:`_undecided`)."""
    gate = "soak/latency"
    pre = _precheck(gate, a)
    if pre:
        return pre
    ceiling = a.spec.ttft_p95_slope_max_ms_per_h
    rate = a.errors / a.requests if a.requests else 0.0
    problems = []
    if rate > profile.slo.error_rate_max:
        samples = sorted({r.get("errors") for r in a.result.measured if r.get("errors")})
        problems.append(f"{a.errors} of {a.requests} requests failed ({rate:.1%} > {profile.slo.error_rate_max:.1%}; "
                        f"per-round error counts {samples[:5]})")
    if a.ttft is None:
        if problems:
            return Verdict(gate, FAIL, f"{'; '.join(problems)}; {a.ttft_why} over {_what(a)} -> FAIL",
                           measured=round(rate, 4), limit=profile.slo.error_rate_max, unit="ratio",
                           evidence=_evidence(a))
        return Verdict(gate, INVALID, f"{a.ttft_why} over {_what(a)}: raise soak.rate_rps or soak.round -> INVALID",
                       limit=ceiling, unit="ms/h", evidence=_evidence(a))
    g = a.ttft
    ys = [r["ttft_p95_ms"] for r in a.result.measured if r["ttft_p95_ms"] is not None]
    last = f"; last part {_ci(g.last, 'ms/h')}" if g.last else ""
    head = (f"TTFT p95 {ys[0]:,.0f} -> {ys[-1]:,.0f} ms, slope {_ci(g.full, 'ms/h')}{last} over {_what(a)}; "
            f"ceiling {ceiling:g} ms/h")
    pre_s = "n/a (no /metrics)" if a.preemptions is None else f"{a.preemptions:,.0f}"
    seen = (f"; errors {a.errors}/{a.requests} in the measured rounds (the mix's counts include the warm-up); "
            f"preemptions {pre_s}")
    d = a.drift
    if d is not None:  # --soak-control: the control's slope beside the gated one's
        ctl = a.result.control.get("endpoint") if a.result.control else "the control"
        seen += (f"; control {ctl} (the same rounds alongside): TTFT p95 slope {_ci(a.control.full, 'ms/h')}"
                 if a.control is not None else f"; control {ctl}: {a.control_why}")
    if a.ttft_shown:
        problems.insert(0, f"{a.classification}: {a.explanation}")
        if d is not None:
            problems.insert(0, f"drift cause {d.kind}: {d.short}")
    slope = round(g.full.slope, 3)
    if problems:  # the drift's cause is the soak's classification of it (memory growth, preemptions, queueing)
        cause = f"{a.classification}: {a.explanation}" if a.ttft_shown else None
        if cause is not None and d is not None:  # local, shared or undecided first, from the control
            cause = f"{d.words}; {cause}"
        return Verdict(gate, FAIL, f"{head} -> FAIL ({'; '.join(problems)}){seen}", measured=slope,
                       limit=ceiling, unit="ms/h", evidence=_evidence(a), cause=cause)
    if math.isnan(g.full.ci_high) or g.full.ci_high >= ceiling:  # a PASS needs the whole interval below
        why, cause = _undecided(a, g, "ttft_p95_ms", "TTFT p95", "ms", "TTFT drift", keep=lambda r: r["client_kept_up"])
        if d is not None:
            why += f"; drift cause {d.kind}: {d.short}"
            cause += f"; {d.words}"
        return Verdict(gate, INCONCLUSIVE, f"{head} -> INCONCLUSIVE ({why}){seen}", measured=slope, limit=ceiling,
                       unit="ms/h", evidence=_evidence(a), cause=cause)
    # The whole run's upper bound tests a linear drift and carries the PASS; the last part is the
    # check for a late onset: shown above the ceiling it FAILed above (ttft_shown), below it agrees,
    # and straddling it is undecided -- said so, never folded into "no drift".
    lp = g.last
    if lp is None:
        label = "no TTFT drift: the whole interval is below the ceiling (no last part fitted)"
    elif lp.below(ceiling):
        label = "no TTFT drift: the whole interval is below the ceiling, and the last part's too"
    else:
        label = (f"no linear TTFT drift: the whole run's interval is below the ceiling; the last part's interval "
                 f"{lp.ci_low:+,.1f}..{lp.ci_high:+,.1f} ms/h straddles it, so a late onset is neither shown "
                 "nor ruled out (a late drift FAILs only once that part's lower bound clears the ceiling)")
    label += "" if a.classification == "healthy" else f"; soak classified {a.classification}"
    if d is not None:
        label += f"; {d.short}"
    return Verdict(gate, PASS, f"{head} -> PASS ({label}){seen}", measured=slope, limit=ceiling,
                   unit="ms/h", evidence=_evidence(a))


def gpu_verdict(a: SoakAnalysis, profile: Profile) -> Verdict:
    """Peak GPU memory used per local device (NVML) vs ``engine.gpu_memory_utilization`` x total
    (+ ``soak.gpu_slack_mib``): the headroom left for everything outside vLLM's budget must stay.
    SKIP with the reason when NVML is absent, the server is remote, or the profile runs on CPU."""
    gate = "soak/gpu-memory"
    r = a.result
    if r.gpu_skip or not r.gpu:
        return Verdict(gate, SKIP, f"GPU memory not watched: {r.gpu_skip or 'no GPU sampled'} -> SKIP",
                       unit="MiB", evidence={"samplers": r.samplers})
    pre = _precheck(gate, a)
    if pre:
        return pre
    util = profile.engine.gpu_memory_utilization
    default = util is None
    util = 0.92 if util is None else util
    slack = a.spec.gpu_slack_mib
    parts, bad = [], []
    devices = []
    for d in r.gpu:
        total, peak = d["total_bytes"] / MIB, d["peak_used_bytes"] / MIB
        limit = util * total + slack
        devices.append({"gpu": d["index"], "name": d["name"], "total_mib": round(total), "peak_used_mib": round(peak),
                        "limit_mib": round(limit), "headroom_mib": round(total - peak)})
        s = f"GPU{d['index']} peak {peak:,.0f} of {total:,.0f} MiB ({peak / total:.1%})"
        parts.append(s)
        if peak > limit:
            bad.append(f"{s} > {util:g} x total + {slack:g} MiB = {limit:,.0f} MiB")
    budget = f"gpu_memory_utilization {util:g}{' (vLLM default)' if default else ''} + {slack:g} MiB slack"
    ev = {"devices": devices, "gpu_memory_utilization": util, "slack_mib": slack, "samplers": r.samplers}
    worst = max(devices, key=lambda d: d["peak_used_mib"] - d["limit_mib"])
    if bad:
        return Verdict(gate, FAIL, f"{'; '.join(bad)} -> FAIL (the headroom outside vLLM's budget is gone: a process "
                       "or allocation outside the KV pool grew; the next spike OOMs)", measured=worst["peak_used_mib"],
                       limit=worst["limit_mib"], unit="MiB", evidence=ev)
    return Verdict(gate, PASS, f"{'; '.join(parts)} within {budget} over {_what(a)} -> PASS",
                   measured=worst["peak_used_mib"], limit=worst["limit_mib"], unit="MiB", evidence=ev)


__all__ = ["DriftCause", "SoakAnalysis", "analyze", "drift_cause", "gpu_verdict", "latency_verdict", "memory_verdict", "ran", "undecided"]
