"""Load-gate decisions on synthetic observations: INVALID when the client starved, preemptions
judged against the allowance, missing /metrics noted rather than crashing."""

from __future__ import annotations

from kvgate.load import LoadResult, RequestRecord
from kvgate.gates.load import concurrent_long_verdict, latency_verdict, workloads_missing
from kvgate.http.metrics import MetricsTrace
from kvgate.profile.models import load_profile
from kvgate.load.scenarios import LoadObservation
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


def tagged(i, tag, sent, first, end):
    r = rec(i)
    r.tag, r.scheduled_s, r.sent_s, r.first_token_s, r.end_s = tag, sent, sent, first, end
    r.content_s = [first + k * 0.01 for k in range(8)]
    return r


def mixed_run(short_first_token):
    """Two waves: 2 longs sent at the wave start (ending 1.0 s later), 4 shorts just after."""
    rs = []
    for w in range(2):
        t = w * 2.0
        rs += [tagged(len(rs), "long", t, t + 0.4, t + 1.0) for _ in range(2)]
        rs += [tagged(len(rs), "short", t + 0.01 * (j + 1), short_first_token(t), t + 1.5) for j in range(4)]
    return rs


def test_head_of_line_counts_shorts_that_waited_for_a_long_to_complete():
    from kvgate.gates.load import head_of_line
    ok = head_of_line(mixed_run(lambda t: t + 0.5))  # first token while the longs still decode
    assert ok["judged"] == 8 and ok["blocked"] == 0 and ok["lead_ms"][0] == 500.0
    bad = head_of_line(mixed_run(lambda t: t + 1.1))  # only after the longs completed
    assert bad["blocked"] == 8 and bad["share"] == 1.0 and bad["lead_ms"][0] == -100.0
    alone = head_of_line([tagged(0, "short", 0.0, 0.1, 0.2)])  # no long in flight: not judged
    decoding = head_of_line([tagged(0, "long", 0.0, 0.1, 0.5), tagged(1, "short", 0.2, 0.6, 0.7)])
    assert decoding["judged"] == 0  # the long was already decoding: its completion blocks nobody
    assert alone == {"judged": 0, "blocked": 0, "share": None, "lead_ms": []}


def test_interference_fails_head_of_line_blocking_even_within_the_slo():
    from kvgate.gates.load import interference_verdict
    loose = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": 5000})})
    alone = LoadObservation("short alone", LoadResult("closed", [tagged(i, "short", 0.0, 0.05, 0.1) for i in range(4)],
                                                      4, 0.4, 60.0), MetricsTrace(samples=[]), 16, 8, 1)

    def mixed(fn):
        return LoadObservation("mixed", LoadResult("open", mixed_run(fn), 12, 3.0, 60.0), MetricsTrace(samples=[]),
                               16, 8, 6, extra={"long_per_wave": 2, "long_prompt_tokens": 200, "waves": 2})

    v = interference_verdict(alone, mixed(lambda t: t + 1.1), loose)
    assert v.status is Status.FAIL, v.message
    assert "head-of-line blocking: 8 of 8 short requests got their first token only after a long request queued ahead" in v.message
    assert "(median 100 ms after it; allowed: under 75%)" in v.message
    assert v.evidence["head_of_line"]["blocked"] == 8
    good = interference_verdict(alone, mixed(lambda t: t + 0.5), loose)
    assert good.status is Status.PASS, good.message
    assert "no head-of-line blocking (0 of 8 short requests" in good.message


def test_a_profile_without_a_long_or_short_workload_skips_the_gates_that_load_with_it():
    """A profile that declares only short workloads: the long-sequence and interference gates SKIP
    naming what is missing (they used to end in a harness ERROR, ScenarioError); the SLO gate runs."""
    shorts = {n: w for n, w in PROFILE.workloads.items() if not w.long}
    only_short = PROFILE.model_copy(update={"workloads": shorts})
    assert workloads_missing(PROFILE, "long-sequences") is None and workloads_missing(only_short, "slo") is None
    for case, gate in (("long-sequences", "concurrency/long-sequences"), ("interference", "latency/interference")):
        v = workloads_missing(only_short, case)
        assert v is not None and v.gate == gate and v.status is Status.SKIP
        assert "declares no long workload (workloads.*.long: true)" in v.message and v.message.endswith("-> SKIP")
    only_long = PROFILE.model_copy(update={"workloads": {n: w for n, w in PROFILE.workloads.items() if w.long},
                                           "slo": PROFILE.slo.model_copy(update={"workload": None})})
    v = workloads_missing(only_long, "slo")
    assert v is not None and "declares no short workload" in v.message
