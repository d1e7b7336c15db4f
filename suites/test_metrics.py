"""Gate: metrics. What the deployment's consumers read on /metrics is there and true. One load step
(metrics.held_requests streams held open, /metrics scraped before, during and after) for four checks:

- contract: every consumed series (metrics.consumed + autoscale.metric) exists, is numeric, has
  the labels its consumer filters on, and moves under the step;
- running-truth: while all streams run, num_requests_running sums to them and num_requests_waiting
  to what is queued, with no per-process duplicate series an average would dilute;
- histograms: the TTFT and e2e histograms counted exactly the requests sent and hold the client's
  own p50/p90 in their buckets;
- under-load: /metrics answers 200 text/plain while the streams run.
"""

import pytest

from kvgate.gates.metrics import CASES, metrics_verdict
from kvgate.load.scenarios import run_metrics_step


@pytest.fixture(scope="module")
def step(kvgate_client, kvgate_endpoint, kvgate_profile):
    """The one load step the four checks judge, and the server's version (``/version``)."""
    return run_metrics_step(kvgate_client, kvgate_endpoint, kvgate_profile), kvgate_client.version()


@pytest.mark.metrics
@pytest.mark.gate("metrics", cases=list(CASES))
def test_metrics_consumers_read_are_there_and_true(case, step, kvgate_profile, kvgate_gate):
    observation, version = step
    assert kvgate_gate(metrics_verdict(case, observation, kvgate_profile, version)).passed
