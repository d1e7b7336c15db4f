"""Pure verdict of the health/under-load gate: do ``/health`` and ``/v1/models`` answer within the
deployment's probe timeout while the server is saturated?

A kubelet restarts a pod whose liveness probe misses ``timeoutSeconds`` (``failureThreshold``
times in a row, 3 by default) and takes it out of the Service when readiness does; a saturated
engine whose API server answers ``/health`` late gets a healthy pod restarted (gonka PR#1421: a
2 s liveness deadline missed under load, 8+ restarts a day; litellm PR#12669). The samples come
from :class:`kvgate.http.health_sampler.HealthSampler`, taken while the load gates ran
(:mod:`kvgate.run.health_watch`) or during the gate's own short load
(:func:`kvgate.load.health.run_own_load`). This module decides; no I/O.

The opposite lie -- ``/health`` 200 while generations make no progress -- is judged by the canary
(:mod:`kvgate.gates.health`), not here.

**No percentile confidence here (issue 24, decided).** The verdict is not a percentile against a
limit: it FAILs on any probe at or over the timeout (the route's max), which is the kubelet's own
rule -- each probe that misses ``timeoutSeconds`` counts, whatever the others did -- and a measured
miss needs no statistics. Its PASS ("no probe of n missed") is stricter than any p99 bound could
be, and an order-statistic bound would not add to it: with fewer than 299 probes no p99 upper bound
exists at 95% (:func:`kvgate.stats.confidence.min_samples_to_pass` ``(0.99)``), so the rule would turn
every short run INCONCLUSIVE while answering a question the kubelet does not ask. What n probes
without a miss do say: the per-probe miss probability is below ``1 - 0.05 ** (1 / n)`` (~3/n) at
95%, so ``n`` is in the message and :data:`MIN_SAMPLES` keeps it from being a handful.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvgate.http.health_sampler import ROUTES, ProbeSample
from kvgate.http.tokenizers import ABSENT
from kvgate.profile.models import Profile
from kvgate.stats import percentile
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP

GATE = "health/under-load"
#: Fewest samples per route for a verdict other than INVALID: 10 rounds (~2.5 s of load at one
#: round per 0.25 s). Below it a p99 is the max of a handful of probes; a sample over the limit
#: or a non-200 still FAILs (a measured failure needs no statistics).
MIN_SAMPLES = 10


def probe_limit(profile: Profile, isvc: Any = None) -> tuple[float, str]:
    """``(seconds, where it came from)`` of the probe timeout the samples are judged against.

    With ``--isvc`` (``isvc``: a :class:`kvgate.launch.kserve.ProbeTimeout`) the InferenceService's
    probes decide: that is what its pods' kubelet enforces, whatever the profile says; a profile
    value that differs is named beside it. Else ``limits.probe_timeout_s`` (default 1 s,
    Kubernetes' own ``timeoutSeconds`` default)."""
    lim = profile.limits
    explicit = "probe_timeout_s" in lim.model_fields_set
    if isvc is not None:
        where = f"the InferenceService's {isvc.where}"
        if explicit and lim.probe_timeout_s != isvc.seconds:
            where += f"; profile limits.probe_timeout_s {lim.probe_timeout_s:g} s not used (the kubelet enforces the " \
                     "InferenceService's)"
        return isvc.seconds, where
    if explicit:
        return lim.probe_timeout_s, "profile limits.probe_timeout_s"
    return lim.probe_timeout_s, "limits.probe_timeout_s default: Kubernetes' timeoutSeconds default"


def absent_routes(samples: Sequence[ProbeSample]) -> list[str]:
    """The routes the server does not have: every probe of them answered 404, 405 or 501
    (:data:`kvgate.http.tokenizers.ABSENT`; llama-cpp-python serves no ``/health``). Nothing about
    a deployment's probes can be read from them (the kubelet's probes use a route the server has),
    so they are named in the verdict and not judged."""
    out = []
    for r in ROUTES:
        xs = [s for s in samples if s.route == r]
        if xs and all(s.status in ABSENT for s in xs):
            out.append(r)
    return out


def needs_more(samples: Sequence[ProbeSample], limit_s: float) -> bool:
    """Whether ``samples`` cannot decide yet: a route the server has (:func:`absent_routes`) has
    fewer than :data:`MIN_SAMPLES` and none already failed (non-200, or at/over ``limit_s``
    seconds) -- then the gate adds its own load."""
    gone = absent_routes(samples)
    samples = [s for s in samples if s.route not in gone]
    failed = any(s.status != 200 or s.latency_s >= limit_s for s in samples)
    return not failed and any(sum(s.route == r for s in samples) < MIN_SAMPLES for r in ROUTES if r not in gone)


def _ms(s: float) -> str:
    ms = s * 1000
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


def route_stats(samples: Sequence[ProbeSample], route: str) -> dict[str, Any]:
    """One route's samples: ``n``, ``p50_s``/``p99_s``/``max_s`` (seconds; a probe that got no
    answer counts with its wait), ``bad`` (the non-200 samples) and ``worst`` (the slowest)."""
    xs = [s for s in samples if s.route == route]
    lat = [s.latency_s for s in xs]
    worst = max(xs, key=lambda s: s.latency_s) if xs else None
    return {"n": len(xs), "p50_s": percentile(lat, 50) if xs else None, "p99_s": percentile(lat, 99) if xs else None,
            "max_s": worst.latency_s if worst else None, "worst": worst, "bad": [s for s in xs if s.status != 200]}


def _bad_words(bad: list[ProbeSample]) -> str:
    kinds: dict[str, int] = {}
    for s in bad:
        key = str(s.status) if s.status else (s.error.split(" (")[0] or "no answer")
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in kinds.items())


def under_load_verdict(samples: Sequence[ProbeSample], limit_s: float, source: str, load: str) -> Verdict:
    """FAIL when ``/health`` or ``/v1/models`` answered anything but 200 under load (no answer
    within the sample's wait included), or when a route's p99 or max latency reaches ``limit_s`` (the probe timeout,
    seconds; ``source`` says where it came from). INVALID when no FAIL was seen but a route has
    fewer than :data:`MIN_SAMPLES` samples (no p99 to speak of; a run that sampled nothing never
    reads PASS). ``load``: what load ran (the gates' names, or the gate's own load), for the
    message. ``measured``: the ``/health`` p99 (ms; ``/v1/models``' where the server has no
    ``/health``); ``limit``: the probe timeout (ms). A route the server does not have
    (:func:`absent_routes`) is named and not judged; with none left the gate SKIPs."""
    gone = absent_routes(samples)
    absent_note = "".join(f"; {r} not judged: all {sum(s.route == r for s in samples)} probes answered "
                          f"{'/'.join(sorted({str(s.status) for s in samples if s.route == r}))} (the server has no such route)"
                          for r in gone)
    if len(gone) == len(ROUTES):
        return Verdict(GATE, SKIP, absent_note.removeprefix("; ") + " -> SKIP", evidence={"absent_routes": gone})
    samples = [s for s in samples if s.route not in gone]
    stats = {route: route_stats(samples, route) for route in ROUTES if route not in gone}
    first_route = next(iter(stats))
    h = stats[first_route]
    ev: dict[str, Any] = {"limit_s": limit_s, "limit_source": source, "load": load,
                          "routes": {r: {k: v for k, v in st.items() if k not in ("worst", "bad")}
                                     | {"non_200": len(st["bad"]),
                                        "worst_during": st["worst"].during if st["worst"] else None}
                                     for r, st in stats.items()}, "absent_routes": gone}
    parts = []
    for route, st in stats.items():
        if st["n"]:
            parts.append(f"{route} p50 {_ms(st['p50_s'])}, p99 {_ms(st['p99_s'])}, max {_ms(st['max_s'])} "
                         f"({st['n']} samples)")
        else:
            parts.append(f"{route}: no samples")
    what = "; ".join(parts) + f" under {load}" + absent_note
    limit = f"probe timeout {limit_s:g} s ({source})"
    measured = round(h["p99_s"] * 1000, 3) if h["n"] else None
    seen = {"measured": measured, "limit": limit_s * 1000, "unit": "ms", "evidence": ev}
    problems = []
    for route, st in stats.items():
        if st["bad"]:
            first = st["bad"][0]
            problems.append(f"{route} failed {len(st['bad'])} of {st['n']} probes under load "
                            f"({_bad_words(st['bad'])}; first at {first.t_s:.1f} s during {first.during})")
        if st["n"] and (st["p99_s"] >= limit_s or st["max_s"] >= limit_s):
            w = st["worst"]
            over = "p99" if st["p99_s"] >= limit_s else "max"
            problems.append(f"{route} {over} {_ms(st['p99_s'] if over == 'p99' else st['max_s'])} reaches the "
                            f"{limit_s:g} s probe timeout (worst {_ms(w.latency_s)}"
                            f"{' no answer' if w.status == 0 else ''} at {w.t_s:.1f} s during {w.during}): the "
                            "kubelet would fail these probes and restart (liveness) or unroute (readiness) a busy pod")
    if problems:
        return Verdict(GATE, FAIL, f"{what}; " + "; ".join(problems) + f"; {limit} -> FAIL", **seen)
    thin = [f"{route} {st['n']}" for route, st in stats.items() if st["n"] < MIN_SAMPLES]
    if thin:
        return Verdict(GATE, Status.INVALID, f"{what}; too few samples under load ({', '.join(thin)}; need >= "
                       f"{MIN_SAMPLES} per route for a p99): nothing judged; {limit} -> INVALID", **seen)
    worst = h["worst"]
    return Verdict(GATE, PASS, f"{what}; all 200; worst {first_route} {_ms(worst.latency_s)} during {worst.during}; "
                   f"p99 and max below the {limit} -> PASS", **seen)


__all__ = ["GATE", "MIN_SAMPLES", "absent_routes", "needs_more", "probe_limit", "route_stats", "under_load_verdict"]
