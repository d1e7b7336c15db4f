"""pytest wiring only: options, profile loading into ``config.stash``, report header, readable
test ids, verdict recording, summary/Allure/JUnit output, the terminal verdict table.

Inert unless ``--profile``/``--deploy-profile`` is given, so the suite's own tests (and any other
project in the same environment) are unaffected. pytest-profiling also owns ``--profile`` (a
flag); when it is installed kvgate registers only ``--deploy-profile`` and says so if the clash
bites.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from .client import Endpoint, EndpointUnreachable
from .launch.target import TargetError, check_reachable, endpoint_from_url
from .profile import DEFAULT_PROFILE_DIR, Profile, ProfileError, available_profiles, load_profile
from .redact import Redactor
from .report import RunRecord, attach_png, attach_text, attach_verdict
from .verdict import Status, Verdict


@dataclass
class KvgateState:
    """What one run knows, stashed on the config. ``endpoint`` is None until launched/targeted."""

    profile: Profile
    record: RunRecord
    redactor: Redactor
    reports_dir: Path
    endpoint: Endpoint | None = None
    startup_budget_s: float = 240.0
    extra: dict[str, Any] = field(default_factory=dict)


STATE = pytest.StashKey[KvgateState]()
CLASH = pytest.StashKey[bool]()


def _profiling_installed() -> bool:
    return importlib.util.find_spec("pytest_profiling") is not None


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("kvgate", "kvgate deployment conformance")
    names = ["--deploy-profile"] if _profiling_installed() else ["--profile", "--deploy-profile"]
    group.addoption(*names, dest="kvgate_profile", default=None, metavar="NAME|PATH",
                    help="deployment profile: a name in profiles/ or a path to a YAML file")
    group.addoption("--endpoint", dest="kvgate_endpoint", default=None, metavar="URL",
                    help="gate an existing OpenAI-compatible server (default: launch the embedded vLLM)")
    group.addoption("--api-key-env", dest="kvgate_api_key_env", default=None, metavar="VAR",
                    help="environment variable holding the endpoint's API key (never printed)")
    group.addoption("--kvgate-reports", dest="kvgate_reports", default="reports", metavar="DIR",
                    help="directory for summary.json, allure-results/, junit.xml (default: reports)")
    group.addoption("--startup-budget", dest="kvgate_startup_budget", type=float, default=240.0, metavar="S",
                    help="seconds the embedded vLLM may take to become healthy (default 240)")
    group.addoption("--profile-dir", dest="kvgate_profile_dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR",
                    help="where --profile NAME is looked up")


def _usage(msg: str) -> pytest.UsageError:
    return pytest.UsageError(msg)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in ("gate(name, cases=()): a kvgate gate; cases become readable ids PROFILE/GATE/CASE",
                 "fit: the fit gate", "deployment: deployment matches profile", "max_context: max-context gate",
                 "max_tokens: max_tokens caps gate", "streaming: streaming gate", "disconnect: disconnect gate",
                 "load: gates that put the server under concurrent load"):
        config.addinivalue_line("markers", line)
    name = config.getoption("kvgate_profile")
    if name is None:
        if _profiling_installed() and config.getoption("profile", default=False) is True:
            raise _usage("pytest-profiling is installed and owns --profile (a flag); "
                         "use --deploy-profile NAME for kvgate")
        return
    reports = _reports_dir(config)
    try:
        _configure(config, name, reports)
    except pytest.UsageError as exc:
        # a stale summary from an earlier run must not be read as this run's verdict
        if not config.option.collectonly:
            _write_error_summary(reports, str(exc))
        raise


def _reports_dir(config: pytest.Config) -> Path:
    """``--kvgate-reports``; the default ``reports`` is relative to the rootdir, not the cwd."""
    raw = config.getoption("kvgate_reports")
    path = Path(raw)
    return path if path.is_absolute() or raw != "reports" else config.rootpath / "reports"


def _write_error_summary(reports: Path, message: str) -> None:
    try:
        reports.mkdir(parents=True, exist_ok=True)
        (reports / "summary.json").write_text(json.dumps(
            {"kvgate_summary_version": 1, "overall": "ERROR", "complete": False, "error": message, "gates": []},
            indent=2))
    except OSError:
        pass


def _configure(config: pytest.Config, name: str, reports: Path) -> None:
    if config.inipath is None:
        raise _usage(f"pytest found no kvgate configuration (rootdir {config.rootpath}): run from the kvgate "
                     "checkout, and give profile paths as --profile=PATH (with '='), since pytest reads a bare "
                     "path after an option it does not know yet as a test path")
    profile_dir = Path(config.getoption("kvgate_profile_dir"))
    try:
        profile = load_profile(name, profile_dir)
    except ProfileError as exc:
        raise _usage(str(exc)) from None
    try:
        reports.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _usage(f"--kvgate-reports {reports}: cannot create it ({exc.strerror})") from None

    api_key_env = config.getoption("kvgate_api_key_env")
    redactor = Redactor()
    url = config.getoption("kvgate_endpoint")
    endpoint = None
    if url:
        try:
            endpoint = endpoint_from_url(url, profile, api_key_env)
            redactor.add(endpoint.api_key)
            if not config.option.collectonly and not _only_fit(config):
                check_reachable(endpoint)
        except (TargetError, EndpointUnreachable) as exc:
            raise _usage(redactor.text(str(exc))) from None
    elif not profile.embedded and not _only_fit(config):
        raise _usage(f"profile {profile.name!r} describes a deployment kvgate cannot launch here; "
                     "give --endpoint URL (or run only the fit gate: -m fit)")

    record = RunRecord(profile.name, profile.source, redactor, endpoint=endpoint.display if endpoint else None)
    config.stash[STATE] = KvgateState(profile, record, redactor, reports, endpoint,
                                      config.getoption("kvgate_startup_budget"))
    # report outputs, unless the user chose their own
    if getattr(config.option, "allure_report_dir", None) is None and hasattr(config.option, "allure_report_dir"):
        config.option.allure_report_dir = str(reports / "allure-results")
        config.option.clean_alluredir = True
    if not getattr(config.option, "xmlpath", None):
        config.option.xmlpath = str(reports / "junit.xml")
    _install_sigterm(config)


def _install_sigterm(config: pytest.Config) -> None:
    """SIGTERM (CI cancel, ``timeout``, Kubernetes) takes pytest's Ctrl-C path: fixtures tear the
    embedded server down and the summary is written, marked incomplete."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, on_term)
    config.add_cleanup(lambda: signal.signal(signal.SIGTERM, previous))


def _only_fit(config: pytest.Config) -> bool:
    return (config.getoption("markexpr") or "").strip() == "fit"


def state(config: pytest.Config) -> KvgateState:
    """The run's :class:`KvgateState`; raises ``pytest.UsageError`` when no profile was given."""
    st = config.stash.get(STATE, None)
    if st is None:
        names = ", ".join(available_profiles(Path(config.getoption("kvgate_profile_dir"))))
        raise _usage(f"kvgate suites need a deployment profile: --profile NAME (available: {names})")
    return st


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    st = config.stash.get(STATE, None)
    if st is None:
        return None
    where = st.endpoint.display if st.endpoint else "embedded vLLM (launched on first use)"
    return [f"kvgate: profile {st.profile.name} ({st.profile.source}); endpoint {where}; reports {st.reports_dir}/"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.gate("max-context", cases=[...])`` + a ``case`` argument -> ids PROFILE/GATE/CASE."""
    marker = metafunc.definition.get_closest_marker("gate")
    if marker is None or "case" not in metafunc.fixturenames:
        return
    gate = marker.args[0]
    cases = list(marker.kwargs.get("cases", ()))
    st = metafunc.config.stash.get(STATE, None)
    prefix = st.profile.name if st else "no-profile"
    metafunc.parametrize("case", cases, ids=[f"{prefix}/{gate}/{c}" for c in cases])


def test_id(item: pytest.Item) -> str:
    """Readable id: the PROFILE/GATE/CASE parameter id when there is one, else the test name."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "/" in callspec.id:
        return callspec.id
    st = item.config.stash.get(STATE, None)
    marker = item.get_closest_marker("gate")
    if st and marker:
        return f"{st.profile.name}/{marker.args[0]}"
    return item.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(STATE, None) is None:
        if any(item.get_closest_marker("gate") for item in items):
            state(config)  # raises the usage error listing profiles
        return
    # the fit gate needs no server and runs first; gates that load the server run last
    items.sort(key=_gate_rank)


GATE_ORDER = ("fit", "deployment", "max-context", "max-tokens", "streaming", "disconnect", "concurrency", "latency")


def _gate_rank(item: pytest.Item) -> int:
    marker = item.get_closest_marker("gate")
    name = marker.args[0] if marker else ""
    return GATE_ORDER.index(name) if name in GATE_ORDER else len(GATE_ORDER)


def make_recorder(item: pytest.Item) -> Callable[..., Verdict]:
    """The ``kvgate_gate`` fixture's callable: record, attach, then pass/fail/skip the test.

    ``kvgate_gate(verdict, attachments={"name.txt": text, "plot.png": png_bytes}, console=False)``;
    ``console=True`` prints the text attachments under the verdict table at the end of the run.
    """
    st = state(item.config)

    def record(verdict: Verdict, attachments: dict[str, str] | None = None, console: bool = False) -> Verdict:
        attachments = attachments or {}
        item.user_properties.extend([("kvgate_verdict", verdict.status.value),
                                     ("kvgate_message", st.redactor.text(verdict.message)),
                                     ("kvgate_measured", st.redactor.text(json.dumps(verdict.measured, default=str))),
                                     ("kvgate_limit", st.redactor.text(json.dumps(verdict.limit, default=str)))])
        st.record.add(item.nodeid, test_id(item), verdict,
                      [(k, v) for k, v in attachments.items() if isinstance(v, str)] if console else None)
        attach_verdict(verdict, st.redactor)
        for name, body in attachments.items():
            if isinstance(body, bytes):
                attach_png(name, body)
            else:
                attach_text(name, body, st.redactor, "csv" if name.endswith(".csv") else "text")
        if verdict.status is Status.FAIL:
            pytest.fail(st.redactor.text(verdict.message), pytrace=False)
        if verdict.status is Status.INVALID:
            pytest.fail("INVALID: " + st.redactor.text(verdict.message), pytrace=False)
        if verdict.status is Status.SKIP:
            pytest.skip(st.redactor.text(verdict.message))
        return verdict

    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    rep = outcome.get_result()
    st = item.config.stash.get(STATE, None)
    if st is None or item.get_closest_marker("gate") is None:
        return
    if rep.when == "call" or rep.skipped or rep.failed:
        st.extra.setdefault("finished", set()).add(item.nodeid)
    if rep.failed and item.nodeid not in st.record.entries:
        # the harness or the server broke before a verdict: still a named result, never silent
        text = str(rep.longrepr.reprcrash.message) if hasattr(rep.longrepr, "reprcrash") and rep.longrepr.reprcrash \
            else str(rep.longrepr).splitlines()[-1] if rep.longrepr else "error"
        st.record.error(item.nodeid, test_id(item), f"{rep.when}: {text}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    st = session.config.stash.get(STATE, None)
    if st is None or session.config.option.collectonly:
        return
    finished = st.extra.get("finished", set())
    missing = [test_id(it) for it in session.items if it.get_closest_marker("gate") and it.nodeid not in finished]
    if exitstatus == pytest.ExitCode.INTERRUPTED or missing:
        st.record.complete = False
        st.record.not_run = missing
    path = st.record.write_summary(st.reports_dir / "summary.json")
    st.extra["summary_path"] = str(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    st = config.stash.get(STATE, None)
    if st is None:
        return
    tr = terminalreporter
    tr.section("kvgate verdicts")
    for e in st.record.entries.values():
        for name, text in e.console:
            tr.write_line(f"--- {e.test_id}: {name}")
            for line in st.redactor.text(text).splitlines():
                tr.write_line(line)
    for line in st.record.table():
        tr.write_line(line)
    if "summary_path" in st.extra:
        tr.write_line(f"summary: {st.extra['summary_path']}; allure: {st.reports_dir / 'allure-results'}")
