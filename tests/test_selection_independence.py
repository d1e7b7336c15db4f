"""Issue 48: a verdict that reads timing does not depend on what else runs. The probes whose timing
a verdict reads run with nothing of their own gate or of another beside them, so the same healthy
deployment gets the same verdict under any ``-m``/``-k`` selection.

route-timeout (suites/test_requests.py) reads its TTFT and gaps from the longest allowed stream:
it now runs alone, after the gate's side-by-side probes have their answers. Shown on the fake's
own record of what it served (``FakeVLLM.state.requests``: each request's arrival and end on the
server's clock): under the gate alone and under ``-m "streaming or requests"`` with the streaming
gate's probes in the same run, no other generation was in flight while that stream ran, and the
verdict is the same."""

from __future__ import annotations

import pytest

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
LONGEST = 64  # the profile's max_tokens_cap: the route-timeout stream's max_tokens


def _beside(fake):
    """The route-timeout stream's record and the generations that overlapped it on the server."""
    reqs = fake.state.requests
    longest = [r for r in reqs if r.stream and r.endpoint == "completions" and r.max_tokens == LONGEST
               and r.completion_tokens == LONGEST]
    assert longest, [(r.endpoint, r.stream, r.max_tokens, r.completion_tokens, r.status, r.disconnected) for r in reqs
                     if r.stream]
    rt = longest[-1]  # the last one sent: the gate's own stream (the others are chunk/other probes)
    end = rt.t_done if rt.t_done is not None else float("inf")
    return rt, [r for r in reqs if r is not rt and r.t_received < end and (r.t_done or float("inf")) > rt.t_received]


@pytest.mark.parametrize("suites,select", [
    (["suites/test_requests.py"], ["-k", "route-timeout"]),
    (["suites/test_streaming.py", "suites/test_requests.py"], ["-m", "streaming or requests"]),
])
def test_the_route_timeout_stream_runs_alone_whatever_is_selected(pytester, suites, select):
    with FakeVLLM(FakeConfig(max_tokens_cap=LONGEST, itl_s=0.002)) as fake:
        _, summary, gates = run_suites(pytester, fake.url, *select, suites=suites, profile=PROFILE)
        rt, beside = _beside(fake)
    g = gates["fake-vllm/requests/route-timeout"]
    assert g["status"] == "PASS", g["message"]
    assert not beside, [(r.endpoint, r.stream, r.max_tokens, r.t_received - rt.t_received) for r in beside]
    assert g["evidence"]["beside"]["idle"] is True, g["evidence"]["beside"]  # measured on the server, and stated
    live = g["evidence"]["requests/route-timeout/live"]["evidence"]
    assert live["beside_probes"] == 0, live  # what the verdict states ("timed alone: no other probe in flight")
    if select[0] == "-m":
        assert any(k.startswith("fake-vllm/streaming/") for k in gates)  # the other gate did run in this run
