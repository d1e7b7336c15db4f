"""The server matrix of docs/servers.md from the summary.json of each gated server.

Not a test. Each argument is ``LABEL=PATH``: a label for the row (``"transformers serve 5.25"``)
and the ``summary.json`` of a ``pytest --profile ... --endpoint ...`` run against that server. Prints
two Markdown tables: one row per run (date, kvgate commit, the server as the run named it, counts:
PASS / FAIL measured / NOT SENT / INVALID / SKIP / ERROR, seconds), and per gate the
``PASS/FAIL/SKIP`` counts of each run (other statuses after them when present)::

    .venv/bin/python benchmarks/servers_matrix.py "vLLM 0.32=reports/summary.json" \\
        "transformers serve 5.25=/tmp/tf/summary.json"

How each server is started and gated, and what its non-PASS verdicts are: docs/servers.md.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import sys
from pathlib import Path

from kvgate.report.record import server_words

STATUSES = ("PASS", "FAIL", "SKIP", "INVALID", "INCONCLUSIVE", "ERROR")


def load(arg: str) -> tuple[str, dict]:
    """``LABEL=PATH`` -> (label, parsed summary.json). Raises SystemExit with one line when unreadable."""
    label, sep, path = arg.partition("=")
    if not sep:
        raise SystemExit(f"servers_matrix: {arg!r} is not LABEL=PATH")
    try:
        return label, json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"servers_matrix: cannot read {path}: {exc}") from None


def run_row(label: str, s: dict) -> str:
    c = s.get("counts") or {}
    when = dt.datetime.fromtimestamp(s.get("started_unix") or 0, dt.timezone.utc).strftime("%Y-%m-%d")
    commit = (s.get("kvgate") or {}).get("commit") or "?"
    said = server_words(s.get("server"), s.get("server_version"))
    return (f"| {label} | {when} | `{commit}` | {said} | {c.get('PASS', 0)} | {c.get('FAIL', 0)} | "
            f"{c.get('NOT_SENT', 0)} | {c.get('INVALID', 0)} | {c.get('SKIP', 0)} | {c.get('ERROR', 0)} | "
            f"{s.get('duration_s', 0):.0f} |")


def gate_rows(runs: list[tuple[str, dict]]) -> list[str]:
    per: dict[str, list[collections.Counter]] = collections.defaultdict(lambda: [collections.Counter() for _ in runs])
    for i, (_, s) in enumerate(runs):
        for g in s.get("gates") or []:
            per[g["id"].split("/")[1] if "/" in g["id"] else g["id"]][i][g["status"]] += 1

    def cell(c: collections.Counter) -> str:
        if not c:
            return "-"
        head = "/".join(str(c.get(k, 0)) for k in ("PASS", "FAIL", "SKIP"))
        rest = ", ".join(f"{c[k]} {k}" for k in STATUSES[3:] if c.get(k))
        return head + (f" ({rest})" if rest else "")

    return [f"| {gate} | " + " | ".join(cell(c) for c in counters) + " |" for gate, counters in sorted(per.items())]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip())
        return 2
    runs = [load(a) for a in argv]
    print("| server | date | kvgate | the run named it | PASS | FAIL (measured) | NOT SENT | INVALID | SKIP | ERROR | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, s in runs:
        print(run_row(label, s))
    print()
    print("| gate (PASS/FAIL/SKIP) | " + " | ".join(label for label, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for row in gate_rows(runs):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
