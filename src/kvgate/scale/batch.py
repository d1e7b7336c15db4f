"""One batch of load, as the coordinator publishes it and a worker runs its share of it.

A :class:`Batch` is one call of a load loop (one look of a sampling gate): its ``mode``
(``closed``: ``n`` requests at ``concurrency``; ``open``: one request per ``offsets_s`` entry,
seconds from the start), the distinct request ``specs`` (request ``i`` sends
``specs[i % len(specs)]``, as :func:`kvgate.load.closed_loop` cycles them), the shared start
instant ``start_wall`` (the coordinator's wall clock, seconds) and the bounds every request runs
under (seconds). Its JSON form (:meth:`Batch.to_json`) is what ``GET /scale/v1/batch`` returns;
specs travel whole (path, body, headers, tag), the endpoint's API key never does (each worker has
its own).

:func:`assignment` is the worker's share (:mod:`kvgate.scale.split`): the global request indices it
sends, their specs, and the keyword arguments of its own loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvgate.load.record import RequestSpec
from kvgate.scale.split import WorkerId, closed_slice, open_slice

#: The control plane's path prefix (:mod:`kvgate.scale.coordinator` serves it).
API = "/scale/v1"
MODES = ("closed", "open")


def spec_to_json(s: RequestSpec) -> dict[str, Any]:
    """A :class:`RequestSpec` as JSON (every field)."""
    return {"path": s.path, "body": dict(s.body), "headers": dict(s.headers) if s.headers else None, "tag": s.tag,
            "hangup_after_chunks": s.hangup_after_chunks, "hangup_after_s": s.hangup_after_s,
            "idle_timeout_s": s.idle_timeout_s}


def spec_from_json(d: dict[str, Any]) -> RequestSpec:
    """The inverse of :func:`spec_to_json`."""
    return RequestSpec(str(d["path"]), dict(d["body"]), d.get("headers") or None, str(d.get("tag") or ""),
                       d.get("hangup_after_chunks"), d.get("hangup_after_s"), d.get("idle_timeout_s"))


def batch_label(d: dict[str, Any]) -> str:
    """How verdicts name a batch, from its JSON (:meth:`Batch.to_json`): ``batch 3``, or ``batch 3
    (soak round 2)`` for a batch carrying a round in its ``meta``."""
    inner = d.get("meta") or {}
    return f"batch {d['id']}" + (f" ({inner.get('phase', 'round')} round {inner['round']})" if "round" in inner else "")


@dataclass
class Batch:
    """One load batch (see the module docstring). ``id``: 0, 1, ... in the order published;
    ``issued_wall``: when the coordinator published it (its wall clock, seconds)."""

    id: int
    mode: str
    specs: list[RequestSpec]
    n: int
    start_wall: float
    deadline_s: float
    concurrency: int | None = None
    offsets_s: list[float] | None = None
    max_in_flight: int = 512
    request_timeout_s: float | None = None
    idle_timeout_s: float | None = None
    issued_wall: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"batch mode {self.mode!r}: expected one of {MODES}")
        if not self.specs and self.n:
            raise ValueError("a batch with requests needs at least one spec")

    @property
    def label(self) -> str:
        """``batch 3`` / ``batch 3 (soak round 2)`` (:func:`batch_label`)."""
        return batch_label({"id": self.id, "meta": self.meta})

    @property
    def overlaps(self) -> bool:
        """The worker runs this batch beside the ones before it (``meta["overlap"]``: a soak's
        rounds, whose stragglers may still run when the next round starts), not after them."""
        return bool(self.meta.get("overlap"))

    def to_json(self, with_specs: bool = True) -> dict[str, Any]:
        d = {"id": self.id, "mode": self.mode, "n": self.n, "start_wall": self.start_wall,
             "deadline_s": self.deadline_s, "concurrency": self.concurrency, "offsets_s": self.offsets_s,
             "max_in_flight": self.max_in_flight, "request_timeout_s": self.request_timeout_s,
             "idle_timeout_s": self.idle_timeout_s, "issued_wall": self.issued_wall, "meta": self.meta}
        if with_specs:
            d["specs"] = [spec_to_json(s) for s in self.specs]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Batch":
        return cls(int(d["id"]), str(d["mode"]), [spec_from_json(s) for s in d.get("specs") or ()], int(d["n"]),
                   float(d["start_wall"]), float(d["deadline_s"]), d.get("concurrency"),
                   None if d.get("offsets_s") is None else [float(x) for x in d["offsets_s"]],
                   int(d.get("max_in_flight") or 512), d.get("request_timeout_s"), d.get("idle_timeout_s"),
                   float(d.get("issued_wall") or 0.0), dict(d.get("meta") or {}))


@dataclass(frozen=True)
class Assignment:
    """A worker's share of a batch: ``indices`` (the batch's global request indices it sends,
    ascending), ``specs`` (one per index), ``concurrency`` (closed loop: its streams),
    ``offsets_s`` (open loop: one per index, seconds from the shared start), ``max_in_flight``."""

    indices: tuple[int, ...]
    specs: tuple[RequestSpec, ...]
    concurrency: int
    offsets_s: tuple[float, ...] | None = None
    max_in_flight: int = 1


def assignment(batch: Batch, w: WorkerId) -> Assignment:
    """Worker ``w``'s share of ``batch`` (:func:`kvgate.scale.split.closed_slice` /
    :func:`~kvgate.scale.split.open_slice`); the open loop's sockets bound split evenly (at least 1)."""
    specs = batch.specs
    if batch.mode == "closed":
        sl = closed_slice(batch.n, int(batch.concurrency or 1), w)
        return Assignment(sl.indices, tuple(specs[i % len(specs)] for i in sl.indices), sl.concurrency)
    arrivals = open_slice(batch.offsets_s or [], w)
    idx = tuple(i for i, _ in arrivals)
    return Assignment(idx, tuple(specs[i % len(specs)] for i in idx), 0, tuple(o for _, o in arrivals),
                      max(1, math.ceil(batch.max_in_flight / w.n)))
