"""Merging the workers' parts: one :class:`~kvgate.load.LoadResult` per batch, one run per directory.

:func:`merge_batch` concatenates the parts of one batch: each worker's records shifted by its
:attr:`~kvgate.scale.ship.Part.start_offset_s` onto the batch's time base (seconds since the shared
start instant, coordinator clock), in global request order (the order one process's closed loop
hands the indices out), with every worker's event-loop lag samples, CPU seconds summed, the
batch's request count. Nothing is re-binned: percentiles of the merge are the percentiles of the
union (:func:`kvgate.stats.percentile` over every record).

A run directory (the coordinator's, or a shared volume) holds ``run.json`` (workers, joins, each
batch's shape and which workers it lost, written by :mod:`kvgate.scale.coordinator`) and the part
files (:mod:`kvgate.scale.ship`). :func:`load_run` reads it back as a :class:`ScaleRun`;
:func:`resample` replays a sampling gate's looks over its batches with the gate's own functions
(:func:`kvgate.load.sampling.sample_batches`: each recorded batch one ``send``, on the recorded
times), so ``kvgate merge DIR`` decides exactly as the live run did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from kvgate.load.sampling import Sampled, sample_batches
from kvgate.load.schedule import LoadResult
from kvgate.scale.ship import Part, PartError, loads, part_path
from kvgate.scale.split import WorkerId
from kvgate.stats.confidence import LookPlan

RUN_FILE = "run.json"


def merge_batch(parts: Sequence[Part], *, mode: str, n_requested: int, concurrency: int | None,
                rate_rps: float | None = None, deadline_s: float = 0.0) -> LoadResult:
    """One :class:`LoadResult` of a batch's ``parts`` (see the module docstring). The records are
    the parts' own objects, shifted in place; ``wall_s``: the last end on the shared base."""
    records = []
    lags: list[float] = []
    cpu = 0.0
    hit = False
    for p in parts:
        dt = p.start_offset_s
        records += [r.shift(dt) for r in p.result.records]
        lags += p.result.loop_lag_s
        cpu += p.result.cpu_s
        hit = hit or p.result.deadline_hit
    records.sort(key=lambda r: r.index)
    ends = [r.end_s for r in records if r.end_s is not None]
    conns = [p.result.connections_opened for p in parts]
    return LoadResult(mode, records, n_requested, max(ends, default=0.0), deadline_s, deadline_hit=hit,
                      concurrency=concurrency, rate_rps=rate_rps, loop_lag_s=lags, cpu_s=cpu,
                      transport=next((p.result.transport for p in parts if p.result.transport), ""),
                      connections_opened=None if not conns or any(c is None for c in conns) else sum(conns))


@dataclass
class BatchOutcome:
    """One batch as the coordinator saw it: ``meta`` (:meth:`kvgate.scale.batch.Batch.to_json`
    without specs), ``parts`` (worker index -> :class:`Part`), ``lost`` (worker index -> why no
    part came: one line) and ``merged`` (:func:`merge_batch` of the parts that came)."""

    meta: dict[str, Any]
    parts: dict[int, Part]
    lost: dict[int, str]
    merged: LoadResult

    @property
    def id(self) -> int:
        return int(self.meta["id"])

    @property
    def complete(self) -> bool:
        """Every worker's part came and none reported an error."""
        return not self.lost and all(p.error is None for p in self.parts.values())


@dataclass
class ScaleRun:
    """A split run: ``n`` workers of ``kind`` (``local``/``k8s``), ``joined`` (worker index -> its
    hello: host, pid, clock), ``never_joined`` (index -> why), the ``batches`` in order, and
    ``notes`` (run-wide lines: how the workers were started)."""

    n: int
    kind: str
    joined: dict[int, dict[str, Any]]
    never_joined: dict[int, str]
    batches: list[BatchOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_id: str = ""

    def workers(self) -> list[WorkerId]:
        return [WorkerId(k, self.n) for k in range(self.n)]

    def only(self, phase: str) -> "ScaleRun":
        """This run with only the batches published for ``phase`` (their ``meta["phase"]``, e.g.
        ``"soak"``); the latency gate's batches carry none (``"latency"`` selects them)."""
        keep = [b for b in self.batches if ((b.meta.get("meta") or {}).get("phase") or "latency") == phase]
        return ScaleRun(self.n, self.kind, self.joined, self.never_joined, keep, self.notes, self.run_id)


def merge_parts(meta: dict[str, Any], parts: dict[int, Part], lost: dict[int, str]) -> BatchOutcome:
    """A :class:`BatchOutcome` from a batch's ``meta`` and the parts that came."""
    ok = [parts[k] for k in sorted(parts)]
    merged = merge_batch(ok, mode=meta["mode"], n_requested=int(meta["n"]), concurrency=meta.get("concurrency"),
                         deadline_s=float(meta.get("deadline_s") or 0.0))
    return BatchOutcome(meta, parts, lost, merged)


class RunDirError(ValueError):
    """A run directory that cannot be merged; the message names the file and why."""


def load_run(root: Path) -> ScaleRun:
    """The :class:`ScaleRun` in ``root`` (``run.json`` and the part files). A part file listed by
    neither a loss nor present is a loss (``no part file``); an unreadable part is a loss naming
    the file. Raises :class:`RunDirError` when ``run.json`` is missing or malformed."""
    root = Path(root)
    try:
        run = json.loads((root / RUN_FILE).read_text())
        n = int(run["n"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunDirError(f"{root / RUN_FILE}: not a kvgate scale-out run ({type(exc).__name__}: {exc})") from None
    out = ScaleRun(n, str(run.get("kind", "")), {int(k): v for k, v in (run.get("joined") or {}).items()},
                   {int(k): v for k, v in (run.get("never_joined") or {}).items()}, notes=list(run.get("notes") or ()),
                   run_id=str(run.get("run_id", "")))
    for meta in run.get("batches") or ():
        lost = {int(k): v for k, v in (meta.get("lost") or {}).items()}
        parts: dict[int, Part] = {}
        for k in range(n):
            if k in lost or k in out.never_joined or meta.get("skipped"):
                continue
            path = part_path(root, k, int(meta["id"]))
            try:
                parts[k] = loads(path.read_bytes(), str(path))
            except OSError:
                lost[k] = f"no part file {path.relative_to(root)}"
            except PartError as exc:
                lost[k] = str(exc)
        out.batches.append(merge_parts({k: v for k, v in meta.items() if k != "lost"}, parts, lost))
    return out


def resample(run: ScaleRun, plan: LookPlan, decide: Callable[[list[Any], float], dict[str, str]], *,
             stop_on_fail: bool = True) -> Sampled:
    """The sampling :func:`~kvgate.load.sampling.sample_batches` did live, replayed over ``run``'s
    batches: look after look, each recorded batch is one ``send`` (its merged result, the requests
    it added), on a clock that reads the recorded times (seconds since the first batch was issued:
    each batch's issue; after the last, its shared start + wall). Ends where the live run ended:
    decided, at the cap, or when the recorded batches run out (``source``). The batches' records are
    shifted in place onto the sampling's time base, as the live run's were: call it once per
    :func:`load_run`."""
    batches = list(run.batches)
    base = float(batches[0].meta.get("issued_wall") or 0.0) if batches else 0.0
    now = {"t": 0.0, "i": 0}

    def clock() -> float:
        return now["t"]

    def send(k: int, left: float | None) -> tuple[LoadResult, int]:
        i = now["i"]
        if i >= len(batches):
            return LoadResult("closed", [], 0, 0.0, 0.0), 0
        now["i"] = i + 1
        res = batches[i].merged
        # after the send: the next batch's issue (the live run's clock when it sent it), else this one's end
        nxt = batches[i + 1].meta.get("issued_wall") if i + 1 < len(batches) else None
        now["t"] = (float(nxt) if nxt is not None else float(batches[i].meta.get("start_wall") or base) + res.wall_s) - base
        return res, len(res.records)

    return sample_batches(plan, send, decide, clock=clock, stop_on_fail=stop_on_fail)
