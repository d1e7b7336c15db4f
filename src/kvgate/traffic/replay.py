"""Replaying a traffic sample against the endpoint: the plan (which requests, when) and the run.

:func:`plan_replay` turns a :class:`~kvgate.traffic.sample.TrafficSample` and the workload's
``traffic:`` into a :class:`ReplayPlan`: open loop on the recorded arrival times (offsets from the
first arrival divided by ``speedup``, cut at ``max_duration_s``), or closed loop at the workload's
concurrency drawing from the sample (seeded); at most ``max_requests``. :func:`run_replay` builds
exact-length prompts for it (``/tokenize``-checked, or token ids), sends them with
:mod:`kvgate.load` and returns a :class:`ReplayResult`: the :class:`~kvgate.load.LoadResult`, the
plan, and the per-turn cache effect.

Interface note (skeleton): single-turn requests only so far; sessions (history growing turn by
turn, a shared system prompt) and the per-turn cache measurement are being built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvgate.http.client import Endpoint, KvClient
from kvgate.load import LoadResult, closed_loop, completion_request, open_loop
from kvgate.traffic.sample import TraceRequest, TrafficError, TrafficSample


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a replay: the recorded ``trace`` row, ``offset_s`` (open loop: seconds from
    the replay's start; None in a closed loop) and ``key`` (a stable id: ``r<i>`` or ``<session>/<turn>``)."""

    trace: TraceRequest
    offset_s: float | None
    key: str


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay sends: ``items`` in send order, ``mode`` (``open``/``closed``),
    ``concurrency`` (closed loop), ``speedup`` (open loop), ``sample`` (provenance)."""

    sample: TrafficSample
    mode: str
    items: tuple[PlannedRequest, ...]
    concurrency: int
    speedup: float = 1.0

    def describe(self) -> str:
        """One line: what was replayed, how, from which sample."""
        how = (f"open loop on recorded arrivals at {self.speedup:g}x" if self.mode == "open"
               else f"closed loop at concurrency {self.concurrency}")
        return f"{len(self.items):,} of {len(self.sample.requests):,} requests replayed ({how}) from {self.sample.describe()}"

    def provenance(self) -> dict[str, Any]:
        return {**self.sample.provenance(), "drawn": len(self.items), "mode": self.mode,
                "concurrency": self.concurrency, "speedup": self.speedup}


def plan_replay(sample: TrafficSample, spec: Any, concurrency: int, max_requests: int | None = None) -> ReplayPlan:
    """The replay of ``sample`` per ``spec`` (a :class:`~kvgate.profile.models.TrafficSpec`).
    ``max_requests``: the gate's own cap (the smaller of it and ``spec.max_requests`` applies).
    Raises :class:`TrafficError` for an open-loop replay of a sample without arrival times."""
    cap = min(x for x in (max_requests, spec.max_requests, len(sample.requests)) if x is not None)
    if spec.replay == "open":
        if not sample.has_arrivals:
            raise TrafficError(f"traffic sample {sample.path}: replay open needs arrival_s on every request "
                               "(replay: closed draws from it at the workload's concurrency instead)")
        rows = sorted(sample.requests, key=lambda r: r.arrival_s)  # type: ignore[arg-type,return-value]
        t0 = rows[0].arrival_s or 0.0
        items = []
        for i, r in enumerate(rows):
            off = ((r.arrival_s or 0.0) - t0) / spec.speedup
            if spec.max_duration_s is not None and off > spec.max_duration_s:
                break
            items.append(PlannedRequest(r, off, f"r{i}"))
        return ReplayPlan(sample, "open", tuple(items[:cap]), concurrency, spec.speedup)
    rng = np.random.default_rng(spec.seed)
    picks = rng.choice(len(sample.requests), size=cap, replace=cap > len(sample.requests))
    return ReplayPlan(sample, "closed", tuple(PlannedRequest(sample.requests[int(j)], None, f"r{i}")
                                              for i, j in enumerate(picks)), concurrency)


@dataclass
class ReplayResult:
    """A finished replay: ``result`` (records in send order, tagged), ``plan``, and ``turns``:
    per turn position ``{"turn", "requests", "cached_tokens_mean", "ttft_p50_ms"}`` (empty for a
    sample without sessions)."""

    plan: ReplayPlan
    result: LoadResult
    turns: list[dict[str, Any]] = field(default_factory=list)


def run_replay(client: KvClient, endpoint: Endpoint, profile: Any, plan: ReplayPlan, *, tag: str = "replay",
               deadline_s: float = 300.0, salt: str = "") -> ReplayResult:
    """Send ``plan`` to ``endpoint``: each request a completions prompt of exactly its recorded
    ``prompt_tokens`` (:func:`kvgate.http.probes.build_prompt`, a distinct prefix per request so
    unrelated requests share no KV block) and ``max_tokens`` = its ``output_tokens`` (``ignore_eos``,
    so it generates exactly that). Bounded by ``deadline_s`` and ``limits.request_timeout_s``."""
    from kvgate.http.probes import build_prompt

    model = profile.model.served_name
    specs = []
    for it in plan.items:
        p = build_prompt(client, model, "completions", it.trace.prompt_tokens, prefix=f"{tag} {it.key}{salt}: ")
        prompt: Any = list(p.token_ids) if p.token_ids is not None else p.text
        specs.append(completion_request(endpoint, model=model, prompt=prompt, max_tokens=max(1, it.trace.output_tokens),
                                        tag=tag, temperature=0, ignore_eos=True))
    kw = dict(deadline_s=deadline_s, request_timeout_s=profile.limits.request_timeout_s,
              idle_timeout_s=profile.limits.stream_idle_timeout_s)
    if plan.mode == "open":
        result = open_loop(endpoint, specs, offsets_s=[it.offset_s or 0.0 for it in plan.items], **kw)
    else:
        result = closed_loop(endpoint, specs, concurrency=plan.concurrency, **kw)
    return ReplayResult(plan, result)
