"""kvmath with hand-checked numbers (Llama-3.3-70B: 80 layers, 64 heads, 8 KV heads, head_dim 128)."""

import pytest

from kvgate.kv import arithmetic as km
from kvgate.kv.arithmetic import GiB, MiB, KvMathError

L70 = dict(layers=80, kv_heads=8, head_dim=128)


def test_llama70b_bf16_bytes_per_token():
    # 2 (K,V) x 80 x 8 x 128 x 2 B
    assert km.kv_bytes_per_token(**L70, kv_dtype_bytes=2) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_llama70b_32k_sequence():
    per_token = km.kv_bytes_per_token(**L70, kv_dtype_bytes=2)
    assert km.sequence_kv_bytes(32_768, per_token) == 10_737_418_240 == 10 * GiB
    # a whole number of 16-token blocks: rounding changes nothing
    assert km.sequence_kv_bytes(32_768, per_token, block_size=16) == 10_737_418_240


def test_tp4_per_gpu():
    assert km.kv_bytes_per_token(**L70, kv_dtype_bytes=2, tensor_parallel_size=4) == 81_920
    assert km.kv_heads_per_gpu(8, 4) == 2


def test_fp8_halves_both():
    assert km.vllm_kv_dtype_bytes("fp8", "bfloat16") == 1
    assert km.vllm_kv_dtype_bytes("fp8_e5m2", "bfloat16") == 1
    assert km.kv_bytes_per_token(**L70, kv_dtype_bytes=1) == 163_840
    assert km.kv_bytes_per_token(**L70, kv_dtype_bytes=1, tensor_parallel_size=4) == 40_960
    assert km.sequence_kv_bytes(32_768, 163_840) == 5 * GiB


def test_auto_kv_dtype_is_model_dtype():
    assert km.vllm_kv_dtype_bytes("auto", "bfloat16") == 2
    assert km.vllm_kv_dtype_bytes("auto", "float32") == 4
    with pytest.raises(KvMathError):
        km.vllm_kv_dtype_bytes("nvfp4", "bfloat16")


@pytest.mark.parametrize("tp, heads", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_kv_heads_replicated_when_tp_exceeds_them(tp, heads):
    assert km.kv_heads_per_gpu(8, tp) == heads
    # beyond TP=8 the per-GPU KV stops shrinking: each GPU keeps (a copy of) one head
    assert km.kv_bytes_per_token(**L70, kv_dtype_bytes=2, tensor_parallel_size=tp) == 2 * 80 * heads * 128 * 2


def test_mla_not_supported():
    with pytest.raises(KvMathError, match="MLA"):
        km.kv_bytes_per_token(61, 128, 128, 2, attention="mla")


def test_pool_rounds_down_to_whole_blocks():
    # tiny-cpu: 2,048 B/token, block 128 -> 262,144 B/block; 64 MiB = 256 blocks exactly
    pool = km.kv_pool(64 * MiB, 2048, 128, 2048)
    assert (pool.num_blocks, pool.tokens, pool.blocks_per_sequence) == (256, 32_768, 16)
    assert pool.vllm_kv_cache_size_tokens == 32_768 and pool.vllm_max_concurrency == 16.0
    assert pool.sequences_at_once == 15  # 255 usable blocks: one is vLLM's null block
    # one byte short of 256 blocks -> 255 blocks, not 255.99
    assert km.kv_pool(64 * MiB - 1, 2048, 128, 2048).num_blocks == 255
    # negative budget -> empty pool
    assert km.kv_pool(-5, 2048, 128, 2048).num_blocks == 0


def test_sequence_rounds_up_to_whole_blocks():
    assert km.blocks_for_tokens(2000, 128) == 16
    assert km.blocks_for_tokens(2049, 128) == 17
    assert km.sequence_kv_bytes(1, 2048, block_size=128) == 128 * 2048
    pool = km.kv_pool(8 * MiB, 2048, 128, 2000)  # 32 blocks
    assert pool.blocks_per_sequence == 16
    # vLLM's own formula: int(32 / 16 * 2000)
    assert pool.vllm_kv_cache_size_tokens == 4000 and pool.tokens == 4096


def test_overcommitted_pool():
    pool = km.kv_pool(8 * MiB, 2048, 128, 2048)
    assert (pool.num_blocks, pool.tokens) == (32, 4096)
    assert pool.num_blocks // pool.blocks_per_sequence == 2  # vLLM's "2.00x"
    assert pool.sequences_at_once == 1


def test_gpu_budget_terms():
    b = km.gpu_budget(48 * GiB, 0.9, 33 * GiB, 1 * GiB, GiB // 2, GiB // 2, {"weights": "x"})
    assert b.requested_bytes == int(48 * GiB * 0.9)
    assert b.kv_budget_bytes == b.requested_bytes - 35 * GiB
    assert b.reserved_bytes == 35 * GiB
    assert b.headroom_bytes == 48 * GiB - b.requested_bytes
    neg = km.gpu_budget(24 * GiB, 0.9, 33 * GiB, 0, 0, 0)
    assert neg.kv_budget_bytes < 0


def test_activation_peak_scales_with_batched_tokens():
    args = dict(max_num_seqs=0, hidden_size=8192, intermediate_size=28672, attention_heads=64, kv_heads=8,
                head_dim=128, vocab_size=128256, tensor_parallel_size=4)
    a1 = km.activation_peak_bytes(max_num_batched_tokens=2048, **args)
    a4 = km.activation_peak_bytes(max_num_batched_tokens=8192, **args)
    assert a4 == 4 * a1
    # hand-checked: 8192 x (3 x 7168 + 4 x 8192 + (64 + 16) x 128 / 4) x 2 B
    assert a4 == 8192 * (21504 + 32768 + 2560) * 2


def test_estimate_params_llama70b():
    p = km.estimate_params(80, 8192, 64, 8, 128, 28672, 128256)
    assert 70.4e9 < p < 70.7e9


def test_vllm_defaults():
    assert km.vllm_defaults(True, None).block_size == km.CPU_DEFAULT_BLOCK_SIZE == 128
    assert km.vllm_defaults(True, None).max_num_seqs == 128
    d48 = km.vllm_defaults(False, 48 * GiB, "RTX 6000")
    assert (d48.max_num_seqs, d48.max_num_batched_tokens, d48.block_size) == (256, 2048, 16)
    assert km.vllm_defaults(False, 80 * GiB, "NVIDIA H100").max_num_seqs == 1024
    assert km.vllm_defaults(False, 80 * GiB, "NVIDIA A100-SXM4-80GB").max_num_seqs == 256
    assert km.vllm_defaults(False, 180 * GiB, "B200").max_num_batched_tokens == 16384


def test_what_would_fit():
    pool = km.kv_pool(8 * MiB, 2048, 128, 2048)  # 31 usable blocks
    w = km.what_would_fit(pool, 8, fp8_kv_bytes_per_token=512)
    assert w.max_model_len_for_concurrency == (31 // 8) * 128 == 384
    assert w.max_concurrency_at_len == 1
    assert w.fp8_tokens == 16_384 and w.fp8_max_concurrency_at_len == 7  # 127 usable // 16
    assert w.fp8_max_model_len_for_concurrency == (127 // 8) * 128
    assert km.what_would_fit(pool, 2, fp8_kv_bytes_per_token=None).fp8_tokens is None


def test_min_gpu_memory_utilization():
    b = km.gpu_budget(40 * GiB, 0.5, 10 * GiB, 0, 0, 0)
    assert km.min_gpu_memory_utilization(b, 10 * GiB) == 0.5


# --- llama.cpp offload ------------------------------------------------------------------------


def test_ollama_graph_size_hand_checked():
    # llama 70B, batch 512, context 8192: partial = 4*512*8192 + max(A, B)
    a = 4 * 512 * (1 + 8192 + 8192) + 8192 * 8192 * 9 // 16 + 4 * 8192 * (512 * 64 + 128 * 8)
    b = 4 * 512 * (8192 + 128256) + 8192 * 128256 * 105 // 128
    assert km.ollama_graph_bytes(512, 8192, 8192, 64, 8, 128, 128256, False) == 4 * 512 * 8192 + max(a, b)
    full = max(4 * 512 * (1 + 4 * 8192 + 8192 * 65), 4 * 512 * (8192 + 128256))
    assert km.ollama_graph_bytes(512, 8192, 8192, 64, 8, 128, 128256, True) == full


def _offload_args(**over):
    args = dict(layers=80, layer_weight_bytes=500 * MiB, output_weight_bytes=600 * MiB,
                kv_bytes_per_layer_token=4096, kv_tokens=32_768, memory_bytes=48 * GiB,
                compute_buffer_partial_bytes=4 * GiB, compute_buffer_full_bytes=4 * GiB, overhead_bytes=457 * MiB)
    args.update(over)
    return args


def test_offload_layer_accounting():
    p = km.offload_plan(num_gpu=60, **_offload_args())
    assert p.repeating_on_gpu == 59 and p.output_on_gpu  # -ngl counts the output layer
    assert p.weights_gpu_bytes == 59 * 500 * MiB + 600 * MiB
    assert p.kv_gpu_bytes == 59 * 4096 * 32_768  # 128 MiB per layer
    assert p.total_bytes == p.weights_gpu_bytes + p.kv_gpu_bytes + 4 * GiB + 457 * MiB
    assert km.offload_plan(num_gpu=0, **_offload_args()).total_bytes == 0
    assert km.offload_plan(num_gpu=200, **_offload_args()).num_gpu == 81


def test_max_gpu_layers_hand_checked():
    # each repeating layer costs 500 MiB + 128 MiB; fixed: output 600 MiB + compute 4 GiB + 457 MiB
    fixed = 600 * MiB + 4 * GiB + 457 * MiB
    expected_repeating = (48 * GiB - fixed) // (628 * MiB)
    assert km.max_gpu_layers(**_offload_args()) == expected_repeating + 1 == 71
    assert not km.offload_plan(num_gpu=80, **_offload_args()).fits
    assert km.offload_plan(num_gpu=60, **_offload_args()).fits


def test_llamacpp_kv_types():
    assert km.llamacpp_kv_dtype_bytes("auto") == 2
    assert km.llamacpp_kv_dtype_bytes("q8_0") == 34 / 32
    with pytest.raises(KvMathError):
        km.llamacpp_kv_dtype_bytes("fp8")


def test_dtype_bytes():
    assert km.dtype_bytes("bfloat16") == 2
    assert km.dtype_bytes("q4_k_m") == pytest.approx(4.89 / 8)
    with pytest.raises(KvMathError, match="weights_gib"):
        km.dtype_bytes("mystery")


# --- the KV element size read back from a live pool (SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64) --------

SMOL_BLOCK_ELEMENTS = 128 * 2 * 30 * 3 * 64  # 1,474,560 KV elements in one 128-token block
SMOL_POOL = 377_487_360  # 360 MiB


def test_kv_element_size_from_the_live_block_count():
    # float32: 5,898,240 B a block -> 64 blocks; bfloat16: 2,949,120 B -> 128 blocks; fp8: 256
    for blocks, size in ((64, 4), (128, 2), (256, 1)):
        r = km.read_kv_element_bytes(SMOL_POOL, blocks, SMOL_BLOCK_ELEMENTS)
        assert r.sizes == (size,) and r.size == size and r.bytes_per_element == size
        assert r.bytes_per_block_high == SMOL_POOL / blocks and r.bytes_per_block_low == SMOL_POOL / (blocks + 1)
    # a pool with a remainder under one block still reads whole: floor(pool / (2 x E)) == 128
    r = km.read_kv_element_bytes(SMOL_POOL + 1_000_000, 128, SMOL_BLOCK_ELEMENTS)
    assert r.size == 2 and 2 < r.bytes_per_element < 2.01


def test_kv_element_size_that_fits_no_dtype_lists_what_the_numbers_allow():
    r = km.read_kv_element_bytes(SMOL_POOL, 130, SMOL_BLOCK_ELEMENTS)  # 1.969 B per element
    assert r.sizes == () and r.size is None
    assert km.kv_block_alternatives(r, 128, 30, 2 * 3 * 64) == []
    # 32 blocks: 11,796,480 B each = 4 B x 256-token blocks, 2 B x 512, 1 B x 1024 of all 30 layers
    r = km.read_kv_element_bytes(SMOL_POOL, 32, SMOL_BLOCK_ELEMENTS)
    assert r.size is None
    assert km.kv_block_alternatives(r, 128, 30, 2 * 3 * 64) == [
        "256-token blocks of all 30 layers at 4 B/element (11,796,480 B)",
        "512-token blocks of all 30 layers at 2 B/element (11,796,480 B)",
        "1024-token blocks of all 30 layers at 1 B/element (11,796,480 B)"]
    # 128 blocks under a 2-layer grouping: 15 of 30 layers' float32 pages a block (2,949,120 B) also fit
    r = km.read_kv_element_bytes(SMOL_POOL, 128, SMOL_BLOCK_ELEMENTS)
    assert "15 of 30 layers' 128-token pages per block at 4 B/element (2,949,120 B)" in \
        km.kv_block_alternatives(r, 128, 30, 2 * 3 * 64)
    with pytest.raises(KvMathError):
        km.read_kv_element_bytes(SMOL_POOL, 0, SMOL_BLOCK_ELEMENTS)


def test_kv_element_cause_names_both_sides():
    assert km.kv_element_cause(2, 4, "float32") == ("2-byte KV elements: the server runs bfloat16/float16 (or a 2-byte "
                                                     "--kv-cache-dtype), the profile says float32 (4 B)")
    assert km.kv_element_cause(4, 2, "bfloat16").startswith("4-byte KV elements: the server runs float32,")
    assert "fp8" in km.kv_element_cause(1, 2, "bfloat16")


@pytest.mark.parametrize("name, weights, close", [
    ("float33", True, "float32"), ("bflaot16", True, "bfloat16"), ("bfloat16", True, None), ("Q4_K_M", True, None),
    ("torch.float16", True, None), ("nvfp4", True, None),  # a format kvgate does not model: not a typo
    ("bfloat61", False, "bfloat16"), ("auto", False, None), ("q4_k_m", False, None), (None, False, None),
])
def test_a_misspelt_dtype_is_named_an_unmodelled_one_is_not(name, weights, close):
    assert km.misspelt_dtype(name, weights=weights) == close
