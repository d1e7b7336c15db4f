"""Gate: health under load. While the server is saturated, ``/health`` and ``/v1/models`` answer
200 within the deployment's probe timeout (p99 and max), so the kubelet neither restarts nor
unroutes a pod that is merely busy. The samples were taken while the load gates ran; a run
without them (``-m health``), or whose load gates gave too few to decide, sends a few seconds of
long requests of its own.

Case ready-to-serving: the seconds from "ready" to the first completed generation, timed at the
server's start (or the run's first look at a given endpoint), within ``limits.ready_to_serving_max_s``."""

import pytest

from kvgate.gates.health import ready_to_serving_verdict
from kvgate.gates.health_load import needs_more, under_load_verdict
from kvgate.load.health import run_own_load
from kvgate.report.record import records_csv


@pytest.mark.health
@pytest.mark.gate("health", cases=["under-load"])
def test_health_answers_within_the_probe_timeout_under_load(case, kvgate_client, kvgate_endpoint, kvgate_profile,
                                                            kvgate_gate, kvgate_health_log, kvgate_probe_limit):
    limit_s, source = kvgate_probe_limit
    log = kvgate_health_log
    samples, loads = list(log.samples), ["the load of " + ", ".join(log.gates)] if log.gates else []
    if needs_more(samples, limit_s):  # no load gate ran, or too short a one: a few seconds of its own
        own = run_own_load(kvgate_client, kvgate_endpoint, kvgate_profile, limit_s, during="its own load")
        samples, loads = samples + own.samples, loads + [own.label]
    verdict = under_load_verdict(samples, limit_s, source, " and ".join(loads))
    csv = records_csv([s.row() for s in samples])
    assert kvgate_gate(verdict, attachments={"health samples.csv": csv}).passed


@pytest.mark.health
@pytest.mark.gate("health", cases=["ready-to-serving"])
def test_ready_means_serving(case, kvgate_endpoint, kvgate_gate, kvgate_readiness):
    """Kubernetes routes traffic the moment the readiness probe passes: from the endpoint's first
    "ready" (``/health`` 200, the model listed) to its first completed generation must stay within
    ``limits.ready_to_serving_max_s``. Timed when kvgate started the server, or from the run's first
    look at a given endpoint (before the first gate); nothing is sent here."""
    obs, missing, (limit_s, where), probe = kvgate_readiness
    assert kvgate_gate(ready_to_serving_verdict(obs, limit_s, where, probe=probe, missing=missing)).passed
