"""``reports/signoff.md``: the run on one screen, for a PR comment, a rollout ticket or
``$GITHUB_STEP_SUMMARY`` -- the overall verdict, server and profile identity (the vLLM command line
or the KServe object's args, kvgate's version and commit, the host contention the latency windows
measured, or why it was not -- a row in every run), the verdict table (every gate that did not
pass with its whole message and its cause, the passes folded in a ``<details>`` block and cut),
which way each measured/limit pair passes, the fit table,
and what was not checked (or not run) and why, in full.

Built from ``summary.json`` alone (schema ``kvgate/schema/summary.schema.json``) plus the fit
table text the fit gate printed, so it describes exactly the run those reports describe.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from kvgate.report.allure_meta import fmt_quantity, profile_sha256
from kvgate.report.record import server_words
from kvgate.report.redact import Redactor
from kvgate.verdict import floor_pass

SIGNOFF = "signoff.md"
#: A PASS row's message is cut to this many characters (the full text is in summary.json and the
#: Allure report); a row that did not pass is never cut: it is what the signer must read.
MESSAGE_CHARS = 140

#: What an overall verdict means for whoever signs off.
OVERALL_MEANING = {
    "PASS": "every gate passed (SKIPs listed below were not checked)",
    "FAIL": "at least one gate found a defect in the deployment (or kvgate could not run it): do not roll out",
    "INVALID": "no FAIL, but at least one measurement could not be trusted: rerun before signing",
    "INCONCLUSIVE": "no FAIL, but at least one statistical verdict stayed undecided (its interval straddles its "
                    "limit at the most the run could measure): measure longer or on a quieter host before signing",
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


#: What certify means on a server kvgate launched itself from the profile (embedded, docker).
LAUNCHED_MEANING = ("The server was launched by kvgate from the profile ({mode}): this run shows the profile and "
                    "kvgate hold on this machine, not that a deployment you serve does -- gate that one with "
                    "`--endpoint=URL` (or `--isvc`). A profile whose own cases SKIP here (tiny-cpu has no GPU "
                    "memory, no second pool, no baseline) can never read CERTIFIED: certify exits 7 naming them.")


#: What kvgate launched, by summary.json ``launch.mode``.
LAUNCHED = {"embedded": "embedded vLLM", "docker": "vLLM in docker", "pools": "two embedded vLLM pools behind nginx"}


def launch_words(launch: dict[str, Any], contacted: bool) -> str:
    """The endpoint row's words for how the server came to be (summary.json ``launch``): started by
    kvgate only when a launch succeeded; a failed one (``launch.error``) says it did not start."""
    server = LAUNCHED.get(launch.get("mode") or "")
    if server and launch.get("error"):
        return f"{server}: kvgate's launch failed, nothing gated"
    if server:
        return f"{server}, started by kvgate"
    return "gated with --endpoint" if contacted else "not contacted"


def _cell(text: Any, limit: int | None = MESSAGE_CHARS) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if limit is None or len(s) <= limit else s[: limit - 1].rsplit(" ", 1)[0] + " …"


def _found(data: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in ``data`` (nested dicts and lists), depth first."""
    out: list[Any] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            out += [v] if k == key else _found(v, key)
    elif isinstance(data, list):
        for v in data:
            out += _found(v, key)
    return out


def server_command(summary: Mapping[str, Any]) -> str | None:
    """The served command line: the launch's (embedded, docker) or the KServe object's container
    ``command`` + ``args`` the deployment/spec gate read (``evidence.spec_argv``); None for an
    ``--endpoint`` kvgate cannot see into."""
    cmd = (summary.get("launch") or {}).get("command") or next(iter(_found(summary.get("gates") or [], "spec_argv")), None)
    return " ".join(str(a) for a in cmd) if cmd else None


def contention_windows(summary: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Every host-contention window a run's gates recorded, once each: ``(gate id, window,
    HostContention.to_dict())``. The latency gates (:func:`kvgate.gates.load.host_evidence`) and the
    pools' isolation write ``evidence.host_contention`` as ``{scenario name: window}``, the capacity
    gate one window per step (``evidence.steps[i].host_contention``, named ``concurrency N``); a
    verdict folded from parts repeats its parts' evidence, so a window is keyed by gate and name."""
    seen: dict[tuple[str, str], Mapping[str, Any]] = {}

    def walk(data: Any, gid: str, name: str) -> None:
        if isinstance(data, list):
            for v in data:
                step = isinstance(v, Mapping) and isinstance(v.get("concurrency"), int) and "decision" in v
                walk(v, gid, f"concurrency {v['concurrency']}" if step else name)
        elif isinstance(data, Mapping):
            for k, v in data.items():
                if k == "host_contention" and isinstance(v, Mapping):
                    windows = {name: v} if "measured" in v else {str(n): w for n, w in v.items()}
                    for n, w in windows.items():
                        if isinstance(w, Mapping) and "measured" in w:
                            seen.setdefault((gid, n), w)
                else:
                    walk(v, gid, name)

    for g in summary.get("gates") or []:
        walk(g.get("evidence") or {}, str(g.get("id")), "")
    return [(gid, name, w) for (gid, name), w in seen.items()]


def ready_to_serving(summary: Mapping[str, Any]) -> str | None:
    """signoff.md's ready -> serving row: the health/ready-to-serving verdict's measured seconds (from
    ready -- ``/health`` 200, the model listed -- to the first completed generation), its limit,
    status and who timed it; None when the run has no such verdict."""
    g = next((g for g in summary.get("gates") or [] if str(g.get("id", "")).endswith("/health/ready-to-serving")), None)
    if g is None:
        return None
    m, lim = (g.get("measured") or {}).get("value"), (g.get("limit") or {}).get("value")
    ev = (g.get("evidence") or {}).get("readiness") or {}
    who = f", timed by {ev['where']}" if ev.get("where") else ""
    refused = f", {ev['refusals']} refusals" if ev.get("refusals") else ""
    seen = f"{m:g} s" + ("" if ev.get("onset_seen", True) else " at least (ready before kvgate looked)") \
        if isinstance(m, (int, float)) else "not measured"
    limit = f" (limit {lim:g} s)" if isinstance(lim, (int, float)) else ""
    return f"{seen}{limit}{refused}{who}: {g.get('status')}"


def host_contention(summary: Mapping[str, Any]) -> str:
    """signoff.md's host-contention row, for every run: the worst window's figures (its share of the
    server's CPUs that went to other processes, per CPU, the server tree's and kvgate's time, the
    run queue: :meth:`kvgate.host.contention.HostContention.text`) and which window, out of how many;
    or why it was not measured -- the windows' own reason (``--endpoint``: kvgate cannot see the
    server's processes), or ``no load gate ran`` when no gate measured a window."""
    windows = contention_windows(summary)
    measured = [(w["share"], gid, name, w) for gid, name, w in windows
                if w.get("measured") and isinstance(w.get("share"), (int, float))]
    if measured:
        share, gid, name, w = max(measured, key=lambda t: t[0])
        where = f"`{gid}`" + (f" ({name})" if name else "")
        text = str(w.get("text") or f"{share:.1%} of the server's CPUs went to other processes")
        text = text.removeprefix("host contention: ")
        others = len(windows) - len(measured)
        more = f"; {others} not measured" if others else ""
        return f"{text} -- the worst of {len(measured)} measured window{'s' if len(measured) != 1 else ''}: {where}{more}"
    if windows:
        why = list(dict.fromkeys(str(w.get("reason") or "no reason given") for _, _, w in windows))
        return f"not measured ({'; '.join(why)}; {len(windows)} window{'s' if len(windows) != 1 else ''})"
    if summary.get("endpoint") and (summary.get("launch") or {}).get("mode") in (None, "endpoint"):
        return ("not measured (no load gate ran; and with --endpoint the server is not on this host: kvgate cannot "
                "see its processes)")
    return "not measured (no load gate ran: the latency windows and the capacity steps measure it)"


#: The "passes when" cell of a statistical verdict: it decides on a confidence bound of the measured
#: value, not on the point estimate in the measured column.
BOUND_DECIDED = "decided on its bound (see the message)"


def decided_on_bound(g: Mapping[str, Any]) -> bool:
    """Whether gate ``g`` (a summary.json gate) decided on a confidence bound: its evidence (or a
    check's) holds a ``confidence`` level or judgement, or a ``dependence``."""
    def has(ev: Any) -> bool:
        return isinstance(ev, dict) and (ev.get("confidence") is not None or ev.get("dependence") is not None)
    return has(g.get("evidence")) or any(has(c.get("evidence")) for c in g.get("checks") or [] if isinstance(c, dict))


def lower_confidence_passes(gates: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The PASSes taken at ``slo.pass_confidence_floor``, below ``slo.confidence`` (their evidence's
    :data:`~kvgate.verdict.PASS_CONFIDENCE`, or a judgement in it that used the floor)."""
    return [g for g in gates if g.get("status") == "PASS" and floor_pass(g.get("evidence") or {}) is not None]


def passes_when(g: Mapping[str, Any]) -> str:
    """Which way a gate's measured/limit pair passes (``"measured <= limit"``), read from the pair and
    its verdict: a PASS held the relation its numbers show, a FAIL needed the opposite one. ``"-"``
    when the pair is not two numbers of one unit, or the verdict decides neither way."""
    m, lim = g.get("measured") or {}, g.get("limit") or {}
    mv, lv = m.get("value"), lim.get("value")
    if g.get("status") in ("PASS", "FAIL") and decided_on_bound(g):
        return BOUND_DECIDED
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (mv, lv)) or m.get("unit") != lim.get("unit"):
        return "-"
    if g.get("status") == "PASS":
        return "measured <= limit" if mv < lv else "measured >= limit" if mv > lv else "-"
    if g.get("status") == "FAIL":
        return "measured <= limit" if mv > lv else "measured >= limit" if mv < lv else "-"
    return "-"


def full_reason(summary: Mapping[str, Any], skipped: Mapping[str, Any]) -> str:
    """A not-checked entry's whole reason: the SKIP verdict's (or its skipped sub-check's) message
    without ``-> SKIP``, where summary.json's ``reason`` keeps only its first clause."""
    gate = next((g for g in summary.get("gates") or [] if g.get("id") == skipped.get("id")), {})
    candidates = [gate] + list(gate.get("checks") or [])
    for c in candidates:
        if c.get("gate") == skipped.get("check") and c.get("status") == "SKIP" and c.get("message"):
            return re.sub(r"\s*->\s*SKIP\b.*$", "", str(c["message"])).strip() or str(skipped.get("reason", ""))
    return str(skipped.get("reason", ""))


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
    count_text = ", ".join(f"{counts.get(k, 0)} {k.replace('_', ' ')}"
                           for k in ("PASS", "FAIL", "NOT_SENT", "INVALID", "INCONCLUSIVE", "SKIP", "ERROR")
                           if k not in ("INCONCLUSIVE", "NOT_SENT") or counts.get(k))
    launch = summary.get("launch") or {}
    where = launch_words(launch, bool(summary.get("endpoint_contacted")))
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
        f"| server | {server_words(summary.get('server'), summary.get('server_version'))} |",
        f"| run | `{summary.get('run_id') or '-'}`" + (f", {secs:.0f} s" if isinstance(secs, (int, float)) else "")
        + (f", gate mode {summary['gate_mode']}" if summary.get("gate_mode") else "") + " |",
    ]
    kv = summary.get("kvgate") or {}
    if kv:
        lines.append(f"| kvgate | {kv.get('version') or 'version unknown'}"
                     + (f", commit `{kv['commit']}`" if kv.get("commit") else ", commit unknown (not a git checkout)") + " |")
    command = server_command(summary)
    if command:
        lines.append(f"| server command | `{_cell(command, None).replace('`', chr(39))}` |")
    lines.append(f"| host contention | {_cell(host_contention(summary), None)} |")
    if (ready := ready_to_serving(summary)) is not None:
        lines.append(f"| ready -> serving | {_cell(ready, None)} |")
    if launch.get("mode") in ("embedded", "docker") and not launch.get("error"):
        lines += ["", LAUNCHED_MEANING.format(mode=launch["mode"])]
    if summary.get("gate_mode") not in (None, "enforce") and summary.get("outcome"):
        lines += ["", f"**Gate mode {summary['gate_mode']}: {summary['outcome']}**"
                  + (f" (exit {summary.get('exit_code')}: {summary.get('exit_meaning')})" if summary.get("exit_meaning")
                     else "")]
    if summary.get("error"):
        lines += ["", f"**Error:** {_cell(summary['error'], 600)}"]
    if counts.get("NOT_SENT"):
        cause = (summary.get("engine") or {}).get("reason") or "the engine's condition"
        lines += ["", f"**Not sent: {counts['NOT_SENT']} gate(s)** FAIL without a measurement, one cause: "
                  f"{_cell(cause, 600)}. Counted apart from the {counts.get('FAIL', 0)} measured FAIL(s)."]
    if summary.get("complete") is False and overall != "ERROR":
        where_cut = f" during {summary['interrupted_in']}" if summary.get("interrupted_in") else ""
        lines += ["", f"**Interrupted{where_cut}.** Gates that did not run: "
                  + (", ".join(f"`{g}`" for g in summary.get("not_run") or []) or "none listed")]
    gates = summary.get("gates") or []
    lines += ["", "### Verdicts", ""]
    shown = [g for g in gates if g.get("status") != "PASS"]
    passed = [g for g in gates if g.get("status") == "PASS"]
    if shown:  # what did not pass is read in full
        lines += _verdict_table(shown, None, causes=True)
    elif gates:
        lines.append(f"All {len(gates)} gates passed.")
    else:
        lines.append("No gate recorded a verdict.")
    low = lower_confidence_passes(gates)
    if low:  # a PASS below slo.confidence is read whole, apart from the plain ones
        lines += ["", "### Passed at a lower confidence than slo.confidence", "",
                  "Too few independent samples for slo.confidence; the profile's slo.pass_confidence_floor let "
                  "these PASS at the confidence stated first in each message:", ""]
        lines += [f"- `{g.get('id')}`: {_cell(g.get('message', ''), None)}" for g in low]
    if passed:  # folded (GitHub renders <details>), so the decisive rows stay on one screen
        lines += ["", f"<details><summary>{len(passed)} PASS</summary>", "", *_verdict_table(passed), "", "</details>"]
    lines += ["", "### Fit", ""]
    lines += ["```", fit_table.rstrip(), "```"] if fit_table else ["The fit gate did not run in this run."]
    lines += ["", "### Not checked", ""]
    skipped = summary.get("skipped_checks") or []
    not_run = summary.get("not_run") or []
    if not skipped and not not_run:
        lines.append("Everything selected was checked.")
    lines += [f"- `{s.get('id')}`: {s.get('check')} — {_cell(full_reason(summary, s), None)}" for s in skipped]
    lines += [f"- `{g}`: not run (the run ended before it)" for g in not_run]
    if files:
        lines += ["", "### Plots and tables", ""]
        lines += [f"- [{name}]({name}): {LINKED.get(name, name)}" for name in files]
    if report_hint:
        lines += ["", report_hint]
    return redactor.text("\n".join(lines) + "\n")


#: The cause cell of a row that did not pass and states no cause (summary.json has none for it).
NO_CAUSE = "-"


def _verdict_table(gates: list[Mapping[str, Any]], limit: int | None = MESSAGE_CHARS, causes: bool = False) -> list[str]:
    """The verdict table's rows; ``causes``: a last column with each gate's ``cause`` (whole), or
    :data:`NO_CAUSE` where it states none -- the table of what did not pass."""
    head = "| status | gate | measured | limit | passes when | verdict |" + (" cause |" if causes else "")
    rows = [head, "|---|---|---|---|---|---|" + ("---|" if causes else "")]
    for g in gates:
        cause = f" {_cell(g['cause'], None) if g.get('cause') else NO_CAUSE} |" if causes else ""
        rows.append(f"| {g.get('status')} | `{g.get('id')}` | {_cell(fmt_quantity(g.get('measured') or {}, why=False))}"
                    f" | {_cell(fmt_quantity(g.get('limit') or {}, why=False))} | {passes_when(g)}"
                    f" | {_cell(g.get('message', ''), limit)} |{cause}")
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
