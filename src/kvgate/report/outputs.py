"""One run, one set of reports: what kvgate writes into the reports directory, and how a run
replaces it as a whole.

At configure time, before anything runs, :func:`clear` removes the previous run's
``summary.json``, ``junit.xml``, ``allure-results/`` and ``vllm-server.log`` and a ``RUNNING``
summary takes their place; every way a run ends then writes all of them anew with the same run id
(:func:`new_run_id`): a finished run through pytest's JUnit and Allure plugins (stamped by
:func:`stamp_junit` / :func:`write_allure_environment`), a run that could not start through
:func:`write_junit_problem` / :func:`write_allure_problem`. A CI that publishes ``junit.xml``
therefore never shows an earlier run's green: it finds this run's results, an error case, or
nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import time
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from allure_commons.logger import AllureFileLogger
from allure_commons.model2 import Label, Status, StatusDetails, TestResult

SUMMARY = "summary.json"
JUNIT = "junit.xml"
ALLURE = "allure-results"
SERVER_LOG = "vllm-server.log"
#: Everything kvgate writes into the reports directory (a run replaces all of it).
#: The soak's own outputs (written by :class:`kvgate.soak.runner.SoakRunner` and the soak fixture).
SOAK_FILES = ("soak-rounds.csv", "soak-requests.csv", "soak.png")
#: The capacity gate's outputs (suites/test_capacity.py): the search steps and the throughput-latency plot.
CAPACITY_CSV, CAPACITY_PNG = "capacity-steps.csv", "capacity.png"
CAPACITY_FILES = (CAPACITY_CSV, CAPACITY_PNG)
#: record mode's profile overlay (kvgate.run.modes.OVERLAY_FILE).
OVERLAY = "profile-overlay.yaml"
#: ``kvgate report``'s sign-off summary (kvgate.report.signoff.SIGNOFF); the HTML report dir
#: ``allure-report/`` is kept: its ``history.jsonl`` carries the trend into the next report.
SIGNOFF = "signoff.md"
#: launch mode pools (kvgate.launch.pools.POOLS_DIR): each pool's vLLM log, nginx's config and logs.
POOLS_DIR = "pools"
#: the compare gate's golden answers (kvgate.compare.golden.GOLDEN_FILE): what a later run's
#: ``--baseline-reports`` compares with.
GOLDEN = "golden.json"
#: where a run stopped by a usage error before gating anything moves the previous run's whole set
#: (:func:`set_aside`), so its own ERROR set can take the reports dir without losing that run's.
PREVIOUS = "previous-run"
OWNED = (SUMMARY, SUMMARY + ".tmp", JUNIT, ALLURE, SERVER_LOG, OVERLAY, SIGNOFF, *SOAK_FILES, *CAPACITY_FILES, POOLS_DIR,
         GOLDEN, PREVIOUS)
#: The reports dir's run lock (:func:`hold`): held by the run writing there, for the run's life.
LOCK = ".kvgate-run.lock"
#: JUnit testsuite property / Allure label and environment key that carry the run id.
RUN_ID_KEY = "kvgate_run_id"


def new_run_id(now: Callable[[], float] = time.time) -> str:
    """A run id: UTC start time plus 6 random hex digits, e.g. ``20260130T072836Z-3fa29c``."""
    stamp = datetime.fromtimestamp(now(), tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


class ReportsBusy(Exception):
    """Another kvgate run holds the reports directory's lock; the message names it and says what to do."""


def hold(reports: Path, run_id: str) -> int:
    """Take ``reports``'s run lock (``flock`` on :data:`LOCK`, exclusive, not waiting) and write
    who holds it (pid, run id, UTC start) into it. Returns the open descriptor: the lock lasts
    until it is closed or the process ends (a killed run leaves no stale lock). Two runs into one
    reports dir would otherwise mix silently: both exit 0, ``allure-results/`` holds results of two
    ``kvgate_run_id``s under the first run's environment, the second leaves no summary of its own
    (CI runners sharing a workspace). Raises :class:`ReportsBusy` when another run holds it,
    ``OSError`` when the lock file cannot be opened."""
    fd = os.open(reports / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "pid unknown"
        os.close(fd)
        raise ReportsBusy(f"--kvgate-reports {reports}: another kvgate run is writing its reports there ({holder}); "
                          f"give this run its own --kvgate-reports=DIR (nothing in it was touched)") from None
    os.ftruncate(fd, 0)
    stamp = datetime.now(timezone.utc).strftime("%H:%M:%S UTC")
    os.pwrite(fd, f"pid {os.getpid()}, run {run_id}, started {stamp}".encode(), 0)
    return fd


def clear(reports: Path, extra: list[Path] | tuple[Path, ...] = (), keep: set[str] | frozenset[str] = frozenset()
          ) -> list[Path]:
    """Remove the previous run's outputs (:data:`OWNED`, less the names in ``keep``) from
    ``reports`` and the ``extra`` paths (a JUnit file or Allure directory chosen elsewhere).
    Missing ones are fine; other files in ``reports`` are left alone. Returns what was removed.
    Raises ``OSError`` when a path exists but cannot be removed."""
    removed = []
    for p in [*(reports / name for name in OWNED if name not in keep), *extra]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        removed.append(p)
    return removed


def set_aside(reports: Path, extra: list[Path] | tuple[Path, ...] = (), keep: set[str] | frozenset[str] = frozenset()
              ) -> Path | None:
    """Move the previous run's outputs -- :data:`OWNED` in ``reports`` less ``keep`` and
    :data:`PREVIOUS`, plus the ``extra`` paths (a JUnit file or Allure directory chosen elsewhere,
    moved in under their own names) -- into ``reports/previous-run/``, replacing a set moved there
    before, so they stay one run's set. Only a set whose summary.json says a run gated (its
    ``overall`` is not ``ERROR``) is moved: a previous ERROR set, or outputs with no readable
    summary, are left for :func:`clear`. Returns the folder, or None when nothing was moved.
    Raises ``OSError`` when a path cannot be moved."""
    try:
        overall = json.loads((reports / SUMMARY).read_text()).get("overall")
    except (OSError, ValueError, AttributeError):
        return None
    if overall in (None, "ERROR"):
        return None
    dest = reports / PREVIOUS
    staging = reports / (PREVIOUS + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    for p in [*(reports / n for n in OWNED if n not in keep and n != PREVIOUS), *extra]:
        if p.exists() or p.is_symlink():
            shutil.move(str(p), str(staging / p.name))
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)
    return dest


def _suite(root: ET.Element) -> ET.Element:
    if root.tag == "testsuite":
        return root
    suite = root.find("testsuite")  # (an Element with no children is falsy: compare with None)
    return suite if suite is not None else ET.SubElement(root, "testsuite", name="kvgate")


def _set_property(suite: ET.Element, name: str, value: str) -> None:
    props = suite.find("properties")
    if props is None:
        props = ET.Element("properties")
        suite.insert(0, props)
    for p in props.findall("property"):
        if p.get("name") == name:
            p.set("value", value)
            return
    ET.SubElement(props, "property", name=name, value=value)


def _add_error_case(suite: ET.Element, name: str, message: str) -> None:
    case = ET.SubElement(suite, "testcase", classname="kvgate", name=name, time="0")
    err = ET.SubElement(case, "error", message=message, type="kvgate")
    err.text = message
    for attr in ("tests", "errors"):
        suite.set(attr, str(int(suite.get(attr, "0")) + 1))


def write_junit_problem(path: Path, run_id: str, overall: str, message: str, case: str = "run") -> Path:
    """A JUnit file for a run that did not produce test results (usage error, preflight refusal):
    one ``kvgate.<case>`` testcase in error carrying ``message``; testsuite properties
    ``kvgate_run_id`` and ``kvgate_overall``. Raises ``OSError``."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="kvgate", tests="0", errors="0", failures="0", skipped="0",
                          time="0", timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _set_property(suite, RUN_ID_KEY, run_id)
    _set_property(suite, "kvgate_overall", overall)
    _set_property(suite, "kvgate_outcome", overall)
    _add_error_case(suite, case, message)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def _errors_as_errors(suite: ET.Element) -> None:
    """A testcase whose ``kvgate_verdict`` is ERROR (a harness error in the gate's call, which
    pytest's JUnit plugin writes as ``<failure>``) becomes an ``<error>``, one whose verdict is FAIL
    given in the setup (a gate after a hang, written as ``<error>``) a ``<failure>``, and the
    testsuite's ``failures`` / ``errors`` counts follow, so JUnit counts what summary.json counts."""
    moved = 0  # failures turned errors, minus errors turned failures
    for case in suite.iter("testcase"):
        verdicts = [p.get("value") for p in case.iter("property") if p.get("name") == "kvgate_verdict"]
        failure, error = case.find("failure"), case.find("error")
        if verdicts[-1:] == ["ERROR"] and failure is not None:
            failure.tag = "error"
            moved += 1
        elif verdicts[-1:] == ["FAIL"] and error is not None and failure is None:
            error.tag = "failure"
            moved -= 1
    if moved:
        for key, delta in (("failures", -moved), ("errors", moved)):
            suite.set(key, str(max(0, int(suite.get(key, "0") or 0) + delta)))


def _drop_nameless(suite: ET.Element) -> None:
    """Remove the ``<testcase time="12.370" />`` pytest's JUnit plugin leaves for a test interrupted
    in its call (it timed the setup, never saw a result, so it has no name) and make ``tests``
    count the testcases listed: strict JUnit consumers reject both. The interrupted gate is named
    by the ``kvgate.run`` error case (and its own INCOMPLETE case when it recorded one)."""
    for case in [c for c in suite.findall("testcase") if not c.get("name")]:
        suite.remove(case)
    suite.set("tests", str(len(suite.findall("testcase"))))


def stamp_junit(path: Path, run_id: str, overall: str, problem: str | None = None,
                incomplete: dict[str, str] | None = None, outcome: str | None = None) -> bool:
    """Add ``kvgate_run_id`` and ``kvgate_overall`` properties to the testsuite of the JUnit file
    pytest wrote; with ``problem`` (an incomplete run) also an error testcase ``kvgate.run`` so
    the file is not green; ``incomplete`` (``{test id: message}``: gates cut short, e.g. a soak
    stopped by SIGTERM, which pytest's JUnit plugin never saw finish) become error testcases named
    by their test id unless the file has them already; ``outcome`` (the gate mode's word, e.g.
    NOT-CERTIFIED) becomes the ``kvgate_outcome`` property. Returns False when there is no such
    file (or it does not parse)."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return False
    suite = _suite(tree.getroot())
    _set_property(suite, RUN_ID_KEY, run_id)
    _set_property(suite, "kvgate_overall", overall)
    if outcome:
        _set_property(suite, "kvgate_outcome", outcome)
    _drop_nameless(suite)
    if problem:
        _add_error_case(suite, "run", problem)
    _errors_as_errors(suite)
    present = {c.get("name", "") for c in suite.iter("testcase")}
    for test_id, message in (incomplete or {}).items():
        if not any(test_id in name for name in present):
            _add_error_case(suite, test_id, f"INCOMPLETE: {message}")
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return True


def write_allure_environment(directory: Path, props: dict[str, str | None]) -> Path:
    """``environment.properties`` (Allure's Environment widget): ``kvgate_run_id`` and the other
    ``props`` (``None`` values skipped). Raises ``OSError``."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for k, v in props.items():
        if v is not None:
            value = str(v).replace("\\", "\\\\").replace("\n", " ")
            lines.append(f"{k}={value}")
    path = directory / "environment.properties"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_allure_problem(directory: Path, run_id: str, message: str, name: str = "kvgate run",
                         profile: str | None = None) -> None:
    """One *broken* Allure result that says why the run produced no (or not all) results, labelled
    with the run id. Raises ``OSError``."""
    now = int(time.time() * 1000)
    labels = [Label(name=RUN_ID_KEY, value=run_id), Label(name="suite", value="kvgate")]
    if profile:
        labels.append(Label(name="kvgate_profile", value=profile))
    result = TestResult(uuid=str(uuid.uuid4()), name=name, fullName=f"kvgate::{name}", historyId=f"kvgate::{name}",
                        status=Status.BROKEN, statusDetails=StatusDetails(message=message), labels=labels,
                        start=now, stop=now)
    AllureFileLogger(str(directory)).report_result(result)
