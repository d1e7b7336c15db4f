"""A soak's rounds sent by the workers: the soak runner's ``send_round`` over the coordinator.

:class:`SoakSplit` is a :data:`kvgate.soak.runner.SendRound` (with the runner's ``lead_s``, see
:class:`kvgate.soak.runner.SoakRunner`): round ``k`` -- the offsets and requests one process would
send (:meth:`kvgate.soak.runner.SoakPlan.requests`, seeded by round) -- becomes one open-loop
batch, published ``lead_s`` ahead of the round's start and marked ``overlap`` (a worker runs it
beside the rounds before it, whose stragglers may still run, as one process does) with
``phase: soak`` and its round. Each worker sends the arrivals ``i`` with ``i mod N == k``
(:func:`kvgate.scale.split.open_slice`: thinned by index, each at its own offset from the round's
start; no float arithmetic decides who sends what), so the union of the workers' requests is the
one-process round, every request once.

**What is deterministic.** Which requests a round holds and which worker sends each: by round and
index only. A record belongs to the round whose batch sent it (the batch it came back in), never
to the round its completion falls in. The round's shared start instant is the schedule's
``t0 + k * round_s`` (the runner's clock) put on the coordinator's wall clock when the round is
handed over (both clocks read together), not the moment the call happened. The merged round
(:func:`kvgate.scale.merge.merge_batch`: records in index order, each worker's shifted by how
late its loop began) is what the runner turns into the round's row, exactly as it does with one
process's result: TTFT p95 of the round is the percentile of the union; memory comes from the
coordinator's own samplers (the server side), as without workers.

**Losses.** A round whose part from a worker did not come (killed, silent, late past the
deadline) calls ``on_lost`` with one line (the fixture stops the soak: nothing more is published
after a loss, see :mod:`kvgate.scale.coordinator`); the verdicts are then INVALID naming the worker
(:func:`kvgate.gates.scale.scaled_verdict` over :meth:`~kvgate.scale.coordinator.Coordinator.report`
``(phase="soak")``), never a PASS on a partial merge.

Shapes refused (:func:`refused`): a soak mix whose traffic sample draws whole sessions (their later
turns are built from the earlier replies in the sending process; a batch carries fixed requests).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Sequence

from kvgate.load.record import RequestSpec
from kvgate.load.schedule import LoadResult
from kvgate.scale.batch import batch_label
from kvgate.scale.merge import BatchOutcome

PHASE = "soak"


def refused(mix: Sequence[Any], spec: Any, profile_name: str) -> str | None:
    """Why the soak of a mix cannot be split over ``spec``'s workers (one line), or None: a workload
    drawing whole sessions (:attr:`kvgate.soak.runner.MixItem.units`)."""
    drawn = [m.name for m in mix if getattr(m, "units", ())]
    if drawn:
        return (f"--workers {spec}: the soak of profile {profile_name} draws whole sessions from "
                f"workloads.{drawn[0]}.traffic; a session's later turns are built from its earlier replies in the "
                "process that sends it, which a worker's batch of fixed requests cannot carry (run the soak without "
                "--workers, or give soak.mix workloads without sessions)")
    return None


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread of its own (never the default executor's few: every round in
    flight holds one while it waits for its parts); awaitable and cancellable (the thread then
    finishes unobserved)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            loop.call_soon_threadsafe(settle, False, exc)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=run, name="kvgate-soak-round", daemon=True).start()
    return await fut


class SoakSplit:
    """The soak's ``send_round`` over ``coordinator`` (see the module docstring).

    ``request_timeout_s`` / ``idle_timeout_s``: as the one-process sender's
    (:func:`kvgate.soak.runner.open_loop_sender`); ``warmup_rounds``: rounds marked warm-up (the
    workers' lag rule does not count them); ``clock``: the runner's clock (seconds; its ``start_s``
    is read on it); ``on_lost(line)``: called once, at the first round that lost a worker."""

    def __init__(self, coordinator: Any, *, request_timeout_s: float, idle_timeout_s: float | None = None,
                 warmup_rounds: int = 0, clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[str], None] | None = None, max_in_flight: int = 512) -> None:
        self.coord = coordinator
        self.request_timeout_s, self.idle_timeout_s = request_timeout_s, idle_timeout_s
        self.warmup_rounds, self.clock, self.on_lost = warmup_rounds, clock, on_lost
        self.max_in_flight = max_in_flight
        self.outcomes: dict[int, BatchOutcome] = {}
        self._lost_told = False

    @property
    def lead_s(self) -> float:
        """How far ahead of its start a round is handed over (the coordinator's ``lead_s``)."""
        return float(self.coord.lead_s)

    def ready(self) -> dict[int, str]:
        """Before the soak's clock starts: wait until every worker joined (or the join timeout);
        returns the ones that did not (index -> why)."""
        return self.coord.wait_joined()

    async def __call__(self, k: int, offsets: list[float], specs: list[Any], deadline_s: float, *,
                       start_s: float | None = None) -> LoadResult:
        if any(not isinstance(s, RequestSpec) for s in specs):
            raise TypeError("a split soak round carries fixed requests only (sessions are refused: kvgate.scale.soak)")
        start_wall = None if start_s is None else self.coord.wall() + (start_s - self.clock())
        batch = self.coord.publish("open", specs, len(specs), deadline_s, offsets_s=offsets,
                                   max_in_flight=self.max_in_flight,
                                   request_timeout_s=min(self.request_timeout_s, deadline_s),
                                   idle_timeout_s=self.idle_timeout_s, start_wall=start_wall,
                                   meta={"phase": PHASE, "round": int(k), "overlap": True,
                                         "warmup": k < self.warmup_rounds})
        outcome = await _in_thread(self.coord.collect, batch)
        self.outcomes[k] = outcome
        if outcome.lost and not self._lost_told:
            self._lost_told = True
            if self.on_lost is not None:
                first = min(outcome.lost)
                self.on_lost(f"worker {first} of {self.coord.n} lost in {batch_label(outcome.meta)}: "
                             f"{outcome.lost[first]}")
        return outcome.merged
