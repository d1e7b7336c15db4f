"""Scale-out workers with faults, for kvgate's own tests: one named fault per defect a split run
must catch (:data:`FAULTS`), injected through the worker's own injectables (its wall clock, its
sleep, its loop's transport) -- nothing sleeps for the fault's length, nothing is hard-coded into
the part it ships: the worker measures and reports what the fault did to it.

    worker = faulty_worker(WorkerOptions(url, WorkerId(1, 2)), "start_late", late_s=1.8)
    threading.Thread(target=worker.run).start()

A killed worker is a real process killed (:class:`kvgate.scale.local.LocalWorkers` + SIGKILL):
see tests/test_scale.py. ``vanish`` is the in-process stand-in for a pod that stops answering.
"""

from __future__ import annotations

import time
from typing import Any

from kvgate.load.schedule import make_transport
from kvgate.scale.worker import Worker, WorkerOptions

#: fault -> what it does (the defect it stands for).
FAULTS = {
    "start_late": "the worker is held late_s between the end of its wait for the shared start and its loop's first "
                  "clock reading (its monotonic clock jumps that much, as a descheduled or CPU-throttled pod's "
                  "does): its loop starts late_s after the instant, the barrier is missed",
    "clock_drift": "the worker's wall clock steps drift_s ahead while its first batch runs (an NTP step, or an "
                   "undisciplined clock): its clock readings before and after the batch disagree by drift_s",
    "falls_behind": "the worker's event loop is blocked block_s (busy, not sleeping) before every request it sends: "
                    "its client falls behind its schedule",
    "vanish": "the worker stops answering once its batch has started: no heartbeat, no part (a pod gone silent)",
    "batch_error": "the worker's loop raises in its batch (a broken client): it ships a part with the error",
}


class _Shifted:
    """A wall clock ``time.time() + shift`` whose shift the fault changes."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.time() + self.shift


class _Blocking:
    """A transport that busy-blocks the event loop ``block_s`` before each send."""

    def __init__(self, inner: Any, block_s: float) -> None:
        self.inner, self.block_s = inner, block_s
        self.name = getattr(inner, "name", "fake")

    def bind(self, clock: Any, t0: float, max_connections: int) -> None:
        self.inner.bind(clock, t0, max_connections)

    def prepare(self, spec: Any) -> Any:
        return self.inner.prepare(spec)

    async def send(self, prepared: Any, rec: Any, timeout_s: float) -> None:
        end = time.perf_counter() + self.block_s
        while time.perf_counter() < end:  # the loop is starved, as by a saturated core
            pass
        await self.inner.send(prepared, rec, timeout_s)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Vanish(Exception):
    pass


def faulty_worker(opts: WorkerOptions, fault: str, *, late_s: float = 1.8, drift_s: float = 0.25,
                  block_s: float = 0.08, log: Any = None, **worker_kw: Any) -> Worker:
    """A :class:`~kvgate.scale.worker.Worker` with ``fault`` (a key of :data:`FAULTS`);
    ``worker_kw``: the worker's other injectables (its loops)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}")
    wall = _Shifted()
    kw: dict[str, Any] = {**worker_kw, "wall": wall, "log": log or (lambda line: None)}
    if fault == "falls_behind":
        kw["transport"] = lambda endpoint: _Blocking(make_transport(endpoint), block_s)
    elif fault == "batch_error":
        def broken(*a: Any, **k: Any) -> Any:
            raise RuntimeError("injected: the load loop broke")

        async def broken_async(*a: Any, **k: Any) -> Any:
            broken()
        kw["closed"] = kw["opened"] = broken
        kw["closed_async"] = kw["opened_async"] = broken_async
    worker = Worker(opts, **kw)
    if fault == "start_late":
        perf = {"armed": 0, "shift": 0.0}

        def late_wait() -> None:  # the shared instant is reached (a batch in turn, or a soak's round)
            if not perf["armed"]:
                perf["armed"] = 1

        def late_perf() -> float:  # descheduled late_s between getting ready and its loop's first reading
            if perf["armed"] == 2:
                perf["shift"] = late_s
            elif perf["armed"] == 1:
                perf["armed"] = 2
            return time.perf_counter() + perf["shift"]
        worker._waited = late_wait  # type: ignore[method-assign]
        worker.perf = late_perf
    elif fault == "clock_drift":
        true = worker.clock
        readings = {"n": 0}

        def clock() -> Any:  # joining and before batch 0: true; then the clock has stepped drift_s ahead
            got = true()
            readings["n"] += 1
            if readings["n"] == 2:
                wall.shift = drift_s
            return got
        worker.clock = clock  # type: ignore[method-assign]
    elif fault == "vanish":
        def gone(batch: Any) -> Any:  # it has the batch; nothing more is sent or heard from it
            raise _Vanish()
        worker.run_share = gone  # type: ignore[method-assign]
        inner_run = worker.run

        def run() -> int:
            try:
                return inner_run()
            except _Vanish:
                return 1
        worker.run = run  # type: ignore[method-assign]
    return worker
