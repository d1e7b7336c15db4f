"""The run-wide health sampler: while each load gate saturates the server, a
:class:`~kvgate.http.health_sampler.HealthSampler` probes ``/health`` and ``/v1/models``; the samples
collect in the run's :class:`HealthLog` (on the config's stash, :data:`HEALTH_LOG`) with the gate
that was running, for the health/under-load gate (``suites/test_health_load.py``) to judge. The
samples come from load the run sends anyway: the main job pays ~0 s for them.

:func:`watch` is entered by :func:`kvgate.plugin.pytest_runtest_call` around every gate's call.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator

import pytest

from kvgate.gates import health_load
from kvgate.http.health_sampler import HealthSampler, ProbeSample
from kvgate.run.session import ISVC_PROBE_TIMEOUT, RUN, test_id

#: The gates whose load the sampler runs under (``gate`` marker names): they saturate the server.
LOAD_GATES = ("concurrency", "latency", "priority", "autoscale-signal")


@dataclass
class HealthLog:
    """What the run's samplers saw: ``samples`` (every load gate's, on one time base: seconds
    since ``t0``, monotonic) and ``gates`` (the test ids of the load gates that ran with a verdict
    other than SKIP: their samples were taken under load)."""

    t0: float = field(default_factory=time.monotonic)
    samples: list[ProbeSample] = field(default_factory=list)
    gates: list[str] = field(default_factory=list)


#: This run's :class:`HealthLog` (created on first use).
HEALTH_LOG = pytest.StashKey[HealthLog]()


def health_log(config: pytest.Config) -> HealthLog:
    """The run's :class:`HealthLog` (made on first call)."""
    log = config.stash.get(HEALTH_LOG, None)
    if log is None:
        log = config.stash[HEALTH_LOG] = HealthLog()
    return log


def isvc_probe(config: pytest.Config) -> object | None:
    """``--isvc``: the InferenceService's probe timeout (:class:`kvgate.launch.kserve.ProbeTimeout`), or None."""
    return config.stash.get(ISVC_PROBE_TIMEOUT, None)


def probe_limit(config: pytest.Config) -> tuple[float, str]:
    """``(seconds, where from)``: the probe timeout of this run (the InferenceService's when
    ``--isvc`` read one, else the profile's ``limits.probe_timeout_s``;
    :func:`kvgate.gates.health_load.probe_limit`)."""
    return health_load.probe_limit(config.stash[RUN].profile, isvc_probe(config))


@contextlib.contextmanager
def watch(item: pytest.Item) -> Iterator[None]:
    """Sample health while ``item`` runs, when it is a load gate (:data:`LOAD_GATES`) of a kvgate
    run with a live endpoint; samples of a gate that ended SKIP (it sent no load), or whose sends
    the run's :class:`~kvgate.http.watch.EngineWatch` refused (a server that stalls streams: the
    load gate's streamed requests were never sent, so the probes saw an idle server), are dropped."""
    run = item.config.stash.get(RUN, None)
    marker = item.get_closest_marker("gate")
    endpoint = getattr(item, "funcargs", {}).get("kvgate_endpoint")
    if run is None or marker is None or marker.args[0] not in LOAD_GATES or endpoint is None:
        yield
        return
    log = health_log(item.config)
    gate = test_id(item)
    sampler = HealthSampler(endpoint, probe_limit(item.config)[0], gate, t0=log.t0)
    sampler.start()
    try:
        yield
    finally:
        samples = sampler.stop()
        refused = run.watch.refused.get(gate, 0) if run.watch is not None else 0
        if run.verdict_status(item.nodeid) not in (None, "SKIP") and not refused:
            log.samples += samples
            log.gates.append(gate)


__all__ = ["HEALTH_LOG", "LOAD_GATES", "HealthLog", "health_log", "isvc_probe", "probe_limit", "watch"]
