"""The autoscale-signal gate: pure verdicts on hand-built bursts, then the suite against the fake
with a healthy queue gauge (PASS), a gauge that never moves and one that never drains (FAIL), and
no /metrics (SKIP)."""

from __future__ import annotations

import pytest

from kvgate.gates.autoscale import autoscale_verdict, signal_points
from kvgate.load import LoadResult, RequestRecord
from kvgate.http.metrics import MetricsTrace
from kvgate.profile.models import AutoscaleSpec, ProfileError, load_profile
from kvgate.load.scenarios import BurstObservation
from kvgate.verdict import Status
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
M = "vllm:num_requests_waiting"
SPEC = AutoscaleSpec(threshold=4, rise_within_s=2, drain_within_s=3)


def burst(values, start=1.0, end=3.0, available=True, n=24, seqs=8):
    """Readings every 0.5 s from t=0; the burst runs from ``start`` to ``end`` (sampler seconds)."""
    recs = [RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, status=200) for i in range(n)]
    trace = MetricsTrace(samples=[(k * 0.5, {M: v}) for k, v in enumerate(values)], available=available)
    return BurstObservation("chat", n, LoadResult("open", recs, n, end - start, 60.0), trace, M, start, end, seqs)


def test_queue_that_rises_and_drains_passes_with_its_timing():
    v = autoscale_verdict(burst([0, 0, 3, 16, 9, 2, 0, 0]), SPEC)
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("burst of 24 chat requests at once (24 of 24 completed 200; max_num_seqs 8): "
                                "vllm:num_requests_waiting rose to 16 (> threshold 4) 0.5 s after it began")
    assert "drained to 0 0.0 s after it was served (2.0 s; allowed 3 s) -> PASS" in v.message
    assert v.measured == 16 and v.limit == 4
    assert signal_points(burst([0, 5]))[1] == (-0.5, 5)
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_frozen_gauge_fails_and_says_the_autoscaler_never_sees_the_burst():
    v = autoscale_verdict(burst([0] * 10), SPEC)
    assert v.status is Status.FAIL
    assert "vllm:num_requests_waiting peaked at 0, never above the threshold 4; requests waited (the burst of 24 " \
        "exceeds max_num_seqs 8)" in v.message
    assert "the autoscaler never sees the burst -> FAIL" in v.message
    small = autoscale_verdict(burst([0] * 10, n=8), SPEC)
    assert "the burst (8) is not above max_num_seqs (8): nothing had to wait" in small.message
    # max_num_seqs not declared: nothing is known to have waited -- the message must not say requests did
    unknown = autoscale_verdict(burst([0] * 10, seqs=None), SPEC)
    assert "requests waited" not in unknown.message and "max_num_seqs is not declared, so whether any of the 24 " \
        "had to wait is not known" in unknown.message, unknown.message


def test_late_rise_and_stuck_gauge_fail_with_the_numbers():
    on_time = autoscale_verdict(burst([0, 0, 0, 0, 0, 0, 8, 0, 0], end=4.0), SPEC)  # crossed at 3.0 - 1.0 = 2.0 s
    assert on_time.status is Status.PASS and "rose to 8 (> threshold 4) 2.0 s after it began" in on_time.message
    later = autoscale_verdict(burst([0, 0, 0, 0, 0, 0, 0, 8, 0, 0], end=4.0), SPEC)
    assert later.status is Status.FAIL and "crossed the threshold 4 only 2.5 s into the burst (allowed 2 s)" in later.message
    stuck = autoscale_verdict(burst([0, 0, 9, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12]), SPEC)
    assert stuck.status is Status.FAIL
    assert "vllm:num_requests_waiting still 12 (> 0) 3.0 s after the burst was served (allowed 3 s)" in stuck.message


def test_absent_metric_fails_and_no_metrics_skips():
    gone = burst([None] * 6)
    v = autoscale_verdict(gone, SPEC)
    assert v.status is Status.FAIL and "is absent from /metrics in all 6 scrapes" in v.message
    skip = autoscale_verdict(burst([None] * 6, available=False), SPEC)
    assert skip.status is Status.SKIP and "serves no /metrics here" in skip.message


def test_profile_burst_workload_must_exist(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text((REPO / "tests" / "data" / "fake-vllm.yaml").read_text().replace(
        "autoscale:\n", "autoscale:\n  burst_workload: chatt\n"))
    with pytest.raises(ProfileError, match="autoscale.burst_workload 'chatt' is not a workload"):
        load_profile(str(p))


SUITE = ["suites/test_autoscale.py"]
GID = "fake-vllm/autoscale-signal/burst"


@pytest.mark.parametrize("fault, status, fragment", [
    (None, "PASS", "vllm:num_requests_waiting rose to"),
    ("frozen_queue_gauge", "FAIL", "never above the threshold 2"),
    ("stuck_queue_gauge", "FAIL", "a gauge that does not drain keeps the deployment scaled out"),
    ("no_metrics", "SKIP", "serves no /metrics here"),
])
def test_suite_against_the_fake(pytester, fault, status, fragment):
    cfg = FakeConfig(max_tokens_cap=64, itl_s=0.02, max_num_seqs=2, faults={fault} if fault else set())
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, suites=SUITE)
    g = gates[GID]
    assert g["status"] == status and fragment in g["message"], g["message"]
