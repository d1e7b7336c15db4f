"""Short/long pools behind one router: where each request landed, and what the split buys.

- :func:`pool_endpoints`: each pool's own URL (``--pool-endpoint NAME=URL``, a launched pool, or
  ``pools.NAME.endpoint``), next to the router (the run's endpoint).
- :func:`run_routing` (the ``pools/routing`` gate): requests below, at and just above the routing
  threshold and each pool's own workload, sent one at a time through the router; where each one
  landed is read from each pool's ``/metrics`` -- the delta of ``vllm:request_success_total``
  (served) and of ``http_requests_total{status="4xx"}`` on the generation routes (rejected; vLLM's
  API server counts every answer it gives there, prometheus-fastapi-instrumentator) -- never
  assumed from the answer.
- :func:`run_isolation` (the ``pools/isolation`` gate): the interference scenario
  (:func:`kvgate.load.scenarios.run_interference`) sent through the router, with the short pool's
  short workload and the long pool's declared long load.

Every loop is bounded in requests and in time.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kvgate.http.client import Endpoint, KvClient
from kvgate.launch.target import TargetError, endpoint_from_url
from kvgate.http.metrics import parse_or_none
from kvgate.http.probes import build_prompt
from kvgate.profile.models import Profile, RoutingRule
from kvgate.stats.confidence import LookPlan, sample_until_decided
from kvgate.load import LoadResult, closed_loop
# the interference scenario's own request builder and wave runner: an extra look sends what its
# first look sent, with fresh prompts
from kvgate.load.scenarios import (SHORT_OUTPUT_TOKENS, LoadObservation, _specs, _waves, long_workload, merged_results,
                                   run_interference, short_workload)

POOLS = ("short", "long")
#: Routes whose answers count as "this pool answered a generation request" in http_requests_total.
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: Output tokens of a routing probe: where it lands is what is judged.
PROBE_MAX_TOKENS = 1


class PoolsError(Exception):
    """The pools cannot be reached as the profile describes (a pool without an endpoint, a bad
    URL, a threshold no request can sit at). One line naming the field or option."""


@dataclass(frozen=True)
class PoolTargets:
    """The router (the run's endpoint), each pool's own endpoint and profile."""

    router: Endpoint
    endpoints: dict[str, Endpoint]
    profiles: dict[str, Profile]


def parse_pool_endpoints(given: list[str] | None, profile: Profile) -> dict[str, str]:
    """``--pool-endpoint NAME=URL`` values -> ``{pool name: URL}``. Raises :class:`PoolsError` (one
    line) for a value that is not ``NAME=URL`` with NAME one of :data:`POOLS` and an http(s) URL, or
    a pool given twice."""
    urls: dict[str, str] = {}
    for item in given or ():
        name, sep, url = item.partition("=")
        if not sep or name not in POOLS or not url:
            raise PoolsError(f"--pool-endpoint={item}: expected NAME=URL with NAME one of {', '.join(POOLS)} "
                             f"(e.g. --pool-endpoint=short=http://127.0.0.1:8001/v1)")
        if name in urls:
            raise PoolsError(f"--pool-endpoint={item}: pool {name!r} given twice")
        try:
            endpoint_from_url(url, profile)
        except TargetError as exc:
            raise PoolsError(f"--pool-endpoint={name}=...: {str(exc).replace('--endpoint ', '', 1)}") from None
        urls[name] = url
    return urls


def pool_endpoints(profile: Profile, pools: dict[str, Profile], given: list[str] | None = None,
                   launched: dict[str, str] | None = None, api_key_env: str | None = None) -> dict[str, Endpoint]:
    """``{"short": Endpoint, "long": Endpoint}`` from ``given`` (``--pool-endpoint NAME=URL``,
    first), ``launched`` (root URLs of launched pools), then ``pools.NAME.endpoint``. Raises
    :class:`PoolsError` naming the pool and where its URL may be given."""
    spec = profile.pools
    assert spec is not None
    urls = parse_pool_endpoints(given, profile)
    for name in POOLS:
        url = urls.get(name) or (launched or {}).get(name) or getattr(spec, name).endpoint
        if not url:
            raise PoolsError(f"pool {name!r} has no endpoint: give --pool-endpoint={name}=URL (the pool's own server, "
                             f"not the router) or pools.{name}.endpoint in {profile.source or profile.name}")
        urls[name] = url
    try:
        return {name: endpoint_from_url(urls[name], pools[name], api_key_env) for name in POOLS}
    except TargetError as exc:
        raise PoolsError(f"pool endpoint: {exc}") from None


# ------------------------------------------------------------------------------- landing counts
def landing_counts(text: str | None) -> dict[str, float] | None:
    """``{"served": n, "rejected": n}`` from one pool's ``/metrics`` text: ``served`` =
    ``vllm:request_success_total`` summed over its label sets (any finish reason); ``rejected`` =
    ``http_requests_total`` with a 4xx status on the generation routes (absent on servers without
    the HTTP instrumentator: 0). None when there is no usable ``/metrics`` or no
    ``vllm:request_success_total`` at all."""
    scrape = parse_or_none(text)
    if scrape is None:
        return None
    served = scrape.samples.get("vllm:request_success_total")
    if not served:
        return None
    rejected = sum(v for labels, v in scrape.samples.get("http_requests_total", ())
                   if labels.get("handler") in GENERATION_ROUTES and str(labels.get("status", "")).startswith("4"))
    return {"served": sum(v for _, v in served), "rejected": rejected}


# ------------------------------------------------------------------------------- routing
@dataclass(frozen=True)
class RoutingCase:
    """One request shape: ``expect`` is the pool the rule sends it to; ``size`` its measure in
    the rule's unit (tokens or bytes); ``body`` the exact bytes sent."""

    name: str
    expect: str
    prompt_tokens: int
    size: int
    body: bytes


@dataclass
class Routed:
    """One routed request: the router's answer and where it landed. ``landed``: pool ->
    ``served`` / ``rejected`` for each pool whose counters moved (normally one; none when the
    request reached no pool)."""

    case: str
    expect: str
    prompt_tokens: int
    size: int
    status: int
    error: str | None
    landed: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def where(self) -> str:
        """``short``, ``long``, ``none`` or ``short+long`` (ambiguous)."""
        return "+".join(sorted(self.landed)) or "none"


@dataclass
class RoutingObservation:
    """The routing run: ``rule``, the cases, every routed request, and pools without usable
    ``/metrics`` (nothing can be attributed to them)."""

    rule: RoutingRule
    cases: list[RoutingCase]
    routed: list[Routed]
    no_metrics: list[str]
    workload_sizes: dict[str, int]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per request (for the CSV attachment)."""
        return [{**{k: v for k, v in asdict(r).items() if k != "landed"}, "where": r.where,
                 "landed": ";".join(f"{p}:{how}" for p, how in sorted(r.landed.items()))} for r in self.routed]


def rule_sends(rule: RoutingRule, size: int) -> str:
    """The pool ``rule`` sends a request of ``size`` (tokens or bytes) to: at most the threshold
    -> ``short``, above it -> ``long``."""
    return "short" if size <= rule.threshold else "long"


def completion_body(model: str, prompt: str, pad_to: int | None = None) -> bytes:
    """A ``/v1/completions`` body (``max_tokens`` :data:`PROBE_MAX_TOKENS`, greedy) as bytes;
    ``pad_to``: JSON whitespace before the closing brace makes it exactly that many bytes (the
    request the server sees is unchanged). Raises :class:`PoolsError` when it is already longer."""
    head = json.dumps({"model": model, "prompt": prompt, "max_tokens": PROBE_MAX_TOKENS, "temperature": 0})[:-1]
    body = (head + "}").encode()
    if pad_to is None:
        return body
    if len(body) > pad_to:
        raise PoolsError(f"a {len(body)}-byte request is the smallest kvgate can send; the routing threshold "
                         f"({pad_to} bytes) is below it")
    return head.encode() + b" " * (pad_to - len(body)) + b"}"


def routing_cases(targets: PoolTargets, rule: RoutingRule, tokenizer: KvClient) -> tuple[list[RoutingCase], dict[str, int]]:
    """The cases the routing gate sends, and each pool workload's size in the rule's unit:

    - ``short workload``: the short pool's short workload (``slo.workload`` or its first
      non-long one) at its ``prompt_tokens``;
    - ``at threshold`` / ``above threshold``: exactly the threshold and one more (tokens: the
      prompt as ``/tokenize`` counts it; bytes: the body, padded with JSON whitespace around a
      short prompt) -> short / long;
    - ``long workload``: the long pool's long workload, capped to its ``max_model_len`` less
      :data:`PROBE_MAX_TOKENS`.

    Prompts are verified with ``tokenizer``'s ``/tokenize`` (a pool's own server)."""
    model = targets.profiles["short"].model.served_name
    sname, swl = short_workload(targets.profiles["short"])
    lname, lwl = long_workload(targets.profiles["long"])
    long_len = targets.profiles["long"].engine.max_model_len - PROBE_MAX_TOKENS
    plans: list[tuple[str, int, int | None]] = [(f"short workload ({sname})", swl.prompt_tokens, None)]
    if rule.by == "prompt_tokens":
        plans += [("at threshold", rule.threshold, None), ("above threshold", rule.threshold + 1, None)]
    else:
        small = min(swl.prompt_tokens, 64)
        plans += [("at threshold", small, rule.threshold), ("above threshold", small, rule.threshold + 1)]
    plans.append((f"long workload ({lname})", min(lwl.prompt_tokens, long_len), None))
    cases, sizes = [], {}
    for name, tokens, pad in plans:
        prompt = build_prompt(tokenizer, model, "completions", tokens)
        body = completion_body(model, prompt.text, pad)
        size = tokens if rule.by == "prompt_tokens" else len(body)
        cases.append(RoutingCase(name, rule_sends(rule, size), tokens, size, body))
        if "workload" in name:
            sizes["short" if name.startswith("short") else "long"] = size
    return cases, sizes


def _landing(before: dict[str, dict[str, float] | None], after: dict[str, dict[str, float] | None]) -> dict[str, str]:
    out = {}
    for pool, b in before.items():
        a = after.get(pool)
        if a is None or b is None:
            continue
        if a["served"] > b["served"]:
            out[pool] = "served"
        elif a["rejected"] > b["rejected"]:
            out[pool] = "rejected"
    return out


def run_routing(targets: PoolTargets, rule: RoutingRule, per_case: int = 2, *, settle_s: float = 3.0,
                timeout_s: float = 120.0, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> RoutingObservation:
    """Each case ``per_case`` times, one request at a time through the router: scrape both pools,
    send, then scrape until a pool's counters moved or ``settle_s`` seconds passed (vLLM counts a
    request a moment after answering it). Nothing is sent when a pool has no usable ``/metrics``
    (``no_metrics``: no landing could be read). Bounded: ``len(cases) x per_case`` requests of at
    most ``timeout_s`` each."""
    pool_clients = {name: KvClient(ep, timeout_s=10.0) for name, ep in targets.endpoints.items()}
    router = KvClient(targets.router, timeout_s=timeout_s)
    try:
        cases, sizes = routing_cases(targets, rule, pool_clients["long"])

        def counts() -> dict[str, dict[str, float] | None]:
            return {name: landing_counts(c.metrics_text()) for name, c in pool_clients.items()}

        no_metrics = [name for name, v in counts().items() if v is None]
        routed: list[Routed] = []
        for i in range(per_case if not no_metrics else 0):  # unattributable: send nothing
            for case in cases:
                before = counts()
                reply = router.request("POST", router.api("/completions"), content=case.body)
                t_end = clock() + settle_s
                landed = _landing(before, counts())
                while not landed and clock() < t_end:
                    sleep(0.05)
                    landed = _landing(before, counts())
                routed.append(Routed(case.name, case.expect, case.prompt_tokens, case.size, reply.status,
                                     None if reply.status == 200 else reply.error_message, landed,
                                     round(reply.elapsed_s, 4)))
    finally:
        router.close()
        for c in pool_clients.values():
            c.close()
    return RoutingObservation(rule, cases, routed, no_metrics, sizes)


# ------------------------------------------------------------------------------- isolation
def isolation_view(short: Profile, long: Profile) -> Profile:
    """The profile the interference scenario runs through the router: the long pool's (model,
    ``max_model_len`` that caps the long prompts, limits) with the short pool's short workload
    and SLO beside the long pool's long workload."""
    sname, swl = short_workload(short)
    lname, lwl = long_workload(long)
    return long.model_copy(update={"name": f"{short.name}+{long.name}", "workloads": {sname: swl, lname: lwl},
                                   "slo": short.slo.model_copy(update={"workload": sname})})


def _more_waves(tokenizer: KvClient, router: Endpoint, view: Profile, waves: int, shorts_per_wave: int, salt: str,
                deadline_s: float) -> tuple[LoadResult, LoadResult]:
    """One more look's worth of the interference scenario through the router: ``waves`` x
    ``shorts_per_wave`` short requests alone (sequential), then ``waves`` waves of the long pool's
    long concurrency with those shorts behind them -- as :func:`run_interference` sends them (same
    lengths, offsets and output caps), with prompts salted by ``salt`` so the prefix cache serves
    none of them from an earlier look. Fixed lengths only (a ``traffic:`` workload is not
    extended). Bounded by ``deadline_s`` (both runs together)."""
    t0 = time.monotonic()
    sname, short = short_workload(view)
    lname, long = long_workload(view)
    model, limit = view.model.served_name, view.engine.max_model_len
    sout, lout = min(short.output_tokens, SHORT_OUTPUT_TOKENS), min(long.output_tokens, 16)
    n = waves * shorts_per_wave
    shorts = _specs(tokenizer, router, model, short.prompt_tokens, sout, n, "short", salt=salt)
    longs = _specs(tokenizer, router, model, min(long.prompt_tokens, limit - lout), lout, waves * long.concurrency,
                   "long", salt=salt)
    kw = dict(request_timeout_s=view.limits.request_timeout_s, idle_timeout_s=view.limits.stream_idle_timeout_s)
    alone = closed_loop(router, shorts, concurrency=1, deadline_s=deadline_s, **kw)
    left = max(0.0, deadline_s - (time.monotonic() - t0))
    mixed = _waves(router, [(longs[w * long.concurrency:(w + 1) * long.concurrency],
                             shorts[w * shorts_per_wave:(w + 1) * shorts_per_wave]) for w in range(waves)], left, **kw)
    return alone, mixed


def run_isolation(targets: PoolTargets, waves: int, shorts_per_wave: int, deadline_s: float = 300.0,
                  plan: LookPlan | None = None, decide: Callable[[LoadObservation, LoadObservation, float], str] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> tuple[LoadObservation, LoadObservation]:
    """Short requests through the router alone, then while each wave sends the long pool's
    declared long concurrency of long requests through the router (:func:`run_interference`).
    Prompts are counted on the long pool's own ``/tokenize``. Returns ``(alone, mixed)``.

    With ``plan`` (looks in short requests, the first = ``waves x shorts_per_wave``; see
    :func:`kvgate.gates.pools.isolation_plan`) and ``decide`` (``(alone, mixed, per-look
    confidence) -> PASS/FAIL/UNDECIDED``), undecided looks add waves
    (:func:`kvgate.stats.confidence.sample_until_decided`): each look adds as many short requests alone as
    with the long load, so both runs' bounds tighten (the ratio check needs both), in whole waves,
    with fresh prompts. Bounded by the plan's cap and ``max_s`` (the extra looks; the first look
    is bounded by ``deadline_s``). What it did is in ``mixed.extra["sampling"]``
    (:meth:`~kvgate.stats.confidence.Sampling.to_dict`); ``mixed.extra["waves"]`` counts all waves. A
    ``traffic:``-replayed workload gets its first look only."""
    view = isolation_view(targets.profiles["short"], targets.profiles["long"])
    with KvClient(targets.endpoints["long"], timeout_s=30.0) as tokenizer:
        # exactly `waves` waves (max_waves=waves: run_interference's own looks off); this gate's looks follow
        alone, mixed = run_interference(tokenizer, targets.router, view, waves=waves, shorts_per_wave=shorts_per_wave,
                                        deadline_s=deadline_s, max_waves=waves)
        if plan is None or decide is None:
            return alone, mixed
        extra = mixed.extra if mixed.extra is not None else {}
        mixed.extra = extra
        replayed = alone.traffic is not None
        looks = {"n": 0}

        def shorts_sent() -> int:
            return sum(1 for r in mixed.result.records if r.tag == "short")

        def take(k: int, left: float | None) -> int:
            if looks["n"] == 0:  # the first look is the run above
                looks["n"] = 1
                return shorts_sent()
            if replayed:
                return 0
            looks["n"] += 1
            before = shorts_sent()
            w = -(-k // shorts_per_wave)
            a, m = _more_waves(tokenizer, targets.router, view, w, shorts_per_wave, f" (look {looks['n']})",
                               deadline_s if left is None else min(deadline_s, left))
            alone.result, mixed.result = merged_results(alone.result, a), merged_results(mixed.result, m)
            extra["waves"] = extra.get("waves", waves) + w
            return min(k, shorts_sent() - before)

        sampling = sample_until_decided(plan, take, lambda c: {"isolation": decide(alone, mixed, c)}, clock)
        extra["sampling"] = sampling.to_dict()
    return alone, mixed


__all__ = ["GENERATION_ROUTES", "POOLS", "PoolTargets", "PoolsError", "Routed", "RoutingCase", "RoutingObservation",
           "completion_body", "isolation_view", "landing_counts", "pool_endpoints", "routing_cases", "rule_sends",
           "run_isolation", "run_routing"]
