"""Sampling a latency percentile until it is decided: batches of requests sent in the planned
looks of :func:`kvgate.stats.confidence.plan_looks`, judged after each (:func:`kvgate.stats.confidence.sample_until_decided`).

- :func:`sample_batches` is the driver: ``send(k, seconds_left)`` sends one batch for ``k`` more
  samples (a closed-loop run, a few interference waves, a slice of a replay plan) and returns its
  :class:`~kvgate.load.LoadResult` and how many samples it added; ``decide(records, level)``
  judges every record so far at the plan's per-look level. Batches are merged onto one time base
  (:func:`merge_results`: seconds since the first batch's start).
- :func:`sample_latency` is the closed-loop case (the latency-SLO gate; the capacity gate's steps):
  the same prompt specs cycled at one concurrency, batch after batch.
- :func:`slo_samples` / :func:`judge_slo` / :func:`slo_decisions`: what the latency-SLO gate judges
  per request (TTFT, ITL, e2e, ms) and its decisions, shared by the sampling loop and the verdict
  (:func:`kvgate.gates.load.latency_verdict`) so both judge the same numbers.

**ITL** is the field's ITL: percentiles over **all inter-token gaps pooled across requests**,
exactly as ``vllm bench serve`` computes it (``vllm/benchmarks/serve.py``, ``calculate_metrics``:
each successful request's gaps extended into one list, ``np.percentile`` over it;
:func:`kvgate.stats.cluster.pooled_percentile`). Its confidence bound does not come from order
statistics over gaps -- a request's gaps are correlated (one prefill stalls every running stream
at once), and the requests of one closed-loop batch share the engine's steps, so neither gaps nor
requests are the independent unit -- but from a cluster bootstrap over waves (the ``slo.concurrency``
requests sent together, by send index; :func:`kvgate.stats.cluster.judge_pooled`: whole waves
resampled, the pooled p95 recomputed; unit = wave, the ICC between requests in a wave and the
effective n stated). TPOT, the per-request mean
gap ``(e2e - ttft) / (tokens - 1)``, stays in the samples (``tpot_ms``) where a per-request
quantity is meant. TTFT and e2e are one sample per request, judged by order statistics.

**Deadline censoring.** A request cut by kvgate's own time bound (the look's share of
``max_s``, a capacity step's, interference's waves') is ``censored``
(:attr:`kvgate.load.record.RequestRecord.censored`): it is not an error (:func:`error_rate` leaves
it out), and in the latency samples it is right-censored at its elapsed time: one that had already
passed a metric's limit counts as an exceedance of that limit, the others leave that sample; the
run stops with ``why_stopped`` "time" (INCONCLUSIVE where undecided), never a FAIL for errors.
Batches after the first get the e2e seen so far so no request starts that cannot finish in the
time left (:func:`kvgate.load.schedule.run_closed_loop`).

Every batch is bounded in count (the look's size) and time (the plan's ``max_s``; the first look
by the caller's ``deadline_s``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvgate.stats.confidence import (FAIL, PASS, UNDECIDED, Judgement, LookPlan, Sampling, family_level, judge,
                                     sample_until_decided)
from kvgate.stats.proportion import RateJudgement, judge_at_most
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.schedule import LoadResult, closed_loop, frozen_heap
from kvgate.stats import request_metrics
from kvgate.stats.cluster import judge_pooled

#: (record-metric key, ``slo`` field, label) of the percentiles the latency-SLO gate judges.
SLO_METRICS = (("ttft_ms", "ttft_p95_ms", "TTFT"), ("itl_ms", "itl_p95_ms", "ITL"), ("e2e_ms", "e2e_p95_ms", "e2e"))
#: The quantile every SLO field names (``*_p95_ms``).
Q = 0.95
#: The decision key of the error rate (a point check at every look: ``slo.error_rate_max``).
ERRORS = "errors"


def slo_samples(records: Sequence[Any], slo: Any = None) -> dict[str, Any]:
    """The latency-SLO samples (ms) of ``records``: per request ``ttft_ms``, ``e2e_ms`` and
    ``tpot_ms`` (succeeded records; hang-ups left out), ``itl_ms`` = every inter-token gap of
    the succeeded records pooled (``vllm bench serve``'s ITL list; its p95 is the field's ITL p95),
    ``itl_gaps_ms`` = the same gaps per request (a list of lists, the clusters of
    :func:`kvgate.stats.cluster.judge_pooled`; requests with fewer than two content events add none)
    and ``itl_gaps_s`` = those in seconds (what :func:`judge_slo` judges: percentile of seconds,
    then x 1000, exactly as ``vllm bench serve``), ``itl_index`` = each of those requests' send
    index (``RequestRecord.index``; its position when a record has none): :func:`judge_slo` groups
    them into waves of ``slo.concurrency`` (``index // concurrency``).

    Censored records (kvgate's deadline cut them; see the module docstring) are right-censored
    at their elapsed time when ``slo`` (a :class:`~kvgate.profile.models.SLOSpec`) is given: a
    TTFT already seen counts as measured; one not seen, or an e2e, that had already run past its
    limit counts as an exceedance (the elapsed time, > limit); the rest leave the sample. Their
    gaps leave the ITL sample (a cut stream is not a finished one, as ``vllm bench serve``)."""
    out: dict[str, Any] = {"ttft_ms": [], "itl_ms": [], "e2e_ms": [], "tpot_ms": [], "itl_gaps_ms": [],
                           "itl_gaps_s": [], "itl_index": []}
    for pos, r in enumerate(records):
        if getattr(r, "hung_up", False):
            continue
        if getattr(r, "censored", False):
            if slo is not None:
                _censored(r, slo, out)
            continue
        if not r.ok:
            continue
        m = request_metrics(r)
        if m.ttft_s is not None:
            out["ttft_ms"].append(m.ttft_s * 1e3)
        if m.e2e_s is not None:
            out["e2e_ms"].append(m.e2e_s * 1e3)
        if m.tpot_s is not None:
            out["tpot_ms"].append(m.tpot_s * 1e3)
        if m.itl_s:
            gaps = [g * 1e3 for g in m.itl_s]
            out["itl_gaps_s"].append(list(m.itl_s))
            idx = getattr(r, "index", None)
            out["itl_index"].append(pos if idx is None else int(idx))
            out["itl_gaps_ms"].append(gaps)
            out["itl_ms"].extend(gaps)
    return out


def _censored(r: Any, slo: Any, out: dict[str, Any]) -> None:
    """Add censored record ``r`` to ``out`` where it is evidence (:func:`slo_samples`)."""
    if r.sent_s is None or r.end_s is None:
        return
    elapsed = (r.end_s - r.sent_s) * 1e3
    ttft_limit, e2e_limit = getattr(slo, "ttft_p95_ms", None), getattr(slo, "e2e_p95_ms", None)
    if r.first_token_s is not None:
        out["ttft_ms"].append((r.first_token_s - r.sent_s) * 1e3)
    elif ttft_limit is not None and elapsed > ttft_limit:
        out["ttft_ms"].append(elapsed)
    if e2e_limit is not None and elapsed > e2e_limit:
        out["e2e_ms"].append(elapsed)


def censored_count(records: Sequence[Any]) -> int:
    """Records cut by kvgate's own deadline (:attr:`~kvgate.load.record.RequestRecord.censored`)."""
    return sum(1 for r in records if getattr(r, "censored", False))


def slo_levels(slo: Any, confidence: float, pass_confidence: float | None = None) -> tuple[float, float]:
    """(FAIL-side level, PASS-side level) of each latency metric the ``slo`` judges (F11): any one
    metric's FAIL fails latency/slo, so the FAIL side is corrected over the ``m`` SLO'd metrics of
    :data:`SLO_METRICS` (:func:`kvgate.stats.confidence.family_level`: ``1 - (1 - confidence) / m``,
    Bonferroni); the PASS side (every metric must PASS) stays at ``pass_confidence`` (``confidence``
    when None). Used by :func:`judge_slo` and :func:`kvgate.load.scenarios.latency_judgements` alike,
    so the sampling's decisions and the verdict judge each side at the same level."""
    m = sum(1 for _, field_name, _ in SLO_METRICS if getattr(slo, field_name, None) is not None)
    return family_level(confidence, m), (confidence if pass_confidence is None else pass_confidence)


def judge_slo(records: Sequence[Any], slo: Any, confidence: float,
              pass_confidence: float | None = None) -> dict[str, Judgement]:
    """label (``TTFT``/``ITL``/``e2e``) -> :class:`~kvgate.stats.confidence.Judgement` of its p95 against
    ``slo.<field>`` at ``confidence`` (the PASS side at ``pass_confidence`` when given:
    :attr:`~kvgate.stats.confidence.LookPlan.pass_level`), for every metric the ``slo`` (a
    :class:`~kvgate.profile.models.SLOSpec`) sets a limit on. TTFT and e2e: order statistics over
    requests; ITL: the pooled-gap p95 with a cluster bootstrap over the closed loop's waves (the
    requests sent together: send index // ``slo.concurrency``; seed 0: the same records give the
    same bound), a :class:`~kvgate.stats.cluster.PooledJudgement` (unit wave; the module docstring of
    :mod:`kvgate.stats.cluster` says why always the wave). The FAIL side is
    corrected over the metrics judged (:func:`slo_levels`; F11), the PASS side is not."""
    xs = slo_samples(records, slo)
    confidence, pass_confidence = slo_levels(slo, confidence, pass_confidence)
    out: dict[str, Judgement] = {}
    for key, field_name, label in SLO_METRICS:
        if (limit := getattr(slo, field_name)) is None:
            continue
        if key == "itl_ms":
            c = max(1, int(getattr(slo, "concurrency", 1) or 1))
            out[label] = judge_pooled(xs["itl_gaps_s"], Q, limit, confidence, pass_confidence, rng=0, scale=1e3,
                                      waves=[i // c for i in xs["itl_index"]])
        else:  # failed requests as exceedances when an error allowance lets them through (F10)
            out[label] = judge(with_failures(xs[key], records, slo), Q, limit, confidence, pass_confidence)
    return out


def error_rate(records: Sequence[Any]) -> tuple[int, int]:
    """(errors, judged requests): failed records among those neither deliberately hung up nor
    censored by kvgate's own deadline (those are not the server's errors)."""
    judged = [r for r in records if not getattr(r, "hung_up", False) and not getattr(r, "censored", False)]
    return sum(1 for r in judged if not r.ok), len(judged)


def judge_errors(records: Sequence[Any], slo: Any, confidence: float,
                 pass_confidence: float | None = None) -> RateJudgement:
    """The error rate (:func:`error_rate`; unit: the request) against ``slo.error_rate_max``
    (:func:`kvgate.stats.proportion.judge_at_most`): with an allowance above 0, PASS when the
    one-sided Clopper-Pearson upper bound at ``pass_confidence`` (None: ``confidence``) is within
    it, FAIL when the lower bound at ``confidence`` is above it, else UNDECIDED; an allowance of 0
    is a count (any error FAILs, a measured fact). ``confidence`` is the look's FAIL-side level
    (the run's false-alarm budget share when one is set), ``pass_confidence`` the PASS side's
    (:func:`errors_pass_level`), so the budget makes no error-rate PASS stricter."""
    bad, n = error_rate(records)
    if pass_confidence is None or pass_confidence == confidence:
        return judge_at_most(bad, n, slo.error_rate_max, confidence)
    return judge_at_most(bad, n, slo.error_rate_max, pass_confidence, fail_confidence=confidence)


def errors_pass_level(plan: LookPlan | None) -> float | None:
    """The error rate's PASS-side level at a look of ``plan``: ``1 - (1 - confidence) / K`` over its
    ``K`` looks (Bonferroni over every look: an error-rate PASS is possible at any look), the level
    both sides had before a run's false-alarm budget moved the FAIL side to ``plan.per_look``; None
    when the plan has no budget (``fail_confidence`` None: both sides at ``per_look``, as before)
    or there is no plan. Not :attr:`~kvgate.stats.confidence.LookPlan.pass_level`: that one is
    corrected only over the looks large enough for a p95 PASS."""
    if plan is None or plan.fail_confidence is None:
        return None
    return 1 - (1 - plan.confidence) / len(plan.looks)


def with_failures(samples: list[float], records: Sequence[Any], slo: Any) -> list[float]:
    """``samples`` (TTFT or e2e, ms) with every failed request (:func:`error_rate`'s errors) counted
    as an exceedance (+inf: it met no latency limit) when ``slo.error_rate_max`` > 0 -- dropping the
    failures an allowance lets through would bias the p95 low (the slowest are the ones cut). With
    an allowance of 0 any error FAILs the gate by itself, and ``samples`` come back as given."""
    if not getattr(slo, "error_rate_max", 0):
        return list(samples)
    bad, _ = error_rate(records)
    return list(samples) + [math.inf] * bad


def slo_decisions(records: Sequence[Any], slo: Any, confidence: float,
                  pass_confidence: float | None = None, errors_pass_confidence: float | None = None) -> dict[str, str]:
    """The sampling loop's decisions: each SLO'd metric's (:func:`judge_slo`) plus ``errors``
    (:func:`judge_errors` at ``confidence``, its PASS side at ``errors_pass_confidence`` when given,
    :func:`errors_pass_level`: a FAIL stands whatever more samples say; no request judged yet:
    PASS, the metrics decide)."""
    out = {label: j.decision for label, j in judge_slo(records, slo, confidence, pass_confidence).items()}
    ej = judge_errors(records, slo, confidence, errors_pass_confidence)
    out[ERRORS] = ej.decision if ej.n else PASS
    return out


def merge_results(parts: Sequence[tuple[float, LoadResult]]) -> LoadResult:
    """One :class:`LoadResult` of batches run one after another: ``(start_s, result)`` with
    ``start_s`` the batch's start on the common time base (seconds since the first batch's start).
    Records are shifted onto it and re-indexed in send order; lags, CPU seconds and requested
    counts add up; ``deadline_hit`` if any batch hit its deadline. The records are the batches'
    own objects (shifted in place)."""
    if not parts:
        return LoadResult("closed", [], 0, 0.0, 0.0)
    first = parts[0][1]
    records: list[RequestRecord] = []
    lags: list[float] = []
    for start, res in parts:
        records += [r.shift(start) for r in res.records]
        lags += res.loop_lag_s
    for i, r in enumerate(records):
        r.index = i
    ends = [r.end_s for r in records if r.end_s is not None]
    conns = [res.connections_opened for _, res in parts]
    return LoadResult(first.mode, records, sum(res.n_requested for _, res in parts), max(ends, default=0.0),
                      sum(res.deadline_s for _, res in parts), deadline_hit=any(res.deadline_hit for _, res in parts),
                      concurrency=first.concurrency, rate_rps=first.rate_rps, loop_lag_s=lags,
                      cpu_s=sum(res.cpu_s for _, res in parts), transport=first.transport,
                      connections_opened=None if any(c is None for c in conns) else sum(c for c in conns if c))


@dataclass
class Sampled:
    """What :func:`sample_batches` sent: ``result`` (every batch merged, :func:`merge_results`),
    ``sampling`` (the looks taken, decisions, why it stopped), ``batches`` (each batch's start on
    the common time base, seconds, and its own result, before merging)."""

    result: LoadResult
    sampling: Sampling
    batches: list[tuple[float, LoadResult]] = field(default_factory=list)


def sample_batches(plan: LookPlan, send: Callable[[int, float | None], tuple[LoadResult, int]],
                   decide: Callable[[list[Any], float], dict[str, str]], *, first_deadline_s: float | None = None,
                   clock: Callable[[], float] = time.monotonic, stop_on_fail: bool = True) -> Sampled:
    """Drive ``plan``'s looks with batches: ``send(k, seconds_left)`` sends one batch for ``k``
    more samples within ``seconds_left`` (the first look gets ``first_deadline_s`` when given,
    else the plan's ``max_s``; later looks what is left of ``max_s``) and returns ``(result,
    samples_added)``; ``decide(records_so_far, per_look_confidence)`` judges every record sent.
    ``stop_on_fail``: stop at the first look with a FAIL (the verdict is FAIL whatever the other
    metrics would say later; why_stopped ``decided``). ``clock``: seconds (injected in tests). The
    batches run inside one :func:`~kvgate.load.schedule.frozen_heap`. Returns :class:`Sampled`."""
    batches: list[tuple[float, LoadResult]] = []
    records: list[Any] = []
    t0 = 0.0  # set once the heap is frozen: the collection is not the first batch's time

    def take(k: int, left: float | None) -> int:
        if not batches and first_deadline_s is not None:
            left = first_deadline_s
        start = clock() - t0
        res, added = send(k, left)
        batches.append((start, res))
        for j, r in enumerate(res.records):  # send order across batches, as merge_results numbers them: each
            r.index = len(records) + j       # look's decide (its send-order dependence) sees the verdict's order
        records.extend(res.records)
        return added

    failed: dict[str, str] = {}

    def judged(level: float) -> dict[str, str]:
        d = decide(records, level)
        if stop_on_fail and FAIL in d.values():  # decided: a FAIL stands; what is still open stays UNDECIDED below
            failed.clear()
            failed.update(d)
            return {k: (FAIL if v == UNDECIDED else v) for k, v in d.items()}
        return d

    with frozen_heap():  # one full collection for all the batches, not one before each (schedule.frozen_heap)
        t0 = clock()
        s = sample_until_decided(plan, take, judged, clock=clock)
    if s.why_stopped == "source" and batches and batches[-1][1].deadline_hit:
        s.why_stopped = "time"  # the batch stopped at the time bound (requests that could not finish not started)
    if failed:
        s.decisions = dict(failed)
        if s.history:
            s.history[-1]["decisions"] = dict(failed)
    return Sampled(merge_results(batches), s, list(batches))


def sample_latency(endpoint: Any, specs: Sequence[RequestSpec], concurrency: int, plan: LookPlan,
                   decide: Callable[[list[Any], float], dict[str, str]], *, deadline_s: float = 300.0,
                   request_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                   clock: Callable[[], float] = time.monotonic, loop: Callable[..., LoadResult] = closed_loop,
                   stop_on_fail: bool = True) -> Sampled:
    """Closed-loop batches at ``concurrency`` (``specs`` cycled; each batch starts with all its
    workers at once, as one :func:`~kvgate.load.closed_loop` run) until ``decide`` has decided,
    in ``plan``'s looks: the first look's batch is bounded by ``deadline_s`` seconds, later ones by
    what is left of ``plan.max_s``; every request by ``request_timeout_s`` and cut after
    ``idle_timeout_s`` of silence. ``loop``: the runner (tests inject a fake); it gets
    ``expected_e2e_s``, the e2e seconds of the requests finished in earlier batches (empty at
    first), so it starts none that cannot finish in the time left. Returns :class:`Sampled` (samples = requests
    sent and not censored: a batch cut by the time bound adds fewer than asked, and the sampling
    stops with why "time")."""
    seen_e2e: list[float] = []  # seconds, the finished requests of earlier batches

    def send(k: int, left: float | None) -> tuple[LoadResult, int]:
        budget = deadline_s if left is None else max(0.001, min(left, deadline_s))
        res = loop(endpoint, list(specs), n=k, concurrency=concurrency, deadline_s=budget,
                   request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s, expected_e2e_s=list(seen_e2e))
        seen_e2e.extend(r.end_s - r.sent_s for r in res.records
                        if r.ok and r.sent_s is not None and r.end_s is not None)
        return res, len(res.records) - censored_count(res.records)

    return sample_batches(plan, send, decide, first_deadline_s=deadline_s, clock=clock, stop_on_fail=stop_on_fail)


__all__ = ["ERRORS", "Q", "SLO_METRICS", "Sampled", "censored_count", "error_rate", "errors_pass_level", "judge_errors", "judge_slo", "merge_results", "sample_batches",
           "sample_latency", "slo_decisions", "slo_levels", "slo_samples", "with_failures"]
