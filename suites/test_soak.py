"""Gate: soak. Rounds of fixed offered load for the profile's soak.duration; the server's retained
memory must not grow, TTFT p95 must not drift, local GPUs must keep their headroom. A cut-short
soak is INCOMPLETE, a client that fell behind makes it INVALID.

The soak runs once per module (the ``kvgate_soak`` fixture, async on one event loop: load and
samplers together); each case below judges one half of it."""

import pytest

from kvgate.gates.scale import scaled_verdict
from kvgate.gates.soak import gpu_verdict, latency_verdict, memory_verdict
from kvgate.verdict import Status, Verdict

pytestmark = [pytest.mark.soak, pytest.mark.asyncio(loop_scope="module")]


def judged(soak, decide, gate, profile):
    """The case's verdict, or SKIP when the profile declares no soak; with --workers, held to the
    workers' checks over the soak's rounds (a lost, late or lagging worker: INVALID naming it)."""
    if soak.analysis is None:
        return Verdict(gate, Status.SKIP, f"{soak.skip} -> SKIP")
    verdict = decide(soak.analysis)
    if soak.workers is None or verdict.status is Status.SKIP:  # a case that does not apply stays SKIP
        return verdict
    return scaled_verdict(verdict, soak.workers, profile, lagged_rounds_max=soak.spec.lagged_rounds_max)


def record(kvgate_gate, soak, verdict):
    """Record the verdict with the plot and the rounds; a signal that cut the soak short goes on
    after the verdict is written (the run ends INCOMPLETE)."""
    try:
        return kvgate_gate(verdict, attachments=soak.attachments)
    finally:
        soak.reraise()


@pytest.mark.gate("soak", cases=["memory"])
async def test_retained_memory_does_not_grow(case, kvgate_soak, kvgate_profile, kvgate_gate):
    verdict = judged(kvgate_soak, memory_verdict, "soak/memory", kvgate_profile)
    assert record(kvgate_gate, kvgate_soak, verdict).passed


@pytest.mark.gate("soak", cases=["latency"])
async def test_ttft_p95_does_not_drift(case, kvgate_soak, kvgate_profile, kvgate_gate):
    verdict = judged(kvgate_soak, lambda a: latency_verdict(a, kvgate_profile), "soak/latency", kvgate_profile)
    assert record(kvgate_gate, kvgate_soak, verdict).passed


@pytest.mark.gate("soak", cases=["gpu-memory"])
async def test_gpu_headroom_holds(case, kvgate_soak, kvgate_profile, kvgate_gate):
    verdict = judged(kvgate_soak, lambda a: gpu_verdict(a, kvgate_profile), "soak/gpu-memory", kvgate_profile)
    assert record(kvgate_gate, kvgate_soak, verdict).passed
