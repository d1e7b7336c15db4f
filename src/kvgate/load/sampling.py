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

**ITL** is judged per request: each request contributes one sample, the p95 of its own
inter-token gaps (ms). Pooled gaps (31 per 32-token request) are correlated within a request --
one prefill stalls every running stream at once -- so an order-statistic bound over them would
claim ``n`` = gaps where the independent units are requests (optimistic); per request, ``n`` is
the number of requests that streamed two or more tokens. The pooled gap p95 (what
``vllm bench serve`` reports as ITL p95) stays in the evidence (``summary.itl_ms``) as context.
TTFT and e2e are one sample per request already.

Every batch is bounded in count (the look's size) and time (the plan's ``max_s``; the first look
by the caller's ``deadline_s``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvgate.stats.confidence import FAIL, PASS, UNDECIDED, Judgement, LookPlan, Sampling, judge, sample_until_decided
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.schedule import LoadResult, closed_loop, frozen_heap
from kvgate.stats import percentile, request_metrics

#: (record-metric key, ``slo`` field, label) of the percentiles the latency-SLO gate judges.
SLO_METRICS = (("ttft_ms", "ttft_p95_ms", "TTFT"), ("itl_ms", "itl_p95_ms", "ITL"), ("e2e_ms", "e2e_p95_ms", "e2e"))
#: The quantile every SLO field names (``*_p95_ms``).
Q = 0.95
#: The decision key of the error rate (a point check at every look: ``slo.error_rate_max``).
ERRORS = "errors"


def slo_samples(records: Sequence[Any]) -> dict[str, list[float]]:
    """Per-request samples (ms) of the records that succeeded (hang-ups left out):
    ``ttft_ms``, ``e2e_ms`` and ``itl_ms`` = each request's own p95 inter-token gap (requests with
    at least two content events; see the module docstring)."""
    out: dict[str, list[float]] = {"ttft_ms": [], "itl_ms": [], "e2e_ms": []}
    for r in records:
        if getattr(r, "hung_up", False) or not r.ok:
            continue
        m = request_metrics(r)
        if m.ttft_s is not None:
            out["ttft_ms"].append(m.ttft_s * 1e3)
        if m.e2e_s is not None:
            out["e2e_ms"].append(m.e2e_s * 1e3)
        if m.itl_s:
            out["itl_ms"].append(percentile(m.itl_s, Q * 100) * 1e3)
    return out


def judge_slo(records: Sequence[Any], slo: Any, confidence: float,
              pass_confidence: float | None = None) -> dict[str, Judgement]:
    """label (``TTFT``/``ITL``/``e2e``) -> :class:`~kvgate.stats.confidence.Judgement` of its p95 against
    ``slo.<field>`` at ``confidence`` (the PASS side at ``pass_confidence`` when given:
    :attr:`~kvgate.stats.confidence.LookPlan.pass_level`), for every metric the ``slo`` (a
    :class:`~kvgate.profile.models.SLOSpec`) sets a limit on."""
    xs = slo_samples(records)
    return {label: judge(xs[key], Q, limit, confidence, pass_confidence)
            for key, field_name, label in SLO_METRICS if (limit := getattr(slo, field_name)) is not None}


def error_rate(records: Sequence[Any]) -> tuple[int, int]:
    """(errors, judged requests): failed records among those not deliberately hung up."""
    judged = [r for r in records if not getattr(r, "hung_up", False)]
    return sum(1 for r in judged if not r.ok), len(judged)


def slo_decisions(records: Sequence[Any], slo: Any, confidence: float,
                  pass_confidence: float | None = None) -> dict[str, str]:
    """The sampling loop's decisions: each SLO'd metric's (:func:`judge_slo`) plus ``errors``: FAIL
    once the error rate exceeds ``slo.error_rate_max`` (a FAIL whatever more samples say), else PASS."""
    out = {label: j.decision for label, j in judge_slo(records, slo, confidence, pass_confidence).items()}
    bad, n = error_rate(records)
    out[ERRORS] = FAIL if n and bad / n > slo.error_rate_max else PASS
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
    ``idle_timeout_s`` of silence. ``loop``: the runner (tests inject a fake). Returns
    :class:`Sampled` (samples = requests sent)."""
    def send(k: int, left: float | None) -> tuple[LoadResult, int]:
        budget = deadline_s if left is None else max(0.001, min(left, deadline_s))
        res = loop(endpoint, list(specs), n=k, concurrency=concurrency, deadline_s=budget,
                   request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s)
        return res, len(res.records)

    return sample_batches(plan, send, decide, first_deadline_s=deadline_s, clock=clock, stop_on_fail=stop_on_fail)


__all__ = ["ERRORS", "Q", "SLO_METRICS", "Sampled", "error_rate", "judge_slo", "merge_results", "sample_batches",
           "sample_latency", "slo_decisions", "slo_samples"]
