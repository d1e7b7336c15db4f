"""Host contention: the share arithmetic on a fake psutil (no sleeping), the latency verdicts it
turns INVALID (never FAIL) or leaves to the SLO with the share in the evidence, "not measured" for a
server kvgate did not launch, and one real busy loop pinned to a CPU seen by the real sampler."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace as NS

import pytest

from kvgate.gates.load import interference_verdict, latency_verdict
from kvgate.host.contention import ContentionSampler, HostContention, Unmeasured, for_endpoint
from kvgate.http.client import Endpoint
from kvgate.http.metrics import MetricsSampler, MetricsTrace
from kvgate.load import LoadResult
from kvgate.load.scenarios import LoadObservation
from kvgate.verdict import Status
from tests.test_gates_load import PROFILE, rec, tagged


class NoSuchProcess(Exception):
    pass


class AccessDenied(Exception):
    pass


class ZombieProcess(NoSuchProcess):
    pass


class FakeProc:
    """A process: ``affinity`` (CPUs), ``threads`` {tid: [cpu seconds, CPU it is on]}."""

    def __init__(self, ps, pid, affinity, threads, children=()):
        self.ps, self.pid, self.affinity, self.thread_map, self.kids = ps, pid, affinity, threads, list(children)

    def is_running(self):
        return True

    def children(self, recursive=False):
        return [self.ps.procs[k] for k in self.kids]

    def cpu_affinity(self):
        return list(self.affinity)

    def cpu_times(self):
        return NS(user=sum(t for t, _ in self.thread_map.values()), system=0.0, children_user=0.0, children_system=0.0)

    def threads(self):
        return [NS(id=tid, user_time=t, system_time=0.0) for tid, (t, _) in self.thread_map.items()]

    def cpu_num(self):  # psutil.Process(tid) of a main thread is the process itself
        return FakeThread(self, self.pid).cpu_num()


class FakeThread:
    def __init__(self, proc, tid):
        self.proc, self.tid = proc, tid

    def cpu_num(self):
        if self.proc.ps.no_cpu_num:
            raise AccessDenied("cpu_num")
        return self.proc.thread_map[self.tid][1]


class FakePsutil:
    """psutil's surface the sampler uses: ``Process``, ``cpu_times(percpu=True)``, the exceptions."""

    NoSuchProcess, AccessDenied, ZombieProcess = NoSuchProcess, AccessDenied, ZombieProcess

    def __init__(self, ncpu=2):
        self.busy = [0.0] * ncpu  # user seconds per CPU
        self.procs: dict[int, FakeProc] = {}
        self.denied: set[int] = set()
        self.no_cpu_num = False

    def add(self, pid, affinity, threads, children=()):
        self.procs[pid] = FakeProc(self, pid, affinity, threads, children)
        return self.procs[pid]

    def Process(self, pid):  # noqa: N802 -- psutil's name
        if pid in self.denied:
            raise AccessDenied(f"pid {pid}")
        if pid in self.procs:
            return self.procs[pid]
        for p in self.procs.values():
            if pid in p.thread_map:
                return FakeThread(p, pid)
        raise NoSuchProcess(pid)

    def cpu_times(self, percpu=False):
        return [NS(user=u, nice=0.0, system=0.0, steal=0.0) for u in self.busy]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def host(ps, clock, server=100, own=1):
    return ContentionSampler([server], psutil_mod=ps, clock=clock, own_pid=own, interval_s=0,
                             loadavg=lambda: (3, 1.5))


def contended_window(server_cpus=(0,)):
    """2 s on 2 CPUs: CPU 0 busy 2.0 CPU-s (0.6 the server's), CPU 1 busy 1.0 (0.8 kvgate's)."""
    ps, clock = FakePsutil(2), Clock()
    srv = ps.add(100, server_cpus, {100: [5.0, 0]})
    me = ps.add(1, (0, 1), {1: [3.0, 1]})
    s = host(ps, clock).start()
    clock.t += 2.0
    ps.busy[0] += 2.0
    ps.busy[1] += 1.0
    srv.thread_map[100][0] += 0.6
    me.thread_map[1][0] += 0.8
    return s.stop()


def test_other_processes_on_the_servers_cpu_are_the_share_kvgate_and_the_server_are_not():
    h = contended_window()
    assert h.measured and h.cpus == (0,)
    assert h.share == pytest.approx(0.7)  # (2.0 - 0.6 server - 0 kvgate: it ran on CPU 1) / 2 s
    assert h.server_total_s == pytest.approx(0.6) and h.kvgate_total_s == pytest.approx(0.8)
    assert "70% of the server's CPUs (CPU 0) went to other processes over 2.0 s (CPU 0: 70%)" in h.text()
    assert "run queue up to 3" in h.text()


def test_per_cpu_shares_over_a_server_on_two_cpus():
    h = contended_window(server_cpus=(0, 1))
    assert h.per_cpu == {0: pytest.approx(0.7), 1: pytest.approx(0.1)}  # CPU 1: 1.0 - 0.8 kvgate
    assert h.share == pytest.approx(0.4)  # (1.4 + 0.2) / (2 s x 2 CPUs)
    assert h.cpus_text() == "CPU 0: 70%, CPU 1: 10%"


def test_kvgate_time_it_cannot_place_is_charged_to_the_servers_cpus():
    ps, clock = FakePsutil(2), Clock()
    ps.add(100, (0,), {100: [5.0, 0]})
    me = ps.add(1, (0, 1), {1: [3.0, 1]})
    ps.no_cpu_num = True
    s = host(ps, clock).start()
    clock.t += 2.0
    ps.busy[0] += 2.0
    me.thread_map[1][0] += 0.8
    h = s.stop()
    assert h.share == pytest.approx(0.6)  # (2.0 - 0.8) / 2: a lower bound, never a false INVALID
    assert "not placeable" in h.attribution


def test_no_access_to_the_server_pid_is_not_measured_with_the_reason():
    ps = FakePsutil(2)
    ps.add(1, (0, 1), {1: [3.0, 1]})
    ps.denied.add(100)
    h = host(ps, Clock()).start().stop()
    assert not h.measured and h.share is None
    assert h.text().startswith("host contention not measured: no psutil access to the server's process (pid 100)")
    gone = host(FakePsutil(2), Clock(), server=999).start().stop()
    assert gone.text() == "host contention not measured: the server's process (pid 999) is not running"


def test_an_endpoint_kvgate_did_not_launch_is_not_measured():
    h = for_endpoint(Endpoint("http://127.0.0.1:1")).start().stop()
    assert h.text() == ("host contention not measured: the server was not launched by kvgate (--endpoint): its "
                        "processes and CPUs are not visible to kvgate")
    assert "watches no local process tree" in for_endpoint(Endpoint("http://x", managed=True)).stop().text()
    assert isinstance(for_endpoint(Endpoint("http://x", managed=True, server_pids=(os.getpid(),))), ContentionSampler)


def test_the_metrics_sampler_carries_what_ran_alongside_it():
    sampler = MetricsSampler(lambda: None, interval_s=5.0, alongside=Unmeasured("test"))
    with sampler:
        pass
    assert sampler.trace.host.reason == "test"


def latency_obs(h):
    result = LoadResult("closed", [rec(i) for i in range(60)], 60, 0.2, 60.0)  # 60: a p95 PASS is possible (59)
    return LoadObservation("latency (chat)", result, MetricsTrace(samples=[], host=h), 16, 8, 2)


def test_a_contended_window_is_invalid_naming_the_share_and_cpu_never_fail():
    slow = latency_obs(contended_window())
    for r in slow.result.records:  # a TTFT far over the 500 ms SLO: still not judged
        r.first_token_s = 3.0
    v = latency_verdict(slow, PROFILE)
    assert v.status is Status.INVALID, v.message
    assert v.message.startswith("contended host: 70% of the server's CPUs went to other processes (CPU 0: 70%) "
                                "during the measurement over 2.0 s (limit 25%, limits.host_contention_max) -> INVALID")
    assert "(latency (chat): TTFT p95 3,000 ms over 60 requests measured, not judged)" in v.message
    assert v.measured == pytest.approx(0.7) and v.limit == 0.25
    assert "; would have been FAIL: " in v.message and v.evidence["verdict_if_judged"]["status"] == "FAIL"
    assert v.evidence["host_contention"]["latency (chat)"]["share"] == pytest.approx(0.7)


def test_a_pass_on_a_contended_host_stands_saying_so():
    # other processes can only have slowed the server: a bound that held anyway is a PASS
    v = latency_verdict(latency_obs(contended_window()), PROFILE)
    assert v.status is Status.PASS, v.message
    assert v.message.endswith("measured on a contended host (70% of the server's CPUs went to other processes, "
                              "limit 25%): the bound held anyway -> PASS")


def test_a_raised_limit_lets_the_slo_decide_and_the_share_is_in_the_evidence():
    loose = PROFILE.model_copy(update={"limits": PROFILE.limits.model_copy(update={"host_contention_max": 0.8})})
    v = latency_verdict(latency_obs(contended_window()), loose)
    assert v.status is Status.PASS, v.message
    ev = v.evidence["host_contention"]["latency (chat)"]
    assert ev["share"] == pytest.approx(0.7) and ev["per_cpu"] == {"0": pytest.approx(0.7)}


def test_a_quiet_window_passes_carrying_its_share():
    ps, clock = FakePsutil(2), Clock()
    srv = ps.add(100, (0,), {100: [5.0, 0]})
    ps.add(1, (0, 1), {1: [3.0, 1]})
    s = host(ps, clock).start()
    clock.t += 2.0
    ps.busy[0] += 1.7
    srv.thread_map[100][0] += 1.6
    v = latency_verdict(latency_obs(s.stop()), PROFILE)
    assert v.status is Status.PASS, v.message
    assert v.evidence["host_contention"]["latency (chat)"]["share"] == pytest.approx(0.05)


def test_not_measured_is_evidence_not_invalid():
    v = latency_verdict(latency_obs(for_endpoint(Endpoint("http://127.0.0.1:1")).stop()), PROFILE)
    assert v.status is Status.PASS
    assert v.evidence["host_contention"]["latency (chat)"]["text"].startswith("host contention not measured: "
                                                                                "the server was not launched by kvgate")


def test_interference_is_invalid_when_either_window_was_contended():
    loose = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": 5000})})
    quiet = HostContention(True, None, 2.0, (0,), {0: 1.0}, {0: 1.0}, {0: 0.0}, {0: 0.0})
    alone = LoadObservation("short alone", LoadResult("closed", [tagged(i, "short", 0.0, 0.05, 0.1) for i in range(4)],
                                                      4, 0.4, 60.0), MetricsTrace(samples=[], host=quiet), 16, 8, 1)
    records = [tagged(0, "long", 0.0, 0.4, 1.0), *(tagged(1 + j, "short", 0.01, 3.0, 3.1) for j in range(4))]
    mixed = LoadObservation("mixed", LoadResult("open", records, 5, 3.1, 60.0),
                            MetricsTrace(samples=[], host=contended_window()), 16, 8, 5,
                            extra={"long_per_wave": 1, "long_prompt_tokens": 200, "waves": 1})
    v = interference_verdict(alone, mixed, loose)
    assert v.status is Status.INVALID and "contended host: 70%" in v.message and "(mixed: TTFT p95" in v.message
    ok = interference_verdict(alone, LoadObservation("mixed", mixed.result, MetricsTrace(samples=[], host=quiet),
                                                     16, 8, 5, extra=mixed.extra), loose)
    assert ok.status is not Status.INVALID
    assert set(ok.evidence["host_contention"]) == {"short alone", "mixed"}


BUSY_S = 1.5  # the processes end by themselves after this; the window is 1.0 s inside it


def _spin(cpu):
    return subprocess.Popen([sys.executable, "-c", f"import time\nt = time.monotonic()\n"
                             f"while time.monotonic() - t < {BUSY_S}: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform (Linux only)")
def test_the_real_sampler_sees_a_busy_loop_pinned_to_the_servers_cpu_and_not_the_server():
    """A spinning stand-in 'server' and one busy loop, both pinned to one CPU: the server's own
    time is not counted as contention, the loop's is. Alone on the CPU the loop would take half of
    it (CFS, equal nice); the bound is 30% because the machine is shared with other test runs --
    their work on that CPU counts as other processes too, so the share can only rise, and the
    server may get less than half -- and the server must have run at all (its time subtracted).
    Measured here (2 cores, load average 9): 50% with no extra loop (other helpers' work), 78%
    with one, 87% with two. ~1.3 s wall."""
    cpu = min(os.sched_getaffinity(0))
    server, loop = _spin(cpu), _spin(cpu)
    try:
        time.sleep(0.2)  # both interpreters up: the window sees them spinning
        s = ContentionSampler([server.pid]).start()
        time.sleep(1.0)
        h = s.stop()
    finally:
        for p in (loop, server):
            p.kill()
            p.wait(timeout=10)
    assert h.measured and h.cpus == (cpu,), h.text()
    assert h.per_cpu[cpu] > 0.3, h.text()
    assert h.server_total_s > 0.05, h.text()  # the server's own spinning is not "other processes"
    assert h.busy_s[cpu] == pytest.approx(h.server_s[cpu] + h.kvgate_s[cpu] + h.other_s[cpu], abs=0.05)
    assert h.invalid_verdict("latency/slo", 0.25) is not None


def test_pools_isolation_is_invalid_on_a_contended_window_and_carries_the_share():
    from kvgate.gates.pools import isolation_verdict
    spec = NS(isolation=NS(ttft_ratio_max=3.0))  # what the verdict reads of pools:
    alone = LoadObservation("short alone", LoadResult("closed", [tagged(i, "short", 0.0, 0.05, 0.1) for i in range(4)],
                                                      4, 0.4, 60.0), MetricsTrace(samples=[], host=contended_window()),
                            16, 8, 1)
    mixed = LoadObservation("mixed", alone.result, MetricsTrace(samples=[]), 16, 8, 5, extra={"long_per_wave": 1})
    v = isolation_verdict(alone, mixed, spec, PROFILE, 0.05)
    assert v.status is Status.INVALID and v.message.startswith("contended host: 70%"), v.message
    quiet = LoadObservation("short alone", alone.result, MetricsTrace(samples=[]), 16, 8, 1)
    ok = isolation_verdict(quiet, mixed, spec, PROFILE, 0.05)
    assert ok.status is not Status.INVALID
    assert ok.evidence["host_contention"]["mixed"]["text"].startswith("host contention not measured")
