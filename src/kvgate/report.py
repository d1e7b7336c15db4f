"""Where verdicts go: ``reports/summary.json``, Allure attachments and the console verdict table.

Everything written passes through a :class:`~kvgate.redact.Redactor`, so API keys and auth
headers never reach a report.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .redact import Redactor
from .verdict import Verdict

try:  # allure-pytest is a dependency, but keep the library importable without it
    import allure
except ImportError:  # pragma: no cover
    allure = None


@dataclass
class Entry:
    """One test's outcome: its readable id, its verdict (None when the harness itself erred)."""

    test_id: str
    nodeid: str
    verdict: Verdict | None = None
    error: str | None = None
    console: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.verdict is not None:
            return self.verdict.status.value
        return "ERROR" if self.error else "NO-VERDICT"


@dataclass
class RunRecord:
    """Everything a run collects for its reports. ``endpoint`` is the redacted display URL."""

    profile_name: str
    profile_source: str | None
    redactor: Redactor
    endpoint: str | None = None
    server_version: str | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    complete: bool = True
    not_run: list[str] = field(default_factory=list)

    def add(self, nodeid: str, test_id: str, verdict: Verdict, console: list[tuple[str, str]] | None = None) -> None:
        e = self.entries.setdefault(nodeid, Entry(test_id, nodeid))
        e.verdict = verdict
        e.console.extend(console or [])

    def error(self, nodeid: str, test_id: str, message: str) -> None:
        e = self.entries.setdefault(nodeid, Entry(test_id, nodeid))
        if e.verdict is None:
            e.error = message

    def overall(self) -> str:
        """FAIL if any FAIL or ERROR; else INVALID if any INVALID; else PASS (SKIPs allowed);
        NO-GATES when nothing ran."""
        statuses = {e.status for e in self.entries.values()}
        if not statuses:
            return "NO-GATES"
        if statuses & {"FAIL", "ERROR", "NO-VERDICT"}:
            return "FAIL"
        if "INVALID" in statuses:
            return "INVALID"
        if statuses <= {"SKIP"}:
            return "SKIP"
        return "PASS"

    def summary(self) -> dict[str, Any]:
        gates = []
        for e in self.entries.values():
            d: dict[str, Any] = {"id": e.test_id, "nodeid": e.nodeid, "status": e.status}
            if e.verdict is not None:
                d.update({k: v for k, v in e.verdict.to_dict().items() if k != "status"})
            if e.error:
                d["error"] = e.error
            gates.append(d)
        out = {
            "kvgate_summary_version": 1,
            "profile": self.profile_name,
            "profile_source": self.profile_source,
            "endpoint": self.endpoint,
            "server_version": self.server_version,
            "launch": self.launch,
            "started_unix": round(self.started, 3),
            "duration_s": round(time.time() - self.started, 3),
            "complete": self.complete,
            "not_run": self.not_run,
            "overall": self.overall() if self.complete else "INCOMPLETE",
            "counts": {s: sum(1 for e in self.entries.values() if e.status == s)
                       for s in ("PASS", "FAIL", "INVALID", "SKIP", "ERROR")},
            "gates": gates,
        }
        return self.redactor.data(out)

    def write_summary(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.summary(), indent=2, default=str))
        tmp.replace(path)
        return path

    def table(self) -> list[str]:
        """The console verdict table: one line per gate, ``STATUS  id  message`` (not truncated)."""
        lines = [f"kvgate {self.profile_name} @ {self.endpoint or '-'} (vLLM {self.server_version or '?'})"]
        for e in self.entries.values():
            msg = e.verdict.message if e.verdict else (e.error or "")
            msg = self.redactor.text(msg.splitlines()[0] if msg else "")
            lines.append(f"{e.status:<8} {e.test_id:<44} {msg}")
        lines.append(f"OVERALL: {self.overall() if self.complete else 'INCOMPLETE'}")
        return lines


def attach_text(name: str, text: str, redactor: Redactor, kind: str = "text") -> None:
    """Attach redacted ``text`` to the current Allure test (no-op without allure)."""
    if allure is None:
        return
    t = {"text": allure.attachment_type.TEXT, "json": allure.attachment_type.JSON,
         "csv": allure.attachment_type.CSV, "yaml": allure.attachment_type.YAML}.get(kind, allure.attachment_type.TEXT)
    allure.attach(redactor.text(text), name=name, attachment_type=t)


def attach_png(name: str, data: bytes) -> None:
    """Attach a PNG image to the current Allure test (no-op without allure)."""
    if allure is not None:
        allure.attach(data, name=name, attachment_type=allure.attachment_type.PNG)


def attach_verdict(verdict: Verdict, redactor: Redactor) -> None:
    """Attach the verdict (measured, limit, evidence) as JSON to the current Allure test."""
    attach_text(f"verdict {verdict.gate}", json.dumps(redactor.data(verdict.to_dict()), indent=2, default=str),
                redactor, "json")



def records_csv(rows: list[dict[str, Any]]) -> str:
    """Per-request rows (``kvgate.load.RequestRecord.row()``) as CSV text."""
    import csv
    import io

    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def latency_png(records: list[Any], title: str) -> bytes:
    """PNG: TTFT and ITL distributions (ms) of successful records, via matplotlib (Agg)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .stats import request_metrics

    ttft, itl = [], []
    for r in records:
        if r.ok:
            m = request_metrics(r)
            if m.ttft_s is not None:
                ttft.append(m.ttft_s * 1e3)
            itl.extend(x * 1e3 for x in m.itl_s)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, data, name in ((axes[0], ttft, "TTFT (ms)"), (axes[1], itl, "ITL (ms)")):
        if data:
            ax.hist(data, bins=min(40, max(5, len(data) // 2)), color="#3b6ea5")
        ax.set_xlabel(name)
        ax.set_ylabel("count")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
