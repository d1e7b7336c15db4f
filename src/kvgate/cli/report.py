"""``kvgate report``: ``reports/signoff.md`` from the run's summary.json, and the HTML report
``reports/allure-report/`` rendered from ``reports/allure-results`` with the Allure 3 CLI
(:mod:`kvgate.report.render`). :func:`add_command` adds it to ``kvgate``'s sub-parsers; it sets
``args.run`` (see :func:`kvgate.cli.main.main`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, TextIO

from kvgate.report.redact import Redactor
from kvgate.report.render import NO_ALLURE, REPORT_DIR, RenderError, find_allure, open_command, render, report_name
from kvgate.report.signoff import write_signoff

#: Exit codes: written; the Allure CLI is missing or failed (signoff.md is written anyway); no summary.json.
OK, FAILED, USAGE = 0, 1, 2


def add_command(sub: argparse._SubParsersAction) -> None:
    """Add ``report`` to the ``kvgate`` sub-parsers ``sub``."""
    rep = sub.add_parser("report", help="write reports/signoff.md and render the HTML sign-off report",
                         description="Write REPORTS/signoff.md from summary.json and render REPORTS/allure-results "
                                     "into REPORTS/allure-report/ with the Allure 3 CLI (the previous report's "
                                     "history carried over).")
    rep.add_argument("--reports", "--kvgate-reports", dest="reports", default="reports", metavar="DIR",
                     help="the run's reports directory, the run's --kvgate-reports (default: reports)")
    rep.add_argument("--output", default=None, metavar="DIR", help="HTML report directory (default: REPORTS/allure-report)")
    rep.add_argument("--single-file", action="store_true", help="one self-contained index.html that opens from disk")
    rep.add_argument("--signoff-only", action="store_true", help="write signoff.md only (no Allure CLI needed)")
    rep.set_defaults(run=run_report)


def run_report(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None,
               find: Callable[[], list[str] | None] = find_allure, render_fn: Callable[..., Path] = render) -> int:
    """Run ``kvgate report``: :data:`OK` when signoff.md (and, unless ``--signoff-only``, the HTML
    report) was written; :data:`USAGE` without a readable summary.json; :data:`FAILED` when the
    Allure CLI is missing or fails (signoff.md is written first either way). ``find`` and
    ``render_fn`` are injectable for tests."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call: pytest swaps sys.stdout
    reports = Path(args.reports)
    output = Path(args.output) if args.output else reports / REPORT_DIR
    try:
        summary = json.loads((reports / "summary.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"kvgate report: no summary.json in {reports}/ (run the gates first: pytest --profile NAME; "
              "or give --reports=DIR)", file=err)
        return USAGE
    except ValueError as exc:
        print(f"kvgate report: {reports / 'summary.json'} is not JSON ({exc})", file=err)
        return USAGE
    except OSError as exc:  # --reports names a file, an unreadable folder...
        print(f"kvgate report: cannot read {reports / 'summary.json'} ({exc.strerror or exc}; --reports takes the "
              f"reports folder of a run)", file=err)
        return USAGE
    if not isinstance(summary, dict) or not isinstance(summary.get("gates"), list) \
            or not all(isinstance(g, dict) for g in summary["gates"]):
        print(f"kvgate report: {reports / 'summary.json'} is not a kvgate summary (a JSON object with 'gates' "
              f"expected, got {_shape(summary)})", file=err)
        return USAGE
    allure = None if args.signoff_only else find()
    hint = None if args.signoff_only else (f"HTML report: `{output}/index.html` (serve it over HTTP: "
                                           f"`{open_command(allure, output)}`)")
    try:
        path = write_signoff(reports, redactor=Redactor(), report_hint=hint)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a field of the wrong shape
        print(f"kvgate report: {reports / 'summary.json'} is not a kvgate summary (a field has the wrong shape: "
              f"{type(exc).__name__}: {exc})", file=err)
        return USAGE
    outcome = summary.get("outcome")
    said = f"overall {summary.get('overall')}" + (f", outcome {outcome}" if outcome and outcome != summary.get("overall")
                                                  else "")
    print(f"kvgate report: {path} ({said})", file=out)
    if args.signoff_only:
        return OK
    if allure is None:
        print(f"kvgate report: {NO_ALLURE}", file=err)
        return FAILED
    try:
        render_fn(reports / "allure-results", output, report_name(summary), allure, single_file=args.single_file)
    except RenderError as exc:
        print(f"kvgate report: {exc}", file=err)
        return FAILED
    how = "one file: opens from disk" if args.single_file else f"serve it over HTTP: {open_command(allure, output)}"
    print(f"kvgate report: {output}/index.html ({how})", file=out)
    return OK


def _shape(summary: object) -> str:
    """What a summary.json that is not a kvgate summary holds, in a few words."""
    if not isinstance(summary, dict):
        return type(summary).__name__
    gates = summary.get("gates")
    if gates is None:
        return "an object without 'gates'"
    return f"'gates' as {type(gates).__name__}" + ("" if not isinstance(gates, list) else " of non-objects")

