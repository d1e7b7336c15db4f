"""``reports/signoff.md``: the run on one screen, for a PR comment, a rollout ticket or
``$GITHUB_STEP_SUMMARY`` -- the overall verdict, server and profile identity, the verdict table
(every gate that did not pass, the passes folded in a ``<details>`` block), the fit table, and
what was not checked (or not run) and why.

Built from ``summary.json`` alone (schema ``kvgate/schema/summary.schema.json``) plus the fit
table text the fit gate printed, so it describes exactly the run those reports describe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from kvgate.report.allure_meta import fmt_quantity, profile_sha256
from kvgate.report.redact import Redactor

SIGNOFF = "signoff.md"
#: A verdict table cell's message is cut to this many characters (the full text is in summary.json
#: and the Allure report).
MESSAGE_CHARS = 140

#: What an overall verdict means for whoever signs off.
OVERALL_MEANING = {
    "PASS": "every gate passed (SKIPs listed below were not checked)",
    "FAIL": "at least one gate found a defect in the deployment (or kvgate could not run it): do not roll out",
    "INVALID": "no FAIL, but at least one measurement could not be trusted: rerun before signing",
    "INCONCLUSIVE": "no FAIL, but at least one percentile could not be decided within its sampling cap (its "
                    "confidence interval straddles the limit): measure longer or on a quieter host before signing",
    "SKIP": "nothing was checked",
    "INCOMPLETE": "the run was cut short: not every gate ran, so this is no sign-off",
    "ERROR": "the run could not start: nothing was gated",
    "NO-GATES": "no gate was selected",
    "NO-SERVER": "no server could be had for the live gates (the launcher cannot run here): only the arithmetic was "
                 "gated -- this is not a pass",
    "RUNNING": "the run has not finished (or was killed outright)",
    "NOT-CERTIFIED": "certify mode: a selected gate or check was skipped or INVALID, so this is no sign-off",
}


#: Files a run may leave in the reports dir that signoff.md links (name -> what it shows).
LINKED = {
    "capacity.png": "the capacity search: latency p95 with bounds, throughput and goodput per concurrency step",
    "capacity-steps.csv": "the capacity search's steps (p95s with bounds, goodput, throughput, scheduler gauges)",
    "soak.png": "the soak: memory and TTFT p95 per round",
    "soak-rounds.csv": "the soak's rounds",
}


def _cell(text: Any, limit: int = MESSAGE_CHARS) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1].rsplit(" ", 1)[0] + " …"


def signoff_markdown(summary: Mapping[str, Any], fit_table: str | None = None,
                     redactor: Redactor | None = None, report_hint: str | None = None,
                     files: tuple[str, ...] = ()) -> str:
    """The sign-off Markdown for one run's ``summary`` (a parsed summary.json). ``fit_table``: the
    fit gate's table text (None: the section says it is not in this run). ``report_hint``: where
    the HTML report is, one line. ``files``: plots and tables of this run in the reports dir
    (:data:`LINKED`), linked relative to signoff.md. Redacted with ``redactor`` (a fresh one when None)."""
    redactor = redactor or Redactor()
    overall = summary.get("overall") or "?"
    outcome = summary.get("outcome")
    # the headline says what the run ends in: a certify run whose verdicts all PASS but that is
    # NOT-CERTIFIED (exit 7) must not read "PASS: every gate passed"
    head = outcome if outcome and outcome != overall and summary.get("exit_code") not in (0, None) else overall
    profile = summary.get("profile") or "(no profile)"
    endpoint = summary.get("endpoint") or "-"
    counts = summary.get("counts") or {}
    count_text = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("PASS", "FAIL", "INVALID", "INCONCLUSIVE", "SKIP", "ERROR")
                           if k != "INCONCLUSIVE" or counts.get(k))
    launch = summary.get("launch") or {}
    if launch.get("mode") == "embedded":
        where = "embedded vLLM, started by kvgate"
    elif summary.get("endpoint_contacted"):
        where = "gated with --endpoint"
    else:
        where = "not contacted"
    source = summary.get("profile_source")
    sha = profile_sha256(source)
    prof_text = f"{profile}" + (f" (`{Path(source).name}`" + (f", sha256 {sha}" if sha else "") + ")" if source else "")
    secs = summary.get("duration_s")
    lines = [
        f"## kvgate sign-off: {profile} @ {endpoint} — {head}",
        "",
        f"**{head}**: {OVERALL_MEANING.get(head, summary.get('exit_meaning') or '')}."
        + (f" The verdicts themselves: {overall}." if head != overall else ""),
        "",
        "| | |",
        "|---|---|",
        f"| overall | **{overall}** ({count_text}) |",
        f"| profile | {_cell(prof_text, 300)} |",
        f"| endpoint | {_cell(endpoint, 300)} ({where}) |",
        f"| server | vLLM {summary.get('server_version') or 'version unknown'} |",
        f"| run | `{summary.get('run_id') or '-'}`" + (f", {secs:.0f} s" if isinstance(secs, (int, float)) else "")
        + (f", gate mode {summary['gate_mode']}" if summary.get("gate_mode") else "") + " |",
    ]
    if summary.get("gate_mode") not in (None, "enforce") and summary.get("outcome"):
        lines += ["", f"**Gate mode {summary['gate_mode']}: {summary['outcome']}**"
                  + (f" (exit {summary.get('exit_code')}: {summary.get('exit_meaning')})" if summary.get("exit_meaning")
                     else "")]
    if summary.get("error"):
        lines += ["", f"**Error:** {_cell(summary['error'], 600)}"]
    if summary.get("complete") is False and overall != "ERROR":
        where_cut = f" during {summary['interrupted_in']}" if summary.get("interrupted_in") else ""
        lines += ["", f"**Interrupted{where_cut}.** Gates that did not run: "
                  + (", ".join(f"`{g}`" for g in summary.get("not_run") or []) or "none listed")]
    gates = summary.get("gates") or []
    lines += ["", "### Verdicts", ""]
    shown = [g for g in gates if g.get("status") != "PASS"]
    passed = [g for g in gates if g.get("status") == "PASS"]
    if shown:
        lines += _verdict_table(shown)
    elif gates:
        lines.append(f"All {len(gates)} gates passed.")
    else:
        lines.append("No gate recorded a verdict.")
    if passed:  # folded (GitHub renders <details>), so the decisive rows stay on one screen
        lines += ["", f"<details><summary>{len(passed)} PASS</summary>", "", *_verdict_table(passed), "", "</details>"]
    lines += ["", "### Fit", ""]
    lines += ["```", fit_table.rstrip(), "```"] if fit_table else ["The fit gate did not run in this run."]
    lines += ["", "### Not checked", ""]
    skipped = summary.get("skipped_checks") or []
    not_run = summary.get("not_run") or []
    if not skipped and not not_run:
        lines.append("Everything selected was checked.")
    lines += [f"- `{s.get('id')}`: {s.get('check')} — {_cell(s.get('reason', ''), 300)}" for s in skipped]
    lines += [f"- `{g}`: not run (the run ended before it)" for g in not_run]
    if files:
        lines += ["", "### Plots and tables", ""]
        lines += [f"- [{name}]({name}): {LINKED.get(name, name)}" for name in files]
    if report_hint:
        lines += ["", report_hint]
    return redactor.text("\n".join(lines) + "\n")


def _verdict_table(gates: list[Mapping[str, Any]]) -> list[str]:
    rows = ["| status | gate | measured | limit | verdict |", "|---|---|---|---|---|"]
    for g in gates:
        rows.append(f"| {g.get('status')} | `{g.get('id')}` | {_cell(fmt_quantity(g.get('measured') or {}, why=False))}"
                    f" | {_cell(fmt_quantity(g.get('limit') or {}, why=False))} | {_cell(g.get('message', ''))} |")
    return rows


def fit_table_from_results(results: Path) -> str | None:
    """The ``fit-table.txt`` attachment the fit gate left in an Allure results directory (None
    when the fit gate did not run or the directory is missing)."""
    if not results.is_dir():
        return None
    for path in sorted(results.glob("*-result.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for att in data.get("attachments") or []:
            if att.get("name") == "fit-table.txt" and (results / att.get("source", "")).is_file():
                return (results / att["source"]).read_text(encoding="utf-8", errors="replace")
    return None


def write_signoff(reports: Path, results: Path | None = None, redactor: Redactor | None = None,
                  report_hint: str | None = None) -> Path:
    """Write ``reports/signoff.md`` from ``reports/summary.json`` and the fit table in ``results``
    (default ``reports/allure-results``). Raises ``FileNotFoundError`` when there is no
    summary.json, ``ValueError`` when it is not JSON."""
    summary_path = reports / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    fit = fit_table_from_results(results if results is not None else reports / "allure-results")
    path = reports / SIGNOFF
    files = tuple(name for name in LINKED if (reports / name).is_file())
    path.write_text(signoff_markdown(summary, fit, redactor, report_hint, files), encoding="utf-8")
    return path
