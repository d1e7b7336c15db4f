"""deployment/memory-peak (issue 49): the container's memory limit against the server's memory peak
measured in the run -- the launcher's model-load peak of the process tree (kvgate.host.peak, sampled
once per readiness poll), the case's own reading (kvgate.run.memory) -- with limits.memory_peak_margin.
Both ways on the pure verdict (the recorded KServe object's 32Gi limit), on a real process tree (this
process), on the embedded launcher's wait loop, and through the plugin with --isvc against the fake
vLLM, whose only visible memory is the API server's RSS (a lower bound: it FAILs a limit, never
PASSes one)."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from kvgate.gates.deployment import MEMORY, memory_peak_verdict
from kvgate.host.peak import GiB, MemoryPeak, PeakWatch
from kvgate.http.client import Endpoint, KvClient
from kvgate.launch import kserve
from kvgate.profile.models import load_profile
from kvgate.run.memory import observe_memory, tree_reader
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary
from .test_kserve import FakeApi

pytest_plugins = ["pytester"]
SPEC = yaml.safe_load((REPO / "tests" / "data" / "kserve" / "spec-serverless.yaml").read_text())  # limits 32Gi


@pytest.fixture(scope="module")
def profile():
    return load_profile("kserve-vllm-4k")


def with_limits(profile, **limits):
    return profile.model_copy(update={"limits": profile.limits.model_copy(update=limits)})


def load_peak(gib: float, **kw) -> MemoryPeak:
    return MemoryPeak(**{"bytes": int(gib * GiB), "quantity": "PSS + swap", "rss_bytes": int(gib * GiB) + 1,
                         "phase": "during model load (launch to /health 200)", "at_s": 14.2, "samples": 57,
                         "processes": 2, "source": "psutil, process tree of pid 7", **kw})


# ---------------------------------------------------------------------------- the peak watch
def test_peak_watch_keeps_the_largest_reading_bounded_and_never_raises():
    t = [100.0]
    readings = iter([{"memory": 1e9, "rss": 2e9, "processes": 2}, {"memory": 3e9, "rss": 4e9, "processes": 3},
                     RuntimeError("gone"), {"memory": None, "processes": 0}, {"memory": 2e9, "processes": 3}])

    def read():
        t[0] += 0.25
        r = next(readings)
        if isinstance(r, Exception):
            raise r
        return r

    w = PeakWatch(read, phase="during model load", source="fake", clock=lambda: t[0], max_samples=4, t0=100.0,
                  min_interval_s=0.2)
    for _ in range(6):
        w.sample()
    p = w.peak()
    assert (p.bytes, p.rss_bytes, p.processes, p.at_s, p.samples) == (3_000_000_000, 4_000_000_000, 3, 0.5, 4)
    assert w.errors == 2 and w.last_error == "no process of the tree alive"  # the RuntimeError, then the dead tree
    assert "2.79 GiB (PSS + swap of 3 processes, during model load, 0.5 s in, peak of 4 samples)" == p.words()
    assert PeakWatch(lambda: {"memory": None}, phase="x", source="y").peak() is None
    calls, now = [], [0.0]
    w = PeakWatch(lambda: calls.append(1) or {"memory": 1.0}, phase="x", source="y", clock=lambda: now[0])
    for i in range(10):  # ten polls 0.25 s apart: one reading a second (MIN_INTERVAL_S), the forced one at the end
        now[0] = i * 0.25
        w.sample()
    w.sample(force=True)
    assert len(calls) == w.samples == 4  # t = 0, 1.0, 2.0, then forced


# ---------------------------------------------------------------------------- the verdict, both ways
def test_limit_below_the_measured_peak_plus_margin_fails_naming_peak_limit_margin_and_when(profile):
    v = memory_peak_verdict([load_peak(28.0)], SPEC, profile)  # 28 GiB x 1.2 = 33.6 GiB > 32Gi
    assert v.status.value == "FAIL" and v.gate == MEMORY, v.message
    assert v.message.startswith("container memory limit 32.00 GiB (spec.predictor.model.resources.limits.memory 32Gi "
                                "(InferenceService models/llama)) < measured peak 28.00 GiB (PSS + swap of 2 processes, "
                                "during model load (launch to /health 200), 14.2 s in, peak of 57 samples) + 20% "
                                "margin (limits.memory_peak_margin) = 33.60 GiB -> FAIL"), v.message
    assert v.measured == int(28 * GiB) and v.limit == 32 * GiB and v.evidence["peak_phase"].startswith("during model")


def test_limit_above_the_peak_plus_margin_passes_with_the_headroom(profile):
    v = memory_peak_verdict([load_peak(20.0), load_peak(21.0, phase="when deployment/memory-peak ran", samples=1)],
                            SPEC, profile)
    assert v.status.value == "PASS", v.message
    assert "measured peak 21.00 GiB (PSS + swap of 2 processes, when deployment/memory-peak ran, one reading)" in v.message
    assert "headroom 11.00 GiB (52% above the peak) -> PASS" in v.message
    assert memory_peak_verdict([load_peak(27.0)], SPEC, with_limits(profile, memory_peak_margin=0.1)).status.value \
        == "PASS"  # 27 x 1.1 = 29.7 GiB: the margin is the profile's


def test_without_isvc_the_peak_is_reported_or_judged_against_the_profiles_limit(profile):
    v = memory_peak_verdict([load_peak(3.5)], None, profile)
    assert v.status.value == "SKIP" and v.measured == int(3.5 * GiB), v.message
    assert v.message == ("server memory peak 3.50 GiB (PSS + swap of 2 processes, during model load (launch to /health "
                         "200), 14.2 s in, peak of 57 samples); no container memory limit to compare (no --isvc and the "
                         "profile declares no limits.container_memory_limit_gib) -> SKIP")
    declared = with_limits(profile, container_memory_limit_gib=4.0)
    assert memory_peak_verdict([load_peak(3.5)], None, declared).status.value == "FAIL"  # 4.2 GiB needed
    v = memory_peak_verdict([load_peak(3.0)], None, declared)
    assert v.status.value == "PASS" and "(limits.container_memory_limit_gib 4 GiB (the profile; no --isvc))" in v.message


def test_the_api_servers_rss_alone_fails_a_limit_but_never_passes_one(profile):
    api = MemoryPeak(int(30 * GiB), "RSS of the API server process", None, "when deployment/memory-peak ran", 0.0, 1, 0,
                     "GET /metrics process_resident_memory_bytes", lower_bound=True)
    v = memory_peak_verdict([api], SPEC, profile)
    assert v.status.value == "FAIL" and "the API server alone: the engine core and workers need more -> FAIL" in v.message
    small = MemoryPeak(int(1 * GiB), *[getattr(api, f) for f in ("quantity", "rss_bytes", "phase", "at_s", "samples",
                                                                 "processes", "source")], lower_bound=True)
    v = memory_peak_verdict([small], SPEC, profile)
    assert v.status.value == "SKIP" and v.message.startswith("only the API server's memory is visible (1.00 GiB"), v.message
    v = memory_peak_verdict([], SPEC, profile, "the server's processes are not on this machine")
    assert v.status.value == "SKIP" and "no memory peak of the server measured (the server's processes" in v.message


def test_an_unset_or_unreadable_limit(profile):
    obj = yaml.safe_load(yaml.safe_dump(SPEC))
    obj["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] = "lots"
    v = memory_peak_verdict([load_peak(3.0)], obj, profile)
    assert v.status.value == "FAIL" and "'lots' is not a Kubernetes quantity" in v.message
    del obj["spec"]["predictor"]["model"]["resources"]["limits"]["memory"]
    v = memory_peak_verdict([load_peak(3.0)], obj, profile)
    assert v.status.value == "SKIP" and "resources.limits.memory is unset" in v.message


# ---------------------------------------------------------------------------- measured on a real tree
def test_observe_memory_reads_a_local_tree_and_the_verdict_holds_a_limit_to_it(profile):
    with FakeVLLM(FakeConfig()) as fake:
        ep = Endpoint(base_url=fake.base_url, server_pids=(os.getpid(),), load_peak=load_peak(0.001))
        with KvClient(ep) as client:
            peaks, unseen = observe_memory(ep, client)
        assert fake.state.metrics_scrapes == 0  # a local tree: no /metrics scrape
    own = peaks[-1]
    assert unseen == "" and len(peaks) == 2 and own.samples == 1 and own.processes >= 1 and not own.lower_bound
    assert own.bytes > 20 << 20 and own.phase.startswith("when deployment/memory-peak ran")  # this pytest process
    fits = with_limits(profile, container_memory_limit_gib=own.bytes * 2 / GiB)
    tight = with_limits(profile, container_memory_limit_gib=own.bytes * 1.1 / GiB)
    assert memory_peak_verdict(peaks, None, fits).status.value == "PASS"
    v = memory_peak_verdict(peaks, None, tight)
    assert v.status.value == "FAIL" and v.measured == own.bytes, v.message  # the larger of the two readings


def test_observe_memory_of_a_remote_server_is_the_api_servers_rss_a_lower_bound():
    with FakeVLLM(FakeConfig(base_rss_bytes=700 << 20)) as fake:
        ep = Endpoint(base_url=fake.base_url)
        with KvClient(ep) as client:
            peaks, unseen = observe_memory(ep, client)
    assert [(p.bytes, p.lower_bound, p.source) for p in peaks] == [
        (700 << 20, True, "GET /metrics process_resident_memory_bytes")]
    assert unseen.startswith("the server's processes are not on this machine")


def test_the_embedded_launcher_samples_its_tree_while_it_waits(tmp_path, monkeypatch):
    """EmbeddedServer._wait: one tree reading per readiness poll (a real child process as the 'server')."""
    from kvgate.launch import local

    polls = []

    def wait_health(url, proc, deadline, sleep, poll_s, exited, late, clock):
        for _ in range(3):
            sleep(poll_s)
            polls.append(poll_s)

    monkeypatch.setattr(local, "wait_health", wait_health)
    server = local.EmbeddedServer(load_profile("tiny-cpu"), tmp_path, tmp_path / "log", sleep=lambda s: None,
                                  python=sys.executable, reserve_client_cpu=False)
    server.tree_reader = tree_reader  # as kvgate.run.lifecycle._build sets it
    monkeypatch.setattr(local, "render_command", lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(30)"])
    server.launch()
    try:
        server._wait()  # the launcher's own wait (wait_ready then times ready -> serving: kvgate.http.readiness)
    finally:
        server.stop(grace_s=0.5)
    p = server.load_peak
    assert len(polls) == 3 and p is not None and p.samples == 2 and p.processes == 1 and p.bytes > 1 << 20  # 1/s + at ready
    assert p.phase == "during model load (launch to /health 200)" and "embedded vLLM" in p.source


def test_the_docker_launcher_samples_the_containers_tree_on_this_host(write_profile, tmp_path):
    """DockerLauncher._wait reads the container's State.Pid (here: this process) once per poll."""
    from .test_launch_docker import FakeContainer, launcher, profile_with

    box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64))
    dock = launcher(profile_with(write_profile, "  mode: docker\n  image: local/x\n"), tmp_path, box)
    dock.tree_reader = tree_reader
    dock.launch()
    box._container.attrs["State"]["Pid"] = os.getpid()
    try:
        dock._wait()
    finally:
        dock.stop()
    p = dock.load_peak
    assert p is not None and p.samples >= 2 and p.bytes > 20 << 20 and "container 0123456789ab" in p.source
    assert p.phase == "during model load (container start to the first generation)"
    box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64))  # no State.Pid: nothing sampled
    dock = launcher(profile_with(write_profile, "  mode: docker\n  image: local/x\n"), tmp_path, box)
    dock.tree_reader = tree_reader
    try:
        dock.wait_ready()
    finally:
        dock.stop()
    assert dock.load_peak is None


# ---------------------------------------------------------------------------- through the plugin (--isvc)
def run_memory(pytester, monkeypatch, fake):
    api = FakeApi([SPEC])
    monkeypatch.setattr(kserve, "custom_objects_api", lambda: api)
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--kvgate-reports={reports}", "--profile=kserve-vllm-4k", "--isvc", "llama", "--namespace", "models",
        "--ingress", fake.base_url, str(REPO / "suites" / "test_deployment.py") + "::test_memory_limit_holds_the_measured_peak")
    return result, {g["id"]: g for g in read_summary(reports)["gates"]}["kserve-vllm-4k/deployment/memory-peak"]


def test_isvc_limit_below_what_the_fake_api_server_alone_holds_fails_through_the_plugin(pytester, monkeypatch):
    with FakeVLLM(FakeConfig(served_name="llama-3-1-8b-instruct", max_model_len=4096, base_rss_bytes=30 * GiB)) as fake:
        result, gate = run_memory(pytester, monkeypatch, fake)
    assert gate["status"] == "FAIL" and result.ret == 1, gate["message"]
    assert gate["message"].startswith("container memory limit 32.00 GiB (spec.predictor.model.resources.limits.memory 32Gi")
    assert "measured peak 30.00 GiB (RSS of the API server process, when deployment/memory-peak ran" in gate["message"]


def test_isvc_healthy_fake_skips_saying_only_the_api_server_is_visible(pytester, monkeypatch):
    with FakeVLLM(FakeConfig(served_name="llama-3-1-8b-instruct", max_model_len=4096)) as fake:
        result, gate = run_memory(pytester, monkeypatch, fake)
    assert gate["status"] == "SKIP" and result.ret == 0, gate["message"]
    assert gate["message"].startswith("only the API server's memory is visible (0.50 GiB") and "32.00 GiB" in gate["message"]
