"""The verdict type every gate returns, and its report form.

A :class:`Verdict` is pure data: which gate, PASS/FAIL/INVALID/SKIP, what was measured, the limit
it was held to (each a number with a ``unit``), the evidence (JSON-serialisable), the sub-checks it
was folded from (``parts``), and a one-line ``message`` that reads as a verdict, e.g.
``KV pool holds 4 full-length (2048-token) sequences; profile declares 8 -> FAIL``.

Gate modules pass plain values (``measured=2049, limit=2048, unit="tokens"``);
:meth:`Verdict.to_summary` turns them into the report form of ``summary.json`` (schema
``kvgate/schema/summary.schema.json``): ``measured``/``limit`` as ``{"value", "unit"}``, or
``{"value": null, "unit": null, "reason": ...}`` when there is no single value, and ``checks`` /
``skipped_checks`` listing the sub-verdicts with their own status.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """PASS and FAIL are verdicts on the server; INVALID means the measurement itself cannot be
    trusted (e.g. the client fell behind its schedule); SKIP means the profile does not ask;
    INCOMPLETE means the measurement was cut short (a soak stopped by a signal or its deadline)
    and is never a PASS; INCONCLUSIVE means a percentile verdict stayed undecided at its sampling
    cap -- its confidence interval straddles the limit (:mod:`kvgate.stats.confidence`) -- never a PASS,
    and INVALID in certify mode."""

    PASS = "PASS"
    FAIL = "FAIL"
    INVALID = "INVALID"
    SKIP = "SKIP"
    INCOMPLETE = "INCOMPLETE"
    INCONCLUSIVE = "INCONCLUSIVE"


#: Units gates use (free text is allowed; these keep reports consistent).
UNITS = ("tokens", "ms", "s", "bytes", "sequences", "requests", "HTTP status", "chars", "chunks", "events",
         "preemptions", "ratio", "blocks")

_NUMBER_UNIT = re.compile(r"^\s*([-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)\s+([A-Za-z%/][\w%/ .-]*?)\s*$")


#: Characters that must not reach a console, log or report raw from an endpoint's answer: C0 and C1
#: controls and DEL (an ESC sequence can rewrite a CI log line: ``\x1b[2K\rOVERALL: PASS``), lone
#: surrogates (unencodable), bidi overrides and isolates (text that reads other than it is), and the
#: Unicode line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character of :data:`_UNSAFE` written as a visible escape (``\x1b``,
    ``\u202e``); ``lines``: newlines and tabs kept (a multi-line body in evidence). The one escape of
    bytes that came from an endpoint: every :class:`Verdict` passes its message, values and evidence
    through it, so the console, JUnit, Allure, signoff.md and summary.json all get the same text.
    Idempotent (a backslash is left as it is)."""
    return (_UNSAFE_KEEP_LINES if lines else _UNSAFE).sub(_escape, text)


def printable_data(obj: Any) -> Any:
    """``obj`` (nested dicts, lists, tuples, strings) with every string -- keys too -- passed through
    :func:`printable` (newlines kept); other values as they are."""
    if isinstance(obj, str):
        return printable(obj, lines=True)
    if isinstance(obj, dict):
        return {printable_data(k) if isinstance(k, str) else k: printable_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [printable_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(printable_data(v) for v in obj)
    return obj


#: The evidence key every PASS taken at ``slo.pass_confidence_floor`` carries (set by :class:`Verdict`
#: itself from the judgement's ``pass_confidence_floor_used``): ``{"achieved": 0.623 or None,
#: "floor": 0.6, "stated": 0.95 or None}`` -- the confidence the PASS has, the floor it was taken at,
#: the level slo.confidence asked of it.
PASS_CONFIDENCE = "pass_confidence"


def floor_pass(evidence: Any) -> dict[str, Any] | None:
    """The lowest-confidence PASS taken at a declared floor anywhere in ``evidence`` (nested dicts and
    lists: a folded verdict keeps its parts' evidence): a dict whose ``pass_confidence_floor_used`` is
    a number and whose ``decision`` (when stated) is PASS. Returns ``{"achieved", "floor", "stated"}``
    (fractions; ``achieved`` None when the judgement did not state it -- the floor is then its
    level), an already-set :data:`PASS_CONFIDENCE` as it is, or None."""
    if isinstance(evidence, dict) and isinstance(evidence.get(PASS_CONFIDENCE), dict):
        return evidence[PASS_CONFIDENCE]
    found: list[dict[str, Any]] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            f = o.get("pass_confidence_floor_used")
            if isinstance(f, (int, float)) and not isinstance(f, bool) and o.get("decision", "PASS") == "PASS":
                a = o.get("pass_confidence_achieved")
                found.append({"achieved": float(a) if isinstance(a, (int, float)) else None, "floor": float(f),
                              "stated": o.get("pass_confidence_stated")})
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(evidence)
    if not found:
        return None
    return min(found, key=lambda d: d["achieved"] if d["achieved"] is not None else d["floor"])


def floor_pass_words(low: dict[str, Any]) -> str:
    """``PASS at 62% confidence (below slo.confidence 95%: too few independent samples;
    slo.pass_confidence_floor 0.6)`` for a :func:`floor_pass` record; ``PASS at 62%`` short form is
    :func:`floor_pass_short`."""
    stated = low.get("stated")
    below = f"below the {stated * 100:.4g}% slo.confidence asks" if isinstance(stated, (int, float)) else "below slo.confidence"
    return (f"{floor_pass_short(low)} confidence ({below}: too few independent samples; "
            f"slo.pass_confidence_floor {low['floor']:g})")


def floor_pass_short(low: dict[str, Any]) -> str:
    """``PASS at 62%``: the confidence a floor PASS has (the floor when not stated)."""
    a = low.get("achieved")
    return f"PASS at {(a if a is not None else low['floor']) * 100:.0f}%"


@dataclass(frozen=True)
class Verdict:
    """One gate's outcome.

    ``measured`` and ``limit`` are single values -- a number (``2049``), or a word when the check
    is categorical (``"length"``, ``"4xx"``) -- in ``unit`` (``limit_unit`` when the limit's unit
    differs; ``None`` for unit-less values). ``evidence`` holds the raw observations (status codes,
    bodies truncated, timings in seconds). ``parts``: the sub-verdicts this one was folded from
    (:func:`combine`), each with its own status.
    """

    gate: str
    status: Status
    message: str
    measured: Any = None
    limit: Any = None
    evidence: dict[str, Any] = field(default_factory=dict)
    unit: str | None = None
    limit_unit: str | None = None
    parts: tuple["Verdict", ...] = ()
    #: The most likely cause of a FAIL, INVALID or INCONCLUSIVE, stated only from measured evidence
    #: (``"2-byte KV elements: the server runs bfloat16/float16, the profile says float32"``), or a
    #: sentence saying that the evidence cannot tell the candidates apart; ``None`` when the gate
    #: measured nothing that points at one. Never set on a PASS or SKIP.
    cause: str | None = None

    def __post_init__(self) -> None:
        # what came from an endpoint is escaped here, once, for every writer (printable)
        object.__setattr__(self, "message", printable(self.message))
        if self.cause is not None:
            object.__setattr__(self, "cause", printable(self.cause))
        for name in ("measured", "limit"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, printable(value))
        if self.evidence:
            object.__setattr__(self, "evidence", printable_data(self.evidence))
        if self.status is Status.PASS:
            low = floor_pass(self.evidence)
            if low is not None:
                object.__setattr__(self, "evidence", {**self.evidence, PASS_CONFIDENCE: low})
                if not self.message.startswith("PASS at "):
                    object.__setattr__(self, "message", f"{floor_pass_words(low)} -- {self.message}")

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def to_dict(self) -> dict[str, Any]:
        """Plain data, values as given (``parts`` as their ``to_dict``)."""
        d = asdict(self)
        d["status"] = self.status.value
        d["parts"] = [p.to_dict() for p in self.parts]
        return d

    @property
    def skipped_parts(self) -> list["Verdict"]:
        """Sub-checks that were not checked (SKIP) although the verdict itself was not a SKIP."""
        if self.status is Status.SKIP:
            return []
        return [p for p in self.parts if p.status is Status.SKIP]

    def not_checked_note(self) -> str:
        """``"1 part not checked: memory not declared"`` for the console, or ``""``."""
        skipped = self.skipped_parts
        if not skipped:
            return ""
        reasons = "; ".join(skip_reason(p) for p in skipped)
        return f"{len(skipped)} part{'s' if len(skipped) > 1 else ''} not checked: {reasons}"

    def to_summary(self) -> dict[str, Any]:
        """The report form (summary.json, JUnit properties, Allure): ``gate``, ``status``,
        ``message``, ``measured``/``limit`` as quantities (:func:`quantity`), ``checks`` (the
        parts, each in this form without evidence), ``skipped_checks`` and ``evidence``."""
        out = self._core()
        out["checks"] = [p._core() for p in self.parts]
        out["skipped_checks"] = [{"check": p.gate, "reason": skip_reason(p)} for p in self.skipped_parts]
        ev = dict(self.evidence)
        for name, value in (("measured", self.measured), ("limit", self.limit)):
            if isinstance(value, (dict, list, tuple)):
                ev.setdefault(f"{name}_values", value)
        out["evidence"] = ev
        return out

    def _core(self) -> dict[str, Any]:
        out = {
            "gate": self.gate, "status": self.status.value, "message": self.message,
            "measured": quantity(self.measured, self.unit, self._missing("measured")),
            "limit": quantity(self.limit, self.limit_unit or self.unit, self._missing("limit")),
        }
        if self.cause is not None:
            out["cause"] = self.cause
        return out

    def _missing(self, what: str) -> str:
        if what == "limit" and self.status is Status.SKIP:
            return "not checked: " + skip_reason(self)
        if what == "measured" and self.status is Status.SKIP and self.measured is None:
            return "not measured: " + skip_reason(self)
        if self.status is Status.INVALID:
            return "no trustworthy measurement: " + skip_reason(self)
        if self.parts:
            return f"one {what} value per check (see checks)"
        return f"the gate states no single {what} value (see message and evidence)"


def skip_reason(v: Verdict) -> str:
    """The first clause of a verdict's message (``"memory not declared"``), without ``-> STATUS``."""
    head = v.message.split(";")[0].strip()
    return re.sub(r"\s*->\s*(PASS|FAIL|INVALID|SKIP)\b.*$", "", head) or v.message


def quantity(value: Any, unit: str | None, reason: str) -> dict[str, Any]:
    """``{"value": v, "unit": u}`` for one number, word or boolean; ``{"value": None, "unit": None,
    "reason": reason}`` when there is none (``None``, or several values: dicts and lists go to the
    evidence instead). A legacy string ``"12.5 ms"`` with no ``unit`` is split into 12.5 and "ms".
    Floats are rounded to 6 significant digits."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (dict, list, tuple)):
        why = reason if value is None else f"several values, listed in evidence: {reason}"
        return {"value": None, "unit": None, "reason": why}
    if isinstance(value, str) and unit is None:
        m = _NUMBER_UNIT.match(value)
        if m:
            num = float(m.group(1).replace(",", ""))
            return {"value": int(num) if num.is_integer() and "." not in m.group(1) else num, "unit": m.group(2)}
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"value": None, "unit": None, "reason": f"not a finite number ({value}): {reason}"}
        value = float(f"{value:.6g}")
    elif not isinstance(value, (bool, int, str)):
        value = str(value)
    return {"value": value, "unit": unit}


def combine(gate: str, parts: list[Verdict], headline: str | None = None) -> Verdict:
    """Fold several sub-checks into one verdict, failing closed: the worst part decides, in the order
    FAIL > INVALID > INCOMPLETE > INCONCLUSIVE > SKIP > PASS. SKIP decides only when every part
    skipped (a PASS beside skipped parts stays a PASS and lists them: :attr:`Verdict.skipped_parts`);
    anything else that is not a PASS makes the whole not a PASS.

    The message joins every deciding part's message with ``"; "`` (on PASS, every passing part's);
    ``measured``/``limit``/units are those of the first deciding part -- on PASS the part named
    ``headline`` if it passed, else the first passing part. The evidence keeps every part (by its
    gate name) and ``parts`` lists them with their own status.

    An empty ``parts`` is INVALID ("nothing measured": never a PASS on nothing). Raises
    ``ValueError`` for a part whose status is not a :class:`Status` (a status this fold does not
    order would otherwise fall through to PASS).
    """
    unknown = [p.gate for p in parts if not isinstance(p.status, Status) or p.status not in _SEVERITY]
    if unknown:
        raise ValueError(f"combine({gate!r}): parts with a status that is not a kvgate Status: {unknown}")
    if not parts:
        return Verdict(gate, Status.INVALID, f"{gate}: nothing measured (no sub-check was folded) -> INVALID",
                       evidence={}, cause="no sub-check ran: a verdict folded from nothing is never a PASS")
    evidence = {p.gate: p.to_dict() for p in parts}
    for status in _SEVERITY[:-1]:
        bad = [p for p in parts if p.status is status]
        if bad and (status is not Status.SKIP or len(bad) == len(parts)):
            causes = list(dict.fromkeys(p.cause for p in bad if p.cause))
            return _folded(gate, status, "; ".join(p.message for p in bad), bad[0], evidence, parts,
                           cause="; ".join(causes) or None)
    passed = [p for p in parts if p.status is Status.PASS]
    lead = next((p for p in passed if p.gate == headline), passed[0] if passed else None)
    return _folded(gate, Status.PASS, "; ".join(p.message for p in passed), lead, evidence, parts)


#: :func:`combine`'s order, worst first.
_SEVERITY = (Status.FAIL, Status.INVALID, Status.INCOMPLETE, Status.INCONCLUSIVE, Status.SKIP, Status.PASS)


def _folded(gate: str, status: Status, message: str, lead: Verdict | None, evidence: dict[str, Any],
            parts: list[Verdict], cause: str | None = None) -> Verdict:
    if lead is None:
        return Verdict(gate, status, message, evidence=evidence, parts=tuple(parts), cause=cause)
    return Verdict(gate, status, message, measured=lead.measured, limit=lead.limit, evidence=evidence,
                   unit=lead.unit, limit_unit=lead.limit_unit, parts=tuple(parts), cause=cause)
