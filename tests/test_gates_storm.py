"""disconnect/cancellation-storm both ways against the fake (vllm#46283, #50425): cancellations at
four staged moments, then vllm:kv_cache_usage_perc back to its baseline within a bound sized from the
server's measured step, and a max-context canary admitted. The leak_cancelled_kv fake (a request
cancelled before its first token reached the client never frees its blocks; running falls back)
FAILs naming the usage before/after, the bound, the stages that leaked and the refused canary; the
healthy fake PASSes; no gauge SKIPs; a gauge that never moved or a storm that cut nothing is INVALID.
The suite's own run on the healthy fake: tests/test_gates_vs_fake.py::test_disconnect_frees_slot_on_healthy_fake."""

from __future__ import annotations

import re

import pytest

from kvgate.gates.disconnect import storm_verdict
from kvgate.http.client import Endpoint, KvClient, Reply
from kvgate.http.metrics import GaugePoll
from kvgate.http.probes import Exchange, QueueSample
from kvgate.load.storm import STAGES, StageResult, StepProbe, StormObservation, long_prompt_tokens, release_bound, \
    run_storm, settled
from kvgate.verdict import Status
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import assert_passes_measured

# 18 blocks of 16 tokens: an idle pool holds the 254-token canary (16 blocks); the storm's leaked
# before-first-token requests (at least the two mid-prefill prompts' 2 blocks each) leave too few.
# 0.15 s from admission to the first token: the probe measures it, and the mid-prefill requests are
# hung up half-way through it -- admitted, their KV being built, whatever the host's scheduling jitter.
FAKE = dict(max_tokens_cap=64, itl_s=0.01, ttft_s=0.15, num_gpu_blocks=18)


def storm(fake: FakeVLLM, **kw) -> StormObservation:
    ep = Endpoint(fake.base_url)
    with KvClient(ep, timeout_s=5) as client:
        return run_storm(client, ep, "fake-model", max_model_len=256, k=kw.pop("k", 8), steps=20,
                         floor_s=kw.pop("floor_s", 0.3), canary_deadline_s=kw.pop("canary_deadline_s", 1.0), **kw)


def test_healthy_fake_frees_every_cancelled_request_and_admits_the_canary():
    with FakeVLLM(FakeConfig(**FAKE)) as fake:
        obs = storm(fake)
        leaked = fake.state.leaked_kv_blocks
    v = storm_verdict(obs)
    assert v.status is Status.PASS, v.message
    assert leaked == 0 and obs.cut == 8 and [s.stage for s in obs.stages] == list(STAGES)
    assert v.message.startswith("vllm:kv_cache_usage_perc 0.00% before the storm, 0.00% after 8 cancellations of 8 "
                                "(before-first-byte 2, mid-prefill 2, after-first-token 2, mid-decode 2)"), v.message
    assert "back to baseline" in v.message and "max-context canary (254-token prompt) completed" in v.message
    assert "decode step" in v.message and v.unit == "s" and v.measured <= v.limit == round(obs.bound_s, 3)
    assert obs.probe.kv_during > obs.baseline and obs.peak >= obs.probe.kv_during  # read while the probe decoded
    assert_passes_measured({"gates": [v.to_dict()]})


def test_leaking_fake_fails_naming_usage_bound_stages_and_refused_canary():
    with FakeVLLM(FakeConfig(**FAKE, faults={"leak_cancelled_kv"})) as fake:
        obs = storm(fake, canary_deadline_s=0.5)
    v = storm_verdict(obs)
    assert v.status is Status.FAIL, v.message
    m = v.message
    assert m.startswith("vllm:kv_cache_usage_perc 0.00% before the storm, ") and obs.final > 0, m
    assert f"not back within {obs.bound_s:.2f} s = max(0.3 s floor, " in m and "x 20 decode steps" not in m
    leaked = [s.stage for s in obs.stages if s.leaked]
    assert "mid-prefill" in leaked and "after-first-token" not in leaked and "mid-decode" not in leaked, m
    assert "left up by: " in m and re.search(r"mid-prefill \d+\.\d\d% -> \d+\.\d\d% after \d+\.\d\d s \(cut before the "
                                             r"first (byte|token)", m), m
    assert not re.search(r"(after-first-token|mid-decode) \d+\.\d\d% ->", m)  # freed: not named
    assert "max-context canary (254-token prompt) refused: no answer within its 0.5 s deadline (not admitted" in m
    assert m.endswith("-> FAIL (cancelled requests' KV blocks never freed)")
    assert v.measured == obs.final and v.limit == obs.baseline


def test_server_without_metrics_skips_saying_so_and_sends_no_storm():
    with FakeVLLM(FakeConfig(**FAKE, faults={"no_metrics"})) as fake:
        obs = storm(fake)
        sent = len(fake.state.requests)
    v = storm_verdict(obs)
    assert v.status is Status.SKIP and v.message.startswith("the server exposes no /metrics: whether cancelled "
                                                            "requests free their KV blocks is not observable")
    assert sent == 1 and obs.stages == []  # the canary only


# ---- the verdict alone (constructed observations)

def observation(**kw) -> StormObservation:
    canary = Exchange("completions", False, {"max_tokens": 2}, Reply(200, "{}", 0.4), 254)
    probe = StepProbe(32, 200, 0.05, 0.01)
    poll = GaugePoll("kv_usage", 0.0, True, [(0.0, 0.0)], 0.01)
    stages = [StageResult(s, ["before the first token", "after 1 token event"], 0.0, poll) for s in STAGES]
    base = dict(k=8, baseline=0.0, metrics=True, tolerance=0.025, probe=probe, bound_s=0.3, steps=20, floor_s=0.3,
                stages=stages, final=0.0, peak=0.4, canary=canary, canary_deadline_s=1.0)
    return StormObservation(**{**base, **kw})


def test_metrics_without_the_kv_gauge_skip_naming_it():
    v = storm_verdict(observation(baseline=None, stages=[], final=None, peak=None, probe=None))
    assert v.status is Status.SKIP
    assert v.message.startswith("the server's /metrics has no vllm:kv_cache_usage_perc (nor vllm:gpu_cache_usage_perc)")


def test_refused_canary_fails_even_without_the_gauge():
    refused = Exchange("completions", False, {}, Reply(503, "KV cache exhausted", 0.1), 254)
    v = storm_verdict(observation(baseline=None, stages=[], canary=refused, probe=None))
    assert v.status is Status.FAIL and v.message.startswith("max-context canary (254-token prompt) refused: HTTP 503")


def test_gauge_that_never_moved_is_invalid():
    v = storm_verdict(observation(peak=0.0))
    assert v.status is Status.INVALID and "the gauge never moved, so its return to baseline proves nothing" in v.message


def test_storm_that_cut_nothing_is_invalid():
    stages = [StageResult(s, ["completed", "completed"], 0.0, None) for s in STAGES]
    v = storm_verdict(observation(stages=stages))
    assert v.status is Status.INVALID and v.message.startswith("none of the 8 storm requests was cut")


def test_canary_refused_after_a_clean_release_fails_naming_the_pool():
    held = Exchange("completions", False, {}, Reply(0, "timed out", 1.0), 254)
    v = storm_verdict(observation(canary=held, canary_queue=[QueueSample(0.5, 1.0, 0.0)]))
    assert v.status is Status.FAIL and "back to baseline within 0.30 s" in v.message
    assert "refused: no answer within its 1 s deadline (not admitted: the pool cannot hold it); /metrics while it " \
           "waited: waiting 1, running 0" in v.message
    assert v.message.endswith("-> FAIL (the KV pool refuses a max-length prompt after the storm)")


@pytest.mark.parametrize("prefill,step,want", [(0.5, 0.02, 1.5), (0.0, 0.001, 0.3), (None, 0.01, 0.5),
                                               (2.0, None, 0.3)])
def test_release_bound_is_sized_from_the_measured_step_and_floored(prefill, step, want):
    assert release_bound(prefill, step, 50, 0.3) == pytest.approx(want)


def test_long_prompt_is_bounded():
    assert [long_prompt_tokens(n) for n in (64, 256, 1024, 8192, 131072)] == [32, 32, 128, 512, 512]


def gauge(values):
    """A /metrics fetch reading ``values`` in turn (the last repeated) and a clock its sleeps advance."""
    now, it = [0.0], iter(values)
    last = [values[0]]

    def fetch():
        last[0] = next(it, last[0])
        return f"vllm:kv_cache_usage_perc {last[0]}\n"

    def sleep(s):
        now[0] += s

    return fetch, (lambda: now[0]), sleep


def test_a_stale_read_at_baseline_is_not_a_release():
    # the gauge still shows the pool from before the cut prefill's step; the step ends and shows the leak
    fetch, clock, sleep = gauge([0.0, 0.2])
    p = settled(fetch, 0.001, 1.0, 0.3, clock=clock, sleep=sleep)
    assert not p.reached and p.last == 0.2 and 0.99 <= p.elapsed_s <= 1.4


def test_a_release_read_twice_is_reached_at_the_first_read():
    fetch, clock, sleep = gauge([0.3, 0.3, 0.0, 0.0])
    p = settled(fetch, 0.001, 1.0, 0.3, clock=clock, sleep=sleep)
    assert p.reached and p.elapsed_s == pytest.approx(0.2) and [v for _, v in p.samples] == [0.3, 0.3, 0.0, 0.0]
