"""What a worker ships back for one batch: a :class:`Part`, gzip JSONL.

A part file holds one header line (``"kind": "part"``: who, which batch, when it started on the
coordinator's clock, its clock readings before and after, its loop's lag samples and CPU seconds,
its host's load) and one line per request (``"kind": "record"``): the whole decoded
:class:`~kvgate.load.record.RequestRecord` timeline -- scheduled, sent, first byte, every SSE
event's arrival and text, end, status, usage, error -- with the request's **global** index in the
batch. Raw samples, never histograms: percentiles of the union are exact.

Record times are seconds since the worker's own loop started (its monotonic clock);
:attr:`Part.start_offset_s` puts them on the batch's shared time base (seconds since the shared
start instant, coordinator clock): add it (:func:`kvgate.scale.merge.merge_batch`).

Files live at ``DIR/worker-KKK/batch-BBB.jsonl.gz`` (:func:`part_path`), written whole under a
temporary name and renamed (:func:`write_part`), so a reader never sees half a part: the worker
writes there itself on a shared volume, or POSTs the same bytes to the coordinator, which writes
them (:mod:`kvgate.scale.coordinator`).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvgate.load.record import RequestRecord
from kvgate.load.schedule import LoadResult
from kvgate.scale.clock import ClockOffset
from kvgate.scale.split import WorkerId

#: RequestRecord fields not shipped (hot-path storage, dropped once decoded).
_NOT_SHIPPED = {"piece_s", "pieces", "finalized"}
RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord) if f.name not in _NOT_SHIPPED)


def record_to_json(r: RequestRecord) -> dict[str, Any]:
    """A decoded record as JSON (every field but the raw body pieces)."""
    return {name: getattr(r, name) for name in RECORD_FIELDS}


def record_from_json(d: dict[str, Any]) -> RequestRecord:
    """The inverse of :func:`record_to_json` (a decoded record: ``finalized``)."""
    r = RequestRecord(**{k: v for k, v in d.items() if k in RECORD_FIELDS})
    r.finalized = True
    return r


@dataclass
class Part:
    """One worker's part of one batch.

    ``worker``, ``batch`` (its id); ``start_wall`` (the batch's shared start instant) and
    ``started_wall`` (when this worker's loop started), both on the coordinator's wall clock,
    seconds (the worker's own reading corrected by ``clock_before``); ``clock_before`` /
    ``clock_after`` (:class:`~kvgate.scale.clock.ClockOffset` read before waiting for the start and
    after the batch; ``clock_after`` None when it could not be read); ``assigned`` (requests of its
    slice) and ``concurrency`` (its streams; 0 in an open loop); ``result``: its loop's
    :class:`~kvgate.load.LoadResult` (records with global indices, lag samples, CPU seconds);
    ``host_load``: :meth:`kvgate.scale.host.WorkerHostSampler.stop`'s figures; ``host``/``pid``: where
    it ran; ``error``: one line when the worker's batch broke (then ``result`` may be empty)."""

    worker: WorkerId
    batch: int
    start_wall: float
    started_wall: float
    clock_before: ClockOffset
    clock_after: ClockOffset | None
    assigned: int
    concurrency: int
    result: LoadResult
    host_load: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    error: str | None = None

    @property
    def start_offset_s(self) -> float:
        """How late this worker's loop began after the shared start instant, seconds (negative: early)."""
        return self.started_wall - self.start_wall

    def header(self) -> dict[str, Any]:
        r = self.result
        return {"kind": "part", "worker": self.worker.k, "of": self.worker.n, "batch": self.batch,
                "start_wall": self.start_wall, "started_wall": self.started_wall,
                "clock_before": self.clock_before.to_dict(),
                "clock_after": self.clock_after.to_dict() if self.clock_after is not None else None,
                "assigned": self.assigned, "concurrency": self.concurrency, "host_load": self.host_load,
                "host": self.host, "pid": self.pid, "error": self.error,
                "result": {"mode": r.mode, "n_requested": r.n_requested, "wall_s": r.wall_s, "deadline_s": r.deadline_s,
                           "deadline_hit": r.deadline_hit, "concurrency": r.concurrency, "rate_rps": r.rate_rps,
                           "loop_lag_s": r.loop_lag_s, "cpu_s": r.cpu_s, "transport": r.transport,
                           "connections_opened": r.connections_opened, "records": len(r.records)}}


def dumps(part: Part) -> bytes:
    """``part`` as gzip JSONL bytes (header line, then one line per record)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz:
        gz.write((json.dumps(part.header(), separators=(",", ":")) + "\n").encode())
        for r in part.result.records:
            gz.write((json.dumps({"kind": "record", **record_to_json(r)}, separators=(",", ":")) + "\n").encode())
    return buf.getvalue()


class PartError(ValueError):
    """A part file that cannot be read; the message names it and why."""


def loads(data: bytes, where: str = "part") -> Part:
    """A :class:`Part` from :func:`dumps`' bytes. Raises :class:`PartError` naming ``where``."""
    try:
        lines = gzip.decompress(data).decode().splitlines()
        head = json.loads(lines[0])
        if head.get("kind") != "part":
            raise ValueError("the first line is not a part header")
        records = [record_from_json({k: v for k, v in json.loads(ln).items() if k != "kind"}) for ln in lines[1:] if ln]
        res = head["result"]
        result = LoadResult(res["mode"], records, int(res["n_requested"]), float(res["wall_s"]), float(res["deadline_s"]),
                            deadline_hit=bool(res["deadline_hit"]), concurrency=res.get("concurrency"),
                            rate_rps=res.get("rate_rps"), loop_lag_s=[float(x) for x in res.get("loop_lag_s") or ()],
                            cpu_s=float(res.get("cpu_s") or 0.0), transport=str(res.get("transport") or ""),
                            connections_opened=res.get("connections_opened"))
        after = head.get("clock_after")
        return Part(WorkerId(int(head["worker"]), int(head["of"])), int(head["batch"]), float(head["start_wall"]),
                    float(head["started_wall"]), ClockOffset.from_dict(head["clock_before"]),
                    ClockOffset.from_dict(after) if after else None, int(head["assigned"]), int(head["concurrency"]),
                    result, dict(head.get("host_load") or {}), str(head.get("host") or ""), int(head.get("pid") or 0),
                    head.get("error"))
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise PartError(f"{where}: not a kvgate worker part ({type(exc).__name__}: {exc})") from None


def part_path(root: Path, k: int, batch: int) -> Path:
    """``root/worker-KKK/batch-BBB.jsonl.gz``."""
    return Path(root) / f"worker-{k:03d}" / f"batch-{batch:03d}.jsonl.gz"


def write_part(root: Path, k: int, batch: int, data: bytes) -> Path:
    """Write ``data`` (a part's bytes) to :func:`part_path` atomically (a temporary name, then a
    rename). Returns the path."""
    path = part_path(root, k, batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
