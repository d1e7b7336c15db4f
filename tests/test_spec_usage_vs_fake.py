"""max-tokens/speculative-usage: under speculative decoding, the tokens delivered == usage.completion_tokens
<= max_tokens, and vllm:generation_tokens_total moved by the tokens delivered (sglang#39826). Proven both ways
on the fake (tests/fakes/fake_vllm.py: num_speculative_tokens, faults spec_usage_drafts / spec_counter_drafts /
ignore_max_tokens); the suite's wiring (SKIP without engine.speculative_config, PASS and FAIL with it) through
pytester; the launchers render the field as vLLM's --speculative-config."""

from __future__ import annotations

import json

import pytest

from kvgate.gates.max_tokens import speculative_usage_verdict
from kvgate.http.client import Endpoint, KvClient
from kvgate.http.usage import SpecUsageObservation, counters, observe_spec_usage
from kvgate.launch.local import render_command
from kvgate.profile.models import Profile
from kvgate.verdict import Status
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured, read_summary

pytest_plugins = ["pytester"]
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
N = 22  # tokens a probe asks for


class Clock:
    """Injected time: sleep advances it, nothing waits."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def observe(cfg: FakeConfig) -> tuple[SpecUsageObservation, Clock]:
    clock = Clock()
    with FakeVLLM(cfg) as fake:
        with KvClient(Endpoint(fake.base_url)) as client:
            return observe_spec_usage(client, cfg.served_name, max_tokens=N, clock=clock, sleep=clock.sleep), clock


def test_healthy_speculation_passes_with_every_count_agreeing():
    obs, clock = observe(FakeConfig(num_speculative_tokens=3))
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.PASS, v.message
    assert [(d.label, d.delivered, d.usage_tokens, d.counted_by) for d in obs.deliveries] == [
        ("completions", N, N, "logprobs"), ("completions-stream", N, N, "logprobs"),
        ("chat", N, N, "logprobs"), ("chat-stream", N, N, "logprobs")]
    assert "(ngram, 3 speculative tokens) 4 requests" in v.message and "(88 tokens, by logprobs)" in v.message
    assert "vllm:generation_tokens_total +88 == delivered" in v.message
    # 11 two-token steps a request: 44 drafts, 132 draft tokens, 44 accepted
    assert "44 drafts, 44 of 132 draft tokens accepted (33%)" in v.message
    assert (v.measured, v.limit) == (88, 88) and obs.settle_scrapes == 0 and clock.slept == []


def test_usage_billing_rejected_drafts_fails_naming_delivered_usage_and_max_tokens():
    obs, _ = observe(FakeConfig(num_speculative_tokens=3, faults={"spec_usage_drafts"}))
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.FAIL
    # 22 delivered in 11 steps, each billed 2 more rejected drafts: 44
    assert "4 of 4 requests disagree" in v.message
    assert "chat-stream: delivered 22 (by logprobs), usage.completion_tokens 44, max_tokens 22" in v.message
    assert v.message.endswith("-> FAIL (usage counts drafted tokens the verifier rejected (billed, never delivered))")
    assert (v.measured, v.limit) == (44, 22) and v.evidence["requests"][0]["usage_completion_tokens"] == 44


def test_delivering_past_max_tokens_fails_naming_the_overshoot():
    obs, _ = observe(FakeConfig(num_speculative_tokens=3, faults={"ignore_max_tokens"}, ignore_max_tokens_extra=3))
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.FAIL
    assert "completions: delivered 25 (by logprobs), usage.completion_tokens 25, max_tokens 22" in v.message
    assert "(a verify step's accepted drafts delivered past max_tokens)" in v.message
    assert (v.measured, v.limit) == (25, 22)


def test_a_generation_counter_counting_drafts_fails_naming_counter_and_delivered():
    obs, _ = observe(FakeConfig(num_speculative_tokens=3, faults={"spec_counter_drafts"}))
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.FAIL
    assert ("vllm:generation_tokens_total moved by 176 over 4 idle-bracketed requests that delivered 88 tokens "
            "(usage 88) -> FAIL (the engine counts drafted tokens as generated)") in v.message
    assert (v.measured, v.limit) == (176, 88)


def test_no_draft_proposed_is_invalid_and_no_spec_series_passes_saying_so():
    obs, _ = observe(FakeConfig(num_speculative_tokens=3))
    obs.after = {**obs.after, "drafts": obs.before["drafts"]}  # the draft counter never moved
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.INVALID and "no draft was proposed" in v.message and v.measured == 0
    plain, _ = observe(FakeConfig())  # no vllm:spec_decode_* series at all
    v = speculative_usage_verdict(plain, SPEC)
    assert v.status == Status.PASS and "drafts not observable (no vllm:spec_decode_* series)" in v.message


def test_other_traffic_leaves_the_counter_unjudged_and_a_missing_profile_field_skips():
    obs, _ = observe(FakeConfig(num_speculative_tokens=3, faults={"spec_counter_drafts"}))
    obs.after = {**obs.after, "requests_finished": obs.after["requests_finished"] + 1}  # a fifth request finished
    v = speculative_usage_verdict(obs, SPEC)
    assert v.status == Status.PASS and "other requests finished meanwhile" in v.evidence["skipped_checks"][
        "generation_tokens_total"]
    assert "generation counter not judged" in v.message
    skip = speculative_usage_verdict(None, None)
    assert skip.status == Status.SKIP and "profile declares no engine.speculative_config" in skip.message


def test_counters_read_vllm_names_and_tolerate_garbage():
    text = ('vllm:generation_tokens_total{engine="0"} 5.0\nvllm:generation_tokens_total{engine="1"} 7.0\n'
            'vllm:spec_decode_num_drafts_total{engine="0"} 3.0\n')
    got = counters(text)
    assert got["generation_tokens"] == 12 and got["drafts"] == 3 and got["accepted_tokens"] is None
    assert counters("not { prometheus") == counters(None) == {k: None for k in got}


def test_the_launchers_render_speculative_config_as_compact_json():
    p = Profile.model_validate({"name": "m", "model": {"served_name": "m", "architecture": {"layers": 2, "attention_heads": 4,
                                                                               "kv_heads": 2, "head_dim": 64}},
                                "engine": {"max_model_len": 256, "speculative_config": SPEC}})
    cmd = render_command(p, "MODEL", 0, python="python", default_dtype=None)
    i = cmd.index("--speculative-config")
    assert json.loads(cmd[i + 1]) == SPEC and " " not in cmd[i + 1]


FAKE_PROFILE = (REPO / "tests" / "data" / "fake-vllm.yaml").read_text()


@pytest.mark.parametrize("fault, status", [(None, "PASS"), ("spec_usage_drafts", "FAIL")])
def test_the_suite_case_runs_under_a_declared_speculative_config(pytester, fault, status):
    profile = pytester.path / "fake-spec.yaml"
    profile.write_text(FAKE_PROFILE.replace("  gpu_memory_utilization: 0.9\n",
                                            "  gpu_memory_utilization: 0.9\n  speculative_config: "
                                            + json.dumps(SPEC) + "\n"))
    cfg = FakeConfig(max_tokens_cap=64, num_speculative_tokens=3, faults={fault} if fault else set())
    reports = pytester.path / "reports"
    with FakeVLLM(cfg) as fake:
        pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                                     f"--profile={profile}", "--endpoint", fake.url, "--kvgate-reports", str(reports),
                                     str(REPO / "suites" / "test_max_tokens.py"), "-k", "speculative")
    summary = read_summary(reports)
    g = {g["id"]: g for g in summary["gates"]}["fake-spec/max-tokens/speculative-usage"]
    assert g["status"] == status, g["message"]
    assert ("usage.completion_tokens 44, max_tokens 22" if fault else "+88 == delivered") in g["message"]
    assert_passes_measured(summary)  # the PASS rests on its measured value and evidence (tests/test_passes_measured.py)
