"""Pure verdicts of a split run (``--workers``): is every worker's part trustworthy, and the
merged gate verdict with the per-worker counts. Inputs are :class:`~kvgate.scale.merge.ScaleRun`
(what the coordinator saw: joins, batches, parts, losses); no I/O.

:func:`worker_checks` holds each worker to the rules one process is held to, named:

- it **joined** the coordinator within the join budget and shipped a part of **every batch** (a
  worker whose process was killed, whose heartbeats stopped, or whose part never came is *lost*:
  its requests are missing from the merge);
- its batch did not break (``error`` in its part);

(a lost worker is INVALID at once; otherwise every rule a worker broke is named, each at the
first batch that broke it)
- its **clock** could be put on the coordinator's within ``limits.schedule_lag_max_s`` (the timing
  budget): the uncertainty of the exchange plus the drift between the readings before and after
  the batch (:func:`kvgate.scale.clock.residual_s`) -- the offset itself is corrected, what cannot
  be corrected is held;
- it **started on time**: its loop began within the same budget of the batch's shared start
  instant (coordinator clock) -- a worker that missed the barrier sent all its requests that much
  late, the same rule as a request's schedule lag in one process;
- its **client kept up** with its schedule (:meth:`kvgate.load.LoadResult.invalid_verdict` at
  ``limits.schedule_lag_max_s``, on its own records and event-loop lag); the cause names its
  host's load when that was measured (:mod:`kvgate.scale.host`).

:func:`scaled_verdict` wraps the gate's own verdict of the merged records (judged by the gate's
own function, e.g. :func:`kvgate.gates.load.latency_verdict`): any worker check INVALID -> the
gate is INVALID naming the worker(s), with what it would have been in the message and evidence
-- never a PASS (or FAIL) on a partial or untrusted merge; else the gate's verdict with the
per-worker counts added. :func:`merged_latency_verdict` is ``kvgate merge DIR``: the latency gate
over a run directory's batches, its looks replayed (:func:`kvgate.scale.merge.resample`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvgate.scale.batch import batch_label
from kvgate.scale.clock import residual_s
from kvgate.scale.merge import ScaleRun
from kvgate.scale.split import WorkerId
from kvgate.stats import percentile
from kvgate.verdict import Status, Verdict

INVALID, PASS = Status.INVALID, Status.PASS
#: Above this share of one core a worker's single-threaded client is saturated (the cause of its lag).
SATURATED_SHARE = 0.9


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms"


def _lag_cause(label: str, host: dict[str, Any], contention_max: float) -> str | None:
    """The cause of a worker's lag from its host's measured load, or None when it points at none."""
    others, own = host.get("others_share"), host.get("own_share")
    if others is not None and others > contention_max:
        return (f"{label}'s host: other processes took {others:.0%} of its CPUs during the batch "
                f"(limit {contention_max:.0%}, limits.host_contention_max)")
    if own is not None and own >= SATURATED_SHARE:
        return f"{label}'s client was saturated: {own:.2f} CPU-s per second of one core (more workers, fewer streams each)"
    if host.get("throttled_s"):
        return f"{label}'s container was CPU-throttled for {host['throttled_s']:.1f} s (its pod's CPU limit)"
    return None


def worker_row(run: ScaleRun, k: int) -> dict[str, Any]:
    """One worker's figures over the run: requests assigned/sent/ok/errors, streams, the largest
    start offset and clock residual (ms), the clock offset (ms), p99 schedule and loop lag (ms),
    its client's CPU share and its host's others' share (the largest over the batches)."""
    parts = [b.parts[k] for b in run.batches if k in b.parts]
    recs = [r for p in parts for r in p.result.records]
    lags = [x for r in recs if (x := r.lag_s) is not None]
    loop = [x for p in parts for x in p.result.loop_lag_s]
    hello = run.joined.get(k) or {}
    first = parts[0] if parts else None

    def most(key: str) -> float | None:
        xs = [p.host_load.get(key) for p in parts if p.host_load.get(key) is not None]
        return max(xs) if xs else None

    return {"worker": k, "host": (first.host if first else hello.get("host")) or "",
            "pid": (first.pid if first else hello.get("pid")), "batches": len(parts),
            "assigned": sum(p.assigned for p in parts), "sent": len(recs), "ok": sum(1 for r in recs if r.ok),
            "errors": sum(1 for r in recs if not r.ok and not r.hung_up),
            "streams": max((p.concurrency for p in parts), default=0),
            "start_offset_ms": max((round(p.start_offset_s * 1e3, 3) for p in parts), key=abs, default=None),
            "clock_offset_ms": round(first.clock_before.offset_s * 1e3, 3) if first else None,
            "clock_residual_ms": max((round(residual_s(p.clock_before, p.clock_after) * 1e3, 3) for p in parts),
                                     default=None),
            "p99_lag_ms": round(percentile(lags, 99) * 1e3, 3) if lags else None,
            "p99_loop_lag_ms": round(percentile(loop, 99) * 1e3, 3) if loop else None,
            "client_cpu_share": most("own_share"), "host_others_share": most("others_share"),
            "lost": next((b.lost[k] for b in run.batches if k in b.lost), None) or run.never_joined.get(k)}


def worker_rows(run: ScaleRun) -> list[dict[str, Any]]:
    """:func:`worker_row` of every worker, in index order (the per-worker counts the report shows)."""
    return [worker_row(run, k) for k in range(run.n)]


def worker_checks(run: ScaleRun, profile: Any, gate: str, lagged_rounds_max: float | None = None) -> list[Verdict]:
    """One verdict per worker (``<gate>.worker K``): INVALID naming the first rule it broke (see
    the module docstring), else PASS with its counts. ``lagged_rounds_max``: a soak's rule for the
    client's lag (``soak.lagged_rounds_max``, a share of the measured rounds) instead of one
    batch's (see :func:`_lagged_rounds`)."""
    bound = profile.limits.schedule_lag_max_s
    out = []
    for w in run.workers():
        out.append(_check(run, w, profile, f"{gate}.worker {w.k}", bound, lagged_rounds_max))
    return out


def _lagged_rounds(run: ScaleRun, w: WorkerId, bound: float, allowed: float, name: str,
                   contention_max: float) -> Verdict | None:
    """A soak's worker held to the soak's own lag rule, as one process is (:mod:`kvgate.gates.soak`):
    INVALID when its client fell behind (:meth:`kvgate.load.LoadResult.client_kept_up` at ``bound``)
    in more than ``allowed`` (a share) of the measured rounds it sent (warm-up rounds not counted),
    naming the rounds; None otherwise."""
    rounds = [(b, b.parts[w.k]) for b in run.batches
              if w.k in b.parts and not (b.meta.get("meta") or {}).get("warmup")]
    behind = [(b, p) for b, p in rounds if not p.result.client_kept_up(bound)]
    if not rounds or len(behind) / len(rounds) <= allowed:
        return None
    b, p = max(behind, key=lambda bp: max(bp[1].result.p99_lag_s, bp[1].result.p99_loop_lag_s))
    worst = max(p.result.p99_lag_s, p.result.p99_loop_lag_s)
    names = ", ".join(str((x.meta.get("meta") or {}).get("round", x.id)) for x, _ in behind)
    return Verdict(name, INVALID, f"{w.label}'s client fell behind its schedule in {len(behind)} of {len(rounds)} "
                   f"measured rounds (allowed {allowed:.0%}, soak.lagged_rounds_max; rounds {names}; worst "
                   f"{batch_label(b.meta)}: p99 schedule lag {_ms(p.result.p99_lag_s)}, event-loop lag "
                   f"{_ms(p.result.p99_loop_lag_s)} > bound {_ms(bound)}) -> INVALID",
                   measured=round(len(behind) / len(rounds), 4), limit=allowed, unit="ratio",
                   evidence={"host_load": p.host_load, "worst_p99_lag_ms": round(worst * 1e3, 3)},
                   cause=_lag_cause(w.label, p.host_load, contention_max))


def _check(run: ScaleRun, w: WorkerId, profile: Any, name: str, bound: float,
           lagged_rounds_max: float | None = None) -> Verdict:
    """Worker ``w`` held to the rules: a lost or never-joined worker is INVALID at once; else every
    rule it broke (the first batch that broke each; the clock before the start, whose offset comes
    from the clock), one INVALID naming them all."""
    k, label = w.k, w.label
    row = worker_row(run, k)
    ev: dict[str, Any] = {"worker": row}
    if k in run.never_joined:
        return Verdict(name, INVALID, f"{label} {run.never_joined[k]}: its share of every batch is missing from the "
                       "merge -> INVALID", measured="not joined", limit="joined", evidence=ev)
    problems: dict[str, Verdict] = {}
    for b in run.batches:
        if k in b.lost:
            if b.meta.get("skipped"):
                continue
            share = len(range(k, int(b.meta["n"]), w.n))  # its slice: requests i with i mod N == k
            return Verdict(name, INVALID, f"{label} lost: {b.lost[k]}; its {share} of {batch_label(b.meta)}'s "
                           f"{b.meta['n']} requests are missing from the merge -> INVALID",
                           measured="lost", limit="every worker's part", evidence=ev)
        p = b.parts.get(k)
        if p is None:
            continue
        if p.error is not None and "error" not in problems:
            problems["error"] = Verdict(name, INVALID, f"{label} broke in {batch_label(b.meta)}: {p.error} -> INVALID",
                                        measured="error", limit="no error")
        resid = residual_s(p.clock_before, p.clock_after)
        if resid > bound and "clock" not in problems:
            after = p.clock_after.text() if p.clock_after is not None else "not measured"
            problems["clock"] = Verdict(
                name, INVALID, f"{label}'s clock against the coordinator: {p.clock_before.text()} before {batch_label(b.meta)}, "
                f"{after} after: its start and records can be placed only within {_ms(resid)} (drift plus the "
                f"exchange's uncertainty) > timing budget {_ms(bound)} (limits.schedule_lag_max_s) -> INVALID",
                measured=round(resid * 1e3, 3), limit=round(bound * 1e3, 3), unit="ms")
        late = p.start_offset_s
        if abs(late) > bound and "start" not in problems:
            how = "after" if late > 0 else "before"
            problems["start"] = Verdict(
                name, INVALID, f"{label} started {batch_label(b.meta)} {_ms(abs(late))} {how} the shared start instant (bound "
                f"{_ms(bound)}, limits.schedule_lag_max_s): the barrier was missed, every one of its "
                f"{len(p.result.records)} requests was sent that much {'late' if late > 0 else 'early'} -> INVALID",
                measured=round(late * 1e3, 3), limit=round(bound * 1e3, 3), unit="ms")
        lag = p.result.invalid_verdict(name, bound) if "lag" not in problems and lagged_rounds_max is None else None
        if lag is not None:
            problems["lag"] = replace(lag, message=f"{label} ({batch_label(b.meta)}): {lag.message}",
                                      evidence={**(lag.evidence or {}), "host_load": p.host_load},
                                      cause=_lag_cause(label, p.host_load, profile.limits.host_contention_max))
    if lagged_rounds_max is not None and (lag := _lagged_rounds(run, w, bound, lagged_rounds_max, name,
                                                                profile.limits.host_contention_max)) is not None:
        problems["lag"] = lag
    if problems:
        found = list(problems.values())
        return Verdict(name, INVALID, "; ".join(v.message for v in found), measured=found[0].measured,
                       limit=found[0].limit, unit=found[0].unit,
                       evidence={**ev, **{key: v.to_dict() for key, v in problems.items()}},
                       cause="; ".join(v.cause for v in found if v.cause) or None)
    start = row["start_offset_ms"]
    return Verdict(name, PASS, f"{label}: {row['sent']} of {row['assigned']} requests sent over {row['batches']} "
                   f"batch{'es' if row['batches'] != 1 else ''} at {row['streams']} stream"
                   f"{'s' if row['streams'] != 1 else ''}, start within {abs(start or 0):,.1f} ms, clock "
                   f"+- {row['clock_residual_ms'] or 0:,.1f} ms -> PASS", measured=row["sent"], unit="requests",
                   evidence=ev)


def counts_text(run: ScaleRun) -> str:
    """``4 local workers: 8/8/8/8 requests``."""
    sent = [worker_row(run, k)["sent"] for k in range(run.n)]
    return f"{run.n} {run.kind} worker{'s' if run.n != 1 else ''}: {'/'.join(map(str, sent))} requests"


def scaled_verdict(v: Verdict, run: ScaleRun, profile: Any, lagged_rounds_max: float | None = None) -> Verdict:
    """The gate's verdict ``v`` of the merged records, held to the workers' checks (see the module
    docstring): INVALID naming each worker that broke a rule, or ``v`` with the per-worker counts
    (message and ``evidence["workers"]``). ``lagged_rounds_max``: see :func:`worker_checks`."""
    checks = worker_checks(run, profile, v.gate, lagged_rounds_max)
    rows = worker_rows(run)
    bad = [c for c in checks if c.status is not PASS]
    ev = {"workers": rows, "scale_out": {"n": run.n, "kind": run.kind, "run_id": run.run_id, "notes": run.notes,
                                         "batches": [{**b.meta, "lost": b.lost, "records": len(b.merged.records)}
                                                     for b in run.batches]}}
    if bad:
        causes = list(dict.fromkeys(c.cause for c in bad if c.cause))
        return Verdict(v.gate, INVALID, "; ".join(c.message for c in bad) + f" ({counts_text(run)}; the merge was not "
                       f"judged: it would have been {v.status.value}: {v.message})",
                       measured=bad[0].measured, limit=bad[0].limit, unit=bad[0].unit,
                       evidence={**ev, "verdict_if_judged": v.to_dict()}, parts=tuple(checks),
                       cause="; ".join(causes) or None)
    tail = f" ({counts_text(run)}, merged)"
    for status in Status:
        end = f" -> {status.value}"
        if v.message.endswith(end):
            msg = v.message[:-len(end)] + tail + end
            break
    else:
        msg = v.message + tail
    return replace(v, message=msg, evidence={**(v.evidence or {}), **ev})


def merged_latency_verdict(run: ScaleRun, profile: Any) -> Verdict:
    """``kvgate merge DIR`` for the latency-SLO gate: ``run``'s batches as the gate's looks
    (:func:`kvgate.scale.merge.resample` with :func:`kvgate.load.scenarios.latency_plan` and
    :func:`kvgate.load.scenarios.latency_decide`), judged by :func:`kvgate.gates.load.latency_verdict`,
    held to the workers' checks (:func:`scaled_verdict`). No ``/metrics`` trace and no host
    contention of the server: the coordinator's live run has those. The records are shifted in place."""
    from kvgate.gates.load import latency_verdict
    from kvgate.http.metrics import MetricsTrace
    from kvgate.load.scenarios import LoadObservation, latency_decide, latency_plan, short_workload
    from kvgate.scale.merge import resample

    name, wl = short_workload(profile)
    run = run.only("latency")  # a soak's rounds in the same directory are not the latency gate's looks
    plan = latency_plan(profile)
    got = resample(run, plan, latency_decide(profile, plan))  # the live run's decision, look for look
    obs = LoadObservation(f"latency ({name})", got.result, MetricsTrace(samples=[]), wl.prompt_tokens, wl.output_tokens,
                          profile.slo.concurrency, sampling=got.sampling)
    return scaled_verdict(latency_verdict(obs, profile), run, profile)

