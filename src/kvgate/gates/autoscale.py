"""Pure verdict of the autoscale-signal gate: does the queue metric an autoscaler reads rise
under a burst and drain after it?

Autoscaling an LLM server on GPU utilisation does not work: a saturated vLLM keeps the GPU busy
at the same utilisation whether 1 or 100 requests wait. The signal platform teams scale on is the
queue (``vllm:num_requests_waiting``, read by a KEDA ScaledObject's Prometheus trigger or an HPA
external metric; example in ``ci/keda-scaledobject.yaml``). Two silent misconfigurations break it:
a metric that never moves (wrong name, a gateway's own queue in front, a server that admits
everything and queues internally where the metric cannot see) and a metric that never falls
back (a stuck gauge keeps the deployment scaled out). Input: a
:class:`~kvgate.load.scenarios.BurstObservation`; no I/O.
"""

from __future__ import annotations

from typing import Any

from kvgate.profile.models import AutoscaleSpec
from kvgate.load.scenarios import BurstObservation
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, SKIP

GATE = "autoscale-signal/burst"


def signal_points(obs: BurstObservation) -> list[tuple[float, float]]:
    """The metric's readings as ``(t_s, value)``, ``t_s`` seconds since the burst began
    (negative: scraped before it), scrapes where the metric was absent left out."""
    return [(round(t - obs.burst_start_s, 3), v[obs.metric]) for t, v in obs.trace.samples
            if v.get(obs.metric) is not None]


def autoscale_verdict(obs: BurstObservation, spec: AutoscaleSpec) -> Verdict:
    """FAIL when ``spec.metric`` is absent from ``/metrics``, never exceeds ``spec.threshold``
    within ``spec.rise_within_s`` seconds of the burst's start, or is still above
    ``spec.drain_to`` ``spec.drain_within_s`` seconds after the burst's last request ended;
    SKIP when the endpoint serves no ``/metrics`` (the signal cannot be watched from here).
    ``measured``: the metric's peak (its units: requests for the queue), ``limit``: the threshold.
    """
    n, metric, thr = obs.requests, obs.metric, spec.threshold
    ok = sum(1 for r in obs.result.records if r.ok)
    seqs = f"max_num_seqs {obs.max_num_seqs}" if obs.max_num_seqs else "max_num_seqs: server default"
    burst = f"burst of {n} {obs.workload} requests at once ({ok} of {n} completed 200; {seqs})"
    points = signal_points(obs)
    served_s = obs.burst_end_s - obs.burst_start_s
    ev: dict[str, Any] = {"metric": metric, "threshold": thr, "points": points, "burst_served_s": round(served_s, 3),
                          "scrapes": len(obs.trace.samples), "scrape_errors": obs.trace.errors}
    if not obs.trace.available:
        return Verdict(GATE, SKIP, f"{burst}; the endpoint serves no /metrics here, so {metric} cannot be watched "
                       "from kvgate (the autoscaler scrapes the pods; point kvgate at a pod) -> SKIP", limit=thr,
                       evidence=ev)
    if not points:
        return Verdict(GATE, FAIL, f"{burst}; {metric} is absent from /metrics in all {len(obs.trace.samples)} "
                       "scrapes -> FAIL (an autoscaler reading it sees nothing; check the metric name in "
                       "autoscale.metric and the trigger)", limit=thr, evidence=ev)
    peak = max(v for _, v in points)
    above = [t for t, v in points if v > thr and t >= 0]
    rise_s = above[0] if above else None
    after = [(t - served_s, v) for t, v in points if t >= served_s]
    drained = [t for t, v in after if v <= spec.drain_to]
    drain_s = drained[0] if drained else None
    ev.update(peak=peak, rise_s=rise_s, drain_s=drain_s)
    problems = []
    if rise_s is None:
        if not obs.max_num_seqs:  # how many run at once is not known: nothing is known to have waited
            hint = (f"; max_num_seqs is not declared, so whether any of the {n} had to wait is not known (declare "
                    "engine.max_num_seqs, or raise autoscale.burst_requests above the server's)")
        elif n <= obs.max_num_seqs:
            hint = (f"; the burst ({n}) is not above max_num_seqs ({obs.max_num_seqs}): nothing had to wait -- raise "
                    "autoscale.burst_requests")
        else:
            hint = (f"; requests waited (the burst of {n} exceeds max_num_seqs {obs.max_num_seqs}) but the metric did "
                    "not show it")
        problems.append(f"{metric} peaked at {peak:g}, never above the threshold {thr:g}{hint} -- the autoscaler "
                        "never sees the burst")
    elif rise_s > spec.rise_within_s:
        problems.append(f"{metric} crossed the threshold {thr:g} only {rise_s:.1f} s into the burst (allowed "
                        f"{spec.rise_within_s:g} s)")
    last = after[-1][1] if after else points[-1][1]
    if drain_s is None or drain_s > spec.drain_within_s:
        waited = after[-1][0] if after else 0.0
        problems.append(f"{metric} still {last:g} (> {spec.drain_to:g}) {waited:.1f} s after the burst was served "
                        f"(allowed {spec.drain_within_s:g} s) -- a gauge that does not drain keeps the deployment "
                        "scaled out")
    if problems:
        return Verdict(GATE, FAIL, f"{burst}; " + "; ".join(problems) + " -> FAIL", measured=peak, limit=thr,
                       evidence=ev)
    return Verdict(GATE, PASS, f"{burst}: {metric} rose to {peak:g} (> threshold {thr:g}) {rise_s:.1f} s after it "
                   f"began (allowed {spec.rise_within_s:g} s) and drained to {spec.drain_to:g} {drain_s:.1f} s after "
                   f"it was served ({served_s:.1f} s; allowed {spec.drain_within_s:g} s) -> PASS",
                   measured=peak, limit=thr, evidence=ev)


__all__ = ["GATE", "autoscale_verdict", "signal_points"]
