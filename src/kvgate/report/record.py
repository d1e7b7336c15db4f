"""Where verdicts go: ``reports/summary.json``, Allure attachments and the console verdict table.

Everything written passes through a :class:`~kvgate.report.redact.Redactor`, so API keys and auth
headers never reach a report.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kvgate.report.allure_meta import kvgate_commit, kvgate_version
from kvgate.report.redact import Redactor
from kvgate.verdict import Status, Verdict, floor_pass, floor_pass_short, skip_reason

if TYPE_CHECKING:
    from kvgate.report.outcome import Outcome

#: ``kvgate_summary_version`` of summary.json; bump on any incompatible change of its schema.
SUMMARY_VERSION = 2
#: The JSON Schema of summary.json (shipped as package data).
SUMMARY_SCHEMA = Path(__file__).resolve().parents[1] / "schema" / "summary.schema.json"

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

    @property
    def not_sent(self) -> bool:
        """A FAIL recorded without a measurement: its requests were not sent after the run classified
        the engine hung or the server gone (:meth:`kvgate.run.session.Run.before_gate`; the message
        opens ``not sent: <the one reason>``). Counted apart from the measured FAILs."""
        return self.status == "FAIL" and self.verdict is not None and self.verdict.message.startswith("not sent: ")


#: A PASS/SKIP console line is shortened to this many characters (the main job had 48 verdict lines
#: over 200, up to 773); the whole message is in summary.json, signoff.md and Allure.
LINE_CHARS = 200


def _elide(text: str, width: int) -> str:
    """``text`` in ``width`` characters: its start and its end (the verdict's ``-> PASS (...)``),
    cut at spaces, joined by `` … ``."""
    if len(text) <= width:
        return text
    tail_len = min(len(text) // 2, max(20, width * 2 // 5))
    tail = text[-tail_len:]
    tail = tail[tail.find(" ") + 1:] if " " in tail[:-1] else tail
    head = text[:max(0, width - len(tail) - 3)]
    head = head.rsplit(" ", 1)[0] if " " in head else head
    return f"{head} … {tail}"


#: Phases done faster than this (seconds) are folded into one console line (:meth:`RunRecord.phase_lines`).
PHASE_BRIEF_S = 0.05


@dataclass
class RunRecord:
    """Everything a run collects for its reports. ``endpoint`` is the redacted display URL.

    ``run_id`` is carried by summary.json, junit.xml and allure-results alike; ``run_error`` (one
    line) marks a run that could not start (overall ``ERROR``); ``endpoint_contacted`` says whether
    any request reached the endpoint (False for ``-m fit``).
    """

    profile_name: str | None
    profile_source: str | None
    redactor: Redactor
    endpoint: str | None = None
    server_version: str | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    complete: bool = True
    not_run: list[str] = field(default_factory=list)
    #: The run's phases in order: ``{"name", "seconds", "status"}`` with status ``done``, ``error``
    #: or ``interrupted``; names are ``launch``, ``collect``, ``gate PROFILE/GATE/CASE``, ``teardown``.
    phases: list[dict[str, Any]] = field(default_factory=list)
    #: The phase an interrupt (Ctrl-C, SIGTERM) landed in, or None.
    interrupted_in: str | None = None
    run_id: str = ""
    run_error: str | None = None
    endpoint_contacted: bool = False
    #: ``--gate-mode`` (:mod:`kvgate.run.modes`): enforce, record or certify.
    gate_mode: str = "enforce"
    #: Why no server could be had for the live gates this run selected (the launcher cannot run
    #: here: no Docker engine, fewer GPUs), or None. Such a run gated nothing live: NO-SERVER.
    no_server: str | None = None
    #: The engine's condition when the run classified it (:meth:`kvgate.http.watch.EngineWatch.summary`:
    #: hung, or stalling streams, with the one reason and where), else None.
    engine: dict[str, Any] | None = None
    #: Which vLLM request extensions the server refuses, as probed (:meth:`kvgate.http.extensions.Extensions.summary`).
    extensions: dict[str, Any] | None = None
    #: What the server says it is (:meth:`kvgate.http.tokenizers.ServerIdentity.summary`: name,
    #: version, Server header, owned_by), or None before it was asked.
    server: dict[str, Any] | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _open: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        """Time a phase of the run (seconds on :attr:`clock`) and record how it ended.

        Phases may nest (the embedded server's ``launch`` happens inside the first live gate's
        setup): a phase's ``seconds`` exclude the phases nested in it, so the phases add up to the
        run's wall time. A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM turned into one by the
        plugin) marks the phase ``interrupted`` and sets :attr:`interrupted_in` (the innermost
        phase); any other exception marks it ``error``. The exception propagates either way.
        """
        entry: dict[str, Any] = {"name": name, "seconds": None, "status": "running"}
        self.phases.append(entry)
        self._open.append(entry)
        nested_key = "_nested_s"
        t0 = self.clock()
        try:
            yield entry
        except KeyboardInterrupt:
            entry["status"] = "interrupted"
            self.interrupted_in = self.interrupted_in or name
            raise
        except BaseException:
            entry["status"] = "error"
            raise
        else:
            entry["status"] = "done"
        finally:
            total = self.clock() - t0
            self._open.remove(entry)
            entry["seconds"] = round(total - entry.pop(nested_key, 0.0), 3)
            if self._open:
                parent = self._open[-1]
                parent[nested_key] = parent.get(nested_key, 0.0) + total

    def phase_lines(self, brief_s: float = PHASE_BRIEF_S) -> list[str]:
        """Console lines: each phase with its seconds, e.g. ``  launch  31.2 s``; the gates done in
        under ``brief_s`` seconds (most gates of a main job: 57 of 90 lines read ``0.00``) folded
        into one line, ``  (57 more, each under 0.05 s: 0.31 s together)``. summary.json
        ``phases`` keeps them all."""
        if not self.phases:
            return []
        shown = [p for p in self.phases if not p["name"].startswith("gate ")  # the run's own phases always
                 or p["status"] != "done" or p["seconds"] is None or p["seconds"] >= brief_s]
        brief = [p for p in self.phases if p not in shown]
        width = max(len(p["name"]) for p in shown) if shown else 0
        out = ["phases (seconds):"]
        for p in shown:
            secs = "-" if p["seconds"] is None else f"{p['seconds']:.2f}"
            mark = "" if p["status"] == "done" else f"  ({p['status']})"
            out.append(f"  {p['name']:<{width}}  {secs:>7}{mark}")
        if brief:
            out.append(f"  ({len(brief)} more, each under {brief_s:g} s: {sum(p['seconds'] for p in brief):.2f} s together;"
                       " all in summary.json phases)")
        return out

    def add(self, nodeid: str, test_id: str, verdict: Verdict, console: list[tuple[str, str]] | None = None) -> None:
        e = self.entries.setdefault(nodeid, Entry(test_id, nodeid))
        e.verdict = verdict
        e.console.extend(console or [])

    def error(self, nodeid: str, test_id: str, message: str) -> None:
        e = self.entries.setdefault(nodeid, Entry(test_id, nodeid))
        if e.verdict is None:
            e.error = message

    def overall(self) -> str:
        """ERROR if the run could not start (:attr:`run_error`; INCOMPLETE if an interrupt stopped it
        there: :attr:`interrupted_in`); FAIL if any FAIL or ERROR; else
        INVALID if any INVALID; else INCONCLUSIVE if any INCONCLUSIVE; else NO-SERVER when the live gates it selected had no server
        (:attr:`no_server`); else PASS (SKIPs allowed); NO-GATES when nothing ran."""
        if self.run_error:  # an interrupt before anything was gated (the preflight): INCOMPLETE, exit 2
            return "INCOMPLETE" if self.interrupted_in is not None else "ERROR"
        statuses = {e.status for e in self.entries.values()}
        if not statuses:
            return "NO-GATES"
        if "INCOMPLETE" in statuses:  # a gate cut short (the soak) makes the whole run incomplete
            return "INCOMPLETE"
        if statuses & {"FAIL", "ERROR", "NO-VERDICT"}:
            return "FAIL"
        if "INVALID" in statuses:
            return "INVALID"
        if "INCONCLUSIVE" in statuses:  # a percentile left undecided at its cap: never a PASS
            return "INCONCLUSIVE"
        if self.no_server:  # only the arithmetic ran: never a PASS
            return "NO-SERVER"
        if statuses <= {"SKIP"}:
            return "SKIP"
        return "PASS"

    @property
    def contacted(self) -> bool:
        """Whether any request reached the endpoint (the preflight ran, or kvgate launched it and it
        came up; a failed launch, ``launch["error"]``, contacted nothing)."""
        return self.endpoint_contacted or (bool(self.launch) and "error" not in self.launch)

    def final_status(self, running: bool = False) -> str:
        """The ``overall`` a report shows: RUNNING (written at start), ERROR, INCOMPLETE or :meth:`overall`."""
        if self.run_error:
            return self.overall()  # ERROR, or INCOMPLETE when an interrupt stopped the run before any gate
        if running:
            return "RUNNING"
        return self.overall() if self.complete else "INCOMPLETE"

    def summary(self, running: bool = False) -> dict[str, Any]:
        """summary.json's content (schema ``kvgate/schema/summary.schema.json``, version
        :data:`SUMMARY_VERSION`), redacted. ``running``: the placeholder written at start."""
        gates, skipped = [], []
        for e in self.entries.values():
            d: dict[str, Any] = {"id": e.test_id, "nodeid": e.nodeid, "status": e.status}
            if e.verdict is not None:
                d.update({k: v for k, v in e.verdict.to_summary().items() if k != "status"})
                if e.verdict.status is Status.SKIP:
                    skipped.append({"id": e.test_id, "check": e.verdict.gate, "reason": skip_reason(e.verdict)})
                skipped += [{"id": e.test_id, **s} for s in d["skipped_checks"]]
            else:
                why = f"no verdict: {e.error or 'the test ended without recording one'}"
                d.update({"message": e.error or "no verdict recorded",
                          "measured": {"value": None, "unit": None, "reason": why},
                          "limit": {"value": None, "unit": None, "reason": why},
                          "checks": [], "skipped_checks": [], "evidence": {}})
            if e.error:
                d["error"] = e.error
            gates.append(d)
        out = {
            "kvgate_summary_version": SUMMARY_VERSION,
            "run_id": self.run_id,
            "profile": self.profile_name,
            "profile_source": self.profile_source,
            "endpoint": self.endpoint,
            "endpoint_contacted": self.contacted,
            "server_version": self.server_version,
            "launch": self.launch,
            "started_unix": round(self.started, 3),
            "duration_s": round(time.time() - self.started, 3),
            "complete": self.complete,
            "not_run": self.not_run,
            "interrupted_in": self.interrupted_in,
            "phases": self.phases,
            "overall": self.final_status(running),
            "error": self.run_error,
            "engine": self.engine,
            "kvgate": {"version": kvgate_version(), "commit": kvgate_commit()},
            **self._mode_fields(gates, running),
            "counts": self.counts(),
            "extensions": self.extensions,
            "server": self.server,
            "gates": gates,
            "skipped_checks": skipped,
        }
        return self.redactor.data(out)

    def counts(self) -> dict[str, int]:
        """Gates per status; ``FAIL`` counts the measured FAILs only, ``NOT_SENT`` the FAILs not sent
        after the engine was classified hung or the server gone (:attr:`Entry.not_sent`: one cause,
        named once in ``engine``); pytest counts both as failed."""
        entries = list(self.entries.values())
        out = {s: sum(1 for e in entries if e.status == s) for s in ("PASS", "FAIL", "INVALID", "INCONCLUSIVE", "SKIP", "ERROR")}
        out["NOT_SENT"] = sum(1 for e in entries if e.not_sent)
        out["FAIL"] -= out["NOT_SENT"]
        return out

    def server_words(self) -> str:
        """The server as it says it is: ``vLLM 0.32.0``, ``llama-cpp-python (version not reported)``,
        or what it showed (``server not named: Server: uvicorn; /v1/models owned_by local``)."""
        return server_words(self.server, self.server_version)

    def outcome(self, gates: list[dict[str, Any]] | None = None) -> "Outcome":
        """The run's :class:`kvgate.report.outcome.Outcome` under :attr:`gate_mode` (outcome, exit code)."""
        from kvgate.report.outcome import decide

        return decide(self.gate_mode, self.final_status(), gates if gates is not None else self.summary()["gates"])

    def _mode_fields(self, gates: list[dict[str, Any]], running: bool) -> dict[str, Any]:
        if running:
            return {"gate_mode": self.gate_mode, "outcome": "RUNNING", "exit_code": None, "not_certified": []}
        out = self.outcome(gates)
        return {"gate_mode": self.gate_mode, "outcome": out.outcome, "exit_code": out.exit_code,
                "exit_meaning": out.meaning, "not_certified": out.not_certified}

    def write_summary(self, path: Path, running: bool = False) -> Path:
        """Write :meth:`summary` to ``path`` atomically (tmp file, then rename). Raises ``OSError``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.summary(running), indent=2, default=str))
        tmp.replace(path)
        return path

    def headline(self) -> str:
        """The table's first line: profile, endpoint and vLLM version -- or that no server was contacted."""
        name = self.profile_name or "(no profile)"
        if self.contacted:
            return f"kvgate {name} @ {self.endpoint or '-'} ({self.redactor.text(self.server_words())})"
        if self.launch.get("error"):
            server = "embedded vLLM" if self.launch.get("mode", "embedded") == "embedded" else f"{self.launch['mode']} server"
            return f"kvgate {name}: the {server} did not start (see the errors below)"
        if self.interrupted_in is not None:
            return f"kvgate {name}: interrupted during {self.interrupted_in} before any server was contacted"
        if self.no_server:
            return f"kvgate {name}: no server: {self.no_server} -- the live gates selected could not run (NO-SERVER)"
        if self.endpoint:
            return f"kvgate {name}: endpoint {self.endpoint} not contacted (no selected gate needs a server)"
        return f"kvgate {name}: no server started (no selected gate needs one)"

    def table(self) -> list[str]:
        """The console verdict table: one line per gate, ``STATUS  id  message``; a gate that passed
        with parts not checked says so: ``... -> PASS (1 part not checked: ...)``. A PASS or SKIP
        line longer than :data:`LINE_CHARS` loses the middle of its message (``head … -> PASS
        (...)``, said once under the table); every other line is whole: it is what to act on. A
        FAIL, INVALID, INCONCLUSIVE or INCOMPLETE verdict with a :attr:`~kvgate.verdict.Verdict.cause`
        has it on a line of its own under it (``         cause: ...``, whole, redacted)."""
        lines = [self.headline()]
        shortened = 0
        for e in self.entries.values():
            msg = e.verdict.message if e.verdict else (e.error or "")
            msg = msg.splitlines()[0] if msg else ""
            note = e.verdict.not_checked_note() if e.verdict else ""
            msg = self.redactor.text(f"{msg} ({note})" if note else msg)
            head = f"{e.status:<8} {e.test_id:<44} "
            low = floor_pass(e.verdict.evidence) if e.verdict is not None and e.status == "PASS" else None
            tag = f" ({floor_pass_short(low)})" if low is not None else ""  # a PASS below slo.confidence shows it
            if e.status in ("PASS", "SKIP") and len(head) + len(msg) + len(tag) > LINE_CHARS:
                msg, shortened = _elide(msg, LINE_CHARS - len(head) - len(tag)), shortened + 1
            msg += tag
            lines.append(head + msg)
            if e.verdict is not None and e.verdict.cause and e.status not in ("PASS", "SKIP"):
                lines.append(f"{'':<9}cause: {self.redactor.text(' '.join(e.verdict.cause.split()))}")
        if shortened:
            lines.append(f"({shortened} PASS/SKIP line{'s' if shortened > 1 else ''} shortened to {LINE_CHARS} characters; "
                         "every message whole in summary.json and the Allure report, and in signoff.md each that did not "
                         "pass or passed below slo.confidence)")
        if self.run_error:
            lines.append(f"ERROR: {self.redactor.text(self.run_error)}")
        if self.engine:
            word = {"hung": "ENGINE HUNG", "gone": "SERVER GONE"}.get(self.engine["condition"], "STREAMS STALLED")
            lines.append(f"{word}: {self.redactor.text(self.engine['reason'])}")
        counts = self.counts()
        if counts["NOT_SENT"]:
            lines.append(f"NOT SENT: {counts['NOT_SENT']} gate(s) FAIL without a measurement, one cause (above); "
                         f"measured FAILs: {counts['FAIL']}")
        out = self.outcome()
        if out.outcome != self.final_status() and out.exit_code != 0:  # certify: PASS verdicts, not certified
            lines.append(f"OVERALL: {self.final_status()} -- outcome {out.outcome} (exit {out.exit_code})")
        else:
            lines.append(f"OVERALL: {self.final_status()}")
        if self.gate_mode != "enforce" or self.final_status() in ("INVALID", "INCONCLUSIVE"):
            out = self.outcome()
            lines.append(f"{self.gate_mode} mode: {out.outcome} (exit {out.exit_code}: {out.meaning})")
            lines += [f"  not certified: {m['id']}: {m['check']} {m['status']} ({m['reason']})"
                      for m in out.not_certified]
        return lines


def server_words(server: dict[str, Any] | None, version: str | None) -> str:
    """How reports name the server (``server``: summary.json's ``server``; ``version``: its
    ``server_version``, ``/version``'s): ``vLLM 0.32.0``; a named server other than vLLM with its
    version or ``version not reported``; else what it showed, or ``server unknown``."""
    name = (server or {}).get("name")
    if name == "vLLM" or (name is None and version):
        return f"vLLM {version or 'version not reported'}"
    if name:
        return f"{name} {version or '(version not reported)'}"
    if server:
        facts = [f"Server: {server['server_header']}" if server.get("server_header") else "no Server header",
                 f"/v1/models owned_by {server['owned_by']}" if server.get("owned_by") else "no owned_by", "no /version"]
        return f"server not named: {'; '.join(facts)}"
    return "server unknown"


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
    attach_text(f"verdict {verdict.gate}", json.dumps(redactor.data(verdict.to_summary()), indent=2, default=str),
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

    from kvgate.stats import request_metrics

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
