"""The fit gate: does the concurrency a profile declares fit the KV cache it will get?

Pure (no I/O, no server). :func:`plan` maps a :class:`~kvgate.profile.models.Profile` onto the
arithmetic in :mod:`kvgate.kv.arithmetic`; :func:`fit_verdict` decides; :func:`fit_table` explains per
GPU in numbers; :func:`live_pool_verdict` holds the prediction against the capacity a live vLLM
reports in the labels of its ``vllm:cache_config_info`` metric.

What the gate checks (vLLM runtime), each a sub-verdict folded with :func:`kvgate.verdict.combine`:

* ``fit.budget`` -- ``memory x gpu_memory_utilization - weights/TP - activation peak - CUDA
  graphs - non-torch`` leaves a positive KV budget (with ``kv_cache_memory_bytes`` set: weights +
  reserves + that pool fit in the memory, when the memory is known).
* ``fit.max_model_len`` -- one ``max_model_len`` sequence fits in the pool (vLLM's startup
  check; it refuses to start otherwise).
* ``fit.long`` -- the long workloads' concurrency, summed, as *full-length* (``max_model_len``)
  sequences, fits in the pool at once.
* ``fit.max_num_seqs`` -- ``max_num_seqs`` sequences at the largest short workload's prompt p99 +
  output tokens fit in the pool at once.

llama.cpp runtime: ``fit.offload`` (VRAM for ``num_gpu`` layers + their KV + compute buffer +
reserve <= memory) and ``fit.slots`` (long concurrency <= parallel slots).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvgate.kv import arithmetic as km
from kvgate.kv.arithmetic import GiB, MiB, KvMathError
from kvgate.profile.models import Profile
from kvgate.verdict import Status, Verdict, combine

GATE = "fit"


# --------------------------------------------------------------------------------------------
# formatting (house style: thousands separators, units on every number)


def fmt_bytes(n: float) -> str:
    """``6.5 GiB`` at or above 1 GiB, else ``64.0 MiB``; negative values keep their sign."""
    if abs(n) >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.1f} MiB"


def fmt_bytes2(n: float) -> str:
    """Two decimals, for the table."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.2f} MiB"


def _pf(ok: bool) -> Status:
    return Status.PASS if ok else Status.FAIL


# --------------------------------------------------------------------------------------------
# the plan: a profile turned into numbers


@dataclass(frozen=True)
class Workloads:
    """The declared load. ``long_concurrency``: long workloads' concurrency summed (sequences);
    ``short_tokens``: largest non-long workload's prompt p99 (or prompt) + output, capped at
    ``max_model_len`` (tokens); ``short_parts``: (name, prompt tokens, output tokens) of it."""

    long_concurrency: int
    long_names: tuple[str, ...]
    short_tokens: int | None
    short_name: str | None
    short_prompt: int | None
    short_output: int | None


@dataclass(frozen=True)
class FitPlan:
    """Everything the verdict and the table need, per GPU. Sizes in bytes, lengths in tokens.

    ``kv_bytes_per_token_model`` is the whole model's KV per token (TP=1); ``kv_bytes_per_token``
    is per GPU (every layer holding the token). ``*_source`` fields say where a value came from
    ("profile", a vLLM default, or an estimate); ``arch_sources`` the architecture's (from
    ``model.hf_config``). ``layout`` is vLLM's KV cache groups (:class:`kvgate.kv.arithmetic.KvLayout`)
    with ``in_flight_tokens`` (the sliding-window term) and ``hybrid_source`` (why the hybrid
    manager is on or off). ``pool`` is ``None`` for the llama.cpp runtime; ``offload`` for vLLM.
    """

    profile: str
    runtime: str
    on_gpu: bool
    gpu: str
    gpu_count: int
    tensor_parallel_size: int
    layers: int
    head_dim: int
    max_model_len: int
    kv_cache_dtype: str
    kv_dtype_bytes: float
    kv_heads_per_gpu: int
    kv_bytes_per_token_model: int
    kv_bytes_per_token: int
    block_size: int
    block_size_source: str
    max_num_seqs: int
    max_num_seqs_source: str
    max_num_batched_tokens: int
    max_num_batched_tokens_source: str
    weights_total_bytes: int
    weights_source: str
    workloads: Workloads
    budget: km.GpuBudget | None = None
    pool: km.KvPool | None = None
    pool_source: str = ""
    explicit_pool: bool = False
    what: km.WhatWouldFit | None = None
    offload: km.OffloadPlan | None = None
    offload_max_layers: int | None = None
    offload_max_layers_q8: int | None = None
    offload_max_ctx: int | None = None
    num_parallel: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)
    attention: str = "gqa"
    layout: km.KvLayout | None = None
    hybrid_source: str = ""
    in_flight_tokens: int = 0
    arch_sources: dict[str, str] = field(default_factory=dict)
    arch_values: dict[str, Any] = field(default_factory=dict)
    fp8_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.offload is not None:
            d["offload"]["fits"] = self.offload.fits
        return d


def _workloads(profile: Profile) -> Workloads:
    L = profile.engine.max_model_len
    long_items = [(n, w) for n, w in profile.workloads.items() if w.long]
    short = None
    for name, w in profile.workloads.items():
        if w.long:
            continue
        prompt = w.prompt_tokens_p99 or w.prompt_tokens
        tokens = min(L, prompt + w.output_tokens)
        if short is None or tokens > short[0]:
            short = (tokens, name, prompt, w.output_tokens)
    return Workloads(
        long_concurrency=sum(w.concurrency for _, w in long_items),
        long_names=tuple(n for n, _ in long_items),
        short_tokens=short[0] if short else None,
        short_name=short[1] if short else None,
        short_prompt=short[2] if short else None,
        short_output=short[3] if short else None,
    )


def _declared_concurrency(wl: Workloads, profile: Profile) -> int:
    """Concurrency for "what would fit": the long workloads' sum, else the largest workload's, else 1."""
    if wl.long_concurrency:
        return wl.long_concurrency
    return max((w.concurrency for w in profile.workloads.values()), default=1)


def _gib_or(value: float | None, estimate: int, label: str) -> tuple[int, str]:
    if value is not None:
        return int(round(value * GiB)), "profile memory"
    return estimate, label


def _weights(profile: Profile, arch: Any) -> tuple[int, str]:
    m = profile.model
    if m.weights_gib is not None:
        return int(round(m.weights_gib * GiB)), f"profile weights_gib {m.weights_gib:g}"
    b = km.dtype_bytes(m.dtype)
    if arch.params_billion is not None:
        return int(arch.params_billion * 1e9 * b), f"{arch.params_billion:g}B params x {b:g} B ({m.dtype})"
    if arch.hidden_size is None:
        raise KvMathError("weights unknown: give model.weights_gib, architecture.params_billion or hidden_size")
    params = km.estimate_params(arch.layers, arch.hidden_size, arch.attention_heads, arch.kv_heads,
                                arch.head_dim, arch.intermediate_size, arch.vocab_size, **_moe_mla(arch))
    moe = f", MoE {arch.num_experts} experts" if arch.num_experts else ""
    return int(params * b), f"~{params / 1e9:.3g}B params (estimated from architecture{moe}) x {b:g} B ({m.dtype})"


def _moe_mla(arch: Any) -> dict[str, Any]:
    """The MoE and MLA keywords of :func:`kvgate.kv.arithmetic.estimate_params` from the architecture."""
    keys = ("num_experts", "moe_intermediate_size", "shared_experts", "first_dense_layers", "q_lora_rank",
            "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    out = {k: getattr(arch, k) for k in keys}
    out["kv_lora_rank"] = arch.kv_lora_rank if arch.attention == "mla" else None
    return out


def _hybrid(profile: Profile, arch: Any) -> tuple[bool, str]:
    """Whether vLLM 0.32 keeps its hybrid KV cache manager on, and why (``config/vllm.py``):
    the profile's ``disable_hybrid_kv_cache_manager`` wins; else on, except for chunked-local
    attention without ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``."""
    eng = profile.engine
    if eng.disable_hybrid_kv_cache_manager is not None:
        on = not eng.disable_hybrid_kv_cache_manager
        return on, f"profile disable_hybrid_kv_cache_manager: {eng.disable_hybrid_kv_cache_manager}"
    if arch.layer_types and "chunked_attention" in arch.layer_types and \
            eng.env.get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE") != "1":
        return False, "vLLM turns it off for chunked-local attention"
    return True, "vLLM default"


def _layout(arch: Any, kv_b: float, tp: int, block: int, L: int, in_flight: int, hybrid: bool) -> km.KvLayout:
    mla = arch.attention == "mla"
    lks = km.layer_kvs(arch.layers, arch.kv_heads, arch.head_dim, kv_b, tp, arch.layer_types, arch.sliding_window,
                       arch.attention_chunk_size, arch.kv_lora_rank if mla else None,
                       arch.qk_rope_head_dim if mla else None)
    return km.kv_layout(lks, block, L, in_flight, hybrid)


def plan(profile: Profile) -> FitPlan:
    """Turn ``profile`` into a :class:`FitPlan`. Raises :class:`KvMathError` when the arithmetic
    cannot be done (no architecture, MLA, unknown dtype, no way to size the pool)."""
    arch = profile.model.architecture
    if arch is None:
        raise KvMathError(
            "profile gives no model.architecture (layers, kv_heads, head_dim) and no model.hf_config to read it from"
        )
    if profile.engine.runtime == "llama.cpp":
        km.require_supported_attention(arch.attention)
        return _plan_llamacpp(profile, arch)
    return _plan_vllm(profile, arch)


def _plan_vllm(profile: Profile, arch: Any) -> FitPlan:
    eng, hw, mem = profile.engine, profile.hardware, profile.memory
    on_gpu = hw.gpu.lower() != "cpu"
    tp = eng.tensor_parallel_size
    L = eng.max_model_len
    notes: list[str] = []
    model_dtype = eng.dtype if eng.dtype not in (None, "auto") else profile.model.dtype
    kv_b = km.vllm_kv_dtype_bytes(eng.kv_cache_dtype, model_dtype)
    kv_label = eng.kv_cache_dtype if eng.kv_cache_dtype != "auto" else f"auto = {model_dtype}"
    head_dim = arch.head_dim
    mla = arch.attention == "mla"
    fp8_ok, fp8_why = km.fp8_kv_supported(on_gpu, mla)
    if eng.kv_cache_dtype.lower().startswith("fp8") and not fp8_ok:
        raise KvMathError(f"kv_cache_dtype {eng.kv_cache_dtype}: {fp8_why} (vLLM refuses to start)")
    if tp > arch.kv_heads and not mla:
        notes.append(f"TP {tp} > {arch.kv_heads} KV heads: each GPU keeps 1 KV head (replicated), "
                     "so KV per GPU stops shrinking")
    if mla and tp > 1:
        notes.append(f"MLA: every one of the {tp} GPUs keeps the whole latent cache (not split by TP)")

    memory_bytes = int(round(hw.memory_gib * GiB)) if hw.memory_gib else None
    d = km.vllm_defaults(not on_gpu, memory_bytes, hw.gpu, tp)
    block, block_src = km.vllm_block_size(on_gpu, mla, eng.block_size)
    seqs = eng.max_num_seqs or d.max_num_seqs
    seqs_src = "profile" if eng.max_num_seqs else d.rule
    batched = eng.max_num_batched_tokens or d.max_num_batched_tokens
    batched_src = "profile" if eng.max_num_batched_tokens else d.rule
    util = eng.gpu_memory_utilization or d.gpu_memory_utilization
    in_flight = km.max_in_flight_tokens(batched, on_gpu)
    hybrid, hybrid_src = _hybrid(profile, arch)
    layout = _layout(arch, kv_b, tp, block, L, in_flight, hybrid)
    kv_gpu = layout.bytes_per_token_all_layers
    kv_model = _layout(arch, kv_b, 1, block, L, in_flight, hybrid).bytes_per_token_all_layers

    weights_total, weights_src = _weights(profile, arch)
    weights_gpu = weights_total // tp

    hidden = arch.hidden_size or arch.attention_heads * head_dim
    act_b = 4 if str(model_dtype).lower() in ("float32", "float", "fp32") else 2
    act_est = km.activation_peak_bytes(batched, seqs, hidden, arch.intermediate_size, arch.attention_heads,
                                       arch.kv_heads, head_dim, arch.vocab_size, tp, act_b)
    act, act_src = _gib_or(mem.activation_peak_gib, act_est,
                           f"estimate: {batched:,} batched tokens x one layer's tensors + {seqs} x vocab logits")
    graphs, graphs_src = _gib_or(mem.cuda_graph_gib, km.cuda_graph_reserve_bytes(on_gpu, eng.enforce_eager),
                                 "estimate" if on_gpu and not eng.enforce_eager else
                                 ("enforce_eager: no graphs" if on_gpu else "CPU: no CUDA graphs"))
    nontorch, nontorch_src = _gib_or(mem.non_torch_gib, km.non_torch_bytes(on_gpu, tp),
                                     ("estimate: CUDA context" + (" + NCCL" if tp > 1 else "")) if on_gpu
                                     else "CPU: none")
    sources = {"weights": weights_src, "activation_peak": act_src, "cuda_graph": graphs_src,
               "non_torch": nontorch_src}

    explicit = None
    if eng.kv_cache_memory_bytes:
        explicit, pool_src = eng.kv_cache_memory_bytes, "engine.kv_cache_memory_bytes (exact)"
    elif not on_gpu and eng.env.get("VLLM_CPU_KVCACHE_SPACE"):
        explicit = int(eng.env["VLLM_CPU_KVCACHE_SPACE"]) * GiB
        pool_src = "VLLM_CPU_KVCACHE_SPACE (exact)"

    budget = None
    if memory_bytes is not None:
        # with an explicit pool vLLM ignores gpu_memory_utilization: the whole memory is the limit
        budget = km.gpu_budget(memory_bytes, 1.0 if explicit is not None else util, weights_gpu, act, graphs,
                               nontorch, sources)
    if explicit is not None:
        pool_bytes = explicit
    elif budget is not None:
        pool_bytes = max(0, budget.kv_budget_bytes)
        pool_src = "estimated budget (memory x gpu_memory_utilization - reserves)"
    else:
        raise KvMathError(
            "cannot size the KV pool: give engine.kv_cache_memory_bytes, or hardware.memory_gib"
            + (" (or VLLM_CPU_KVCACHE_SPACE in engine.env)" if not on_gpu else "")
        )

    pool = km.kv_pool_for_layout(pool_bytes, layout)
    wl = _workloads(profile)
    fp8_pool = None
    if kv_b > 1 and fp8_ok:
        fp8_pool = km.kv_pool_for_layout(pool_bytes, _layout(arch, 1, tp, block, L, in_flight, hybrid))
    what = km.what_would_fit(pool, _declared_concurrency(wl, profile), None,
                             budget if (budget is not None and explicit is None) else None, fp8_pool=fp8_pool)
    if arch.max_position_embeddings and L > arch.max_position_embeddings:
        notes.append(f"max_model_len {L:,} > the model's max_position_embeddings {arch.max_position_embeddings:,}")
    return FitPlan(
        profile=profile.name, runtime="vllm", on_gpu=on_gpu, gpu=hw.gpu, gpu_count=hw.count,
        tensor_parallel_size=tp, layers=arch.layers, head_dim=head_dim, max_model_len=L, kv_cache_dtype=kv_label, kv_dtype_bytes=kv_b,
        kv_heads_per_gpu=1 if mla else km.kv_heads_per_gpu(arch.kv_heads, tp), kv_bytes_per_token_model=kv_model,
        kv_bytes_per_token=kv_gpu, block_size=block, block_size_source=block_src,
        max_num_seqs=seqs, max_num_seqs_source=seqs_src, max_num_batched_tokens=batched,
        max_num_batched_tokens_source=batched_src, weights_total_bytes=weights_total,
        weights_source=weights_src, workloads=wl, budget=budget, pool=pool, pool_source=pool_src,
        explicit_pool=explicit is not None, what=what, notes=tuple(notes) + layout.notes,
        attention=arch.attention, layout=layout, hybrid_source=hybrid_src, in_flight_tokens=in_flight,
        arch_sources=dict(arch.sources), fp8_note=fp8_why,
        arch_values={**{k: getattr(arch, k) for k in ("kv_heads", "attention", "sliding_window", "attention_chunk_size",
                                                       "kv_lora_rank", "qk_rope_head_dim", "num_experts",
                                                       "experts_per_token")}, "dtype": profile.model.dtype},
    )


def _plan_llamacpp(profile: Profile, arch: Any) -> FitPlan:
    eng, hw, mem = profile.engine, profile.hardware, profile.memory
    if not hw.memory_gib:
        raise KvMathError("llama.cpp offload needs hardware.memory_gib")
    if arch.hidden_size is None or arch.vocab_size is None:
        raise KvMathError("llama.cpp offload needs architecture.hidden_size and vocab_size")
    notes: list[str] = []
    layers, hidden, vocab = arch.layers, arch.hidden_size, arch.vocab_size
    memory_bytes = int(round(hw.memory_gib * GiB)) * hw.count
    if hw.count > 1:
        notes.append(f"{hw.count} GPUs treated as one pool of {fmt_bytes(memory_bytes)} (llama.cpp layer split)")
    num_ctx = eng.max_model_len
    parallel = eng.num_parallel or 1
    kv_tokens = num_ctx * parallel
    cache = eng.kv_cache_dtype
    kv_elem = km.llamacpp_kv_dtype_bytes(cache)
    kv_layer_tok = 2 * arch.kv_heads * arch.head_dim * kv_elem

    weights_total, weights_src = _weights(profile, arch)
    params = km.estimate_params(layers, hidden, arch.attention_heads, arch.kv_heads, arch.head_dim,
                                arch.intermediate_size, vocab)
    per_layer_params = (params - 2 * vocab * hidden - hidden) / layers
    layer_w = int(weights_total * per_layer_params / params)
    output_w = int(weights_total * (vocab * hidden + hidden) / params)

    def graphs(ctx: int) -> tuple[int, int]:
        if mem.compute_buffer_gib is not None:
            v = int(round(mem.compute_buffer_gib * GiB))
            return v, v
        args = dict(batch=km.LLAMACPP_DEFAULT_BATCH, embedding=hidden, context=ctx, heads=arch.attention_heads,
                    heads_kv=arch.kv_heads, head_dim=arch.head_dim, vocab=vocab)
        return km.ollama_graph_bytes(full_offload=False, **args), km.ollama_graph_bytes(full_offload=True, **args)

    overhead = int(round(mem.non_torch_gib * GiB)) if mem.non_torch_gib is not None else km.OLLAMA_MIN_RESERVE_BYTES

    def kwargs(ctx_tokens: int, kv_bpt: float) -> dict[str, Any]:
        partial, full = graphs(ctx_tokens)
        return dict(layers=layers, layer_weight_bytes=layer_w, output_weight_bytes=output_w,
                    kv_bytes_per_layer_token=kv_bpt, kv_tokens=ctx_tokens, memory_bytes=memory_bytes,
                    compute_buffer_partial_bytes=partial, compute_buffer_full_bytes=full, overhead_bytes=overhead)

    num_gpu = eng.num_gpu_layers if eng.num_gpu_layers is not None else layers + 1
    off = km.offload_plan(num_gpu=num_gpu, **kwargs(kv_tokens, kv_layer_tok))
    max_layers = km.max_gpu_layers(**kwargs(kv_tokens, kv_layer_tok))
    q8 = None
    if kv_elem > km.GGML_KV_BYTES["q8_0"]:
        q8 = km.max_gpu_layers(**kwargs(kv_tokens, 2 * arch.kv_heads * arch.head_dim * km.GGML_KV_BYTES["q8_0"]))
    # largest num_ctx (per slot, multiple of 256) at the declared num_gpu and parallel
    lo, hi = 0, (arch.max_position_embeddings or 1 << 20) // 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if km.offload_plan(num_gpu=num_gpu, **kwargs(mid * 256 * parallel, kv_layer_tok)).fits:
            lo = mid
        else:
            hi = mid - 1
    kv_model = int(round(layers * kv_layer_tok))
    return FitPlan(
        profile=profile.name, runtime="llama.cpp", on_gpu=True, gpu=hw.gpu, gpu_count=hw.count,
        tensor_parallel_size=1, layers=layers, head_dim=arch.head_dim, max_model_len=num_ctx, kv_cache_dtype="f16 (auto)" if cache == "auto" else cache,
        kv_dtype_bytes=kv_elem, kv_heads_per_gpu=arch.kv_heads, kv_bytes_per_token_model=kv_model,
        kv_bytes_per_token=int(round(off.repeating_on_gpu * kv_layer_tok)), block_size=1,
        block_size_source="llama.cpp: contiguous per-slot KV", max_num_seqs=parallel,
        max_num_seqs_source="engine.num_parallel", max_num_batched_tokens=km.LLAMACPP_DEFAULT_BATCH,
        max_num_batched_tokens_source="llama.cpp default n_batch", weights_total_bytes=weights_total,
        weights_source=weights_src, workloads=_workloads(profile), offload=off, offload_max_layers=max_layers,
        offload_max_layers_q8=q8, offload_max_ctx=lo * 256, num_parallel=parallel, notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------
# the verdict


def _where(p: FitPlan) -> str:
    return "/GPU" if p.on_gpu else ""


def _grouped(p: FitPlan) -> bool:
    """True when blocks x block_size is not a token count: several KV groups or windowed layers."""
    lay = p.layout
    return lay is not None and (len(lay.groups) > 1 or lay.groups[0].kind in ("sliding", "chunked"))


def _holds(p: FitPlan) -> str:
    pool = p.pool
    assert pool is not None
    if not _grouped(p):
        return f"{pool.tokens:,} tokens"
    assert p.layout is not None
    return (f"{pool.num_blocks:,} blocks of {pool.block_size} in {len(p.layout.groups)} KV "
            f"group{'s' if len(p.layout.groups) != 1 else ''} ({pool.vllm_kv_cache_size_tokens:,} tokens by vLLM's count)")


def _amount(p: FitPlan, blocks: int) -> str:
    """``blocks`` as tokens (one KV group: blocks x block_size) or as blocks (grouped layouts)."""
    assert p.pool is not None
    return f"{blocks:,} blocks" if _grouped(p) else f"{blocks * p.pool.block_size:,} tokens"


def _group_word(p: FitPlan) -> str:
    """`` summed over 3 x 7 (sliding-window (256), 1 layer) + 16 (1 full-attention layer)``."""
    if not _grouped(p):
        return ""
    assert p.layout is not None
    counts: dict[tuple[int, str], int] = {}
    for g in p.layout.groups:
        key = (g.blocks_per_request, g.describe())
        counts[key] = counts.get(key, 0) + 1
    return " summed over " + " + ".join(f"{n} x {b} ({d})" if n > 1 else f"{b} ({d})"
                                         for (b, d), n in counts.items())


def _seq_word(n: int) -> str:
    return "sequence" if n == 1 else "sequences"


def _vllm_parts(p: FitPlan) -> list[Verdict]:
    pool, budget, wl = p.pool, p.budget, p.workloads
    assert pool is not None
    parts: list[Verdict] = []
    if budget is not None:
        if p.explicit_pool:
            need = budget.reserved_bytes + pool.pool_bytes
            ok = need <= budget.memory_bytes
            msg = (f"weights {fmt_bytes(budget.weights_bytes)} + reserves "
                   f"{fmt_bytes(budget.reserved_bytes - budget.weights_bytes)} + KV pool {fmt_bytes(pool.pool_bytes)}"
                   f" = {fmt_bytes(need)} vs memory {fmt_bytes(budget.memory_bytes)}{_where(p)} -> {_pf(ok).value}")
            parts.append(Verdict("fit.budget", _pf(ok), msg, measured=need, limit=budget.memory_bytes, unit="bytes"))
        else:
            ok = budget.kv_budget_bytes > 0
            msg = (f"{fmt_bytes(budget.memory_bytes)} x {budget.gpu_memory_utilization:g} = "
                   f"{fmt_bytes(budget.requested_bytes)} - weights {fmt_bytes(budget.weights_bytes)} - activation "
                   f"{fmt_bytes(budget.activation_peak_bytes)} - CUDA graphs {fmt_bytes(budget.cuda_graph_bytes)} - "
                   f"non-torch {fmt_bytes(budget.non_torch_bytes)} = KV budget {fmt_bytes(budget.kv_budget_bytes)}"
                   f"{_where(p)} -> {_pf(ok).value}")
            parts.append(Verdict("fit.budget", _pf(ok), msg, measured=budget.kv_budget_bytes, limit=0, unit="bytes",
                                 evidence={"measured_is": "KV budget", "limit_is": "must be above"}))
    else:
        parts.append(Verdict("fit.budget", Status.SKIP,
                             f"memory not declared; KV pool from {p.pool_source}: {fmt_bytes(pool.pool_bytes)}"))

    L = p.max_model_len
    head = f"KV pool {fmt_bytes(pool.pool_bytes)}{_where(p)} holds {_holds(p)}"
    ok = pool.usable_blocks >= pool.blocks_per_sequence
    per_seq = f"{pool.blocks_per_sequence:,} blocks{_group_word(p)}"
    if ok:
        msg = (f"one sequence of {L:,} tokens needs {fmt_bytes(pool.sequence_bytes)}{_where(p)} of KV "
               f"({per_seq}) -> PASS")
    elif pool.num_blocks < pool.blocks_per_sequence:
        msg = (f"{head} < one sequence of {L:,} ({fmt_bytes(pool.sequence_bytes)}, {per_seq}): vLLM refuses to "
               f"start (max_model_len larger than the KV cache) -> FAIL")
    else:
        msg = (f"{head}: concurrency at max_model_len: 0 -- of its {pool.num_blocks:,} blocks block 0 is vLLM's "
               f"null block, so {pool.usable_blocks:,} usable < {per_seq} one {L:,}-token request needs: vLLM 0.32 "
               f"refuses to start (its startup check holds the null block back, "
               f"kv_cache_utils.check_enough_kv_cache_memory); a vLLM that starts anyway can never schedule such a "
               f"request -> FAIL")
    parts.append(Verdict("fit.max_model_len", _pf(ok), msg, measured=pool.usable_blocks,
                         limit=pool.blocks_per_sequence, unit="blocks",
                         evidence={"num_blocks": pool.num_blocks, "null_blocks": 1, "sequence_tokens": L}))

    by_vllm = pool.num_blocks // pool.blocks_per_sequence
    if by_vllm != pool.sequences_at_once:
        at_once = (f"{by_vllm:,} {_seq_word(by_vllm)} of {L:,} by vLLM's count, {pool.sequences_at_once:,} at once "
                   f"(one of its {pool.num_blocks:,} blocks of {pool.block_size} is vLLM's null block)")
    else:
        at_once = f"{pool.sequences_at_once:,} {_seq_word(pool.sequences_at_once)} of {L:,}"
    if wl.long_concurrency:
        ok = pool.sequences_at_once >= wl.long_concurrency
        msg = (f"{head} = {at_once}; profile declares {wl.long_concurrency} "
               f"({' + '.join(wl.long_names)}) -> {_pf(ok).value}")
        parts.append(Verdict("fit.long", _pf(ok), msg, measured=pool.sequences_at_once, limit=wl.long_concurrency,
                             unit="sequences", evidence={"sequence_tokens": L}))
    else:
        parts.append(Verdict("fit.long", Status.SKIP, f"{head} = {at_once}; no long workload declared"))

    if wl.short_tokens:
        need_blocks = pool.blocks_needed(p.max_num_seqs, wl.short_tokens)
        ok = need_blocks <= pool.usable_blocks
        fits = pool.sequences_of(wl.short_tokens)
        msg = (f"max_num_seqs {p.max_num_seqs} x {wl.short_tokens:,} tokens ({wl.short_name}: prompt p99 "
               f"{wl.short_prompt:,} + output {wl.short_output:,}) = {_amount(p, need_blocks)} vs "
               f"{_amount(p, pool.usable_blocks)} usable ({fits:,} such sequences fit) -> {_pf(ok).value}")
        parts.append(Verdict("fit.max_num_seqs", _pf(ok), msg, measured=fits, limit=p.max_num_seqs, unit="sequences",
                             evidence={"sequence_tokens": wl.short_tokens}))
    else:
        parts.append(Verdict("fit.max_num_seqs", Status.SKIP, "no short workload declared"))
    return parts


def _llamacpp_parts(p: FitPlan) -> list[Verdict]:
    off, wl = p.offload, p.workloads
    assert off is not None
    ok = off.fits
    msg = (f"num_gpu {off.num_gpu}/{off.layers + 1}: weights {fmt_bytes(off.weights_gpu_bytes)} + KV "
           f"{fmt_bytes(off.kv_gpu_bytes)} ({p.num_parallel} x {p.max_model_len:,} tokens) + compute buffer "
           f"{fmt_bytes(off.compute_buffer_bytes)} + reserve {fmt_bytes(off.overhead_bytes)} = "
           f"{fmt_bytes(off.total_bytes)} vs {fmt_bytes(off.memory_bytes)}; largest num_gpu that fits: "
           f"{p.offload_max_layers} -> {_pf(ok).value}")
    parts = [Verdict("fit.offload", _pf(ok), msg, measured=off.total_bytes, limit=off.memory_bytes, unit="bytes")]
    if wl.long_concurrency:
        ok = wl.long_concurrency <= p.num_parallel
        msg = (f"{p.num_parallel} parallel slots of {p.max_model_len:,} tokens; profile declares "
               f"{wl.long_concurrency} long ({' + '.join(wl.long_names)}) -> {_pf(ok).value}")
        parts.append(Verdict("fit.slots", _pf(ok), msg, measured=p.num_parallel, limit=wl.long_concurrency,
                             unit="sequences"))
    return parts


def at_served_len(profile: Profile, served: int | None = None, source: str = "") -> tuple[Profile, str]:
    """``(profile, words)`` for the arithmetic. With ``engine.max_model_len: auto`` vLLM chooses the
    length (vllm PR#29431): given the ``served`` length read back (tokens; ``source`` names where,
    e.g. ``/v1/models``) the profile's ``engine.max_model_len`` is replaced by it; without one it
    stays the need (``engine.min_model_len``) and ``words`` says so. A fixed length: ``profile``
    unchanged, ``words`` empty. Pure; never validates the copy (the served length is a fact)."""
    e = profile.engine
    if not e.max_model_len_auto:
        return profile, ""
    if served is None:  # the need (a run's profile may already hold the served length: not here)
        if e.min_model_len is not None and e.min_model_len != e.max_model_len:
            profile = profile.model_copy(update={"engine": e.model_copy(update={"max_model_len": e.min_model_len})})
        return profile, (f"max_model_len: auto -- judged at the {e.min_model_len or e.max_model_len:,} tokens needed "
                         f"(engine.min_model_len): "
                         f"the length vLLM chose is not read here{f' ({source})' if source else ''}")
    copy = profile.model_copy(update={"engine": e.model_copy(update={"max_model_len": served})})
    return copy, (f"max_model_len: auto -- vLLM serves {served:,} tokens ({source or 'read back'}; "
                  f"{e.min_model_len or e.max_model_len:,} needed): the arithmetic uses the served length")


def _noted(v: Verdict, words: str, served: int | None) -> Verdict:
    """``v`` with the ``max_model_len: auto`` words appended (:func:`at_served_len`)."""
    if not words:
        return v
    return replace(v, message=f"{v.message} [{words}]",
                   evidence={**v.evidence, "max_model_len_auto": {"served": served, "words": words}})


def fit_verdict(profile: Profile, served_len: int | None = None, served_source: str = "") -> Verdict:
    """The fit gate's verdict (gate ``"fit"``) for ``profile``; needs no server.

    FAIL when any check in the module docstring fails; the message joins the failing checks'
    sentences (or, on PASS, all of them). INVALID when the arithmetic cannot be done for this
    profile (e.g. MLA, no architecture): no number can be trusted, so neither PASS nor FAIL.
    ``evidence["plan"]`` holds every number of the :class:`FitPlan`. ``served_len`` /
    ``served_source``: with ``engine.max_model_len: auto``, the length the server serves and where
    it was read (:func:`at_served_len`); without one the need is judged, and the message says so.
    """
    profile, words = at_served_len(profile, served_len, served_source)
    return _noted(_fit_verdict(profile), words, served_len)


def _fit_verdict(profile: Profile) -> Verdict:
    try:
        p = plan(profile)
    except KvMathError as exc:
        return Verdict(GATE, Status.INVALID, f"fit arithmetic not possible for profile {profile.name}: {exc}")
    parts = _llamacpp_parts(p) if p.runtime == "llama.cpp" else _vllm_parts(p)
    v = combine(GATE, parts, headline="fit.long" if p.runtime != "llama.cpp" else "fit.slots")
    evidence = dict(v.evidence)
    evidence["plan"] = p.to_dict()
    return replace(v, evidence=evidence)


# --------------------------------------------------------------------------------------------
# the table


def _row(label: str, value: str, note: str = "") -> str:
    line = f"  {label:<40} {value:>16}"
    return f"{line}   {note}" if note else line


def fit_table(profile: Profile) -> str:
    """A per-GPU fit table in plain text (console and Allure attachment)."""
    try:
        p = plan(profile)
    except KvMathError as exc:
        return f"fit table for {profile.name}: not computable: {exc}\n"
    v = fit_verdict(profile)
    lines = [f"fit: {profile.name} -- {profile.model.served_name}"]
    if p.runtime == "llama.cpp":
        lines += _llamacpp_table(p)
    else:
        lines += _vllm_table(p)
    for note in p.notes:
        lines.append(f"  note: {note}")
    lines.append(f"verdict: {v.status.value}")
    return "\n".join(lines) + "\n"


def _vllm_table(p: FitPlan) -> list[str]:
    pool, budget, wl, w = p.pool, p.budget, p.workloads, p.what
    assert pool is not None and w is not None
    where = (f"vLLM, TP={p.tensor_parallel_size} on {p.gpu_count} x {p.gpu}"
             + (f" ({fmt_bytes2(budget.memory_bytes)})" if budget else "")) if p.on_gpu else "vLLM on CPU"
    per = "per GPU" if p.on_gpu else "per engine (CPU)"
    out = [f"  {where}", per]
    if budget is not None:
        util = "1 (kv_cache_memory_bytes set)" if p.explicit_pool else f"{budget.gpu_memory_utilization:g}"
        out.append(_row("memory x gpu_memory_utilization", fmt_bytes2(budget.requested_bytes),
                        f"{fmt_bytes2(budget.memory_bytes)} x {util}"))
        out.append(_row(f"- weights (/ TP {p.tensor_parallel_size})", fmt_bytes2(budget.weights_bytes),
                        budget.sources.get("weights", "")))
        out.append(_row("- activation peak", fmt_bytes2(budget.activation_peak_bytes),
                        budget.sources.get("activation_peak", "")))
        out.append(_row("- CUDA-graph reserve", fmt_bytes2(budget.cuda_graph_bytes),
                        budget.sources.get("cuda_graph", "")))
        out.append(_row("- non-torch overhead", fmt_bytes2(budget.non_torch_bytes),
                        budget.sources.get("non_torch", "")))
        out.append(_row("= KV budget", fmt_bytes2(budget.kv_budget_bytes)))
    else:
        out.append(_row("weights (whole model)", fmt_bytes2(p.weights_total_bytes), p.weights_source))
    out.append(_row("KV pool", fmt_bytes2(pool.pool_bytes), p.pool_source))
    out.append("model numbers (source)")
    for key in ("layers", "kv_heads", "head_dim", "attention", "sliding_window", "attention_chunk_size",
                "layer_types", "kv_lora_rank", "qk_rope_head_dim", "num_experts", "experts_per_token", "dtype"):
        if key in p.arch_sources or key in ("layers", "kv_heads", "head_dim", "attention", "dtype") or (
                p.arch_values.get(key) is not None) or (key == "layer_types" and _grouped(p)):
            out.append(_row(key, _arch_value(p, key), p.arch_sources.get(key, "profile")))
    lay = p.layout
    if p.attention == "mla" and lay is not None:
        kv_note = (f"{p.kv_cache_dtype}: MLA latent {lay.groups[0].bytes_per_token // max(1, p.layers) / p.kv_dtype_bytes:g}"
                   f" (kv_lora_rank + rope) x {p.layers} layers x {p.kv_dtype_bytes:g} B, no V, not split by TP")
    else:
        kv_note = (f"{p.kv_cache_dtype}: 2 x {p.layers} layers x {p.kv_heads_per_gpu} KV heads x {p.head_dim} x "
                   f"{p.kv_dtype_bytes:g} B"
                   + (f"; whole model {p.kv_bytes_per_token_model:,} B" if p.tensor_parallel_size > 1 else ""))
    out.append(_row("KV/token (all layers)" if _grouped(p) else "KV/token", f"{p.kv_bytes_per_token:,} B", kv_note))
    if lay is not None and _grouped(p):
        out.append(_row("KV cache groups", f"{len(lay.groups)}",
                        f"hybrid KV cache manager {'on' if lay.hybrid else 'off'} ({p.hybrid_source}); one block id "
                        f"= {fmt_bytes2(lay.bytes_per_block)} (largest group)"))
        for i, g in enumerate(lay.groups):
            if g.kind == "sliding":
                rule = (f"cdiv(min({g.window:,} - 1 + {g.in_flight_tokens:,} in flight, {p.max_model_len:,}), "
                        f"{g.block_size}) + 1")
            elif g.kind == "chunked":
                rule = f"cdiv(min({g.window:,} + {g.in_flight_tokens:,} in flight, {p.max_model_len:,}), {g.block_size})"
            else:
                rule = f"cdiv({p.max_model_len:,}, {g.block_size})"
            out.append(_row(f"  group {i}: {g.describe()}", f"{g.blocks_per_request:,} blocks/request",
                            f"{rule}; {g.bytes_per_token:,} B/token"))
    out.append(_row(f"KV/sequence ({p.max_model_len:,} tokens)", fmt_bytes2(pool.sequence_bytes),
                    f"{pool.blocks_per_sequence:,} blocks of {pool.block_size} ({p.block_size_source})"))
    if _grouped(p):
        out.append(_row("pool holds", f"{pool.num_blocks:,} blocks",
                        f"vLLM logs {pool.vllm_kv_cache_size_tokens:,} tokens, {pool.vllm_max_concurrency:.2f}x "
                        f"(blocks x block_size = {pool.tokens:,} is not a token count here)"))
    else:
        out.append(_row("pool holds", f"{pool.tokens:,} tokens",
                        f"{pool.num_blocks:,} blocks; vLLM would log {pool.vllm_kv_cache_size_tokens:,} tokens, "
                        f"{pool.vllm_max_concurrency:.2f}x"))
    out.append(_row("sequences that fit at once", f"{pool.sequences_at_once:,} x {p.max_model_len:,}",
                    f"({pool.num_blocks:,} - 1) // {pool.blocks_per_sequence:,}: one block is vLLM's null block"))
    if budget is not None:
        out.append(_row("headroom", fmt_bytes2(budget.headroom_bytes),
                        "left outside gpu_memory_utilization" if not p.explicit_pool
                        else "memory - weights - reserves - KV pool: "
                        f"{fmt_bytes2(budget.kv_budget_bytes - pool.pool_bytes)}"))
    out.append("declared load")
    unit = "blocks" if _grouped(p) else "tokens"
    scale = 1 if _grouped(p) else pool.block_size
    usable = pool.usable_blocks * scale
    if wl.long_concurrency:
        need = pool.blocks_needed(wl.long_concurrency, p.max_model_len) * scale
        out.append(_row(f"long ({' + '.join(wl.long_names)})", f"{wl.long_concurrency} x {p.max_model_len:,}",
                        f"= {need:,} {unit} of {usable:,} usable"
                        f" ({usable - need:+,}) -> {'PASS' if need <= usable else 'FAIL'}"))
    if wl.short_tokens:
        need = pool.blocks_needed(p.max_num_seqs, wl.short_tokens) * scale
        out.append(_row("max_num_seqs x short p99 + output", f"{p.max_num_seqs} x {wl.short_tokens:,}",
                        f"= {need:,} {unit} of {usable:,} usable ({usable - need:+,}) -> "
                        f"{'PASS' if need <= usable else 'FAIL'}; {wl.short_name}; max_num_seqs from "
                        f"{p.max_num_seqs_source}"))
    out.append(_row("max_num_batched_tokens", f"{p.max_num_batched_tokens:,}", p.max_num_batched_tokens_source))
    out.append("what would fit (same KV budget)")
    out.append(_row(f"max_model_len for {w.concurrency} at once", f"{w.max_model_len_for_concurrency:,} tokens"))
    out.append(_row(f"concurrency at max_model_len {p.max_model_len:,}", f"{w.max_concurrency_at_len:,}"))
    if w.fp8_kv_bytes_per_token is not None:
        fp8_tokens = w.fp8_kv_cache_size_tokens if _grouped(p) else w.fp8_tokens
        out.append(_row("with --kv-cache-dtype fp8", f"{fp8_tokens:,} tokens",
                        f"{w.fp8_kv_bytes_per_token:,} B/token; {w.fp8_max_concurrency_at_len:,} x "
                        f"{p.max_model_len:,} at once; max_model_len for {w.concurrency}: "
                        f"{w.fp8_max_model_len_for_concurrency:,}"))
    elif p.kv_dtype_bytes > 1:
        out.append(_row("with --kv-cache-dtype fp8", "not offered", p.fp8_note))
    else:
        out.append(_row("with --kv-cache-dtype fp8", "no change", f"KV already {p.kv_cache_dtype}"))
    if w.min_gpu_memory_utilization is not None:
        out.append(_row(f"gpu_memory_utilization for {w.concurrency} x {p.max_model_len:,}",
                        f"{w.min_gpu_memory_utilization:.3f}",
                        "> 1: not possible on this hardware" if w.min_gpu_memory_utilization > 1 else ""))
    return out


def _arch_value(p: FitPlan, key: str) -> str:
    """The architecture number ``key`` as the table prints it (layer_types as a count per kind)."""
    lay = p.layout
    if key == "layers":
        return f"{p.layers}"
    if key == "head_dim":
        return f"{p.head_dim}"
    if key == "layer_types" and lay is not None:
        kinds: dict[str, int] = {}
        for g in lay.groups:
            kinds[g.kind] = kinds.get(g.kind, 0) + g.layers
        return ", ".join(f"{n} {k}" for k, n in kinds.items())
    value = p.arch_values.get(key)
    return "-" if value is None else (f"{value:,}" if isinstance(value, int) else str(value))


def _llamacpp_table(p: FitPlan) -> list[str]:
    off = p.offload
    assert off is not None
    out = [f"  llama.cpp offload on {p.gpu_count} x {p.gpu} ({fmt_bytes2(off.memory_bytes)}); "
           f"num_ctx {p.max_model_len:,} x parallel {p.num_parallel} = {off.kv_tokens:,} KV tokens", "on the GPU"]
    out.append(_row("weights, whole model", fmt_bytes2(p.weights_total_bytes), p.weights_source))
    out.append(_row("num_gpu (-ngl)", f"{off.num_gpu} / {off.layers + 1}",
                    f"{off.repeating_on_gpu} repeating layers + output layer"
                    if off.output_on_gpu else "nothing offloaded"))
    out.append(_row("weights on GPU", fmt_bytes2(off.weights_gpu_bytes),
                    f"{fmt_bytes2(off.layer_weight_bytes)}/layer + output {fmt_bytes2(off.output_weight_bytes)}"))
    out.append(_row("KV on GPU", fmt_bytes2(off.kv_gpu_bytes),
                    f"{p.kv_cache_dtype}: {off.kv_bytes_per_layer_token:,.0f} B/token/layer x {off.kv_tokens:,} tokens"))
    out.append(_row("compute buffer", fmt_bytes2(off.compute_buffer_bytes), "Ollama GraphSize estimate"
                    " (or memory.compute_buffer_gib)"))
    out.append(_row("runtime reserve", fmt_bytes2(off.overhead_bytes), "Ollama minimum 457 MiB"))
    out.append(_row("total vs memory", f"{fmt_bytes2(off.total_bytes)}",
                    f"of {fmt_bytes2(off.memory_bytes)} -> {'fits' if off.fits else 'does not fit'}"))
    out.append(_row("headroom", fmt_bytes2(off.headroom_bytes)))
    out.append("what would fit")
    out.append(_row("largest num_gpu", f"{p.offload_max_layers}", f"of {off.layers + 1} (output + layers)"))
    if p.offload_max_layers_q8 is not None:
        out.append(_row("largest num_gpu with q8_0 KV", f"{p.offload_max_layers_q8}",
                        "llama.cpp has no fp8 KV: -ctk q8_0 -ctv q8_0 (needs flash attention)"))
    out.append(_row(f"largest num_ctx at num_gpu {off.num_gpu}", f"{p.offload_max_ctx:,} tokens",
                    f"per slot, {p.num_parallel} slots"))
    return out


# --------------------------------------------------------------------------------------------
# live comparison


def _label_int(labels: dict[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw in (None, "", "None", "none", "null"):
        return None
    return int(float(raw))


@dataclass(frozen=True)
class LiveElements:
    """The bytes of one KV element a live vLLM's pool implies, against the profile's
    (:func:`live_kv_elements`).

    ``reading``: :class:`kvgate.kv.arithmetic.KvElementReading` of the live pool, or None with
    ``why_not`` (one clause: no block count, pool size not known). ``pool_source``: where the
    pool's bytes came from (vLLM's own ``kv_cache_memory_bytes`` label, else the profile's exact
    pool). ``expected_bytes``/``expected_words``: the profile's element size (bytes) and its dtype
    in words (``"float32"``, ``"kv_cache_dtype fp8"``); ``elements_words``: how the elements per
    block were counted.
    """

    reading: km.KvElementReading | None
    pool_source: str
    why_not: str | None
    expected_bytes: float
    expected_words: str
    elements_words: str = ""

    @property
    def mismatch(self) -> bool:
        """True when the live pool names one element size and it is not the profile's."""
        return self.reading is not None and self.reading.size is not None and self.reading.size != self.expected_bytes

    def sentence(self) -> str:
        """``377,487,360 B (vllm:cache_config_info kv_cache_memory_bytes) / 128 blocks (num_gpu_blocks) =
        2,949,120 B per block = 2 B per KV element (128 tokens x 2 x 30 layers x 3 KV heads x 64 = 1,474,560
        elements)``, or why it was not read."""
        r = self.reading
        if r is None:
            return f"KV element size not read: {self.why_not}"
        head = (f"{r.pool_bytes:,} B ({self.pool_source}) / {r.num_blocks:,} blocks (num_gpu_blocks) = "
                f"{r.bytes_per_block_high:,.0f} B per block")
        if r.size is not None:
            return f"{head} = {r.size} B per KV element ({self.elements_words})"
        return (f"{head} = {r.bytes_per_element:.3f} B per KV element ({self.elements_words}): no whole element size "
                f"({', '.join(f'{s} B' for s in km.KV_ELEMENT_SIZES)}) gives {r.num_blocks:,} blocks")

    def cause(self) -> str | None:
        """The element-size cause (:func:`kvgate.kv.arithmetic.kv_element_cause`) on a mismatch, else None."""
        if not self.mismatch:
            return None
        assert self.reading is not None and self.reading.size is not None
        return km.kv_element_cause(self.reading.size, self.expected_bytes, self.expected_words)

    def to_dict(self) -> dict[str, Any]:
        return {"reading": self.reading.to_dict() if self.reading else None, "pool_source": self.pool_source,
                "why_not": self.why_not, "expected_bytes": self.expected_bytes,
                "expected_words": self.expected_words, "elements_words": self.elements_words}


def _expected_words(p: FitPlan) -> str:
    """The profile's KV dtype in words: ``float32`` (auto = the model dtype) or ``kv_cache_dtype fp8``."""
    label = p.kv_cache_dtype
    return label.split("= ", 1)[1] if label.startswith("auto = ") else f"kv_cache_dtype {label}"


def _elements_per_token_layer(p: FitPlan) -> int:
    """KV elements one token costs in one layer (``2 x kv_heads per GPU x head_dim``; MLA: the latent)."""
    return max(1, int(round(p.kv_bytes_per_token / p.layers / p.kv_dtype_bytes)))


def live_kv_elements(p: FitPlan, labels: dict[str, str]) -> LiveElements:
    """Read the KV element size from a live vLLM's ``vllm:cache_config_info`` ``labels`` with the
    profile's geometry (``p``, :func:`plan`): ``pool bytes / (num_gpu_blocks x elements per block)``,
    elements per block = the predicted block's bytes (the largest KV group's pages,
    :class:`kvgate.kv.arithmetic.KvLayout`) / the profile's element size, scaled to the live
    ``block_size``. The pool's bytes: the label ``kv_cache_memory_bytes`` when vLLM reports one,
    else the profile's exact pool (``engine.kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE``);
    an estimated pool (from ``gpu_memory_utilization``) is no measurement, so nothing is read then.
    Raises ``ValueError`` on labels that are not numbers."""
    expected, words = p.kv_dtype_bytes, _expected_words(p)
    pool, lay = p.pool, p.layout
    if pool is None or lay is None:
        return LiveElements(None, "", "no vLLM KV layout for this profile", expected, words)
    blocks = _label_int(labels, "num_gpu_blocks")
    live_block = _label_int(labels, "block_size") or pool.block_size
    reported = _label_int(labels, "kv_cache_memory_bytes")
    if reported:
        pool_bytes, source = reported, "vllm:cache_config_info kv_cache_memory_bytes"
    elif p.explicit_pool:
        pool_bytes, source = pool.pool_bytes, f"the profile's {p.pool_source.replace(' (exact)', '')}; vLLM reports none"
    else:
        return LiveElements(None, "", "the pool's size is an estimate (no kv_cache_memory_bytes set or reported), so "
                            "its bytes per block are not measured", expected, words)
    if not blocks:
        return LiveElements(None, source, "vLLM reports no num_gpu_blocks", expected, words)
    elements = int(round(lay.bytes_per_block / p.kv_dtype_bytes * live_block / pool.block_size))
    if not _grouped(p) and p.attention != "mla":
        described = (f"{live_block} tokens x 2 x {p.layers} layers x {p.kv_heads_per_gpu} KV heads x {p.head_dim} = "
                     f"{elements:,} elements")
    else:
        described = (f"{elements:,} elements per block: the largest KV group's {fmt_bytes2(lay.bytes_per_block)} at "
                     f"{p.kv_dtype_bytes:g} B" + (f", scaled to {live_block}-token blocks" if live_block != pool.block_size
                                                  else ""))
    return LiveElements(km.read_kv_element_bytes(pool_bytes, blocks, elements), source, None, expected, words, described)


def live_pool_verdict(profile: Profile, cache_config: dict[str, str], served_len: int | None = None,
                      served_source: str = "") -> Verdict:
    """:func:`_live_pool_verdict` at the length the server serves when the profile says
    ``engine.max_model_len: auto`` (``served_len`` read back from ``served_source``, e.g.
    ``/v1/models``; :func:`at_served_len`), else at the profile's."""
    profile, words = at_served_len(profile, served_len, served_source)
    return _noted(_live_pool_verdict(profile, cache_config), words, served_len)


def _live_pool_verdict(profile: Profile, cache_config: dict[str, str]) -> Verdict:
    """Compare the predicted KV capacity with what a live vLLM allocated (gate ``"fit.live"``).

    ``cache_config`` are the labels of ``vllm:cache_config_info`` (vLLM 0.32 publishes every
    ``CacheConfig`` field there, including ``num_gpu_blocks``, ``kv_cache_size_tokens`` and
    ``kv_cache_max_concurrency``, set by ``v1/core/kv_cache_utils.py::update_kv_cache_capacity``).
    The comparison is in tokens as vLLM counts them: ``kv_cache_size_tokens`` against the
    predicted ``int(num_blocks / blocks_per_request * max_model_len)`` (summed over KV groups);
    without it, ``num_gpu_blocks`` turned into tokens the same way (for one full-attention group
    that is ``num_gpu_blocks x block_size``). PASS when they agree within one block's worth of
    tokens (``max_model_len / blocks_per_request``).

    Tokens that agree are never a FAIL: when ``kv_cache_max_concurrency`` differs anyway, the
    server's ``max_model_len`` is not the profile's (``kv_cache_max_concurrency =
    kv_cache_size_tokens / max_model_len``); the message names it (``evidence
    ["served_max_model_len"]``) and leaves the verdict on it to ``deployment/max-model-len``.

    A difference is explained from the numbers: a block count that differs is read as a KV
    element size (:func:`live_kv_elements`: pool bytes / blocks / elements per block; a whole size
    other than the profile's is the ``cause``, e.g. 2-byte elements under a float32 profile), or,
    when no element size fits, the layer groupings and block sizes the numbers allow; blocks per
    request that differ name the window / in-flight / hybrid-manager terms. When the prediction is
    an estimate (no explicit pool) a larger gap only fails if the live pool no longer holds the
    declared long concurrency at ``max_model_len``. The message gives the difference in tokens and %.
    """
    gate = "fit.live"
    try:
        p = plan(profile)
    except KvMathError as exc:
        return Verdict(gate, Status.INVALID, f"no prediction to compare: {exc}")
    if p.pool is None:
        return Verdict(gate, Status.SKIP, "live KV capacity comparison applies to vLLM only")
    try:
        live_block = _label_int(cache_config, "block_size")
        live_blocks = _label_int(cache_config, "num_gpu_blocks")
        live_size = _label_int(cache_config, "kv_cache_size_tokens")
        raw_conc = cache_config.get("kv_cache_max_concurrency")
        live_conc = float(raw_conc) if raw_conc not in (None, "", "None", "none", "null") else None
        elements = live_kv_elements(p, cache_config)
    except (ValueError, KvMathError) as exc:
        return Verdict(gate, Status.INVALID, f"vllm:cache_config_info labels not numeric: {exc}",
                       evidence={"labels": dict(cache_config)})
    pool = p.pool
    L = p.max_model_len
    per_req = pool.blocks_per_sequence
    block = live_block or pool.block_size
    grouped = _grouped(p)
    if live_size is not None:
        live_tokens, predicted, basis = live_size, pool.vllm_kv_cache_size_tokens, "kv_cache_size_tokens"
    elif live_blocks is not None and not grouped:
        live_tokens, predicted, basis = live_blocks * block, pool.tokens, "num_gpu_blocks x block_size"
    elif live_blocks is not None:
        live_tokens, predicted = int(live_blocks / per_req * L), pool.vllm_kv_cache_size_tokens
        basis = f"num_gpu_blocks / {per_req} blocks per request x {L:,}"
    else:
        return Verdict(gate, Status.INVALID,
                       "vllm:cache_config_info has neither num_gpu_blocks nor kv_cache_size_tokens",
                       evidence={"labels": dict(cache_config)})
    diff = live_tokens - predicted
    pct = 100.0 * diff / predicted if predicted else float("inf")
    one_block = block if basis == "num_gpu_blocks x block_size" else -(-L // per_req) + 1
    within = abs(diff) <= one_block
    evidence = {"labels": dict(cache_config), "predicted_tokens": predicted, "live_tokens": live_tokens,
                "basis": basis, "difference_tokens": diff, "block_size_live": live_block,
                "block_size_predicted": pool.block_size, "exact_prediction": p.explicit_pool,
                "predicted_num_blocks": pool.num_blocks, "live_num_blocks": live_blocks,
                "predicted_blocks_per_request": per_req,
                "predicted_max_concurrency": round(pool.vllm_max_concurrency, 4), "live_max_concurrency": live_conc,
                "kv_elements": elements.to_dict()}
    if p.layout is not None:
        evidence["groups"] = [{"kind": g.kind, "window": g.window, "layers": g.layers, "block_size": g.block_size,
                               "blocks_per_request": g.blocks_per_request} for g in p.layout.groups]
    conc = f", {live_conc:.2f}x" if live_conc is not None else ""
    head = (f"vLLM reports {live_tokens:,} tokens ({basis}{conc}); predicted {predicted:,} "
            f"({pool.vllm_max_concurrency:.2f}x); difference {diff:+,} tokens ({pct:+.1f}%)")
    if grouped and p.layout is not None:
        head += (f"; {len(p.layout.groups)} KV groups, {per_req} blocks per request ("
                 + " + ".join(f"{g.blocks_per_request} {g.kind}" for g in p.layout.groups) + ")")
    if live_block is not None and live_block != pool.block_size:
        head += f"; live block_size {live_block} != predicted {pool.block_size}"
    conc_off = live_conc is not None and abs(live_conc - pool.vllm_max_concurrency) * per_req > 1 + 1e-9
    if within and conc_off:
        assert live_conc is not None
        return _concurrency_only(gate, head, one_block, live_tokens, predicted, live_conc, p, evidence)
    if within:
        return Verdict(gate, Status.PASS, f"{head}, within one block ({one_block:,} tokens) -> PASS",
                       measured=live_tokens, limit=predicted, unit="tokens", evidence=evidence)
    why, cause = _explain_live(p, live_blocks, live_size, live_block, elements)
    if why:
        head += f"; {why}"
    if p.explicit_pool:
        return Verdict(gate, Status.FAIL,
                       f"{head}: more than one block ({one_block:,} tokens) off an exact prediction -> FAIL",
                       measured=live_tokens, limit=predicted, unit="tokens", evidence=evidence, cause=cause)
    if live_blocks is not None:
        live_at_once = max(0, live_blocks - 1) // (per_req if grouped or live_block is None else
                                                   km.blocks_for_tokens(L, block))
    else:
        live_at_once = int(live_tokens // L)
    need = p.workloads.long_concurrency
    ok = live_at_once >= need
    tail = (f"; the estimate is off by more than one block, and the live pool holds {live_at_once:,} "
            f"{_seq_word(live_at_once)} of {L:,} at once"
            + (f", profile declares {need}" if need else "") + f" -> {_pf(ok).value}")
    cause = None if ok else cause
    if need:
        return Verdict(gate, _pf(ok), head + tail, measured=live_at_once, limit=need, unit="sequences",
                       evidence={**evidence, "sequence_tokens": L}, cause=cause)
    return Verdict(gate, _pf(ok), head + tail, measured=live_tokens, limit=predicted, unit="tokens",
                   evidence={**evidence, "limit_is": "estimate"}, cause=cause)


def _concurrency_only(gate: str, head: str, one_block: int, live_tokens: int, predicted: int, live_conc: float,
                      p: FitPlan, evidence: dict[str, Any]) -> Verdict:
    """Tokens within one block, ``kv_cache_max_concurrency`` not: the pool is the predicted one
    (PASS: a 0-token difference is never a FAIL); vLLM computes ``kv_cache_max_concurrency =
    kv_cache_size_tokens / max_model_len``, so the concurrency names the server's ``max_model_len``,
    which ``deployment/max-model-len`` judges (``/v1/models``, ``/tokenize``)."""
    assert p.pool is not None
    served_len = int(round(live_tokens / live_conc)) if live_conc > 0 else None
    evidence = {**evidence, "served_max_model_len": served_len, "served_max_model_len_is":
                "kv_cache_size_tokens / kv_cache_max_concurrency"}
    if served_len is not None and abs(served_len - p.max_model_len) > one_block:
        why = (f"the concurrency differs ({live_conc:.2f}x vs {p.pool.vllm_max_concurrency:.2f}x predicted) because the "
               f"server's max_model_len is ~{served_len:,} tokens ({live_tokens:,} tokens / {live_conc:.2f}x: vLLM's "
               f"kv_cache_max_concurrency = kv_cache_size_tokens / max_model_len), not the profile's "
               f"{p.max_model_len:,}: deployment/max-model-len judges the length")
    else:
        why = (f"the concurrency differs ({live_conc:.2f}x vs {p.pool.vllm_max_concurrency:.2f}x predicted) although "
               f"{live_tokens:,} tokens / {live_conc:.2f}x is the profile's max_model_len {p.max_model_len:,}: vLLM's "
               "own labels disagree with each other")
    return Verdict(gate, Status.PASS, f"{head}: the pool agrees within one block ({one_block:,} tokens); {why} -> PASS",
                   measured=live_tokens, limit=predicted, unit="tokens", evidence=evidence)


def _explain_live(p: FitPlan, live_blocks: int | None, live_size: int | None, live_block: int | None,
                  elements: LiveElements) -> tuple[str, str | None]:
    """``(words, cause)``: where a live/predicted difference comes from, from the numbers -- the
    block count (read as a KV element size, :func:`live_kv_elements`; else the groupings and block
    sizes the bytes per block allow) or the blocks each request is charged (groups, windows,
    in-flight tokens). ``cause`` is None when nothing measured points at one."""
    pool, lay = p.pool, p.layout
    assert pool is not None
    parts: list[str] = []
    causes: list[str] = []
    if live_blocks is not None and live_blocks != pool.num_blocks:
        said = f"vLLM has {live_blocks:,} blocks, predicted {pool.num_blocks:,}"
        r = elements.reading
        if r is None:
            parts.append(f"{said} ({elements.why_not}: a different pool size, KV element size or layer grouping "
                         "cannot be told apart)")
            causes.append(f"the block count differs and the evidence cannot tell a different pool size from a "
                          f"different KV element size or layer grouping ({elements.why_not})")
        elif r.size is not None and r.size != elements.expected_bytes:
            parts.append(f"{said}: {elements.sentence()}, predicted {elements.expected_bytes:g} B "
                         f"({elements.expected_words})")
            causes.append(elements.cause() or "")
        elif r.size is not None:
            words = f"{said}: {elements.sentence()}, the profile's size"
            if r.pool_bytes != pool.pool_bytes:
                words += f"; the pool differs: {r.pool_bytes:,} B live vs {pool.pool_bytes:,} B predicted"
                causes.append(f"the KV pool differs: vLLM reports {r.pool_bytes:,} B, the profile's pool is "
                              f"{pool.pool_bytes:,} B ({p.pool_source})")
            elif live_block is not None and live_block != pool.block_size:
                causes.append(f"the block size differs: vLLM runs {live_block}-token blocks, the profile "
                              f"{pool.block_size} ({p.block_size_source})")
            parts.append(words)
        else:
            alts = km.kv_block_alternatives(r, live_block or pool.block_size, p.layers, _elements_per_token_layer(p))
            allow = "; ".join(alts) if alts else "no whole layer count or power-of-two block size either"
            parts.append(f"{said}: {elements.sentence()}; the numbers allow: {allow}")
            causes.append("no KV element size fits the live block count; " + (
                f"the numbers allow {'; '.join(alts)} -- the evidence cannot tell these apart" if alts else
                "nor does a whole number of layers or a power-of-two block size: the layout is not one kvgate models"))
    if live_blocks and live_size:
        live_per_req = round(live_blocks * p.max_model_len / live_size) if live_size else 0
        if live_per_req != pool.blocks_per_sequence:
            groups = (" = " + " + ".join(f"{g.blocks_per_request} ({g.describe()})" for g in lay.groups)) if lay else ""
            parts.append(f"vLLM charges ~{live_per_req} blocks per {p.max_model_len:,}-token request, predicted "
                         f"{pool.blocks_per_sequence}{groups} (window, in-flight tokens "
                         f"{p.in_flight_tokens:,} or hybrid manager differ)")
            causes.append(f"vLLM charges ~{live_per_req} blocks per request, predicted {pool.blocks_per_sequence}: "
                          "the evidence cannot tell a different window, in-flight token count or hybrid-manager "
                          "setting apart")
    return "; ".join(parts), "; ".join(c for c in causes if c) or None
