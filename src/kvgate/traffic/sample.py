"""A traffic sample: the requests a deployment really serves, read from a file, to be replayed.

:class:`TrafficSample` holds :class:`TraceRequest` rows (prompt and output tokens, optional arrival
time, session and turn, shared-prefix id) plus where they came from (path, SHA-256 of the bytes,
format). :func:`load_sample` reads one; :func:`sample_for` reads a profile workload's
``traffic:``. Every bad record is a :class:`TrafficError` naming the file, the line and the field.

Formats (``TrafficSpec.format``; ``auto`` tells from the content):

- ``jsonl``: one request per line, ``{"prompt_tokens": N, "output_tokens": M}`` (also
  ``input_tokens``/``completion_tokens`` or an OpenAI ``usage`` object), optional ``arrival_s``
  (seconds, any origin), ``session`` (id) and ``turn`` (0-based order within it), ``prefix_id`` and
  ``prefix_tokens`` (a shared prefix, e.g. a system prompt, counted inside ``prompt_tokens``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class TrafficError(ValueError):
    """A traffic sample cannot be read or is malformed; the message names the file (and line, field)."""


@dataclass(frozen=True)
class TraceRequest:
    """One recorded request. ``prompt_tokens`` / ``output_tokens`` (tokens): the whole prompt as
    the server counted it (a later turn's includes the history) and what it generated.
    ``arrival_s``: seconds on the sample's own clock (None: not recorded). ``session``/``turn``: a
    conversation and the 0-based position in it. ``prefix_id``/``prefix_tokens``: a prefix
    (tokens, inside ``prompt_tokens``) shared by every request with the same id. ``messages``: the
    OpenAI messages as sent, when the source carries text. ``line``: 1-based line in the file."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    session: str | None = None
    turn: int | None = None
    prefix_id: str | None = None
    prefix_tokens: int = 0
    messages: tuple[dict[str, Any], ...] | None = None
    line: int | None = None


@dataclass(frozen=True)
class TrafficSample:
    """The requests of one sample, in file order, and its provenance: ``path`` (as given),
    ``sha256`` (hex of the file's bytes), ``format`` (the one read)."""

    requests: tuple[TraceRequest, ...]
    path: str
    sha256: str
    format: str
    notes: tuple[str, ...] = field(default=())

    @property
    def has_arrivals(self) -> bool:
        """Every request carries an arrival time (an open-loop replay needs them)."""
        return bool(self.requests) and all(r.arrival_s is not None for r in self.requests)

    def sessions(self) -> dict[str, list[TraceRequest]]:
        """Session id -> its turns in order (requests without a session left out)."""
        out: dict[str, list[TraceRequest]] = {}
        for r in self.requests:
            if r.session is not None:
                out.setdefault(r.session, []).append(r)
        for turns in out.values():
            turns.sort(key=lambda r: (r.turn if r.turn is not None else 0))
        return out

    def percentiles(self, what: str = "prompt_tokens", qs: Sequence[float] = (50, 90, 99)) -> dict[str, int]:
        """``{"p50": tokens, ...}`` of ``what`` (``prompt_tokens``, ``output_tokens`` or
        ``total``), nearest-rank (numpy ``inverted_cdf``: a length some request really had)."""
        xs = np.asarray([r.prompt_tokens + r.output_tokens if what == "total" else getattr(r, what)
                         for r in self.requests], dtype=float)
        if not len(xs):
            return {f"p{q:g}": 0 for q in qs}
        return {f"p{q:g}": int(np.percentile(xs, q, method="inverted_cdf")) for q in qs}

    def describe(self) -> str:
        """One line: file, short hash, requests, sessions, prompt/output p50/p99 (tokens)."""
        p, o = self.percentiles("prompt_tokens", (50, 99)), self.percentiles("output_tokens", (50, 99))
        ses = self.sessions()
        s = f", {len(ses)} sessions" if ses else ""
        return (f"{self.path} (sha256 {self.sha256[:12]}, {len(self.requests):,} requests{s}): prompt p50/p99 "
                f"{p['p50']:,}/{p['p99']:,} tokens, output p50/p99 {o['p50']:,}/{o['p99']:,}")

    def provenance(self) -> dict[str, Any]:
        """What a verdict's evidence records about the sample (path, sha256, format, counts, percentiles)."""
        return {"path": self.path, "sha256": self.sha256, "format": self.format, "requests": len(self.requests),
                "sessions": len(self.sessions()), "prompt_tokens": self.percentiles("prompt_tokens"),
                "output_tokens": self.percentiles("output_tokens"), "notes": list(self.notes)}


def _int(obj: dict[str, Any], where: str, *names: str, required: bool = True) -> int | None:
    for name in names:
        cur: Any = obj
        for part in name.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None:
            if isinstance(cur, bool) or not isinstance(cur, int) or cur < 0:
                raise TrafficError(f"{where}: field {name!r} must be a non-negative integer, got {cur!r}")
            return cur
    if required:
        raise TrafficError(f"{where}: missing field {names[0]!r} (or {', '.join(repr(n) for n in names[1:])})")
    return None


def _jsonl(path: Path, lines: list[str]) -> list[TraceRequest]:
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrafficError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TrafficError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
        p = _int(obj, where, "prompt_tokens", "input_tokens", "usage.prompt_tokens")
        o = _int(obj, where, "output_tokens", "completion_tokens", "usage.completion_tokens")
        arrival = obj.get("arrival_s")
        if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, (int, float))):
            raise TrafficError(f"{where}: field 'arrival_s' must be a number of seconds, got {arrival!r}")
        turn = _int(obj, where, "turn", required=False)
        pt = _int(obj, where, "prefix_tokens", required=False) or 0
        if pt > p:
            raise TrafficError(f"{where}: field 'prefix_tokens' {pt} exceeds prompt_tokens {p}")
        ses, pid = obj.get("session"), obj.get("prefix_id")
        out.append(TraceRequest(p, o, None if arrival is None else float(arrival),
                                None if ses is None else str(ses), turn, None if pid is None else str(pid), pt,
                                line=n))
    return out


def load_sample(path: str | Path, format: str = "auto", shown: str | None = None) -> TrafficSample:
    """Read the traffic sample at ``path`` (``format``: see the module docstring). ``shown``: how
    the path is written in messages and provenance (default ``path``). Raises
    :class:`TrafficError` when it cannot be read, is empty, or a record is malformed."""
    path = Path(path)
    label = shown or str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrafficError(f"traffic sample {label}: cannot read it ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrafficError(f"traffic sample {label}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if format not in ("auto", "jsonl"):
        raise TrafficError(f"traffic sample {label}: format {format!r} is not supported yet")
    requests = _jsonl(Path(label), text.splitlines())
    if not requests:
        raise TrafficError(f"traffic sample {label}: no requests in it")
    return TrafficSample(tuple(requests), label, hashlib.sha256(data).hexdigest(), "jsonl")


def sample_path(profile: Any, traffic: Any) -> Path:
    """The file a workload's ``traffic.path`` names: absolute as given, else relative to the
    profile's file (``profile.source``), else to the working directory."""
    p = Path(traffic.path).expanduser()
    if p.is_absolute() or not getattr(profile, "source", None):
        return p
    return Path(profile.source).parent / p


def sample_for(profile: Any, workload: str) -> TrafficSample | None:
    """The traffic sample of ``profile.workloads[workload]`` (None when it has no ``traffic:``).
    Raises :class:`TrafficError` naming the profile field and the file."""
    wl = profile.workloads[workload]
    if wl.traffic is None:
        return None
    path = sample_path(profile, wl.traffic)
    try:
        return load_sample(path, wl.traffic.format, shown=wl.traffic.path)
    except TrafficError as exc:
        raise TrafficError(f"{profile.source or profile.name}: field 'workloads.{workload}.traffic': {exc}") from None


def overlong(sample: TrafficSample, max_model_len: int, max_tokens_cap: int | None = None) -> dict[str, Any] | None:
    """Requests the deployment cannot serve as recorded: prompt + output over ``max_model_len``
    (tokens), or output over the ``max_tokens`` cap. ``None`` when every request fits, else
    ``{"requests", "share", "prompt_p99", "limit", "first_line"}`` (``limit`` = max_model_len minus
    the p99 output: the longest prompt the p99 request may have)."""
    bad = [r for r in sample.requests if r.prompt_tokens + r.output_tokens > max_model_len
           or (max_tokens_cap is not None and r.output_tokens > max_tokens_cap)]
    p99 = sample.percentiles("prompt_tokens", (99,))["p99"]
    o99 = sample.percentiles("output_tokens", (99,))["p99"]
    limit = max_model_len - (min(o99, max_tokens_cap) if max_tokens_cap else o99)
    if not bad and p99 <= limit:
        return None
    return {"requests": len(bad), "share": len(bad) / len(sample.requests), "prompt_p99": p99, "limit": limit,
            "first_line": bad[0].line if bad else None}
