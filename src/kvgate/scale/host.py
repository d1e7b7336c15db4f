"""A worker's own host while its batch ran: how busy its client was and what else took its CPUs.

:class:`WorkerHostSampler` reads, between :meth:`~WorkerHostSampler.start` and
:meth:`~WorkerHostSampler.stop` (seconds of wall clock ``wall_s``):

- ``own_cpu_s``: this process's CPU seconds (user + system), and ``own_share`` = ``own_cpu_s /
  wall_s`` (1.0 = one core busy the whole batch: a single-threaded client near 1.0 is saturated);
- ``others_share``: the busy time (user + nice + system) of the CPUs this process may run on
  (its affinity), minus its own, over ``wall_s x`` those CPUs (0-1): what other processes took;
- ``throttled_s``: CFS throttling of the container's cgroup (cgroup v2 ``cpu.stat``
  ``throttled_usec``; a pod at its CPU limit), None where unreadable.

Never raises on a read: what cannot be read is left None with ``reason``. Every source is
injectable (``psutil_mod``, ``read_cpu_stat``, ``wall``) so tests need no real host.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

CPU_STAT = "/sys/fs/cgroup/cpu.stat"


def read_cpu_stat(path: str = CPU_STAT) -> dict[str, int] | None:
    """cgroup v2 ``cpu.stat`` as ``{key: int}``; None when unreadable."""
    try:
        with open(path) as f:
            return {k: int(v) for k, v in (ln.split() for ln in f if ln.strip())}
    except (OSError, ValueError):
        return None


def _busy(t: Any) -> float:
    return float(t.user) + float(getattr(t, "nice", 0.0)) + float(t.system)


class WorkerHostSampler:
    """See the module docstring."""

    def __init__(self, *, psutil_mod: Any = None, wall: Callable[[], float] = time.monotonic,
                 read_stat: Callable[[], dict[str, int] | None] = read_cpu_stat, pid: int | None = None) -> None:
        self.reason: str | None = None
        if psutil_mod is None:
            try:  # imported here, before the worker waits for the shared start (~20 ms the first time)
                import psutil as psutil_mod
            except ImportError as exc:
                self.reason = f"ImportError: {exc}"
        self.ps = psutil_mod
        self.wall = wall
        self.read_stat = read_stat
        self.pid = os.getpid() if pid is None else pid

    def start(self) -> "WorkerHostSampler":
        if self.reason is None:
            try:
                proc = self.ps.Process(self.pid)
                self.cpus = sorted(proc.cpu_affinity())
                self._proc = proc
                self._cpu0 = self.ps.cpu_times(percpu=True)
                t = proc.cpu_times()
                self._own0 = float(t.user) + float(t.system)
            except Exception as exc:  # noqa: BLE001 - a host we cannot read is "not measured", never an error
                self.reason = f"{type(exc).__name__}: {exc}"
        self._stat0 = self.read_stat()
        self._t0 = self.wall()
        return self

    def stop(self) -> dict[str, Any]:
        """The figures (see the module docstring) as a JSON-ready dict with a ``text`` line."""
        wall = max(1e-9, self.wall() - self._t0)
        out: dict[str, Any] = {"wall_s": round(wall, 3), "own_cpu_s": None, "own_share": None, "others_share": None,
                               "cpus": None, "throttled_s": None, "reason": self.reason}
        if self.reason is None:
            try:
                cpu1 = self.ps.cpu_times(percpu=True)
                t = self._proc.cpu_times()
                own = float(t.user) + float(t.system) - self._own0
                cpus = [c for c in self.cpus if c < min(len(cpu1), len(self._cpu0))]
                busy = sum(max(0.0, _busy(cpu1[c]) - _busy(self._cpu0[c])) for c in cpus)
                out.update(own_cpu_s=round(own, 3), own_share=round(own / wall, 4), cpus=cpus,
                           others_share=round(min(1.0, max(0.0, busy - own) / (wall * len(cpus))), 4) if cpus else None)
            except Exception as exc:  # noqa: BLE001
                out["reason"] = f"{type(exc).__name__}: {exc}"
        s1 = self.read_stat()
        if self._stat0 is not None and s1 is not None and "throttled_usec" in s1:
            out["throttled_s"] = round((s1["throttled_usec"] - self._stat0.get("throttled_usec", 0)) / 1e6, 3)
        out["text"] = host_text(out)
        return out


def host_text(h: dict[str, Any]) -> str:
    """``client 0.42 CPU-s/s, others 12% of its 2 CPUs, throttled 0.0 s`` (what was measured)."""
    if h.get("own_share") is None:
        return f"worker host not measured: {h.get('reason') or 'no reading'}"
    cpus = h.get("cpus") or []
    text = f"client {h['own_share']:.2f} CPU-s/s"
    if h.get("others_share") is not None:
        text += f", others {h['others_share']:.0%} of its {len(cpus)} CPU{'s' if len(cpus) != 1 else ''}"
    if h.get("throttled_s") is not None:
        text += f", throttled {h['throttled_s']:.1f} s"
    return text
