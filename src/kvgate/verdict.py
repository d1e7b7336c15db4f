"""The verdict type every gate returns.

A :class:`Verdict` is pure data: which gate, PASS/FAIL/INVALID/SKIP, what was measured, the limit
it was held to, the evidence (JSON-serialisable), and a one-line ``message`` that reads as a
verdict, e.g. ``KV pool holds 4 full-length (2048-token) sequences; profile declares 8 -> FAIL``.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """PASS and FAIL are verdicts on the server; INVALID means the measurement itself cannot be
    trusted (e.g. the client fell behind its schedule); SKIP means the profile does not ask."""

    PASS = "PASS"
    FAIL = "FAIL"
    INVALID = "INVALID"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Verdict:
    """One gate's outcome.

    ``measured`` and ``limit`` are human-readable values with units (e.g. ``"2049 tokens"``);
    ``evidence`` holds the raw observations (status codes, bodies truncated, timings in seconds).
    """

    gate: str
    status: Status
    message: str
    measured: Any = None
    limit: Any = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def combine(gate: str, parts: list[Verdict]) -> Verdict:
    """Fold several sub-checks into one verdict: the first non-PASS decides (FAIL > INVALID > SKIP).

    The message joins every failing part's message with ``"; "``; the evidence keeps all parts.
    """
    order = [Status.FAIL, Status.INVALID, Status.SKIP]
    evidence = {p.gate: p.to_dict() for p in parts}
    for status in order:
        bad = [p for p in parts if p.status is status]
        if bad and (status is not Status.SKIP or len(bad) == len(parts)):
            return Verdict(gate, status, "; ".join(p.message for p in bad),
                           measured=[p.measured for p in bad], limit=[p.limit for p in bad], evidence=evidence)
    return Verdict(gate, Status.PASS, "; ".join(p.message for p in parts if p.status is Status.PASS),
                   measured=[p.measured for p in parts], limit=[p.limit for p in parts], evidence=evidence)
