"""Shared fixtures for kvgate's own tests."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

# Import lazily-loaded HTTP stacks up front: pytester's in-process runs drop modules first
# imported inside them, and httpx imports httpcore lazily -- a re-imported httpcore then has new
# exception classes that httpx no longer maps (httpcore.ConnectError escaping as an INTERNALERROR).
import httpcore  # noqa: F401
import httpx  # noqa: F401
import openai  # noqa: F401
import pytest

httpx.HTTPTransport()  # instantiating triggers httpx's own lazy imports of httpcore internals

# The same for cost: what a gate run imports lazily is imported again by every pytester in-process
# run (its sys.modules snapshot drops it afterwards). matplotlib (every run's report plots, Agg as
# kvgate.report.plots selects it) is ~100 modules; the openai SDK's resources (the streaming/api
# gates' SDK checks), httpx_sse and pynvml (the run record) a few dozen more. Imported once here, an
# inner run finds them loaded and runs the same code: a `-m fit` run against the fake profile took
# 2.6-3.2 s (median of 5) without, 0.9-1.1 s with; a gate run of tests/test_gates_autoscale.py 0.4-0.9 s
# less (2026-12-06, 2 shared cores). Where a test has already imported matplotlib outside a pytester
# run (tests/test_plots.py), the later runs of that process found it loaded anyway.
import httpx_sse  # noqa: E402,F401
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401
import openai.lib.streaming.chat  # noqa: E402,F401
import openai.resources  # noqa: E402,F401

try:
    import pynvml  # noqa: F401
except ImportError:  # pragma: no cover - optional, as in kvgate.report.allure_meta
    pass

REPO = Path(__file__).resolve().parents[1]

# A shell starts a backgrounded job (`.ci/run &`, nohup, some CI runners) with SIGINT ignored, and
# an ignored signal stays ignored across exec: the interrupt tests' Ctrl-C (to this process and to
# the pytest/kvgate subprocesses they start) would then never arrive. kvgate's own tests need a
# working Ctrl-C, so give this process Python's handler back; children then start with SIGINT at
# its default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def write_profile(tmp_path: Path):
    """Write a YAML profile into tmp_path and return its path."""

    def write(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p

    return write


MINIMAL = """\
model:
  served_name: m
  architecture: {layers: 2, attention_heads: 4, kv_heads: 2, head_dim: 64}
engine:
  max_model_len: 256
"""


# ---------------------------------------------------------------------------- summary schema
def validate_summary(summary: dict) -> dict:
    """Validate a summary.json document against kvgate's JSON Schema; return it. Every test that
    makes kvgate write a summary reads it through here (or :func:`read_summary`)."""
    import jsonschema

    from kvgate.report.record import SUMMARY_SCHEMA

    schema = json.loads(SUMMARY_SCHEMA.read_text())
    jsonschema.validate(summary, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return summary


def read_summary(reports: Path) -> dict:
    """``reports/summary.json``, parsed and validated against the schema."""
    return validate_summary(json.loads((reports / "summary.json").read_text()))


# ---------------------------------------------------------------------------- PASSes that were measured
def unmeasured_passes(data: Any) -> list[str]:
    """Every PASS in ``data`` that rests on nothing: its evidence empty (``{}``) **and** its measured
    value None -- ``"id: message"`` each. ``data``: a parsed summary.json (each gate, and each of its
    checks, read from the part the gate folded into its evidence, :func:`kvgate.verdict.combine`;
    a check the gate did not fold in has no evidence in the report), a :class:`~kvgate.verdict.Verdict`
    or a list of them (each with its ``parts``, recursively)."""
    from kvgate.verdict import Status, Verdict

    bad: list[str] = []

    def verdict(v: Verdict, where: str) -> None:
        if v.status is Status.PASS and not v.evidence and v.measured is None:
            bad.append(f"{where}{v.gate}: {v.message}")
        for p in v.parts:
            verdict(p, f"{where}{v.gate} > ")

    if isinstance(data, Verdict):
        verdict(data, "")
    elif isinstance(data, dict) and "gates" in data:
        for g in data["gates"]:
            ev = g.get("evidence") or {}
            if g["status"] == "PASS" and not ev and (g.get("measured") or {}).get("value") is None:
                bad.append(f"{g['id']}: {g['message']}")
            for c in g.get("checks") or []:
                part = ev.get(c["gate"])
                folded = isinstance(part, dict) and "status" in part and "evidence" in part
                if c["status"] == "PASS" and not (folded and part["evidence"]) and \
                        (part["measured"] if folded else (c.get("measured") or {}).get("value")) is None:
                    bad.append(f"{g['id']} > {c['gate']}: {c['message']}")
    else:
        for v in data:
            verdict(v, "")
    return bad


def assert_passes_measured(data: Any) -> None:
    """Fail listing each PASS of ``data`` whose evidence is empty and measured value None
    (:func:`unmeasured_passes`): a PASS is measured, never "nothing was seen". Called on the PASS
    verdicts of every gate module's healthy run or healthy inputs (tests/test_passes_measured.py
    lists where, and fails when a gate module has none)."""
    bad = unmeasured_passes(data)
    assert not bad, f"{len(bad)} PASS verdict(s) with no evidence and no measured value:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------- the checkout's reports/
CHECKOUT_REPORTS = REPO / "reports"


def _run_outputs() -> tuple[str, ...]:
    """The names a gate run (``pytest --profile ...``) writes or replaces in its reports dir:
    kvgate.report.outputs.OWNED less ``kvgate report``'s signoff.md (``allure-report/`` is not in it
    either). ``kvgate report`` -- which a user may well run in the same checkout while these tests
    take their half hour -- writes only signoff.md, allure-report/ and a transient .allure-render-*
    dir; a gate run that kvgate's tests let loose on the checkout writes these."""
    from kvgate.report import outputs

    return tuple(n for n in outputs.OWNED if n != outputs.SIGNOFF)


def reports_snapshot(root: Path = CHECKOUT_REPORTS, names: tuple[str, ...] | None = None
                     ) -> dict[str, tuple[int, int]] | None:
    """``{relative path: (mtime_ns, size)}`` of the gate-run outputs under ``root`` (``names``,
    default :func:`_run_outputs`: files, or every file under a directory of that name); None when
    ``root`` is absent. Anything else there (signoff.md, allure-report/, a user's own files) is
    not looked at."""
    if not root.exists():
        return None
    names = _run_outputs() if names is None else names
    snap: dict[str, tuple[int, int]] = {}
    for name in names:
        top = root / name
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top] if top.is_file() else []
        for f in files:
            try:
                st = f.stat()
            except OSError:  # gone between the listing and the stat
                continue
            snap[str(f.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return snap


def reports_changes(before: dict[str, tuple[int, int]] | None, after: dict[str, tuple[int, int]] | None) -> list[str]:
    """What changed between two :func:`reports_snapshot` s: ``["+ new", "- removed", "~ changed"]``
    by path, sorted; ``[]`` when nothing a gate run writes was touched."""
    before, after = before or {}, after or {}
    return sorted([f"+ {k}" for k in after.keys() - before.keys()] + [f"- {k}" for k in before.keys() - after.keys()]
                  + [f"~ {k}" for k in after.keys() & before.keys() if after[k] != before[k]], key=lambda c: c[2:])


def reports_guard_message(changes: list[str], root: Path = CHECKOUT_REPORTS) -> str:
    return (f"a gate run's outputs in {root} changed during this test session -- kvgate's own tests must give "
            f"every run they make a tmp --kvgate-reports (or a gate run was started in this checkout meanwhile; "
            f"`kvgate report`'s signoff.md and allure-report/ are not counted): {changes[:10]}")


_REPORTS_BEFORE = pytest.StashKey[object]()
_REPORTS_PROBLEM = pytest.StashKey[str]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Snapshot the checkout's reports/ once per run: in the controller under pytest-xdist (whose
    session spans every worker's), not in each worker."""
    if session.config.getoption("kvgate_profile", default=None) is not None:
        return  # a gate run (pytest --profile ...) that loaded this conftest, e.g. for a path not found: not kvgate's tests
    if not _is_xdist_worker(session.config):
        session.config.stash[_REPORTS_BEFORE] = reports_snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """kvgate's own tests never write into the checkout's ``reports/`` (a user's last real run lives
    there): every pytester/subprocess run must pass ``--kvgate-reports`` a tmp dir. Checked once, at
    the end of the session; a change fails the run (exit 1) and says what changed."""
    config = session.config
    if _is_xdist_worker(config) or _REPORTS_BEFORE not in config.stash:
        return
    changes = reports_changes(config.stash[_REPORTS_BEFORE], reports_snapshot())
    if changes:
        config.stash[_REPORTS_PROBLEM] = reports_guard_message(changes)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_COSTS: dict[str, float] = {}
_UNIT_COSTS: dict[str, float] = {}
#: The unit files the cost table names one by one (the costliest), the rest summed.
UNIT_FILES_SHOWN = 15
UNITS = "unit, fake and pytester tests (all other files)"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per test file (setup + call + teardown; a module fixture's start counts in its first
    test), for the cost table below. Under pytest-xdist the controller sees every worker's reports."""
    path = report.nodeid.split("::", 1)[0]
    key = path if _is_e2e(report.nodeid) else UNITS
    _COSTS[key] = _COSTS.get(key, 0.0) + (report.duration or 0.0)
    if key == UNITS:
        _UNIT_COSTS[path] = _UNIT_COSTS.get(path, 0.0) + (report.duration or 0.0)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _COSTS and not _is_xdist_worker(config):
        terminalreporter.section("test cost per file (seconds, summed over tests; CI reads this)")
        for name, secs in sorted(_COSTS.items(), key=lambda kv: -kv[1]):
            terminalreporter.line(f"{secs:8.1f}  {name}")
        top = sorted(_UNIT_COSTS.items(), key=lambda kv: -kv[1])[:UNIT_FILES_SHOWN]
        if len(_UNIT_COSTS) > 1:
            terminalreporter.line(f"  of the unit, fake and pytester tests, the {len(top)} costliest of "
                                  f"{len(_UNIT_COSTS)} files:")
            for name, secs in top:
                terminalreporter.line(f"{secs:10.1f}  {name}")
    if problem := config.stash.get(_REPORTS_PROBLEM, None):
        terminalreporter.section("checkout reports/ guard", sep="=", red=True, bold=True)
        terminalreporter.line(f"FAILED: {problem}", red=True)


# ---------------------------------------------------------------------------- order and pytest-xdist
E2E_DIR = "tests/e2e/"

#: The e2e modules whose assertions hold on a busy machine: each judges token counts, texts, the
#: rendered report, a container's life, a teardown after a signal sent on an event or a verdict
#: against the fake -- never a latency, a TTFT, a soak slope, a priority gain, drain timing, a signal
#: timed from a run's start or an exit timed after it, or host contention -- so they run beside the unit tests
#: (:class:`UnitsThenE2E`'s first lane): a busy core makes them slower, not wrong. Whole modules (their
#: module and session fixtures stay in one lane); a session fixture one of them uses is used by no
#: module of the other lane (tests/e2e/conftest.py). Every other e2e module is timing-sensitive.
E2E_BESIDE_UNITS = (
    "test_causes.py",             # fit/live-pool, served-config, answers and compare FAILs: bytes, tokens, texts
    "test_docker_launch.py",      # a container's start and removal; gates against the fake, as the unit half's
    "test_features.py",           # features PASS/FAIL on what came back (tool arguments, whitespace, cached_tokens);
                                  # slowest reply 0.77 s of the 30 s features.deadline_s (2026-12-06)
    "test_kv_families.py",        # fit/live-pool token counts; preemptions of 10 long sequences (counts)
    "test_null_block.py",         # the fit FAIL and a refused start (or the probe's waiting 1, running 0)
    "test_overcommitted.py",      # fit FAIL and preemptions (counts)
    "test_pools_endpoint.py",     # each pool's deployment and max-context gates through --endpoint
    "test_real_model.py",         # answers at temperature 0, served-config, the auth surface
    "test_release.py",            # which cases PASS/FAIL on 0.32 and 0.28, refusals' texts, the contract
    "test_report_browser.py",     # the rendered report of the overcommitted run and of a fake run
    "test_sigterm.py",            # SIGTERM on an event (vLLM up; the router sending): INCOMPLETE, no process left
)


def _is_e2e(nodeid: str) -> bool:
    return nodeid.startswith(E2E_DIR) or f"/{E2E_DIR}" in nodeid


def _beside_units(nodeid: str) -> bool:
    """An e2e test of a module in :data:`E2E_BESIDE_UNITS`."""
    return _is_e2e(nodeid) and nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in E2E_BESIDE_UNITS


def _lane(nodeid: str) -> int:
    """0: the e2e tests that run beside the unit tests; 1: the unit, fake and pytester tests; 2: the
    timing-sensitive e2e tests, with the machine to themselves."""
    return 2 - (not _is_e2e(nodeid)) - 2 * _beside_units(nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order (stable within each lane): the e2e tests that hold on a busy machine
    (:data:`E2E_BESIDE_UNITS`), the unit, fake and pytester tests, then the timing-sensitive e2e
    tests (tests/e2e/, each starting real vLLMs) last -- under pytest-xdist the first two run side
    by side and the last gets the machine to itself (:class:`UnitsThenE2E`). A name in
    E2E_BESIDE_UNITS that names no module in tests/e2e/ is an error (a renamed module would
    silently change lanes)."""
    stale = [n for n in E2E_BESIDE_UNITS if not (REPO / E2E_DIR / n).is_file()]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py E2E_BESIDE_UNITS names no module in {E2E_DIR}: {stale}")
    items.sort(key=lambda it: _lane(it.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``pytest tests -n 2``, in three lanes:

    1. the e2e modules in :data:`E2E_BESIDE_UNITS`, as ONE work unit, first, on one worker (in
       collection order; module and session fixtures work as without xdist), while
    2. the unit, fake and pytester tests are spread over the other worker(s) a test at a time (as
       ``--dist load``); the first lane's worker joins them once its lane is done;
    3. the other e2e tests (tests/e2e/, timing-sensitive) as ONE work unit on one worker, last, once
       every other worker is out of work -- each needs the machine's CPUs (vLLM is pinned to them),
       so none runs beside another test.

    Applies to ``--dist load`` (what ``-n`` implies) and ``--dist loadfile``; other ``--dist`` modes
    are left as asked. With one worker the lanes run one after the other."""
    if config.getoption("dist") not in ("load", "loadfile"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitsThenE2E(LoadScopeScheduling):
        BESIDE = "<kvgate e2e beside the unit tests, one worker>"
        E2E = "<kvgate e2e, one worker, alone>"

        def _split_scope(self, nodeid: str) -> str:
            if _is_e2e(nodeid):
                return self.BESIDE if _beside_units(nodeid) else self.E2E
            return nodeid  # a unit test is a unit of work of its own: spread a test at a time

        def _assign_work_unit(self, node) -> None:
            # the queue's order, whatever --loadscope-reorder made of it: the first lane, the unit tests, the e2e last
            if self.E2E in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(self.E2E)
            if self.BESIDE in self.workqueue:
                self.workqueue.move_to_end(self.BESIDE, last=False)
            if next(iter(self.workqueue)) != self.E2E:
                return super()._assign_work_unit(node)
            # An xdist worker holds back its last test until it gets more work or is shut down:
            # the other workers are done once at most that one is pending; they run it and stop.
            if any(self._pending_of(work) > 1 for n, work in self.assigned_work.items() if n is not node):
                return  # the last of them to run low (the first lane's worker included) assigns the e2e unit
            super()._assign_work_unit(node)
            for other in self.nodes:
                if other is not node and not other.shutting_down:
                    other.shutdown()

    return UnitsThenE2E(config, log)
