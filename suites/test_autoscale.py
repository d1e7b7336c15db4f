"""Gate: autoscale-signal. Under a burst larger than what runs at once, the queue metric the
autoscaler reads (``autoscale.metric``, default ``vllm:num_requests_waiting``) rises above its
threshold in time, and drains once the burst is served."""

import pytest

from kvgate.gates.autoscale import GATE, autoscale_verdict
from kvgate.report.record import latency_png, records_csv
from kvgate.load.scenarios import run_autoscale_burst
from kvgate.verdict import Status, Verdict


@pytest.mark.load
@pytest.mark.autoscale_signal
@pytest.mark.gate("autoscale-signal", cases=["burst"])
def test_queue_metric_rises_under_a_burst_and_drains(case, kvgate_client, kvgate_endpoint, kvgate_profile,
                                                     kvgate_gate):
    if kvgate_profile.autoscale is None:
        assert kvgate_gate(Verdict(GATE, Status.SKIP, "profile declares no autoscale section -> SKIP")).passed
        return
    obs = run_autoscale_burst(kvgate_client, kvgate_endpoint, kvgate_profile)
    verdict = autoscale_verdict(obs, kvgate_profile.autoscale)
    assert kvgate_gate(verdict, attachments={"burst requests.csv": records_csv(obs.result.rows()),
                                             "burst latency.png": latency_png(obs.result.records, "burst")}).passed
