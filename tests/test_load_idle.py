"""Case 11 of issue 12: the load client cuts a stream at the profile's idle timeout, as the gateway
in front would, and counts it failed with that reason -- so a server that stalls every stream
costs each load gate one idle timeout per request, not the stall. Against the fake vLLM's
``stall_mid_stream`` fault (3 s stalls, 0.2 s idle timeout)."""

from __future__ import annotations

import time

import pytest

from kvgate.http.client import Endpoint
from kvgate.load import HttpxTransport, closed_loop, completion_request
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
STALL_S, IDLE_S = 3.0, 0.2


@pytest.fixture
def stalling():
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"stall_mid_stream"}, stall_s=STALL_S)) as fake:
        yield fake


LONG_STALL_S = 10.0  # uncut, 4 requests 2 at a time would take 2 x 10 s; cut, ~2 x 0.2 s


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_stalled_stream_is_cut_at_the_idle_timeout(transport):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"stall_mid_stream"}, stall_s=LONG_STALL_S)) as stalling:
        ep = Endpoint(stalling.base_url)
        spec = completion_request(ep, model="fake-model", prompt="kv cache", max_tokens=16, temperature=0,
                                  ignore_eos=True)
        t0 = time.monotonic()
        result = closed_loop(ep, spec, n=4, concurrency=2, deadline_s=30, idle_timeout_s=IDLE_S,
                             **({"transport": HttpxTransport(ep)} if transport == "httpx" else {}))
        wall = time.monotonic() - t0
    # generous margin for a loaded 2-core machine: the cut run takes ~0.5 s, one stall alone 10 s
    assert wall < LONG_STALL_S / 2, wall
    assert len(result.records) == 4 and not any(r.ok for r in result.records)
    for r in result.records:
        assert r.error.startswith("idle timeout: no bytes for"), r.error
        assert "stream idle timeout 0.2 s" in r.error
        assert IDLE_S <= r.end_s - r.sent_s < IDLE_S + 2.0


def test_healthy_stream_with_idle_timeout_is_untouched():
    with FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.05)) as fake:  # every gap 0.05 s < 0.2 s
        ep = Endpoint(fake.base_url)
        spec = completion_request(ep, model="fake-model", prompt="kv cache", max_tokens=8, temperature=0,
                                  ignore_eos=True)
        result = closed_loop(ep, spec, n=2, concurrency=2, deadline_s=30, idle_timeout_s=IDLE_S)
    assert all(r.ok and r.error is None for r in result.records), [r.error for r in result.records]


def test_load_gates_against_stalling_server_stay_bounded(pytester, stalling):
    """The load suite against a server that stalls every stream 3 s (profile idle timeout 0.2 s):
    the gates FAIL naming the idle timeout and the run takes seconds, not requests x stall."""
    reports = pytester.path / "reports"
    t0 = time.monotonic()
    pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--profile={REPO / 'tests' / 'data' / 'fake-vllm.yaml'}", f"--endpoint={stalling.url}",
        f"--kvgate-reports={reports}", str(REPO / "suites" / "test_load.py"))
    wall = time.monotonic() - t0
    gates = {g["id"]: g for g in read_summary(reports)["gates"]}
    # measured: 18 s with the idle cut; 80 s uncut (every load request waits out its 3 s stall)
    assert wall < 40, wall
    for gate in ("fake-vllm/concurrency/long-sequences", "fake-vllm/latency/slo"):
        assert gates[gate]["status"] == "FAIL", gates[gate]
        assert "idle timeout" in str(gates[gate]), gates[gate]["message"]
