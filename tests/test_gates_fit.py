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
