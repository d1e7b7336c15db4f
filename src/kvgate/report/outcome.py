"""What a run ends in and its exit code: :func:`decide` turns the verdict aggregate and the gate
entries of summary.json into an :class:`Outcome` under the run's gate mode (enforce, record,
certify: :mod:`kvgate.run.modes`). Used by the run record (:meth:`kvgate.report.record.RunRecord.outcome`)
and the run.

Exit codes (:data:`EXIT_CODES`; README "Verdicts and exit codes"; ``summary.json`` ``exit_code``): 0 pass,
1 a gate failed, 2 interrupted / incomplete, 4 usage error (bad option, profile, unreachable
endpoint), 5 no gate selected, 6 INVALID only (no gate failed, a measurement cannot be trusted),
7 not certified (certify mode: something was skipped), 9 INCONCLUSIVE only (no gate failed or
was INVALID; a statistical verdict stayed undecided: its interval straddles its limit), 8 no server (the live gates selected could
not run here: the launcher is unavailable; only the arithmetic was gated). 2, 4 and 5 are
pytest's own codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

#: outcome -> exit code. Outcomes are :meth:`kvgate.report.record.RunRecord.final_status` values plus
#: the mode words RECORDED, CERTIFIED, NOT-CERTIFIED.
EXIT_CODES = {
    "PASS": 0, "SKIP": 0, "RECORDED": 0, "CERTIFIED": 0,
    "FAIL": 1,
    "INCOMPLETE": 2,
    "ERROR": 4,
    "NO-GATES": 5,
    "INVALID": 6,
    "NOT-CERTIFIED": 7,
    "INCONCLUSIVE": 9,
    "NO-SERVER": 8,
}
#: outcome -> what it means, in summary.json ``exit_meaning`` (by outcome, not by exit code: a
#: RECORDED run exits 0 without having passed).
OUTCOME_MEANING = {
    "PASS": "pass", "SKIP": "pass: nothing failed, every selected gate was skipped (see why)",
    "RECORDED": "recorded (calibration): verdicts kept, not enforced; overall says what they were",
    "CERTIFIED": "certified: every selected gate and check was made and passed",
    "FAIL": "a gate failed", "INCOMPLETE": "interrupted or incomplete", "ERROR": "usage error (nothing was gated)",
    "NO-GATES": "no gate selected", "INVALID": "INVALID only: no gate failed, a measurement cannot be trusted",
    "INCONCLUSIVE": "INCONCLUSIVE only: no gate failed or was INVALID; a statistical verdict stayed undecided: its interval straddles its limit",
    "NOT-CERTIFIED": "not certified: a gate or check was skipped or INVALID (certify mode)",
    "NO-SERVER": "no server: the live gates could not run here (the launcher is unavailable); only the "
                 "arithmetic was gated",
    "RUNNING": "running",
}
#: exit code -> its meaning (README "Verdicts and exit codes").
EXIT_MEANING = {
    0: "pass, certified or recorded", 1: "a gate failed", 2: "interrupted or incomplete",
    4: "usage error (nothing was gated)", 5: "no gate selected",
    6: "INVALID only: no gate failed, a measurement cannot be trusted",
    7: "not certified: a gate or check was skipped or INVALID (certify mode)",
    8: "no server: the live gates could not run (launcher unavailable here)",
    9: "INCONCLUSIVE only: no gate failed or was INVALID; a statistical verdict stayed undecided: its interval straddles its limit",
}


@dataclass(frozen=True)
class Outcome:
    """What a run ends in: ``outcome`` (a key of :data:`EXIT_CODES`), its ``exit_code``, and for
    certify the checks that kept it from being certified (``{"id", "check", "status", "reason"}``)."""

    outcome: str
    exit_code: int
    not_certified: list[dict[str, Any]] = field(default_factory=list)

    @property
    def meaning(self) -> str:
        """What the outcome means (:data:`OUTCOME_MEANING`), e.g. ``recorded (calibration): ...``."""
        return OUTCOME_MEANING.get(self.outcome, EXIT_MEANING.get(self.exit_code, ""))


def decide(mode: str, final_status: str, gates: Iterable[dict[str, Any]]) -> Outcome:
    """The run's outcome under ``mode``.

    ``final_status``: the verdict aggregate (PASS, FAIL, INVALID, SKIP, INCOMPLETE, ERROR,
    NO-GATES). ``gates``: summary.json gate entries (``id``, ``status``, ``message``,
    ``skipped_checks``). A run that could not start (ERROR), was cut short (INCOMPLETE) or
    selected nothing (NO-GATES) keeps that outcome; one that had no server for its live gates
    (NO-SERVER) keeps it too (certify still lists what was not checked) in every mode; otherwise ``record`` is
    RECORDED (FAIL when a gate ended without a verdict: the harness broke); ``certify`` is FAIL or NOT-CERTIFIED when a check was not made (SKIP, INVALID,
    skipped sub-check), else CERTIFIED; ``enforce`` is the aggregate itself.
    """
    if final_status in ("ERROR", "INCOMPLETE", "NO-GATES", "RUNNING"):
        return Outcome(final_status, EXIT_CODES.get(final_status, 1))
    if mode == "record":
        if final_status == "NO-SERVER":
            return Outcome("NO-SERVER", EXIT_CODES["NO-SERVER"])  # nothing live was measured: nothing to record
        if any(g["status"] in ("ERROR", "NO-VERDICT") for g in gates):
            return Outcome("FAIL", 1)  # the harness broke: something was not measured, nothing to calibrate from
        return Outcome("RECORDED", 0)
    if mode == "certify":
        missing: list[dict[str, Any]] = []
        for g in gates:
            if g["status"] in ("SKIP", "INVALID", "INCONCLUSIVE"):
                missing.append({"id": g["id"], "check": g["id"], "status": "SKIP" if g["status"] == "SKIP" else "INVALID",
                                "reason": g.get("message", "")})
            for s in g.get("skipped_checks", ()):
                missing.append({"id": g["id"], "check": s["check"], "status": "SKIP", "reason": s["reason"]})
        if final_status in ("FAIL", "NO-SERVER"):
            return Outcome(final_status, EXIT_CODES[final_status], missing)
        if missing:
            return Outcome("NOT-CERTIFIED", 7, missing)
        return Outcome("CERTIFIED", 0)
    return Outcome(final_status, EXIT_CODES.get(final_status, 1))
