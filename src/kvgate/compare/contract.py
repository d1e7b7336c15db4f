"""The contract a client relies on, as recorded by one run and diffed by a later one (the compare
gate's ``contract`` case): every case of the gates below that ran, with its status, what it said,
and -- for the gates that judge many requests in one case -- each request's or route's own outcome,
so a revision that re-opens one hostile request or one route is named even where the case as a
whole FAILed on both sides.

One record per case (golden.json ``contract``: ``gate/case`` -> record)::

    {"status": "PASS", "said": "<the verdict's message, clipped>",
     "parts": {"response_format-deep": {"ok": true, "rank": 2, "said": "400 in 12 ms (refused)"}, ...}}

Parts: ``security/hostile-parameters`` per request (``evidence.requests``: held when refused 4xx,
a bounded 200, or allowed by the profile, in time, the canary alive after it; a refusal ranks above
a generation, :data:`REQUEST_RANK`), ``security/auth-surface`` per route (``evidence.knocks``: held
when every caller without the key was refused, or the route is absent or declared open). A file
recorded before kvgate recorded more than the status (``"api/n/chat": "PASS"``) reads as a record
without ``said`` or parts. Pure: verdicts in, records and differences out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kvgate.verdict import Verdict

#: The gates whose cases are the contract, in the order the run gates them (the ``limits`` are the
#: max-context and max-tokens gates).
CONTRACT_GATES = ("max-context", "max-tokens", "streaming", "requests", "api", "features", "answers", "security")
#: Characters of a verdict's message kept as the case's evidence (``said``).
SAID = 300
_OK_REQUEST = ("refused", "bounded", "allowed")
_OK_ROUTE = ("refused", "absent", "open")
#: How well a hostile request was held, by outcome: refused (4xx) above generated within bounds
#: (a bounded 200, or allowed by the profile) above not held (unguarded, unanswered, not sent). A
#: request refused on the baseline and generated here is lost though both hold the rule: the server
#: now does work (compiles a schema, samples) it refused before.
REQUEST_RANK = {"refused": 2, "bounded": 1, "allowed": 1}


def _clip(text: str, n: int = SAID) -> str:
    """``text`` on one line in at most ``n`` characters: its start and its last fifth (a verdict's
    ``-> FAIL (...)``), joined by `` ... ``."""
    text = " ".join(str(text).split())
    if len(text) <= n:
        return text
    tail = n // 5
    return text[:n - tail - 5] + " ... " + text[-tail:]


def hostile_parts(evidence: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each hostile request of a ``security/hostile-parameters`` verdict's evidence: probe name ->
    ``{"ok", "rank", "said"}`` (``rank``: :data:`REQUEST_RANK`, 0 when not held; ``said``: ``400 in
    12 ms (refused)``, ``200 after 6.4 s (bounded)``, ``not sent``)."""
    out: dict[str, dict[str, Any]] = {}
    for row in evidence.get("requests") or []:
        name = str(row.get("probe"))
        if row.get("sent") is False:
            out[name] = {"ok": False, "rank": 0, "said": "not sent"}
            continue
        t = float(row.get("elapsed_s") or 0.0)
        when = f"in {t * 1e3:.0f} ms" if t < 1 else f"after {t:.1f} s"
        canary = "" if row.get("canary") in (None, 200) else f"; the canary after it got {row.get('canary')}"
        ok = row.get("outcome") in _OK_REQUEST and not canary
        out[name] = {"ok": ok, "rank": REQUEST_RANK.get(str(row.get("outcome")), 0) if ok else 0,
                     "said": f"{row.get('status')} {when} ({row.get('outcome')}){canary}"}
    return out


def route_parts(evidence: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each route of a ``security/auth-surface`` verdict's evidence: route label -> ``{"ok", "said"}``
    (``said``: each caller's status and class, ``no key: 401 (refused); wrong key: 401 (refused)``)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for k in evidence.get("knocks") or []:
        by.setdefault(str(k.get("route")), []).append(k)
    return {route: {"ok": all(k.get("class") in _OK_ROUTE for k in ks),
                    "said": "; ".join(f"{k.get('who')}: {k.get('status')} ({k.get('class')})" for k in ks)}
            for route, ks in by.items()}


#: case (``gate/case``) -> how its parts are read from its evidence
PARTS = {"security/hostile-parameters": hostile_parts, "security/auth-surface": route_parts}
#: case -> what its parts are, in words (plural)
PART_KINDS = {"security/hostile-parameters": "hostile requests", "security/auth-surface": "routes"}


def record_of(case: str, verdict: Verdict | None, status: str) -> dict[str, Any]:
    """The contract record of one case (``gate/case``): its ``status`` (an ERROR has no verdict),
    its message clipped to :data:`SAID` characters, and its parts where :data:`PARTS` reads them."""
    rec: dict[str, Any] = {"status": status}
    if verdict is not None:
        rec["said"] = _clip(verdict.message)
        reader = PARTS.get(case)
        if reader is not None and isinstance(verdict.evidence, Mapping):
            parts = reader(verdict.evidence)
            if parts:
                rec["parts"] = parts
    return rec


def normal(records: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """golden.json's ``contract`` as records: a bare status (a file from before) becomes ``{"status"}``."""
    return {str(c): (dict(r) if isinstance(r, Mapping) else {"status": str(r)}) for c, r in records.items()}


@dataclass(frozen=True)
class Lost:
    """One thing that held on the baseline and does not here: a case (``part`` None) or one request
    or route of it; what each side said."""

    case: str
    part: str | None
    base_status: str
    new_status: str
    base_said: str
    new_said: str

    @property
    def name(self) -> str:
        return f"{self.case}/{self.part}" if self.part else self.case

    def words(self) -> str:
        """``security/hostile-parameters/deep-schema (baseline 400 in 12 ms (refused); here 200 after 38.5 s
        (unanswered))`` -- for a case, its statuses and what each side's verdict said."""
        if self.part:
            return f"{self.name} (baseline {self.base_said}; here {self.new_said})"
        base = f'PASS: "{_clip(self.base_said, 140)}"' if self.base_said else "PASS"
        here = f'{self.new_status}: "{_clip(self.new_said, 140)}"' if self.new_said else self.new_status
        return f"{self.name} (baseline {base}; here {here})"

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "part": self.part, "baseline": {"status": self.base_status, "said": self.base_said},
                "new": {"status": self.new_status, "said": self.new_said}}


def _rank(part: Mapping[str, Any]) -> int:
    """How well a part held: its ``rank``, else 1 when ``ok`` (a route), else 0."""
    return int(part["rank"]) if isinstance(part.get("rank"), int) else int(bool(part.get("ok")))


def _held_less(base: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` held less than ``base``: by rank where both sides ranked it, else by ``ok``
    (a recording from before ranks: a refusal and a bounded 200 both held)."""
    if isinstance(base.get("rank"), int) and isinstance(new.get("rank"), int):
        return new["rank"] < base["rank"]
    return bool(base.get("ok")) and not new.get("ok")


def diff(base: Mapping[str, Any], new: Mapping[str, Any]
         ) -> tuple[list[Lost], list[str], list[str], dict[str, int], list[str]]:
    """``(lost, gained, not_run_here, held, not_probed_here)`` between two contracts (records or bare statuses):
    ``lost``: each case that PASSed on the baseline and ran here without PASS, and each request or
    route that held on the baseline and not here, or less well (a hostile request refused there and
    generated here: :data:`REQUEST_RANK`) (in a case both sides ran, whatever the case's
    status: a case that FAILed on both sides still loses a request that was refused before; a case
    lost as a whole is listed before its parts); ``gained``: cases PASS here and not on the baseline; ``not_run_here``:
    baseline PASSes this run did not run; ``held``: how many were compared, by kind (``cases``, and
    :data:`PART_KINDS`' words), in that order, kinds with none left out but ``cases``;
    ``not_probed_here``: parts that held on the baseline and were not probed here (``case/part``: a
    route the new server's openapi.json no longer lists -- nothing left to call, so no door opened --
    or a request this kvgate does not send), listed, not judged."""
    b, n = normal(base), normal(new)
    lost: list[Lost] = []
    unprobed: list[str] = []
    held = {"cases": 0}
    for case in sorted(b):
        br, nr = b[case], n.get(case)
        if nr is None:
            continue
        if br.get("status") == "PASS":
            held["cases"] += 1
            if nr.get("status") != "PASS":
                lost.append(Lost(case, None, "PASS", str(nr.get("status")), str(br.get("said") or ""),
                                 str(nr.get("said") or "")))
        bp, np_ = br.get("parts") or {}, nr.get("parts") or {}
        for part in sorted(bp):
            if not _rank(bp[part]):
                continue
            kind = PART_KINDS.get(case, "parts")
            held[kind] = held.get(kind, 0) + 1
            got = np_.get(part)
            if got is None:  # a route the new server no longer lists, a request kvgate no longer sends
                unprobed.append(f"{case}/{part}")
                continue
            if _held_less(bp[part], got):
                lost.append(Lost(case, part, "held", "held less" if got.get("ok") else "not held",
                                 str(bp[part].get("said")), str(got.get("said"))))
    gained = sorted(c for c, r in n.items() if r.get("status") == "PASS" and b.get(c, {}).get("status") != "PASS")
    unrun = sorted(c for c, r in b.items() if r.get("status") == "PASS" and c not in n)
    return lost, gained, unrun, held, unprobed
