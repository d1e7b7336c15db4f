"""``kvgate advise``: write a hardened deployment profile from the model, the hardware, real traffic
and the SLO -- the arithmetic of the fit gate run backwards.

Inputs: the model (a Hugging Face ``config.json`` read by :func:`kvgate.profile.hfconfig.model_from_hf_config`,
architecture numbers, or another profile's model section), the hardware (GPU model, count,
memory per GPU; on the CPU an explicit KV pool), a traffic sample (:func:`traffic_from_file`:
any format :func:`kvgate.traffic.sample.load_sample` reads -- JSONL token counts, an OpenAI
request log, ShareGPT conversations, a saved ``/metrics`` text; or :func:`traffic_from_metrics`: a
running vLLM's ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens`` histograms), and the SLO (the
concurrency to hold, latency targets copied into the profile).

What it decides, per pool (:func:`advise_pool`), each number with its reason and the share of
observed requests it rejects (:class:`Choice`):

* ``max_model_len``: the ``percentile`` (default p99) of prompt + output, rounded up to
  ``round_to`` tokens (a multiple of the KV block size), at most ``max_position_embeddings``.
* ``max_tokens_cap`` / ``max_prompt_tokens``: the percentile of output, rounded up to 64; the
  prompt limit is what is left of ``max_model_len``.
* ``gpu_memory_utilization``: 0.88 (vLLM's default is 0.92; the 4 GiB/GPU left on a 48 GB card
  covers allocator fragmentation and NCCL growth that vLLM's profiling does not see -- the seed
  profile ``llama70b-tp4``). CPU: the KV pool is explicit instead.
* ``kv_cache_dtype``: ``auto`` when it holds the SLO's concurrency (``max_num_seqs`` >= it and
  the long share of it at full length at once), else ``fp8`` if that does (1 byte per element:
  twice the tokens).
* ``max_num_seqs``: the most sequences the KV pool holds at the *observed* mix: the smaller of
  (a) ``N`` with ``N * mean + z * sqrt(N) * sd <= usable blocks`` (the mix's blocks per request,
  ``z`` for ``confidence``; central limit over ``N`` requests in flight) and (b) what the fit
  gate accepts: ``usable blocks // blocks(short p99 prompt + p99 output)``; at most 1024.
* ``max_num_batched_tokens``: 8192 on a GPU (the seed; vLLM's own default for >= 70 GiB GPUs;
  larger chunks raise the activation peak and stall decodes longer), 2048 on the CPU; at
  least ``max_num_seqs``.
* Workloads: requests above a quarter of ``max_model_len`` and above 4 x the median length are
  the *long* workload (the fit gate counts them at full length), at ``ceil(concurrency x their
  share)``; the rest the short one (the fit gate sizes ``max_num_seqs`` at its p99). Each
  workload is a request its own profile admits: ``output_tokens`` at most ``max_tokens_cap``
  and at most what its prompt (p99 or median) leaves of ``max_model_len`` -- a percentile of a
  subset can exceed the whole sample's -- and the explanation says when a workload was cut so
  (:func:`contradictions` is the check).

Two pools (:func:`advise`): when the sample is bimodal (Otsu's threshold on log length; each
mode >= 5% of requests, medians >= 8x apart) and one pool cannot hold the SLO's concurrency
(``max_num_seqs`` below it, or fewer full-length sequences at once than the long share of it),
each mode gets its own pool -- a deployment of its own on
the same hardware -- and the router threshold (prompt tokens) is the short pool's
``max_prompt_tokens``.

Every profile written passes the fit gate: :func:`advise_pool` checks
:func:`kvgate.gates.fit.fit_verdict` and raises :class:`AdviseError` when nothing fits.
"""

from __future__ import annotations

from pydantic import ValidationError

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import yaml

from kvgate.kv import arithmetic as km
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, load_profile
from kvgate.traffic.sample import FORMATS, TrafficError, TrafficSample, load_sample, metrics_lengths

#: What the advisor uses unless told otherwise (see the module docstring for each reason).
DEFAULT_PERCENTILE = 99.0
DEFAULT_ROUND_TO = 1024
DEFAULT_GPU_MEMORY_UTILIZATION = 0.88
DEFAULT_CONFIDENCE = 0.99
GPU_BATCHED_TOKENS = 8192
CPU_BATCHED_TOKENS = 2048
MAX_NUM_SEQS_CAP = 1024
LONG_FRACTION = 0.25
LONG_OVER_MEDIAN = 4


class AdviseError(ValueError):
    """The advice cannot be given: bad input (names the file/field) or nothing fits (says why)."""


# --------------------------------------------------------------------------------------------
# traffic


@dataclass(frozen=True)
class Traffic:
    """Requests as rows: ``prompt`` and ``output`` tokens, ``weight`` (requests a row stands for).

    ``joint`` is False when the rows come from histograms of prompt and output separately: they
    are then paired quantile by quantile (long prompts with long outputs -- conservative for
    their sum). ``source`` says where they came from.
    """

    prompt: np.ndarray
    output: np.ndarray
    weight: np.ndarray
    source: str
    joint: bool = True

    @property
    def total(self) -> np.ndarray:
        return self.prompt + self.output

    @property
    def requests(self) -> float:
        return float(self.weight.sum())

    def subset(self, mask: np.ndarray) -> "Traffic":
        return Traffic(self.prompt[mask], self.output[mask], self.weight[mask], self.source, self.joint)


def quantile(values: np.ndarray, weight: np.ndarray, pct: float) -> float:
    """Weighted percentile ``pct`` (0-100) of ``values``: the smallest value with at least that
    share of the weight at or below it."""
    if len(values) == 0:
        raise AdviseError("no requests in the traffic sample")
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weight[order])
    idx = int(np.searchsorted(cum, pct / 100.0 * cum[-1] - 1e-9, side="left"))
    return float(values[order][min(idx, len(values) - 1)])


def share_above(values: np.ndarray, weight: np.ndarray, limit: float) -> float:
    """The share (0-1) of the weight whose value is above ``limit``."""
    total = weight.sum()
    return float(weight[values > limit].sum() / total) if total else 0.0


def traffic_from_sample(sample: TrafficSample) -> Traffic:
    """The advisor's rows of a :class:`~kvgate.traffic.sample.TrafficSample`: one row a request, or
    (``metrics``) quantile levels weighted by the requests they stand for, ``joint=False``."""
    n = len(sample.requests)
    prompt = np.array([r.prompt_tokens for r in sample.requests], float)
    output = np.array([r.output_tokens for r in sample.requests], float)
    count = sample.represents if sample.represents is not None else n
    source = f"{sample.path} ({count:,.0f} requests" + (f"; {'; '.join(sample.notes)})" if sample.notes else ")")
    return Traffic(prompt, output, np.full(n, count / n), source, joint=sample.format != "metrics")


def traffic_from_file(path: str | Path, format: str = "auto") -> Traffic:
    """A traffic sample file in any format :func:`kvgate.traffic.sample.load_sample` reads
    (JSONL, OpenAI request log, ShareGPT, ``/metrics`` text). Raises :class:`AdviseError` naming
    the file, line and field of a bad record."""
    try:
        return traffic_from_sample(load_sample(path, format))
    except TrafficError as exc:
        raise AdviseError(str(exc)) from None


def traffic_from_jsonl(path: str | Path) -> Traffic:
    """:func:`traffic_from_file` of a JSONL sample (``{"prompt_tokens": N, "output_tokens": M}`` per line)."""
    return traffic_from_file(path, "jsonl")


def traffic_from_metrics(text: str, source: str, rows: int = 1000) -> Traffic:
    """Traffic from vLLM's ``/metrics`` text: the ``vllm:request_prompt_tokens`` and
    ``vllm:request_generation_tokens`` histograms, as ``rows`` quantile levels paired prompt with
    output (:func:`kvgate.traffic.sample.metrics_lengths`; :class:`Traffic` ``joint=False``).
    Raises :class:`AdviseError` when they are missing or empty."""
    try:
        m = metrics_lengths(text, source, rows)
    except TrafficError as exc:
        raise AdviseError(str(exc)) from None
    bounds = ", ".join(f"{le:g}" for le in m.bounds)
    return Traffic(m.prompt, m.output, np.full(rows, m.requests / rows),
                   f"{source} ({m.requests:,.0f} requests; histogram buckets {bounds})", joint=False)


def fetch_metrics(url: str, get: Callable[[str], str] | None = None) -> tuple[str, str]:
    """``(text, metrics URL)`` of a server's ``/metrics``; ``url`` may be the server's base, its
    ``/v1`` or ``/metrics`` URL. ``get`` (URL -> text) is injectable; default httpx, 10 s.
    Raises :class:`AdviseError` with one line when the server cannot be read."""
    base = url.rstrip("/")
    for tail in ("/metrics", "/v1", "/openai/v1"):
        if base.endswith(tail):
            base = base[: -len(tail)]
            break
    murl = base + "/metrics"
    if get is None:
        import httpx

        def get(u: str) -> str:
            r = httpx.get(u, timeout=10.0)
            r.raise_for_status()
            return r.text
    try:
        return get(murl), murl
    except Exception as exc:  # noqa: BLE001 -- any transport/HTTP failure is one line for the user
        raise AdviseError(f"cannot read {murl}: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Target:
    """The model and hardware: ``model`` is a profile ``model:`` section (dict), ``hardware`` a
    ``hardware:`` section, ``tp`` the tensor parallel size, ``kv_cache_memory_bytes`` the
    explicit pool (CPU), ``dtype`` the engine dtype (``None``: the model's)."""

    model: dict[str, Any]
    hardware: dict[str, Any]
    tp: int = 1
    kv_cache_memory_bytes: int | None = None
    dtype: str | None = None

    @property
    def on_gpu(self) -> bool:
        return str(self.hardware.get("gpu", "cpu")).lower() != "cpu"


@dataclass(frozen=True)
class Options:
    """The advisor's knobs (see the module docstring for the defaults' reasons)."""

    concurrency: int
    percentile: float = DEFAULT_PERCENTILE
    round_to: int = DEFAULT_ROUND_TO
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    confidence: float = DEFAULT_CONFIDENCE
    kv_cache_dtype: str = "choose"  # auto | fp8 | choose
    pools: str = "auto"  # auto | 1 | 2
    slo: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    """One decided number: ``field`` (profile path), ``value``, ``why`` (the arithmetic) and
    ``rejects`` (what share of the observed requests it turns away or cuts, in words)."""

    field: str
    value: Any
    why: str
    rejects: str = "none"


@dataclass
class PoolAdvice:
    """One pool's profile (``data``: the YAML mapping), its :class:`Choice` rows, the fit verdict
    of the written profile, and the traffic it serves."""

    name: str
    data: dict[str, Any]
    choices: list[Choice]
    fit_status: str
    fit_message: str
    traffic: Traffic
    holds_slo: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class Advice:
    """The result: one or two pools, the split (threshold in prompt tokens, reason) if any."""

    pools: list[PoolAdvice]
    traffic: Traffic
    split_threshold_prompt_tokens: int | None = None
    split_reason: str = ""


def _ceil_to(x: float, step: int) -> int:
    return int(math.ceil(x / step) * step) if x > 0 else step


def _pct(share: float) -> str:
    return f"{100 * share:.2f}%"


def _arch(target: Target) -> dict[str, Any]:
    arch = target.model.get("architecture")
    if not isinstance(arch, dict):
        raise AdviseError("the model has no architecture numbers: give --hf-config, --arch or --from-profile")
    return arch


# --------------------------------------------------------------------------------------------
# one pool


def _profile(name: str, target: Target, engine: dict[str, Any], limits: dict[str, Any], slo: dict[str, Any],
             workloads: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "description": description,
        "expect_fit": "pass",
        "model": target.model,
        "hardware": target.hardware,
        "engine": engine,
        "limits": limits,
        "slo": slo,
        "workloads": workloads,
    }


def _engine(target: Target, L: int, kv: str, seqs: int, batched: int, util: float) -> dict[str, Any]:
    e: dict[str, Any] = {"tensor_parallel_size": target.tp, "max_model_len": L, "max_num_seqs": seqs,
                         "max_num_batched_tokens": batched}
    if target.on_gpu:
        e["gpu_memory_utilization"] = util
    e["kv_cache_dtype"] = kv
    if target.dtype:
        e["dtype"] = target.dtype
    if target.kv_cache_memory_bytes:
        e["kv_cache_memory_bytes"] = target.kv_cache_memory_bytes
    return e


def _plan(data: dict[str, Any], name: str) -> Any:
    from kvgate.gates.fit import plan

    try:
        return plan(Profile.model_validate({**data, "name": name}))
    except km.KvMathError as exc:
        raise AdviseError(f"the fit arithmetic cannot be done for this model/hardware: {exc}") from None


def _mix_sequences(blocks: np.ndarray, weight: np.ndarray, usable: int, z: float) -> int:
    """Largest ``N`` with ``N * mean + z * sqrt(N) * sd <= usable`` (blocks per request at the mix)."""
    mu = float(np.average(blocks, weights=weight))
    sd = float(math.sqrt(np.average((blocks - mu) ** 2, weights=weight)))
    if mu <= 0:
        return 0
    s = (-z * sd + math.sqrt((z * sd) ** 2 + 4 * mu * usable)) / (2 * mu)
    return max(0, int(math.floor(s * s + 1e-9)))


def contradictions(data: dict[str, Any]) -> list[str]:
    """What a profile mapping (``data``: engine, limits, workloads) asks of itself that it rejects,
    one verdict line each: a workload whose prompt (its ``prompt_tokens_p99`` too) plus
    ``output_tokens`` exceeds ``engine.max_model_len``, or whose ``output_tokens`` exceeds
    ``limits.max_tokens_cap``. Empty when consistent."""
    L = data["engine"]["max_model_len"]
    cap = (data.get("limits") or {}).get("max_tokens_cap")
    out = []
    for name, w in (data.get("workloads") or {}).items():
        prompt = max(w["prompt_tokens"], w.get("prompt_tokens_p99") or 0)
        if prompt + w["output_tokens"] > L:
            out.append(f"workload {name}: prompt {prompt:,} + output {w['output_tokens']:,} tokens > max_model_len "
                       f"{L:,} (vLLM rejects it)")
        if cap is not None and w["output_tokens"] > cap:
            out.append(f"workload {name}: output_tokens {w['output_tokens']:,} > limits.max_tokens_cap {cap:,}")
    return out


def _admitted_output(prompt: int, output: int, L: int, cap: int) -> int:
    """A workload's ``output_tokens`` that its own profile admits: at most ``cap``
    (``limits.max_tokens_cap``) and at most what ``prompt`` leaves of ``L`` (``max_model_len``);
    at least 1 (``prompt`` is at most ``L - 1``). Tokens."""
    return max(1, min(output, cap, L - prompt))


def _clamp_choices(workload: str, who: str, prompt_stat: str, output_stat: str, prompt: int, prompt_w: int,
                   output: int, output_w: int, L: int, cap: int, share_more: float) -> list[Choice]:
    """The explanation rows of a workload cut to fit its own limits (none when it fitted):
    ``who`` (``"the short requests'"``), ``prompt_stat``/``output_stat`` (``"p99 prompt"``), the
    observed and written prompt/output tokens, ``L`` (max_model_len), ``cap`` (max_tokens_cap), and the share
    (0-1) of these requests that ask for more output than written."""
    out = []
    if prompt_w < prompt:
        out.append(Choice(f"workloads.{workload}.prompt_tokens", prompt_w,
                          f"{who} {prompt_stat} {prompt:,} is not below max_model_len {L:,}: written as {L - 1:,}, "
                          "the longest prompt the profile admits"))
    if output_w < output:
        why = (f"{who} {output_stat} {output:,} tokens is above limits.max_tokens_cap {cap:,}: written as the cap "
               "(over_cap: clamp gives them no more)" if output_w == cap else
               f"{who} {prompt_stat} {prompt_w:,} + {output_stat} {output:,} = {prompt_w + output:,} tokens exceed "
               f"max_model_len {L:,}: written as {L:,} - {prompt_w:,} = {output_w:,}, the most such a prompt gets "
               "(vLLM rejects prompt + max_tokens above max_model_len)")
        out.append(Choice(f"workloads.{workload}.output_tokens", output_w, why,
                          f"{_pct(share_more)} of these requests ask for more"))
    return out


def advise_pool(name: str, traffic: Traffic, target: Target, opts: Options, concurrency: int | None = None,
                role: str = "") -> PoolAdvice:
    """The profile for one pool serving ``traffic`` at ``concurrency`` (default ``opts.concurrency``).
    Raises :class:`AdviseError` when not even one ``max_model_len`` sequence fits."""
    from scipy.stats import norm

    from kvgate.gates.fit import fit_verdict, fmt_bytes

    C = concurrency or opts.concurrency
    arch = _arch(target)
    pct = opts.percentile
    tot, w = traffic.total, traffic.weight
    mla = arch.get("attention") == "mla"
    block, block_src = km.vllm_block_size(target.on_gpu, mla, None)
    step = _ceil_to(opts.round_to, block)
    q_total = quantile(tot, w, pct)
    L = _ceil_to(q_total, step)
    max_pos = arch.get("max_position_embeddings")
    notes: list[str] = []
    if max_pos and L > max_pos:
        notes.append(f"p{pct:g} of prompt + output ({q_total:,.0f}) rounds to {L:,}, above the model's "
                     f"max_position_embeddings {max_pos:,}: capped")
        L = int(max_pos)
    q_out = quantile(traffic.output, w, pct)
    cap = min(_ceil_to(q_out, 64), L - 1)
    max_prompt = L - cap
    median_total = quantile(tot, w, 50)
    # at most max_model_len: a threshold above it would call no admitted request long
    long_cut = int(min(max(L * LONG_FRACTION, LONG_OVER_MEDIAN * median_total), L))
    long_mask = tot > long_cut
    share_long = float(w[long_mask].sum() / w.sum())
    long_conc = max(1, math.ceil(C * share_long)) if share_long > 0 else 0
    short = traffic.subset(~long_mask) if (~long_mask).any() else None
    longs = traffic.subset(long_mask) if long_mask.any() else None
    short_prompt_p = int(quantile(short.prompt, short.weight, pct)) if short else 0
    short_out_p = int(quantile(short.output, short.weight, pct)) if short else 0
    # the workloads as written: each one a request this profile admits (module docstring)
    short_prompt_w = max(1, min(short_prompt_p, L - 1))
    short_out_w = _admitted_output(short_prompt_w, short_out_p, L, cap)
    long_prompt_p = int(quantile(longs.prompt, longs.weight, 50)) if longs else 0
    long_out_p = int(quantile(longs.output, longs.weight, pct)) if longs else 0
    long_prompt_w = max(1, min(long_prompt_p, L - 1))
    long_out_w = _admitted_output(long_prompt_w, long_out_p, L, cap)
    z = float(norm.ppf(opts.confidence))
    util = opts.gpu_memory_utilization
    batched0 = GPU_BATCHED_TOKENS if target.on_gpu else CPU_BATCHED_TOKENS

    def evaluate(kv: str) -> dict[str, Any]:
        seqs = MAX_NUM_SEQS_CAP
        for _ in range(3):  # activation peak depends on max_num_seqs: settle it
            batched = max(batched0, seqs)
            p = _plan(_profile(name, target, _engine(target, L, kv, seqs, batched, util), {}, {}, {}, ""), name)
            pool = p.pool
            adm = np.minimum(tot, L)
            per = np.array([pool.blocks_per(int(t)) for t in adm], float)
            n_mix = _mix_sequences(per, w, pool.usable_blocks, z)
            short_tokens = short_prompt_w + short_out_w if short else 0
            n_fit = pool.usable_blocks // pool.blocks_per(short_tokens) if short_tokens else MAX_NUM_SEQS_CAP
            new = max(1, min(n_mix, n_fit, MAX_NUM_SEQS_CAP))
            if new == seqs:
                break
            seqs = new
        long_fit = pool.sequences_at_once
        holds = seqs >= C and long_fit >= long_conc
        return dict(kv=kv, plan=p, pool=pool, seqs=seqs, n_mix=n_mix, n_fit=n_fit, batched=max(batched0, seqs),
                    long_fit=long_fit, holds=holds, short_tokens=short_tokens)

    model_dtype = target.dtype or target.model.get("dtype", "bfloat16")
    fp8_ok, fp8_why = km.fp8_kv_supported(target.on_gpu, mla)
    kv_bytes = km.vllm_kv_dtype_bytes("auto", str(model_dtype))
    if opts.kv_cache_dtype in ("auto", "fp8"):
        candidates = [opts.kv_cache_dtype]
    else:
        candidates = ["auto"] + (["fp8"] if fp8_ok and kv_bytes > 1 else [])
    tried = [evaluate(kv) for kv in candidates]
    pick = next((t for t in tried if t["holds"]), max(tried, key=lambda t: (t["seqs"], t["kv"] == "fp8")))
    if pick["pool"].usable_blocks < pick["pool"].blocks_per_sequence:
        raise AdviseError(f"no profile for {name} fits: the KV pool ({fmt_bytes(pick['pool'].pool_bytes)}) cannot hold "
                          f"one {L:,}-token sequence; give more memory or GPUs, or a lower --percentile")
    pool = pick["pool"]
    seqs = pick["seqs"]
    long_conc_w = min(long_conc, pool.sequences_at_once)
    short_conc = max(1, min(C - long_conc, seqs)) if short else 0

    workloads: dict[str, Any] = {}
    if short:
        workloads["observed-short"] = {
            "prompt_tokens": max(1, min(int(quantile(short.prompt, short.weight, 50)), short_prompt_w)),
            "prompt_tokens_p99": short_prompt_w, "output_tokens": short_out_w,
            "concurrency": short_conc}
    if longs:
        workloads["observed-long"] = {
            "prompt_tokens": long_prompt_w, "output_tokens": long_out_w,
            "concurrency": max(1, long_conc_w), "long": True}
    engine = _engine(target, L, pick["kv"], seqs, pick["batched"], util)
    limits = {"max_prompt_tokens": max_prompt, "max_tokens_cap": cap, "over_cap": "clamp"}
    slo = {"concurrency": C, **opts.slo}
    if workloads:
        slo["workload"] = "observed-short" if short else "observed-long"
    desc = (f"written by kvgate advise{' (' + role + ')' if role else ''}: {traffic.requests:,.0f} observed requests, "
            f"p{pct:g} {q_total:,.0f} tokens -> max_model_len {L:,}, {pick['kv']} KV, max_num_seqs {seqs}")
    data = _profile(name, target, engine, limits, slo, workloads, desc)
    bad = contradictions(data)
    if bad:
        raise AdviseError(f"internal: the advised profile {name} contradicts itself: {'; '.join(bad)}")
    advised = Profile.model_validate({**data, "name": name})
    verdict = fit_verdict(advised)
    if verdict.status.value != "PASS":
        raise AdviseError(f"internal: the advised profile {name} does not pass the fit gate: {verdict.message}")
    from kvgate.authoring.lint import lint_profile  # what vLLM itself would refuse at start-up

    refused = [f for f in lint_profile(advised) if f.severity == "error" and f.counts]
    if refused:
        raise AdviseError(f"the advised profile {name} would not start on vLLM: "
                          + "; ".join(f"{f.field}: {f.message}" for f in refused)
                          + " -- change the inputs (e.g. --tp, --gpus) and run advise again")

    kvp = pick["plan"]
    over_L = share_above(tot, w, L)
    prompt_rej = share_above(traffic.prompt, w, L - 1)
    choices = [
        Choice("engine.max_model_len", L,
               f"p{pct:g} of prompt + output = {q_total:,.0f} tokens, rounded up to a multiple of {step:,} (itself a "
               f"multiple of the {block}-token KV block: {block_src}) = {_ceil_to(q_total, step):,}"
               + (f"; capped at max_position_embeddings {max_pos:,}" if max_pos and L == max_pos else ""),
               f"{_pct(over_L)} exceed it ({_pct(prompt_rej)} rejected: prompt >= max_model_len; the rest cut short)"),
        Choice("limits.max_tokens_cap", cap, f"p{pct:g} of output = {q_out:,.0f} tokens, rounded up to a multiple of 64 "
               f"= {_ceil_to(q_out, 64):,}" + (f"; at most max_model_len - 1 = {L - 1:,}" if cap == L - 1 else ""),
               f"{_pct(share_above(traffic.output, w, cap))} ask for more and are clamped"),
        Choice("limits.max_prompt_tokens", max_prompt, "max_model_len - max_tokens_cap: a prompt up to here gets its "
               "whole cap", f"{_pct(share_above(traffic.prompt, w, max_prompt))} have longer prompts (fewer output "
               "tokens left)"),
    ]
    if target.on_gpu:
        choices.append(Choice("engine.gpu_memory_utilization", util,
                              f"vLLM's default is 0.92; {util:g} leaves {fmt_bytes(kvp.budget.headroom_bytes)}/GPU for "
                              "allocator fragmentation and NCCL growth vLLM's profiling does not see (seed: llama70b-tp4)"))
    else:
        choices.append(Choice("engine.kv_cache_memory_bytes", target.kv_cache_memory_bytes,
                              "CPU: the KV pool is given explicitly (vLLM's CPU backend has no utilisation budget)"))
    long_fit_txt = (f"{pool.sequences_at_once} full-length at once for the {long_conc} long" if long_conc
                    else "no long workload")
    alt = [t for t in tried if t is not pick]
    alt_txt = "; ".join(f"{t['kv']}: max_num_seqs {t['seqs']}, {t['long_fit']} full-length at once"
                        + (" -- holds it" if t["holds"] else " -- does not hold it") for t in alt)
    choices.append(Choice(
        "engine.kv_cache_dtype", pick["kv"],
        f"{kvp.kv_bytes_per_token:,} B/token/GPU -> pool {fmt_bytes(pool.pool_bytes)} = {pool.tokens:,} tokens; "
        f"{'holds' if pick['holds'] else 'does NOT hold'} concurrency {C} (max_num_seqs {seqs}; {long_fit_txt})"
        + (f"; {alt_txt}" if alt_txt else "")
        + ("" if fp8_ok else f"; fp8 not offered: {fp8_why}")))
    choices.append(Choice(
        "engine.max_num_seqs", seqs,
        f"min(at the observed mix {pick['n_mix']} (N x mean + {z:.2f} sqrt(N) x sd <= {pool.usable_blocks:,} usable "
        f"blocks, {opts.confidence:g} confidence), fit gate's worst case {pick['n_fit']} (every short request at "
        f"p{pct:g} prompt {short_prompt_w:,} + output {short_out_w:,}), {MAX_NUM_SEQS_CAP})",
        "none rejected: requests above it wait in the queue"))
    choices.append(Choice("engine.max_num_batched_tokens", pick["batched"],
                          (f"{GPU_BATCHED_TOKENS} on a GPU (the seed; vLLM's default for >= 70 GiB GPUs): larger prefill "
                           "chunks raise the activation peak and stall running decodes longer" if target.on_gpu else
                           f"{CPU_BATCHED_TOKENS} on the CPU (vLLM's CPU default)") + "; chunked prefill splits longer "
                          "prompts; at least max_num_seqs"))
    choices.append(Choice("workloads", f"{share_long:.1%} long",
                          f"requests above {long_cut:,} tokens (the larger of a quarter of max_model_len and 4 x the "
                          f"median {median_total:,.0f}, at most max_model_len {L:,}) are the long workload, counted at "
                          "full length: "
                          f"ceil({C} x {share_long:.3f}) = {long_conc} at once"
                          + (f" (the pool holds {pool.sequences_at_once}: written as {long_conc_w})"
                             if long_conc_w < long_conc else "")))
    if short:
        choices += _clamp_choices("observed-short", "the short requests'", f"p{pct:g} prompt", f"p{pct:g} output",
                                  short_prompt_p,
                                  short_prompt_w, short_out_p, short_out_w, L, cap,
                                  share_above(short.output, short.weight, short_out_w))
    if longs:
        choices += _clamp_choices("observed-long", "the long requests'", "median prompt", f"p{pct:g} output",
                                  long_prompt_p, long_prompt_w,
                                  long_out_p, long_out_w, L, cap, share_above(longs.output, longs.weight, long_out_w))
    if not pick["holds"]:
        notes.append(f"concurrency {C} does not fit this hardware at this mix (max_num_seqs {seqs}, "
                     f"{pool.sequences_at_once} full-length at once): add replicas, memory or GPUs, or split pools")
    if not traffic.joint:
        notes.append("from histograms: prompt and output are paired quantile by quantile (their sum's percentile "
                     "is then an upper bound), bucket interiors interpolated linearly")
    return PoolAdvice(name, data, choices, verdict.status.value, verdict.message, traffic, pick["holds"], notes)


# --------------------------------------------------------------------------------------------
# one pool or two


def otsu_threshold(values: np.ndarray, weight: np.ndarray) -> tuple[float, float, float, float]:
    """Otsu's threshold on ``log(values)``: ``(threshold, share below, median below, median above)``
    maximising the between-class variance (weighted)."""
    x = np.log(np.maximum(values, 1.0))
    order = np.argsort(x)
    xs, ws = x[order], weight[order]
    cw = np.cumsum(ws)
    cx = np.cumsum(ws * xs)
    total_w, total_x = cw[-1], cx[-1]
    best, best_i = -1.0, 0
    for i in range(len(xs) - 1):
        if xs[i] == xs[i + 1]:
            continue
        w0, w1 = cw[i], total_w - cw[i]
        m0, m1 = cx[i] / w0, (total_x - cx[i]) / w1
        var = w0 * w1 * (m0 - m1) ** 2
        if var > best:
            best, best_i = var, i
    thr = float(math.exp((xs[best_i] + xs[min(best_i + 1, len(xs) - 1)]) / 2))
    lo = values <= thr
    med_lo = quantile(values[lo], weight[lo], 50) if lo.any() else 0.0
    med_hi = quantile(values[~lo], weight[~lo], 50) if (~lo).any() else 0.0
    return thr, float(weight[lo].sum() / total_w), med_lo, med_hi


def advise(traffic: Traffic, target: Target, opts: Options, name: str = "advised") -> Advice:
    """One pool, or two when the sample is bimodal and one pool cannot hold it (module docstring)."""
    one = advise_pool(name, traffic, target, opts)
    if opts.pools == "1":
        return Advice([one], traffic)
    thr, share_lo, med_lo, med_hi = otsu_threshold(traffic.total, traffic.weight)
    bimodal = 0.05 <= share_lo <= 0.95 and med_lo > 0 and med_hi / med_lo >= 8
    if opts.pools == "auto" and (one.holds_slo or not bimodal):
        if bimodal:
            one.notes.append(f"the sample is bimodal (modes ~{med_lo:,.0f} and ~{med_hi:,.0f} tokens) but one pool "
                             "holds it; --pools 2 splits anyway")
        return Advice([one], traffic)
    lo = traffic.total <= thr
    short_t, long_t = traffic.subset(lo), traffic.subset(~lo)
    c_long = max(1, math.ceil(opts.concurrency * (1 - share_lo)))
    c_short = max(1, opts.concurrency - c_long)
    short = advise_pool(f"{name}-short", short_t, target, opts, c_short, role="short pool")
    long_ = advise_pool(f"{name}-long", long_t, target, opts, c_long, role="long pool")
    threshold = short.data["limits"]["max_prompt_tokens"]
    routed_long = share_above(traffic.prompt, traffic.weight, threshold)
    reason = (f"bimodal: Otsu threshold {thr:,.0f} tokens (prompt + output) between modes ~{med_lo:,.0f} and "
              f"~{med_hi:,.0f}, {share_lo:.1%} short; one pool "
              + ("cannot hold" if not one.holds_slo else "was split on request (--pools 2) although it holds")
              + f" concurrency {opts.concurrency} at the mix (max_num_seqs "
              f"{one.data['engine']['max_num_seqs']}). Router: prompts <= {threshold:,} tokens to {name}-short, the "
              f"rest ({_pct(routed_long)} of observed requests) to {name}-long; each pool is its own deployment on "
              f"{target.hardware.get('count', 1)} x {target.hardware.get('gpu')}")
    for pool, conc in ((short, c_short), (long_, c_long)):
        pool.choices.insert(0, Choice("pool split", f"{pool.name}: concurrency {conc}", reason))
    return Advice([short, long_], traffic, threshold, reason)


# --------------------------------------------------------------------------------------------
# output


def table(pool: PoolAdvice) -> str:
    """The explanation table of one pool, plain text (also written into the profile as comments)."""
    rows = [("choice", "value", "why", "observed requests rejected/cut")]
    for c in pool.choices:
        rows.append((c.field, str(c.value), c.why, c.rejects))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    out = [f"advise: {pool.name} -- traffic {pool.traffic.source}; fit gate: {pool.fit_status}"]
    for r in rows:
        out.append(f"  {r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}" + (f"  [{r[3]}]" if r[3] and r[3] != "none" else ""))
    for n in pool.notes:
        out.append(f"  note: {n}")
    return "\n".join(out)


def profile_text(pool: PoolAdvice, path: Path) -> str:
    """The profile YAML for ``pool`` written at ``path``: schema modeline, what it is, the table
    as comments, then the sections."""
    from kvgate.profile.schema import modeline_for

    head = [modeline_for(path), f"# {path.stem} -- {pool.data['description']}",
            "# Every number, why, and the share of observed requests it turns away:"]
    head += ["#" + (" " + line if line else "") for line in table(pool).splitlines()]
    return "\n".join(head) + "\n" + yaml.safe_dump(pool.data, sort_keys=False, width=110)


def write(advice: Advice, output: Path) -> list[Path]:
    """Write the profile(s): ``output`` for one pool; ``<stem>-short.yaml`` and
    ``<stem>-long.yaml`` beside it for two. Returns the paths."""
    output.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for pool in advice.pools:
        suffix = pool.name.rsplit("-", 1)[-1] if len(advice.pools) > 1 else ""
        path = output.with_name(f"{output.stem}-{suffix}{output.suffix or '.yaml'}") if suffix else output
        path.write_text(profile_text(pool, path))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------
# command line


def _parse_arch(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise AdviseError(f"--arch: expected key=value, got {part!r}")
        try:
            out[key.strip()] = int(value) if value.strip().isdigit() else float(value) if "." in value else value.strip()
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def target_from_args(args: argparse.Namespace) -> Target:
    """The :class:`Target` from ``--from-profile`` / ``--hf-config`` / ``--arch`` and the hardware
    options. Raises :class:`AdviseError` naming the missing option."""
    model: dict[str, Any] = {}
    hardware: dict[str, Any] = {}
    tp, kvmem, dtype = None, None, None
    if args.from_profile:
        try:
            base = load_profile(args.from_profile, Path(args.profile_dir))
        except ProfileError as exc:
            raise AdviseError(str(exc)) from None
        model = base.model.model_dump(exclude_none=True, exclude_defaults=True)
        arch = base.model.architecture.model_dump(exclude_none=True, exclude={"sources"}) if base.model.architecture else None
        if arch:
            model["architecture"] = arch
        model["served_name"] = base.model.served_name
        model.pop("hf_config", None)
        hardware = base.hardware.model_dump(exclude_none=True)
        tp, kvmem, dtype = base.engine.tensor_parallel_size, base.engine.kv_cache_memory_bytes, base.engine.dtype
    if args.hf_config:
        from kvgate.profile.hfconfig import model_from_hf_config

        try:
            got = model_from_hf_config(args.hf_config)
        except Exception as exc:  # noqa: BLE001 -- HfConfigError and file errors: one line naming the file
            raise AdviseError(f"--hf-config {args.hf_config}: {exc}") from None
        arch = {k: v for k, v in got["architecture"].items() if k != "sources"}
        model = {**model, "dtype": got.get("dtype", "bfloat16"), "architecture": arch}
        model.setdefault("served_name", Path(args.hf_config).resolve().parent.name)
    if args.arch:
        model = {**model, "architecture": {**model.get("architecture", {}), **_parse_arch(args.arch)}}
    if "architecture" not in model:
        raise AdviseError("give the model: --hf-config PATH, --arch layers=..,attention_heads=..,kv_heads=..,"
                          "head_dim=..,hidden_size=.. or --from-profile NAME")
    if args.served_name:
        model["served_name"] = args.served_name
    model.setdefault("served_name", "model")
    if args.model_dtype:
        model["dtype"] = args.model_dtype
    if args.gpu:
        hardware["gpu"] = args.gpu
    if args.gpus:
        hardware["count"] = args.gpus
    if args.memory_gib:
        hardware["memory_gib"] = args.memory_gib
    hardware.setdefault("gpu", "cpu")
    on_gpu = hardware["gpu"].lower() != "cpu"
    if on_gpu and not hardware.get("memory_gib"):
        raise AdviseError(f"--memory-gib: the memory per GPU of {hardware['gpu']} is needed to size the KV pool")
    kvmem = args.kv_cache_memory_bytes or kvmem
    if not on_gpu and not kvmem:
        raise AdviseError("--kv-cache-memory-bytes: on the CPU the KV pool is sized explicitly")
    return Target(model=model, hardware=hardware, tp=args.tp or tp or int(hardware.get("count", 1)),
                  kv_cache_memory_bytes=kvmem if not on_gpu else None, dtype=args.dtype or dtype)


def _number(text: str, kind: type, ok: Callable[[float], bool], expected: str) -> Any:
    """argparse type: ``text`` as ``kind`` (finite) when ``ok(value)``, else a usage error (exit 2)
    naming the value and ``expected``."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected {expected}")
    return value


def positive_int(text: str) -> int:
    """argparse type of a count (GPUs, requests, bytes, tokens): an integer > 0."""
    return _number(text, int, lambda v: v > 0, "an integer > 0 (e.g. 4)")


def non_negative_int(text: str) -> int:
    """argparse type of a seed or a count that may be 0: an integer >= 0."""
    return _number(text, int, lambda v: v >= 0, "an integer >= 0 (e.g. 0)")


def percentile_arg(text: str) -> float:
    """argparse type of ``--percentile``: 0 < P <= 100."""
    return _number(text, float, lambda v: 0 < v <= 100, "a percentile 0 < P <= 100 (e.g. 99)")


def probability_arg(text: str) -> float:
    """argparse type of ``--confidence``: 0 < P < 1 (1 would need an infinite margin)."""
    return _number(text, float, lambda v: 0 < v < 1, "a probability 0 < P < 1 (e.g. 0.99)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``kvgate advise ...``."""
    p = sub.add_parser("advise", help="write a hardened profile from the model, hardware, real traffic and the SLO",
                       description="Write a deployment profile (or a short/long pair) whose max_model_len, KV dtype, "
                                   "gpu_memory_utilization, max_num_seqs and max_num_batched_tokens follow from real "
                                   "traffic; every number explained, the share of requests it rejects stated. The "
                                   "written profile passes the fit gate.")
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--traffic", metavar="FILE", help="a traffic sample: JSONL {prompt_tokens, output_tokens} per line, "
                   "an OpenAI request log, ShareGPT conversations or a saved /metrics text (see --traffic-format)")
    t.add_argument("--metrics", metavar="URL", help="a running vLLM (base, /v1 or /metrics URL): its token histograms")
    p.add_argument("--traffic-format", choices=["auto", *FORMATS], default="auto",
                   help="the --traffic file's format (default: told from the content)")
    m = p.add_argument_group("model")
    m.add_argument("--hf-config", metavar="PATH", help="a local Hugging Face config.json")
    m.add_argument("--arch", metavar="K=V,...", help="architecture numbers, e.g. layers=80,attention_heads=64,...")
    m.add_argument("--from-profile", metavar="NAME|PATH", help="take model and hardware from this profile")
    m.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR")
    m.add_argument("--served-name", metavar="NAME")
    m.add_argument("--model-dtype", metavar="DTYPE", help="weight dtype (default: the config's, else bfloat16)")
    m.add_argument("--dtype", metavar="DTYPE", help="engine --dtype to write")
    h = p.add_argument_group("hardware")
    h.add_argument("--gpu", metavar="NAME", help="GPU model (nvidia-smi name), or cpu")
    h.add_argument("--gpus", type=positive_int, metavar="N", help="GPUs per deployment")
    h.add_argument("--memory-gib", type=float, metavar="GIB", help="memory per GPU, GiB")
    h.add_argument("--tp", type=positive_int, metavar="N", help="tensor parallel size (default: --gpus)")
    h.add_argument("--kv-cache-memory-bytes", type=positive_int, metavar="B", help="CPU: the KV pool, bytes")
    s = p.add_argument_group("SLO and choices")
    s.add_argument("--concurrency", type=positive_int, required=True, metavar="N", help="requests in flight to hold at once")
    s.add_argument("--ttft-p95-ms", type=float)
    s.add_argument("--itl-p95-ms", type=float)
    s.add_argument("--e2e-p95-ms", type=float)
    s.add_argument("--percentile", type=percentile_arg, default=DEFAULT_PERCENTILE, help="of prompt + output (default 99)")
    s.add_argument("--round-to", type=positive_int, default=DEFAULT_ROUND_TO, metavar="TOKENS",
                   help="max_model_len granularity (default 1024; rounded to the block size)")
    s.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION)
    s.add_argument("--confidence", type=probability_arg, default=DEFAULT_CONFIDENCE,
                   help="that max_num_seqs requests at the mix fit (default 0.99)")
    s.add_argument("--kv-cache-dtype", choices=["choose", "auto", "fp8"], default="choose")
    s.add_argument("--pools", choices=["auto", "1", "2"], default="auto")
    p.add_argument("--output", "-o", default="advised.yaml", metavar="PATH",
                   help="the profile to write (two pools: PATH-short.yaml and PATH-long.yaml)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        get: Callable[[str], str] | None = None) -> int:
    """Exit 0 with the profile(s) written, 1 when nothing fits, 2 for bad input (or an output
    path that cannot be written)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return _run(args, out, err, get)
    except ValidationError as exc:  # a value pydantic refuses (a negative --concurrency, --arch layers=abc)
        why = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()[:3])
        print(f"kvgate advise: invalid input ({why}); check the options given (--help)", file=err)
        return 2


def _run(args: argparse.Namespace, out: TextIO, err: TextIO, get: Callable[[str], str] | None) -> int:
    try:
        target = target_from_args(args)
        if args.traffic:
            traffic = traffic_from_file(args.traffic, args.traffic_format)
        else:
            text, murl = fetch_metrics(args.metrics, get)
            traffic = traffic_from_metrics(text, murl)
    except AdviseError as exc:
        print(f"kvgate advise: {exc}", file=err)
        return 2
    slo = {k: v for k, v in (("ttft_p95_ms", args.ttft_p95_ms), ("itl_p95_ms", args.itl_p95_ms),
                              ("e2e_p95_ms", args.e2e_p95_ms)) if v}
    opts = Options(concurrency=args.concurrency, percentile=args.percentile, round_to=args.round_to,
                   gpu_memory_utilization=args.gpu_memory_utilization, confidence=args.confidence,
                   kv_cache_dtype=args.kv_cache_dtype, pools=args.pools, slo=slo)
    output = Path(args.output)
    try:
        advice = advise(traffic, target, opts, name=output.stem)
    except AdviseError as exc:
        print(f"kvgate advise: {exc}", file=err)
        return 1
    for pool in advice.pools:
        print(table(pool), file=out)
    if advice.split_reason:
        print(f"two pools: {advice.split_reason}", file=out)
    try:
        paths = write(advice, output)
    except OSError as exc:
        print(f"kvgate advise: cannot write the profile to {output}: {exc.strerror or exc}"
              + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(output) else ""), file=err)
        return 2
    for path in paths:
        print(f"kvgate advise: wrote {path}; check it: .venv/bin/pytest --profile={path} -m fit", file=out)
    return 0

