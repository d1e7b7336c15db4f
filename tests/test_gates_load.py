"""Load-gate decisions on synthetic observations: INVALID when the client starved, preemptions
judged against the allowance, missing /metrics noted rather than crashing."""

from __future__ import annotations

from kvgate.load import LoadResult, RequestRecord
from kvgate.gates.load import concurrent_long_verdict, latency_verdict
from kvgate.metrics import MetricsTrace
from kvgate.profile import load_profile
from kvgate.scenarios import LoadObservation
from kvgate.verdict import Status


def rec(i, tokens=8, status=200):
    r = RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, first_byte_s=0.01, end_s=0.2, status=status,
                      content_type="text/event-stream")
    r.finalized = True
    r.first_token_s, r.content_s, r.chunk_s, r.tokens = 0.05, [0.05 + k * 0.01 for k in range(tokens)], [], tokens
    return r


def obs(records, loop_lag=(), trace=None):
    result = LoadResult("closed", records, len(records), 0.2, 60.0, loop_lag_s=list(loop_lag))
    trace = trace or MetricsTrace(samples=[(0.0, {"running": 0, "waiting": 0, "kv_usage": 0.0, "preemptions": 5.0}),
                                           (1.0, {"running": 2, "waiting": 0, "kv_usage": 0.4, "preemptions": 5.0})])
    return LoadObservation("concurrent-long (batch)", result, trace, 200, 8, 2)


PROFILE = load_profile("tests/data/fake-vllm.yaml")


def test_healthy_run_passes_and_names_numbers():
    v = concurrent_long_verdict(obs([rec(0), rec(1)]), PROFILE)
    assert v.status is Status.PASS and "preemptions 0 (allowed 0)" in v.message and "peak KV usage 40%" in v.message


def test_starved_client_is_invalid_not_pass_or_fail():
    v = concurrent_long_verdict(obs([rec(0), rec(1, status=500)], loop_lag=[0.5] * 10), PROFILE)
    assert v.status is Status.INVALID and "client fell behind" in v.message and "not judged" in v.message
    v2 = latency_verdict(obs([rec(0), rec(1)], loop_lag=[0.5] * 10), PROFILE)
    assert v2.status is Status.INVALID


def test_preemptions_over_allowance_fail():
    trace = MetricsTrace(samples=[(0.0, {"running": 0, "waiting": 0, "kv_usage": 0.0, "preemptions": 0.0}),
                                  (1.0, {"running": 1, "waiting": 1, "kv_usage": 1.0, "preemptions": 3.0})])
    v = concurrent_long_verdict(obs([rec(0), rec(1)], trace=trace), PROFILE)
    assert v.status is Status.FAIL and "3 preemptions (allowed 0)" in v.message


def test_no_metrics_is_noted_not_a_crash():
    trace = MetricsTrace(samples=[(0.0, {k: None for k in ("running", "waiting", "kv_usage", "preemptions")})],
                         available=False)
    v = concurrent_long_verdict(obs([rec(0), rec(1)], trace=trace), PROFILE)
    assert v.status is Status.PASS and "n/a (no /metrics)" in v.message


def test_wrong_token_count_fails():
    v = concurrent_long_verdict(obs([rec(0), rec(1, tokens=5)]), PROFILE)
    assert v.status is Status.FAIL and "[5] tokens instead of 8" in v.message
