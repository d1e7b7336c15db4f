"""Samplers: each names its source and coverage, counts its reads, and never raises on a failed
read. Process trees are real child processes; /metrics and Prometheus go through
httpx.MockTransport; NVML is a fake module (and the real pynvml where no GPU is: unavailable)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest

from kvgate.soak.sampling import (
    MetricsMemorySampler,
    NvmlSampler,
    ProcessTreeSampler,
    PrometheusSampler,
    SamplingLoop,
    SelfSampler,
    ServerMetricsSampler,
    describe,
)
from tests.fakes.soak_fakes import FakeNVML, run_virtual

METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.5e+09
"""

# a parent that allocates 40 MB and starts a child that allocates 30 MB, then both wait
TREE = """
import subprocess, sys, time
a = bytearray(40 * 10**6)
child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(30 * 10**6); print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE)
child.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == b"ready"
        yield p
    finally:
        import os
        import signal

        os.killpg(p.pid, signal.SIGKILL)
        p.wait(5)


@pytest.mark.asyncio
async def test_process_tree_covers_every_descendant_and_counts_pss_plus_swap(tree):
    s = ProcessTreeSampler([tree.pid])
    r = await s.sample()
    assert r["processes"] == 2
    assert r["uss"] >= 70e6 and r["rss"] >= r["uss"]     # both allocations, in two processes
    assert r["memory"] == pytest.approx(r["pss"] + r["swap"])
    assert r["cpu_s"] > 0  # the tree's user + system seconds: that it worked while its memory was read
    assert s.quantity == "PSS + swap" and "all its descendants" in s.covers and str(tree.pid) in s.source
    import os
    import signal

    os.killpg(tree.pid, signal.SIGKILL)
    tree.wait(5)
    for _ in range(50):  # the child is reaped by init a moment later
        gone = await s.sample()
        if gone["memory"] is None:
            break
        time.sleep(0.02)
    assert gone["memory"] is None and "no process of the tree" in s.last_error
    assert describe(s)["reads"] == s.reads >= 2 and s.errors >= 1


def test_process_tree_falls_back_to_rss_when_smaps_is_denied():
    import psutil

    class Denied:
        pid = 1

        def is_running(self):
            return True

        def children(self, recursive=False):
            return []

        def memory_full_info(self):
            raise psutil.AccessDenied(1)

        def memory_info(self):
            return type("M", (), {"rss": 123e6})()

        def cpu_times(self):
            raise psutil.AccessDenied(1)

    class FakePsutil:
        NoSuchProcess, ZombieProcess, AccessDenied = psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied

        @staticmethod
        def Process(pid):
            return Denied()

    s = ProcessTreeSampler([1], psutil_mod=FakePsutil)
    r = s.read()
    assert r["memory"] == 123e6 and r["swap"] is None and s.quantity.startswith("RSS (smaps denied")
    assert r["cpu_s"] is None  # not readable: nothing shows the tree worked (kvgate.gates.soak.working_s)


@pytest.mark.asyncio
async def test_self_sampler_reads_this_process():
    s = SelfSampler()
    r = await s.sample()
    assert r["rss"] > 10e6 and "this process" in s.source


def metrics_transport(status=200, body=METRICS, seen=None):
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, text=body)

    return httpx.MockTransport(handler)


@pytest.mark.asyncio
async def test_metrics_sampler_reads_vllm_gauges_and_the_api_server_rss():
    seen: list[httpx.Request] = []
    m = ServerMetricsSampler("http://127.0.0.1:9", headers={"Host": "x"}, transport=metrics_transport(seen=seen))
    mem = MetricsMemorySampler(m)
    r = await m.sample()
    assert r == {"running": 3.0, "waiting": 1.0, "kv_usage": 0.5, "preemptions": 7.0,
                 "process_resident_memory_bytes": 1.5e9}
    assert (await mem.sample())["memory"] == 1.5e9
    assert "API-server process only" in mem.covers and "engine core and workers" in mem.covers
    assert len(seen) == 1 and seen[0].url.path == "/metrics" and seen[0].headers["host"] == "x"
    assert m.reads == 1 and mem.reads == 1  # the memory sampler made no request of its own
    await m.aclose()


@pytest.mark.asyncio
async def test_metrics_memory_is_none_with_a_reason_when_the_gauge_is_absent_or_metrics_fail():
    m = ServerMetricsSampler("http://127.0.0.1:9", transport=metrics_transport(body=METRICS.split("# TYPE process")[0]))
    mem = MetricsMemorySampler(m)
    await m.sample()
    assert (await mem.sample())["memory"] is None and mem.last_error == "/metrics has no process_resident_memory_bytes"
    await m.aclose()
    m404 = ServerMetricsSampler("http://127.0.0.1:9", transport=metrics_transport(404, "nope"))
    mem404 = MetricsMemorySampler(m404)
    r = await m404.sample()
    assert all(v is None for v in r.values()) and m404.errors == 1 and m404.available is False
    await mem404.sample()
    assert mem404.last_error == "GET /metrics answered 404"
    await m404.aclose()


@pytest.mark.asyncio
async def test_metrics_sampler_survives_a_refused_connection():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    m = ServerMetricsSampler("http://127.0.0.1:9", transport=httpx.MockTransport(refuse))
    r = await m.sample()
    assert r["running"] is None and m.errors == 1 and "ConnectError" in m.last_error
    await m.aclose()


@pytest.mark.asyncio
async def test_prometheus_query_sums_the_vector_and_sends_the_token():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"pod": "a"}, "value": [1700000000.0, "1000000000"]},
            {"metric": {"pod": "b"}, "value": [1700000000.0, "500000000"]}]}})

    p = PrometheusSampler("http://127.0.0.1:9090/", "sum(container_memory_working_set_bytes{pod=~'x-.*'})",
                          "working set of the predictor pods", token="s3cret", transport=httpx.MockTransport(handler))
    assert (await p.sample()) == {"memory": 1.5e9}
    q = seen[0]
    assert q.url.path == "/api/v1/query" and q.url.params["query"].startswith("sum(container_memory")
    assert q.headers["authorization"] == "Bearer s3cret"
    assert p.covers == "working set of the predictor pods" and "s3cret" not in p.source
    await p.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("status,body,why", [
    (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "returned no series"),
    (400, {"status": "error", "error": "parse error at char 5"}, "parse error"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "x"]}]}}, "not a vector"),
])
async def test_prometheus_failures_are_none_with_the_reason(status, body, why):
    p = PrometheusSampler("http://127.0.0.1:9090", "q", "c",
                          transport=httpx.MockTransport(lambda r: httpx.Response(status, json=body)))
    assert (await p.sample()) == {"memory": None} and why in p.last_error and p.errors == 1
    await p.aclose()


@pytest.mark.asyncio
async def test_nvml_sampler_tracks_used_total_and_peak_per_device():
    gib = 2**30
    nv = FakeNVML(totals=[80 * gib, 80 * gib], used=[[gib, 40 * gib, 70 * gib, 50 * gib], [10 * gib]],  # 1st: at init
                  names=["H100", "H100"])
    s = NvmlSampler(nv)
    assert s.available and s.reason is None and "GPU0 H100, GPU1 H100" in s.source
    readings = [await s.sample() for _ in range(3)]
    assert readings[1]["gpu0_used"] == 70 * gib and readings[1]["gpu0_total"] == 80 * gib
    assert readings[1]["gpu_used_max_frac"] == pytest.approx(70 / 80)
    assert [d.peak_used for d in s.devices] == [70 * gib, 10 * gib] and s.devices[0].last_used == 50 * gib
    await s.aclose()
    assert nv.calls == ["init", "shutdown"] and (await s.sample()) == {}


def test_nvml_unavailable_says_why():
    s = NvmlSampler(FakeNVML(init_error="NVML Shared Library Not Found"))
    assert not s.available and "NVML Shared Library Not Found" in s.reason
    s0 = NvmlSampler(FakeNVML(totals=[], used=[], names=[]))
    assert not s0.available and s0.reason == "NVML reports no GPU on this machine"


def test_real_pynvml_without_a_gpu_is_unavailable_with_a_reason():
    pytest.importorskip("pynvml")
    s = NvmlSampler()
    if s.available:  # a GPU machine: the real devices are listed
        assert s.devices and all(d.total > 0 for d in s.devices)
        asyncio.run(s.aclose())
    else:
        assert s.reason and "NVML" in s.reason


def test_sampling_loop_keeps_a_fixed_period_and_is_bounded():
    class Slow:
        name, source, covers = "slow", "test", "test"
        reads = errors = 0
        last_error = None

        def __init__(self, clock):
            self.clock = clock

        async def sample(self):
            self.reads += 1
            await asyncio.sleep(0.3)  # a slow read delays its tick, not the schedule
            return {"t": self.clock()}

        async def aclose(self):
            return None

    async def go(clock):
        ticks = []
        s = Slow(clock)
        loop = SamplingLoop([s], 1.0, lambda t, r: ticks.append((t, r["slow"]["t"])), clock=clock, max_ticks=1000)
        n = await loop.run(until=10.0)
        capped = SamplingLoop([s], 1.0, lambda t, r: None, clock=clock, max_ticks=3)
        m = await capped.run(until=clock() + 100.0)
        return n, ticks, m

    n, ticks, m = run_virtual(go)
    assert n == 10 and [round(t, 3) for t, _ in ticks] == [round(k + 0.3, 3) for k in range(10)]
    assert m == 3
