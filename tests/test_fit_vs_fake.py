"""fit/live-pool and deployment/served-config against the fake (issue 38): a server that caches 2-byte KV
elements under a float32 profile -- the ``kv_dtype_halved`` fault: twice the blocks for the same pool bytes --
FAILs both, each naming the dtype as the cause; the healthy fake PASSes both. The real suites run through
pytester with ``--endpoint``; verdicts are read back from reports/summary.json."""

from __future__ import annotations

import pytest

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .test_gates_vs_fake import PROFILE, run_suites

pytest_plugins = ["pytester"]
SUITES = ["suites/test_fit.py", "suites/test_deployment.py"]
#: The fake's 64 blocks of 16 tokens in float32: 2 layers x 2 KV heads x 64 x 2 x 4 B = 2,048 B a token,
#: 32,768 B a block, 2 MiB in all.
POOL = 64 * 16 * 2048
DTYPE_CAUSE = ("2-byte KV elements: the server runs bfloat16/float16 (or a 2-byte --kv-cache-dtype), the profile "
               "says float32 (4 B)")


@pytest.fixture
def profile(tmp_path):
    """The fake's profile at float32 with its pool stated exactly (as smollm2-cpu states its 360 MiB)."""
    path = tmp_path / "fake-f32.yaml"
    path.write_text(f"extends: {PROFILE}\nmodel:\n  dtype: float32\n  weights_gib: 0.001\n"
                    f"engine:\n  kv_cache_memory_bytes: {POOL}\n  max_num_seqs: 16\n"
                    "  override_generation_config: {max_new_tokens: 64}\n")
    return path


def fake_config(**kw) -> FakeConfig:
    return FakeConfig(max_tokens_cap=64, kv_cache_memory_bytes=POOL, dtype="float32", **kw)


def test_healthy_fake_passes_live_pool_and_served_config(pytester, profile):
    with FakeVLLM(fake_config(server_info=True)) as fake:
        _, summary, gates = run_suites(pytester, fake.url, suites=SUITES, profile=profile)
    live, served = gates["fake-f32/fit/live-pool"], gates["fake-f32/deployment/served-config"]
    assert live["status"] == "PASS" and "difference +0 tokens (+0.0%), within one block" in live["message"], live
    assert live["evidence"]["kv_elements"]["reading"]["size"] == 4
    assert served["status"] == "PASS", served["message"]
    # measured, not assumed: every field it PASSes on was shown by a source
    checks = {c["gate"]: c["status"] for c in served["checks"]}
    assert [g for g, s in checks.items() if s == "PASS"] == [
        "served-config.dtype", "served-config.kv_cache_dtype", "served-config.kv_element_bytes",
        "served-config.max_model_len", "served-config.block_size", "served-config.override_generation_config"]
    assert "dtype float32 per /server_info" in served["message"]
    assert "KV element size 4 B per vllm:cache_config_info" in served["message"]
    assert "max_model_len 256 per /server_info, /v1/models, /tokenize, vllm:cache_config_info kv_cache_size_tokens " \
        "1,024 / kv_cache_max_concurrency 4" in served["message"]
    assert served["evidence"]["rendering"]["token_strs"][:3] == ["<s>", "<|system|>", "You"]
    assert "cause" not in served and summary["overall"] == "PASS"


def test_kv_dtype_halved_fails_live_pool_and_served_config_naming_the_dtype(pytester, profile):
    with FakeVLLM(fake_config(faults={"kv_dtype_halved"})) as fake:
        _, summary, gates = run_suites(pytester, fake.url, suites=SUITES, profile=profile)
    live, served = gates["fake-f32/fit/live-pool"], gates["fake-f32/deployment/served-config"]
    assert live["status"] == "FAIL", live["message"]
    assert ("vLLM has 128 blocks, predicted 64: 2,097,152 B (vllm:cache_config_info kv_cache_memory_bytes) / 128 "
            "blocks (num_gpu_blocks) = 16,384 B per block = 2 B per KV element (16 tokens x 2 x 2 layers x 2 KV "
            "heads x 64 = 8,192 elements), predicted 4 B (float32)") in live["message"]
    assert live["measured"] == {"value": 2048, "unit": "tokens"} and live["limit"] == {"value": 1024, "unit": "tokens"}
    assert live["cause"] == DTYPE_CAUSE
    assert served["status"] == "FAIL", served["message"]
    assert ("KV elements are 2 bytes (2,097,152 B (vllm:cache_config_info kv_cache_memory_bytes) / 128 blocks "
            "(num_gpu_blocks) = 16,384 B per block = 2 B per KV element (16 tokens x 2 x 2 layers x 2 KV heads x 64 = "
            "8,192 elements)): not float32 (4 B, engine.kv_cache_dtype auto = float32) -> FAIL") in served["message"]
    assert served["cause"] == DTYPE_CAUSE
    # what let the defect through before: the cache settings the profile states all match
    assert gates["fake-f32/deployment/cache-config"]["status"] == "PASS"
    assert summary["overall"] == "FAIL"


def test_served_config_names_the_dtype_from_server_info_too(pytester, profile):
    # VLLM_SERVER_DEV_MODE=1: /server_info says bfloat16 outright
    cfg = FakeConfig(max_tokens_cap=64, kv_cache_memory_bytes=POOL, dtype="bfloat16", server_info=True,
                     faults={"kv_dtype_halved"})
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, "-k", "served_config", suites=["suites/test_deployment.py"],
                                 profile=profile)
    served = gates["fake-f32/deployment/served-config"]
    assert served["status"] == "FAIL", served["message"]
    assert "dtype: torch.bfloat16 (/server_info), profile model.dtype (engine.dtype unset) float32" in served["message"]
    # both deciding parts' causes, folded: the dtype /server_info shows, and the KV element size it means
    assert served["cause"] == f"the server's dtype is torch.bfloat16 (/server_info), the profile says float32; {DTYPE_CAUSE}"
    assert "in 2 of 6 compared fields" in served["message"]


def test_served_config_skips_when_nothing_it_states_is_visible(pytester):
    # llama-cpp-python's server: no /metrics, no /tokenize, no /server_info, no max_model_len on its card
    with FakeVLLM(FakeConfig(max_tokens_cap=64, server="llama-cpp-python")) as fake:
        _, _, gates = run_suites(pytester, fake.url, "-k", "served_config", suites=["suites/test_deployment.py"])
    served = gates["fake-vllm/deployment/served-config"]
    assert served["status"] == "SKIP", served["message"]
    assert served["message"].startswith("nothing the profile states is visible on this server; not visible: dtype, "
                                        "KV cache dtype, KV element size, max_model_len"), served["message"]
