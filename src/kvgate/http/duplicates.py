"""What the engine counted against what kvgate sent: the measurement behind ``requests/no-duplicate-work``.

A gateway that retries a request on a 5xx, or on its own upstream (per-try) timeout, runs the same
work on the engine twice -- a slowed request retried presses the GPU further. Its client sees one
answer; only the engine's own counters show the second run. :func:`observe_duplicate_work` reads
the engine's counters (``vllm:request_success_total`` summed over ``finished_reason``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``) before and after a small bounded
set of requests kvgate sends once each, and records what it sent; the verdict
(:func:`kvgate.gates.requests.duplicate_work_verdict`) compares the two.

The window: wait (bounded, :data:`SETTLE_S`) until ``vllm:num_requests_running`` +
``vllm:num_requests_waiting`` read 0, then read the counters until two reads :data:`QUIET_S` apart
agree (at most :data:`QUIET_READS` reads: counters still moving with nothing sent are another
client's traffic, or work of an earlier gate still finishing). The same after the requests (the
settle bounded by the slow requests' length as well: a try the gateway abandoned may still run).

What is sent (all completions, temperature 0, ``ignore_eos``, each prompt distinct so no cache can
answer it for the engine): :data:`PLAIN` requests of :data:`PLAIN_TOKENS` tokens at once, not
streamed (a gateway can retry a request only before its response starts: a non-streamed answer
starts when it is done); then, when the profile declares the gateway's per-try timeout
(``limits.gateway_try_timeout_s``), one streamed pace probe and :data:`SLOW` requests sized from its
mean gap to run :data:`SLOW_PAST` x that timeout (at most 0.9 x ``route_timeout_s`` when declared,
at most :data:`SLOW_CAP_S`, within the context and the cap), not streamed, at once.

Whose counters: ``--engine-metrics`` URL (:func:`metrics_at`), else ``--direct-endpoint``'s /metrics,
else the endpoint's own (the suite chooses; a gateway that load-balances over several replicas shows one
replica's counts, which the verdict tells by counting fewer than were answered).
"""

from __future__ import annotations

import math
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient, StreamReply
from kvgate.http.metrics import parse_or_none
from kvgate.http.probes import Exchange, portable_body, send

#: engine counter -> Prometheus sample name (vLLM 0.32's v1 loggers; summed over label sets)
COUNTERS: dict[str, str] = {"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total",
                            "generation_tokens": "vllm:generation_tokens_total"}
GAUGES: dict[str, str] = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
#: requests sent at once, not streamed, of PLAIN_TOKENS tokens each
PLAIN, PLAIN_TOKENS = 4, 8
#: slow requests (only with limits.gateway_try_timeout_s declared), sent at once, not streamed
SLOW = 2
#: the slow requests' target length, x the gateway's per-try timeout (they must run past it)
SLOW_PAST = 1.25
#: [s] the slow requests' target length at most (the main job's cost stays bounded)
SLOW_CAP_S = 120.0
#: [tokens] the pace probe's length (streamed: its mean gap sizes the slow requests)
PACE_TOKENS = 16
#: [s] between two counter reads that must agree for the window to open or close
QUIET_S = 0.5
#: reads at most per window edge (the edge is open after QUIET_READS - 1 disagreeing pairs)
QUIET_READS = 4
#: [s] the longest wait for running + waiting to read 0 (plus the slow requests' target, after)
SETTLE_S = 10.0
#: [s] between two scrapes while settling
POLL_S = 0.2


@dataclass(frozen=True)
class Counts:
    """One scrape of the engine's counters and queue gauges (None: absent from /metrics); the
    counters in requests and tokens, cumulative since the engine started."""

    requests: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    running: float | None = None
    waiting: float | None = None

    @property
    def counters(self) -> tuple[float | None, float | None, float | None]:
        return self.requests, self.prompt_tokens, self.generation_tokens


def read_counts(text: str | None) -> Counts | None:
    """:class:`Counts` from one ``/metrics`` body; None when there is no body or it does not parse."""
    scrape = parse_or_none(text)
    if scrape is None:
        return None
    vals = {k: scrape.total(name) for k, name in {**COUNTERS, **GAUGES}.items()}
    return Counts(**vals)


@dataclass(frozen=True)
class Edge:
    """One edge of the window: ``reads`` (seconds since the edge began, :class:`Counts`), ``quiet``
    (two consecutive reads agreed on every counter), ``settled`` (running + waiting read 0; None:
    the gauges are absent), ``waited_s`` (the wait for it)."""

    reads: tuple[tuple[float, Counts | None], ...]
    quiet: bool
    settled: bool | None
    waited_s: float

    @property
    def counts(self) -> Counts | None:
        """The last read (the agreed one when quiet)."""
        return self.reads[-1][1] if self.reads else None

    def to_dict(self) -> dict[str, Any]:
        return {"reads": [{"t_s": t, **(asdict(c) if c else {})} for t, c in self.reads], "quiet": self.quiet,
                "settled": self.settled, "waited_s": self.waited_s}


@dataclass(frozen=True)
class Sent:
    """One request kvgate sent once: ``label`` (plain i / pace / slow i), ``status`` (0: no answer),
    ``prompt_tokens`` (usage's, or /tokenize's count when the answer carried none; None: unknown),
    ``how`` (``usage`` / ``tokenize`` / ``unknown``), ``completion_tokens`` (usage's; 0 without),
    ``max_tokens``, ``elapsed_s``, ``stream``."""

    label: str
    status: int
    prompt_tokens: int | None
    how: str
    completion_tokens: int
    max_tokens: int
    elapsed_s: float
    stream: bool = False


@dataclass(frozen=True)
class DuplicateWork:
    """The observation: ``source`` (whose /metrics: the endpoint's or --direct-endpoint's),
    ``before`` / ``after`` (:class:`Edge`), ``sent`` (:class:`Sent`, in order), ``slow_target_s``
    (None: no slow requests) and ``slow_how`` (why, or how they were sized), ``error`` (the counters
    could not be read: why), ``missing`` (the counters of :data:`COUNTERS` absent from /metrics)."""

    source: str
    before: Edge | None = None
    after: Edge | None = None
    sent: tuple[Sent, ...] = ()
    slow_target_s: float | None = None
    slow_how: str = ""
    error: str | None = None
    missing: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "before": self.before.to_dict() if self.before else None,
                "after": self.after.to_dict() if self.after else None, "sent": [asdict(s) for s in self.sent],
                "slow_target_s": self.slow_target_s, "slow_how": self.slow_how, "error": self.error,
                "missing": list(self.missing)}


def slow_target(try_timeout_s: float | None, route_timeout_s: float | None) -> tuple[float | None, str]:
    """``(seconds, how)``: how long the slow requests should run -- :data:`SLOW_PAST` x the gateway's
    per-try timeout, at most 0.9 x its route timeout and :data:`SLOW_CAP_S`; None when no per-try
    timeout is declared (then no request is sized to cross it, and ``how`` says so)."""
    if try_timeout_s is None:
        return None, ("no slow requests: the profile declares no gateway per-try timeout "
                      "(limits.gateway_try_timeout_s) for them to run past")
    target, how = SLOW_PAST * try_timeout_s, f"{SLOW_PAST:g} x the gateway's per-try timeout {try_timeout_s:g} s"
    if route_timeout_s is not None and target > 0.9 * route_timeout_s:
        target, how = 0.9 * route_timeout_s, f"0.9 x the route timeout {route_timeout_s:g} s (below {how})"
    if target > SLOW_CAP_S:
        target, how = SLOW_CAP_S, f"kvgate's cap {SLOW_CAP_S:g} s (below {how})"
    return target, how


def _edge(metrics: Callable[[], str | None], settle_s: float, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> Edge:
    """Settle (bounded), then read until two reads :data:`QUIET_S` apart agree (bounded)."""
    t0 = clock()
    counts = read_counts(metrics())
    settled: bool | None = None
    for _ in range(int(settle_s / POLL_S) + 2):
        if counts is None or counts.running is None:
            break
        settled = (counts.running or 0) + (counts.waiting or 0) <= 0
        if settled or clock() - t0 >= settle_s:
            break
        sleep(POLL_S)
        counts = read_counts(metrics())
    waited = round(clock() - t0, 3)
    t1 = clock()
    reads = [(0.0, counts)]
    quiet = False
    for _ in range(QUIET_READS - 1):
        sleep(QUIET_S)
        c = read_counts(metrics())
        reads.append((round(clock() - t1, 3), c))
        if c is not None and reads[-2][1] is not None and c.counters == reads[-2][1].counters:
            quiet = True
            break
    return Edge(tuple(reads), quiet, settled, waited)


def _prompt(i: str, nonce: str) -> str:
    return f"request {i} {nonce} of a duplicate-work check: write about the kv cache pool"


def _usage(ex: Exchange) -> tuple[int | None, int]:
    r = ex.reply
    if r.status != 200:
        return None, 0
    usage = None
    if isinstance(r, StreamReply):
        for _, obj in r.chunks():
            if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
    else:
        body = r.json
        usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None, 0
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (pt if isinstance(pt, int) else None), (ct if isinstance(ct, int) else 0)


def _stream_tpot(reply: StreamReply) -> float | None:
    """The mean gap between a stream's token chunks, seconds (None with fewer than two)."""
    times = [t for t, obj in reply.chunks() if isinstance(obj, dict) and any(
        (c.get("text") or (c.get("delta") or {}).get("content")) for c in obj.get("choices") or [])]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 2 else None


def shown_url(url: str) -> str:
    """``url`` without user info or query (what a verdict may print: a URL can carry a credential)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "" if parts.port is None else f"{parts.hostname}:{parts.port}",
                       parts.path, "", ""))


def metrics_at(url: str, timeout_s: float = 10.0) -> Callable[[], str | None]:
    """A reader of one Prometheus URL (``--engine-metrics``: the engine's own /metrics, e.g. a pod's port
    or a metrics sidecar), unauthenticated: each call GETs it and gives the body on a 200, else None
    (an error, a refused connection, a timeout of ``timeout_s`` seconds)."""
    def read() -> str | None:
        try:
            r = httpx.get(url, timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None
    return read


def observe_duplicate_work(client: KvClient, engine: KvClient | Callable[[], str | None], model: str, *,
                           source: str, max_model_len: int,
                           max_tokens_cap: int | None, try_timeout_s: float | None, route_timeout_s: float | None,
                           timeout_s: float, clock: Callable[[], float] = time.monotonic,
                           sleep: Callable[[float], None] = time.sleep) -> DuplicateWork:
    """Send the requests (module doc) through ``client``, reading the engine's counters from
    ``engine.metrics_text()`` (the same client, or --direct-endpoint's) -- or ``engine()``, a reader
    such as :func:`metrics_at` -- before and after. Bounded:
    at most ``PLAIN + 1 + SLOW`` requests, each within ``timeout_s``; each window edge at most
    ``SETTLE_S`` (+ twice the slow target after) + ``QUIET_READS x QUIET_S`` seconds. Never raises
    for what the endpoint answers; ``error`` says why counters could not be read."""
    def metrics() -> str | None:
        try:
            return engine.metrics_text() if isinstance(engine, KvClient) else engine()
        except EndpointUnreachable:  # a pod that cannot be reached: no counts (a read that failed)
            return None

    first = read_counts(metrics())
    if first is None:
        return DuplicateWork(source, error=f"{source} answers no Prometheus /metrics")
    missing = tuple(name for key, name in COUNTERS.items() if getattr(first, key) is None)
    if first.requests is None or first.prompt_tokens is None:
        return DuplicateWork(source, error=f"{source} has no {' and no '.join(missing)}", missing=missing)
    target, how = slow_target(try_timeout_s, route_timeout_s)
    # kvgate probes a vLLM extension (ignore_eos) on its first use with a generation of its own: made here,
    # before the window opens, so that the window holds only the requests counted as sent
    portable_body(client, {"model": model, "prompt": "kv", "max_tokens": 1, "ignore_eos": True})
    before = _edge(metrics, SETTLE_S, clock, sleep)
    nonce = uuid.uuid4().hex[:8]
    out: list[tuple[str, str, Exchange, int]] = []

    def one(label: str, max_tokens: int, stream: bool = False) -> tuple[str, str, Exchange, int]:
        prompt = _prompt(label, nonce)
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return label, prompt, send(client, "completions", body, stream=stream, timeout_s=timeout_s), max_tokens

    room = max_model_len - 64
    cap = min(max_tokens_cap or room, room)
    with ThreadPoolExecutor(max_workers=max(PLAIN, SLOW)) as pool:
        out += list(pool.map(lambda i: one(f"plain {i + 1}", min(PLAIN_TOKENS, cap)), range(PLAIN)))
        if target is not None:
            pace = one("pace", min(PACE_TOKENS, cap), stream=True)
            out.append(pace)
            tpot = _stream_tpot(pace[2].reply) if isinstance(pace[2].reply, StreamReply) else None
            want = cap if not tpot else max(PLAIN_TOKENS, min(cap, math.ceil(target / tpot)))
            how += (f"; {want} tokens at the pace probe's mean gap {tpot * 1e3:.1f} ms" if tpot else
                    f"; {want} tokens (the pace probe gave no gaps: the most allowed)")
            out += list(pool.map(lambda i: one(f"slow {i + 1}", want), range(SLOW)))
    after = _edge(metrics, SETTLE_S + 2 * (target or 0.0), clock, sleep)
    sent = []
    for label, prompt, ex, max_tokens in out:
        pt, ct = _usage(ex)
        how_pt = "usage"
        if pt is None:
            r = client.tokenize(model=model, prompt=prompt)
            count = r.json.get("count") if r.status == 200 and isinstance(r.json, dict) else None
            pt, how_pt = (count, "tokenize") if isinstance(count, int) else (None, "unknown")
        sent.append(Sent(label, ex.reply.status, pt, how_pt, ct, max_tokens, round(ex.reply.elapsed_s, 3),
                         ex.stream))
    return DuplicateWork(source, before, after, tuple(sent), target, how, missing=missing)


__all__ = ["COUNTERS", "Counts", "DuplicateWork", "Edge", "PLAIN", "QUIET_S", "SLOW", "Sent", "metrics_at", "shown_url",
           "observe_duplicate_work", "read_counts", "slow_target"]
