"""Host contention: how much of the CPUs a launched server may run on went to other processes
while a latency measurement ran.

A contended host is not a slow deployment: the main job on the embedded vLLM, run while the same
machine ran a fresh clone's CI and a compiler, FAILed ``latency/interference`` at 3,104 ms
short-request TTFT p95 where a quiet machine measures 55-841 ms (issue 24). kvgate owns the
process tree of a server it launched (the embedded vLLM's API-server pid,
:attr:`kvgate.launch.local.EmbeddedServer.pid`, its own session leader, so the engine core and
workers are its descendants), so it can measure that theft instead of judging the server on it.

The arithmetic (:class:`ContentionSampler`, psutil over ``/proc``; every source injectable):

- **the server's CPUs**: the union of the CPU affinity of every process of the server's tree at
  the window's start (the embedded vLLM is pinned to all allowed CPUs but the last,
  :func:`kvgate.launch.local.server_cpus`; its OMP threads bind within that set);
- **busy time per CPU**: ``user + nice + system`` of ``psutil.cpu_times(percpu=True)`` between
  the window's start and stop (seconds); irq/softirq and steal are not processes' time and are
  left out of the share (steal is reported beside it);
- **the server tree's own time**: ``user + system`` of every live process of the tree plus the
  ``children_*`` time of children it reaped, a process born in the window counted whole; spread
  over the CPUs by each thread's delta and the CPU it last ran on (vLLM's CPU threads are bound,
  so they stay where they are), the rest of it (reaped children, ended threads) spread in
  proportion to the CPUs' busy time;
- **kvgate's own time on those CPUs**: kvgate is not pinned, so its process's threads are sampled
  every ``interval_s`` (0.25 s) and each thread's CPU-time delta is charged to the CPU it is on at
  that tick (where psutil cannot say: the whole delta is charged to the server's CPUs, which can
  only lower the share);
- **other processes** on CPU c = busy(c) - server(c) - kvgate(c), never below 0; the
  **contention share** = the sum over the server's CPUs / (wall x number of those CPUs); per CPU,
  other(c) / wall.
- **run queue**: ``procs_running`` of ``/proc/loadavg`` (the runnable tasks on the whole host,
  these included) at every tick, the largest kept, and the 1-minute load average at the stop.

:meth:`HostContention.invalid_verdict` is the rule the latency gates apply: above
``limits.host_contention_max`` (:data:`DEFAULT_MAX_SHARE`) the window's latency verdict is
INVALID, never FAIL. A server kvgate did not launch (``--endpoint``), or one whose process psutil
may not read, is "not measured" with the reason -- never INVALID for it (:func:`unmeasured`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvgate.verdict import Status, Verdict

#: The contention share above which a latency window is INVALID (``limits.host_contention_max``'s
#: default): the server lost a quarter of its CPUs' time, so its CPU-bound phases ran at least
#: 1.33x slower than the host could run them. Half-way between a quiet host (the server tree's and
#: kvgate's own time are subtracted; what is left is daemons and kernel threads) and one competing
#: CPU-bound process at equal nice, which CFS gives half the CPU. Measured with this sampler on the
#: shared 2-core machine (load average 9-13 from other test runs; no quiet window was to be had):
#: a spinning stand-in server pinned to CPU 0 saw 50% others (the background), 78% with one more
#: busy loop pinned there, 87% with two; the embedded tiny-cpu vLLM's latency windows 60-62%
#: (background only), 64-72% with two busy loops -- the server tree got 29-32% of CPU 0.
DEFAULT_MAX_SHARE = 0.25

#: Seconds between kvgate's thread samples (:class:`ContentionSampler`).
DEFAULT_INTERVAL_S = 0.25


@dataclass
class HostContention:
    """One window's host contention. ``measured`` False: ``reason`` says why nothing was measured
    (then the numbers are empty). Times in CPU seconds over ``wall_s`` wall seconds; ``cpus``:
    the server's CPUs; ``busy_s``/``server_s``/``kvgate_s``/``other_s``: per CPU (``server_s`` and
    ``kvgate_s`` as attributed, see the module docstring); ``server_total_s`` / ``kvgate_total_s``:
    the tree's and kvgate's whole CPU time in the window (kvgate's on any CPU); ``steal_s``:
    hypervisor steal on those CPUs; ``procs_running_max``: the largest run queue seen (whole
    host); ``loadavg_1m`` at the stop; ``attribution``: how kvgate's time was placed."""

    measured: bool
    reason: str | None = None
    wall_s: float = 0.0
    cpus: tuple[int, ...] = ()
    busy_s: dict[int, float] = field(default_factory=dict)
    server_s: dict[int, float] = field(default_factory=dict)
    kvgate_s: dict[int, float] = field(default_factory=dict)
    other_s: dict[int, float] = field(default_factory=dict)
    server_total_s: float = 0.0
    kvgate_total_s: float = 0.0
    steal_s: float = 0.0
    procs_running_max: int | None = None
    loadavg_1m: float | None = None
    attribution: str = ""

    @property
    def share(self) -> float | None:
        """Other processes' CPU time on the server's CPUs / (wall x their number), 0-1; None unmeasured."""
        if not self.measured or not self.cpus or self.wall_s <= 0:
            return None
        return sum(self.other_s.get(c, 0.0) for c in self.cpus) / (self.wall_s * len(self.cpus))

    @property
    def per_cpu(self) -> dict[int, float]:
        """CPU -> the share of it other processes used (0-1)."""
        if not self.measured or self.wall_s <= 0:
            return {}
        return {c: min(1.0, self.other_s.get(c, 0.0) / self.wall_s) for c in self.cpus}

    def cpus_text(self, most: int = 4) -> str:
        """``CPU 0: 71%, CPU 1: 12%`` (the ``most`` most used by others when there are more)."""
        shares = sorted(self.per_cpu.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = sorted(shares[:most])
        more = f", {len(shares) - most} more" if len(shares) > most else ""
        return ", ".join(f"CPU {c}: {s:.0%}" for c, s in shown) + more

    def text(self) -> str:
        """The evidence line: ``host contention: 63% of the server's CPUs (CPU 0) went to other processes
        over 4.2 s (CPU 0: 63%); server tree 1.3 CPU-s, kvgate 0.2 CPU-s on them; run queue up to 5``,
        or ``host contention not measured: <why>``."""
        if not self.measured:
            return f"host contention not measured: {self.reason}"
        rq = "" if self.procs_running_max is None else f"; run queue up to {self.procs_running_max}"
        return (f"host contention: {self.share:.0%} of the server's CPUs ({_cpu_list(self.cpus)}) went to other "
                f"processes over {self.wall_s:.1f} s ({self.cpus_text()}); server tree "
                f"{sum(self.server_s.values()):.1f} CPU-s, kvgate {sum(self.kvgate_s.values()):.1f} CPU-s on them{rq}")

    def contended(self, max_share: float) -> bool:
        """Measured and the share above ``max_share`` (0-1)."""
        share = self.share
        return share is not None and share > max_share

    def invalid_verdict(self, gate: str, max_share: float) -> Verdict | None:
        """INVALID when :meth:`contended` (``max_share``: ``limits.host_contention_max``), naming the
        share and the CPUs: ``contended host: 63% of the server's CPUs went to other processes (CPU 0:
        63%) during the measurement (limit 25%, limits.host_contention_max) -> INVALID``; else None."""
        if not self.contended(max_share):
            return None
        worst = max(self.per_cpu.items(), key=lambda kv: kv[1])[0]
        return Verdict(gate, Status.INVALID,
                       f"contended host: {self.share:.0%} of the server's CPUs went to other processes "
                       f"({self.cpus_text()}) during the measurement over {self.wall_s:.1f} s (limit {max_share:.0%}, "
                       f"limits.host_contention_max) -> INVALID; the server was not judged: run on a quiet host or "
                       f"move the other work off CPU {worst}",
                       measured=round(self.share, 4), limit=max_share, unit="ratio",
                       evidence={"host_contention": self.to_dict()})

    def to_dict(self) -> dict[str, Any]:
        """JSON form for a verdict's evidence (seconds rounded to ms, shares to 0.1%)."""
        if not self.measured:
            return {"measured": False, "reason": self.reason, "text": self.text()}

        def r(d: dict[int, float]) -> dict[str, float]:
            return {str(c): round(v, 3) for c, v in sorted(d.items())}

        return {"measured": True, "text": self.text(), "share": round(self.share or 0.0, 4),
                "per_cpu": {str(c): round(s, 4) for c, s in self.per_cpu.items()}, "cpus": list(self.cpus),
                "wall_s": round(self.wall_s, 3), "busy_s": r(self.busy_s), "server_s": r(self.server_s),
                "kvgate_s": r(self.kvgate_s), "other_s": r(self.other_s),
                "server_total_s": round(self.server_total_s, 3), "kvgate_total_s": round(self.kvgate_total_s, 3),
                "steal_s": round(self.steal_s, 3), "procs_running_max": self.procs_running_max,
                "loadavg_1m": self.loadavg_1m, "attribution": self.attribution}


def _cpu_list(cpus: Sequence[int]) -> str:
    cs = list(cpus)
    return ("CPU " + ", ".join(map(str, cs))) if len(cs) <= 8 else f"{len(cs)} CPUs"


def _busy(t: Any) -> float:
    return float(t.user) + float(getattr(t, "nice", 0.0)) + float(t.system)


def procs_running() -> tuple[int | None, float | None]:
    """``(procs_running, 1-minute load average)`` from ``/proc/loadavg`` (``(None, load)`` where
    it is absent: ``os.getloadavg``; ``(None, None)`` where neither is)."""
    try:
        with open("/proc/loadavg") as f:
            parts = f.read().split()
        return int(parts[3].split("/")[0]), float(parts[0])
    except (OSError, IndexError, ValueError):
        try:
            return None, os.getloadavg()[0]
        except OSError:
            return None, None


class Unmeasured:
    """Stands in for a :class:`ContentionSampler` where nothing can be measured: ``stop()``
    returns ``HostContention(measured=False, reason=...)``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.result = HostContention(False, reason)

    def start(self) -> "Unmeasured":
        return self

    def stop(self) -> HostContention:
        return self.result


def unmeasured(reason: str) -> HostContention:
    """The "not measured" result with its ``reason``."""
    return HostContention(False, reason)



def process_tree(ps: Any, roots: Sequence[int], cache: dict[int, Any] | None = None) -> list[Any]:
    """The live processes of the trees rooted at ``roots`` (pids): each root that is running and
    all its descendants, each once (psutil ``Process`` objects of ``ps``, the psutil module or a
    fake). ``cache``: pid -> Process kept between calls, so a root's ``cpu_times``/``memory`` deltas
    come from one object. Roots that are gone (NoSuchProcess, ZombieProcess) are left out."""
    seen: dict[int, Any] = {}
    for pid in roots:
        try:
            root = cache.get(pid) if cache is not None else None
            root = root or ps.Process(pid)
            if cache is not None:
                cache[pid] = root
            if not root.is_running():
                continue
            seen[pid] = root
            for child in root.children(recursive=True):
                seen.setdefault(child.pid, child)
        except (ps.NoSuchProcess, ps.ZombieProcess):
            continue
    return list(seen.values())

class ContentionSampler:
    """Measure host contention on the CPUs of the process trees rooted at ``roots`` between
    :meth:`start` and :meth:`stop` (see the module docstring for the arithmetic).

    ``psutil_mod``: a psutil-like module (``Process``, ``cpu_times(percpu=True)``, the
    ``NoSuchProcess``/``AccessDenied``/``ZombieProcess`` exceptions); ``clock``: wall seconds;
    ``own_pid``: kvgate's process (default ``os.getpid()``); ``interval_s``: seconds between
    kvgate's thread samples in a background thread (0: no thread, the caller calls :meth:`tick`;
    bounded by ``max_ticks``); ``loadavg``: returns ``(procs_running, load_1m)``. Never raises on a
    read: what cannot be read makes the result "not measured" with the reason."""

    def __init__(self, roots: Sequence[int], *, psutil_mod: Any = None, clock: Callable[[], float] = time.monotonic,
                 own_pid: int | None = None, interval_s: float = DEFAULT_INTERVAL_S, max_ticks: int = 4800,
                 loadavg: Callable[[], tuple[int | None, float | None]] = procs_running) -> None:
        if psutil_mod is None:
            import psutil as psutil_mod
        self.ps = psutil_mod
        self.roots = [int(p) for p in roots]
        self.clock = clock
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.interval_s = interval_s
        self.max_ticks = max_ticks
        self.loadavg = loadavg
        self._why: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._own_last: dict[int, float] = {}
        self._own_cpu: dict[int, float] = defaultdict(float)
        self._own_unplaced = 0.0
        self._rq_max: int | None = None
        self._tids: dict[int, Any] = {}

    # -------------------------------------------------------------- reads
    def _tree(self) -> list[Any]:
        return process_tree(self.ps, self.roots)

    def _proc_time(self, p: Any) -> float:
        t = p.cpu_times()
        return (float(t.user) + float(t.system) + float(getattr(t, "children_user", 0.0))
                + float(getattr(t, "children_system", 0.0)))

    def _threads(self, p: Any) -> dict[int, float]:
        return {t.id: float(t.user_time) + float(t.system_time) for t in p.threads()}

    def _cpu_of(self, tid: int) -> int | None:
        ps = self.ps
        try:
            proc = self._tids.get(tid) or ps.Process(tid)
            self._tids[tid] = proc
            return int(proc.cpu_num())
        except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied, AttributeError, ValueError):
            return None

    def _server_snapshot(self, procs: list[Any]) -> tuple[dict[int, float], dict[int, float]]:
        """``({pid: cpu s}, {tid: cpu s})`` of the tree; processes gone meanwhile are left out."""
        ps, per_pid, per_tid = self.ps, {}, {}
        for p in procs:
            try:
                per_pid[p.pid] = self._proc_time(p)
                try:
                    per_tid.update(self._threads(p))
                except (ps.AccessDenied, AttributeError):
                    pass
            except (ps.NoSuchProcess, ps.ZombieProcess):
                continue
        return per_pid, per_tid

    # -------------------------------------------------------------- the window
    def start(self) -> "ContentionSampler":
        """Take the window's first readings (and start the tick thread). Never raises."""
        ps = self.ps
        try:
            procs = self._tree()
            if not procs:
                self._why = f"the server's process (pid {', '.join(map(str, self.roots))}) is not running"
                return self
            cpus: set[int] = set()
            for p in procs:
                try:
                    cpus.update(p.cpu_affinity())
                except (ps.NoSuchProcess, ps.ZombieProcess):
                    continue
            if not cpus:
                self._why = "the server's CPU affinity could not be read"
                return self
            self.cpus = tuple(sorted(cpus))
            self._cpu0 = ps.cpu_times(percpu=True)
            self._srv0, self._srv_tid0 = self._server_snapshot(procs)
            self._own = ps.Process(self.own_pid)
            self._own0 = self._proc_time_own()
            self._own_last = self._own_threads()
        except ps.AccessDenied as exc:
            self._why = f"no psutil access to the server's process (pid {', '.join(map(str, self.roots))}): {exc}"
            return self
        except (AttributeError, NotImplementedError) as exc:  # psutil without cpu_affinity/cpu_num (macOS)
            self._why = f"this platform's psutil cannot read CPU affinity or per-CPU times ({exc})"
            return self
        self._t0 = self.clock()
        self._sample_queue()
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="kvgate-host-contention", daemon=True)
            self._thread.start()
        return self

    def _proc_time_own(self) -> float:
        t = self._own.cpu_times()
        return float(t.user) + float(t.system)

    def _own_threads(self) -> dict[int, float]:
        try:
            return self._threads(self._own)
        except (self.ps.AccessDenied, self.ps.NoSuchProcess, AttributeError):
            return {}

    def _sample_queue(self) -> None:
        running, _ = self.loadavg()
        if running is not None:
            self._rq_max = running if self._rq_max is None else max(self._rq_max, running)

    def tick(self) -> None:
        """Charge each of kvgate's threads' CPU time since the last tick to the CPU it is on now
        (unplaced where psutil cannot say); sample the run queue."""
        with self._lock:
            now = self._own_threads()
            for tid, cpu_s in now.items():
                d = cpu_s - self._own_last.get(tid, 0.0)
                if d <= 0:
                    continue
                c = self._cpu_of(tid)
                if c is None:
                    self._own_unplaced += d
                else:
                    self._own_cpu[c] += d
            self._own_last = {**self._own_last, **now}
            self._sample_queue()

    def _loop(self) -> None:
        for _ in range(self.max_ticks):
            if self._stop.wait(self.interval_s):
                return
            self.tick()

    def __enter__(self) -> "ContentionSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> HostContention:
        """The window's :class:`HostContention` (not measured, with the reason, where the start or
        this read failed). Stops the tick thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._why is not None:
            return unmeasured(self._why)
        ps = self.ps
        try:
            self.tick()
            wall = self.clock() - self._t0
            cpu1 = ps.cpu_times(percpu=True)
            srv1, srv_tid1 = self._server_snapshot(self._tree())
            own_total = self._proc_time_own() - self._own0
        except ps.AccessDenied as exc:
            return unmeasured(f"no psutil access to the server's process during the measurement: {exc}")
        except (ps.NoSuchProcess, ps.ZombieProcess) as exc:
            return unmeasured(f"kvgate's own process could not be read: {exc}")
        _, load1 = self.loadavg()
        busy = {c: max(0.0, _busy(cpu1[c]) - _busy(self._cpu0[c])) for c in self.cpus if c < min(len(cpu1), len(self._cpu0))}
        steal = sum(max(0.0, float(getattr(cpu1[c], "steal", 0.0)) - float(getattr(self._cpu0[c], "steal", 0.0)))
                    for c in busy)
        server_total = sum(max(0.0, t - self._srv0.get(pid, 0.0)) for pid, t in srv1.items())
        # the server's time per CPU: each thread's delta where it last ran, the rest by busy time
        server = defaultdict(float)
        placed = 0.0
        for tid, t in srv_tid1.items():
            d = t - self._srv_tid0.get(tid, 0.0)
            c = self._cpu_of(tid) if d > 0 else None
            if c in busy:
                server[c] += d
                placed += d
        _spread(server, max(0.0, server_total - placed), busy)
        kvgate = {c: self._own_cpu.get(c, 0.0) for c in busy}
        how = "kvgate's threads sampled every tick, charged to the CPU each was on"
        rest = max(self._own_unplaced, own_total - sum(self._own_cpu.values()))
        if rest > 0.02:  # more than the clock-tick rounding of a few reads (10 ms each)
            _spread(kvgate, rest, busy)
            how += f"; {rest:.2f} CPU-s not placeable, charged to the server's CPUs (can only lower the share)"
        other = {c: max(0.0, busy[c] - server.get(c, 0.0) - kvgate.get(c, 0.0)) for c in busy}
        return HostContention(True, None, wall, tuple(sorted(busy)), busy, dict(server), kvgate, other,
                              server_total, own_total, steal, self._rq_max, load1, how)


def _spread(into: dict[int, float], amount: float, weights: dict[int, float]) -> None:
    """Add ``amount`` to ``into`` over the CPUs of ``weights`` in proportion to them (evenly when all 0)."""
    if amount <= 0 or not weights:
        return
    total = sum(weights.values())
    for c, w in weights.items():
        into[c] = into.get(c, 0.0) + amount * (w / total if total > 0 else 1 / len(weights))


def for_endpoint(endpoint: Any, **kw: Any) -> "ContentionSampler | Unmeasured":
    """The contention sampler for ``endpoint``'s server: its ``server_pids`` (set by
    :mod:`kvgate.run.lifecycle` for a server kvgate launched as a local process tree), or
    :class:`Unmeasured` saying why not (``--endpoint``; a launcher with no local tree: a container,
    pools behind a router). ``kw``: passed to :class:`ContentionSampler`."""
    pids = tuple(getattr(endpoint, "server_pids", ()) or ())
    if not pids:
        if getattr(endpoint, "managed", False):
            return Unmeasured("kvgate launched this server but watches no local process tree of it "
                              "(a container, or pools behind a router)")
        return Unmeasured("the server was not launched by kvgate (--endpoint): its processes and CPUs are not visible "
                          "to kvgate")
    try:
        return ContentionSampler(pids, **kw)
    except ImportError as exc:
        return Unmeasured(f"psutil is not importable: {exc}")
