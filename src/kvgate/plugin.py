"""pytest wiring only: options, profile loading into ``config.stash``, report header, readable
test ids, verdict recording, summary/Allure/JUnit output, the terminal verdict table.

Inert unless ``--profile``/``--deploy-profile`` is given, so the suite's own tests (and any other
project in the same environment) are unaffected. pytest-profiling also owns ``--profile`` (a
flag); when it is installed kvgate registers only ``--deploy-profile`` and says so if the clash
bites.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from kvgate.report import allure_meta, outputs

from kvgate.http.client import Endpoint
from kvgate.launch.base import ENDPOINT_ENV, Choice, choose
from kvgate.launch.target import TargetError, endpoint_from_url
from kvgate.run.modes import DEFAULT_MODE, OVERLAY_FILE, ModeError, overlay, parse_mode
from kvgate.http.preflight import PreflightError, preflight
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, available_profiles, load_profile
from kvgate.report.redact import Redactor
from kvgate.report.record import RunRecord, attach_png, attach_text, attach_verdict
from kvgate.verdict import Status, Verdict

try:  # allure-pytest is a dependency; keep the plugin importable without it
    import allure
except ImportError:  # pragma: no cover
    allure = None


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
#: This run's id (summary.json ``run_id``, JUnit property and Allure label ``kvgate_run_id``).
RUN_ID = pytest.StashKey[str]()
#: Set when the run could not start: ``(message, junit path or None)``; the reports say ERROR.
RUN_ERROR = pytest.StashKey[tuple[str, "Path | None"]]()

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
    "load: gates that put the server under concurrent load",
    "priority: the priority gate (high-priority short requests overtake low-priority long ones)",
    "autoscale_signal: the autoscale-signal gate (the queue metric an autoscaler reads, under a burst)",
    "pools: the pools gates (short/long pools behind a router: routing by length, isolation of short requests)",
    "soak: the soak gate (hours of fixed offered load; memory and TTFT-p95 slopes)",
)
#: Path-valued options of plugins loaded after pytest fixes its rootdir: given as ``--opt PATH``
#: (with a space) pytest reads PATH as a test path when it picks the rootdir.
PATH_OPTIONS = ("--profile", "--deploy-profile", "--kvgate-reports", "--profile-dir", "--alluredir")


def _profiling_installed() -> bool:
    return importlib.util.find_spec("pytest_profiling") is not None


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
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
    group.addoption("--startup-budget", dest="kvgate_startup_budget", type=float, default=None, metavar="S",
                    help="seconds a launched server may take to become ready (default: embedded 240, docker the "
                         "profile's launch.startup_budget_s, 1800)")
    group.addoption("--isvc", dest="kvgate_isvc", default=None, metavar="NAME",
                    help="gate the new version of this KServe InferenceService / LLMInferenceService before it "
                         "takes traffic (read with the kubernetes client; see README 'KServe pre-canary')")
    group.addoption("--namespace", dest="kvgate_namespace", default="default", metavar="NS",
                    help="the --isvc's namespace (default: default)")
    group.addoption("--canary", dest="kvgate_canary", default=None, metavar="NAME",
                    help="--isvc RawDeployment: the named canary to gate (default: the one at trafficPercent 0)")
    group.addoption("--ingress", dest="kvgate_ingress", default=None, metavar="URL",
                    help="--isvc serverless: connect to this ingress and send the tag URL's Host header")
    group.addoption("--ca-bundle", dest="kvgate_ca_bundle", default=None, metavar="PATH",
                    help="a CA bundle (PEM) to verify https endpoints with; TLS is always verified")
    group.addoption("--launch", dest="kvgate_launch", default=None, choices=("embedded", "docker", "none"),
                    help="how kvgate starts the server when no --endpoint/KVGATE_ENDPOINT is given "
                         "(default: the profile's launch.mode)")
    group.addoption("--profile-dir", dest="kvgate_profile_dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR",
                    help="where --profile NAME is looked up (give it with '=': --profile-dir=DIR)")
    group.addoption("--soak-duration", dest="kvgate_soak_duration", default=None, metavar="DURATION",
                    help="override the profile's soak.duration, e.g. 10m, 6h, 90s (warm-up included)")
    group.addoption("--gate-mode", dest="kvgate_gate_mode", default=DEFAULT_MODE, metavar="MODE",
                    help="enforce (default: a FAIL fails the run), record (calibration: every gate runs, none "
                         "fails; measured values written as a profile overlay in the reports dir) or certify "
                         "(sign-off: any SKIP or INVALID makes the run not pass). Exit codes: README")


def _usage(msg: str) -> pytest.UsageError:
    return pytest.UsageError(msg)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[RUN_ID] = outputs.new_run_id()
    name = config.getoption("kvgate_profile")
    try:
        config.option.kvgate_gate_mode = parse_mode(config.getoption("kvgate_gate_mode", default=None))
    except ModeError as exc:
        if name is not None:
            write_error_reports(config, str(exc))
        raise _usage(str(exc)) from None
    if name is None:
        if _profiling_installed() and config.getoption("profile", default=False) is True:
            raise _usage("pytest-profiling is installed and owns --profile (a flag); "
                         "use --deploy-profile NAME for kvgate")
        return
    from kvgate.run import lifecycle  # early launch, phases, interrupts (kept out of the wiring here)

    if not config.pluginmanager.is_registered(lifecycle):
        config.pluginmanager.register(lifecycle, "kvgate-lifecycle")
    reports = _reports_dir(config)
    try:
        _configure(config, name, reports)
    except pytest.UsageError as exc:
        # the earlier run's reports must not be read as this run's verdict: replace them all
        write_error_reports(config, str(exc))
        raise


def _reports_dir(config: pytest.Config) -> Path:
    """``--kvgate-reports``; the default ``reports`` is relative to the rootdir, not the cwd.

    When pytest picked a rootdir outside the checkout (a path option given with a space, which
    kvgate refuses), the default is the cwd's ``reports/`` if the cwd is a project (it has a
    pyproject.toml) -- so the refusal replaces *that* run's reports -- never ``<other rootdir>/reports``.
    """
    raw = config.getoption("kvgate_reports")
    path = Path(raw)
    if path.is_absolute() or raw != "reports":
        return path
    if config.inipath is None and (Path.cwd() / "pyproject.toml").is_file():
        return Path.cwd() / "reports"
    return config.rootpath / "reports"


def _junit_path(config: pytest.Config, reports: Path) -> Path:
    """Where this run's JUnit goes: ``--junitxml`` if given, else ``junit.xml`` in the reports dir."""
    xml = getattr(config.option, "xmlpath", None)
    return Path(xml) if xml else reports / outputs.JUNIT


def _allure_path(config: pytest.Config, reports: Path) -> tuple[Path | None, bool]:
    """``(dir, replace)``: where this run's Allure results go (``--alluredir`` if given, else
    ``allure-results`` in the reports dir; None without allure-pytest) and whether kvgate empties
    it first (its own dir always; a chosen one only with ``--clean-alluredir``)."""
    if not hasattr(config.option, "allure_report_dir"):
        return None, False
    chosen = config.option.allure_report_dir
    if chosen:
        return Path(chosen), bool(getattr(config.option, "clean_alluredir", False))
    return reports / outputs.ALLURE, True


def write_error_reports(config: pytest.Config, message: str) -> None:
    """A run that cannot start (usage error, preflight refusal) still replaces the reports as a
    set: the previous run's outputs are removed, then an ``ERROR`` summary.json, a junit.xml with
    one error testcase and an Allure *broken* result are written, all with this run's id. Not in
    ``--collect-only`` (which is not a run). Never raises: an unwritable reports dir is itself the
    usage error being reported."""
    if config.option.collectonly:
        return
    reports = _reports_dir(config)
    run_id = config.stash.get(RUN_ID, None) or outputs.new_run_id()
    st = config.stash.get(STATE, None)
    if st is not None:
        record = st.record
    else:
        name = config.getoption("kvgate_profile", default=None)
        record = RunRecord(name, None, Redactor())
    record.run_id = run_id
    record.run_error = record.redactor.text(message)
    record.complete = False
    junit = _junit_path(config, reports)
    allure_dir, replace_allure = _allure_path(config, reports)
    config.stash[RUN_ERROR] = (record.run_error, junit)
    # once this run has cleared the reports (configure), the server log there is this run's own:
    # keep it, it says why the embedded server failed its preflight
    keep = {outputs.SERVER_LOG} if st is not None and st.extra.get("reports_cleared") else set()
    try:
        reports.mkdir(parents=True, exist_ok=True)
        outputs.clear(reports, [junit] + ([allure_dir] if allure_dir and replace_allure else []), keep=keep)
        record.write_summary(reports / outputs.SUMMARY)
        outputs.write_junit_problem(junit, run_id, "ERROR", record.run_error)
        if allure_dir is not None:
            outputs.write_allure_problem(allure_dir, run_id, record.run_error, profile=record.profile_name)
            gate_mode = getattr(config.option, "kvgate_gate_mode", "enforce")
            allure_meta.write_metadata(allure_dir, allure_meta.environment_props(record.summary(), gate_mode),
                                       record.redactor)
    except OSError:
        pass


def given_with_space(args: list[str] | tuple[str, ...], options: tuple[str, ...] = PATH_OPTIONS) -> list[tuple[str, str]]:
    """``(option, value)`` for each path-valued option written ``--opt VALUE`` (not ``--opt=VALUE``)
    whose VALUE exists as a path -- the ones pytest took for a test path when it chose its rootdir."""
    found = []
    for opt, value in zip(args, list(args[1:]) + [""]):
        if opt in options and value and not value.startswith("-") and Path(value).exists():
            found.append((opt, value))
    return found


def _no_config_message(config: pytest.Config) -> str:
    spaced = given_with_space(config.invocation_params.args)
    if spaced:
        opts = ", ".join(f"{opt} {value}" for opt, value in spaced)
        fixed = " ".join(f"{opt}={value}" for opt, value in spaced)
        return (f"pytest read the value of {opts} as a test path (it picks its rootdir before it knows kvgate's "
                f"options) and found no kvgate configuration from there (rootdir {config.rootpath}); "
                f"write it with '=': {fixed}")
    return (f"pytest found no kvgate configuration (rootdir {config.rootpath}): run from the kvgate "
            "checkout, and give path options with '=' (--profile=PATH, --kvgate-reports=DIR), since pytest reads a "
            "bare path after an option it does not know yet as a test path")


def _configure(config: pytest.Config, name: str, reports: Path) -> None:
    if config.inipath is None:
        raise _usage(_no_config_message(config))
    profile_dir = Path(config.getoption("kvgate_profile_dir"))
    try:
        profile = load_profile(name, profile_dir)
    except ProfileError as exc:
        raise _usage(str(exc)) from None
    from kvgate.authoring.lint import lint_for_run  # profile lint: warnings, errors under --gate-mode certify

    lint_findings, lint_refusal = lint_for_run(profile, profile_dir, getattr(config.option, "kvgate_gate_mode", "enforce"))
    if lint_refusal:
        raise _usage(lint_refusal)
    try:
        reports.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _usage(f"--kvgate-reports {reports}: cannot create it ({exc.strerror})") from None

    api_key_env = config.getoption("kvgate_api_key_env")
    _ca_bundle(config)
    redactor = Redactor()
    router = profile.pools.router_endpoint if profile.pools else None  # a pools profile's run goes to its router
    url = config.getoption("kvgate_endpoint") or os.environ.get(ENDPOINT_ENV) or router or None
    endpoint = None
    if url:
        try:
            endpoint = endpoint_from_url(url, profile, api_key_env)
        except TargetError as exc:
            raise _usage(redactor.text(str(exc))) from None
        redactor.add(endpoint.api_key)
    # which launcher (kvgate.launch.base.choose); one that cannot run here makes live gates SKIP
    choice = choose(profile, endpoint=config.getoption("kvgate_endpoint") or router, launch=config.getoption("kvgate_launch"),
                    check=not (_only_fit(config) or config.option.collectonly))
    kserve_notes: list[str] = []
    if endpoint is None and config.getoption("kvgate_isvc"):
        if not config.option.collectonly:  # --collect-only reads nothing from the cluster
            endpoint, kserve_notes = _kserve_endpoint(config, profile, api_key_env)
            redactor.add(endpoint.api_key)
        choice = Choice("endpoint", "--isvc")
    if endpoint is not None and profile.model.tokenizer:
        endpoint = dataclasses.replace(endpoint, tokenizer=profile.model.tokenizer)
    if choice.mode == "none" and not _only_fit(config):
        raise _usage(f"profile {profile.name!r} launches nothing (launch: none); give --endpoint URL (or "
                     f"{ENDPOINT_ENV}), or --launch docker, or run only the fit gate: -m fit")

    if config.getoption("kvgate_soak_duration"):
        from kvgate.soak.runner import SoakError, soak_spec

        try:
            soak_spec(profile, config.getoption("kvgate_soak_duration"))
        except SoakError as exc:
            raise _usage(str(exc)) from None
    record = RunRecord(profile.name, profile.source, redactor, endpoint=endpoint.display if endpoint else None,
                       run_id=config.stash[RUN_ID], gate_mode=config.option.kvgate_gate_mode)
    config.stash[STATE] = KvgateState(profile, record, redactor, reports, endpoint,
                                      config.getoption("kvgate_startup_budget"))
    config.stash[STATE].extra["launch_choice"] = choice
    config.stash[STATE].extra["kserve_notes"] = kserve_notes
    config.stash[STATE].extra["lint"] = lint_findings
    if config.option.collectonly:
        return  # not a run: no reports are touched, no endpoint contacted
    # one run, one set of reports: the previous run's go before anything runs
    junit = _junit_path(config, reports)
    allure_dir, replace_allure = _allure_path(config, reports)
    try:
        outputs.clear(reports, [junit] + ([allure_dir] if allure_dir and replace_allure else []))
        record.write_summary(reports / outputs.SUMMARY, running=True)
    except OSError as exc:
        raise _usage(f"--kvgate-reports {reports}: cannot replace the previous run's reports ({exc})") from None
    config.stash[STATE].extra["reports_cleared"] = True
    if allure_dir is not None:
        config.option.allure_report_dir = str(allure_dir)
    config.option.xmlpath = str(junit)
    _install_sigterm(config)
    if endpoint is not None and not _only_fit(config):
        try:
            preflight(endpoint, profile, api_key_env)
        except PreflightError as exc:
            record.endpoint_contacted = exc.kind != "unreachable"
            raise _usage(redactor.text(str(exc))) from None
        except KeyboardInterrupt:
            record.interrupted_in = "preflight"
            write_error_reports(config, "interrupted during the preflight (Ctrl-C or SIGTERM); nothing was gated")
            raise
        record.endpoint_contacted = True


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
    if _only_fit(config):
        where = (f"endpoint {st.endpoint.display} not contacted (-m fit needs no server)" if st.endpoint
                 else "no server (-m fit needs none)")
    else:
        where = f"endpoint {st.endpoint.display}" if st.endpoint else _launch_header(st)
        where += "".join(f"; {n}" for n in st.extra.get("kserve_notes", []))
    run_id = config.stash.get(RUN_ID, "")
    return [f"kvgate: profile {st.profile.name} ({st.profile.source}); {where}; reports {st.reports_dir}/ "
            f"(run {run_id})"] + _lint_header(st) + _pools_header(st)


def _pools_header(st: KvgateState) -> list[str]:
    pools = st.profile.pools
    if pools is None:
        return []
    return [f"kvgate: pools profile: the pools gates only (routing, isolation); gate each pool with its own profile: "
            f"pytest --profile={pools.short.profile} --endpoint=<short pool URL>, "
            f"pytest --profile={pools.long.profile} --endpoint=<long pool URL>"]


def _lint_header(st: KvgateState) -> list[str]:
    from kvgate.authoring.lint import header_lines

    return header_lines(st.extra.get("lint", []))


def _ca_bundle(config: pytest.Config) -> None:
    """``--ca-bundle PATH``: https endpoints are verified against it (``SSL_CERT_FILE``, which httpx
    and Python's ssl read); there is no way to turn verification off."""
    path = config.getoption("kvgate_ca_bundle")
    if not path:
        return
    if not Path(path).is_file():
        raise _usage(f"--ca-bundle {path}: no such file (a PEM bundle of CA certificates)")
    os.environ["SSL_CERT_FILE"] = str(Path(path).resolve())


def _kserve_endpoint(config: pytest.Config, profile: Profile, api_key_env: str | None) -> tuple[Endpoint, list[str]]:
    """``--isvc``: the KServe object's new version as an :class:`Endpoint` (kvgate.launch.kserve) and
    what was found (notes for the header). A usage error when it cannot be read or gated."""
    from kvgate.launch import kserve

    name, ns = config.getoption("kvgate_isvc"), config.getoption("kvgate_namespace")
    try:
        obj, siblings = kserve.read(name, ns, kserve.custom_objects_api())
        target = kserve.discover(obj, canary=config.getoption("kvgate_canary"), ingress=config.getoption("kvgate_ingress"),
                                 siblings=siblings, default_prefix=profile.endpoint.route_prefix)
        endpoint = endpoint_from_url(target.endpoint_url, profile, api_key_env)
    except (kserve.KServeError, TargetError) as exc:
        raise _usage(f"--isvc {ns}/{name}: {exc}") from None
    except Exception as exc:  # no kubeconfig / in-cluster config, API unreachable
        raise _usage(f"--isvc {ns}/{name}: cannot read it from Kubernetes ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    if target.host_header:
        endpoint = dataclasses.replace(endpoint, host_header=target.host_header)
    return endpoint, [f"KServe {target.shape} {ns}/{name}: gating {target.revision}"] + target.notes


def _launch_header(st: KvgateState) -> str:
    choice = st.extra.get("launch_choice")
    if choice is not None and choice.unavailable:
        return f"no server: {choice.unavailable} -- live gates SKIP"
    if choice is not None and choice.mode == "docker":
        from kvgate.launch.docker import DEFAULT_IMAGE

        image = (st.profile.launch.image if st.profile.launch else None) or DEFAULT_IMAGE
        return f"endpoint: {image} in docker, started by kvgate ({choice.source})"
    if choice is not None and choice.mode == "pools":
        return "endpoint: nginx in front of two embedded vLLM pools, started by kvgate"
    return "endpoint: embedded vLLM, started by kvgate"


def live_skip_reason(config: pytest.Config) -> str | None:
    """Why this run's live gates SKIP (its launcher cannot run here), or None."""
    st = config.stash.get(STATE, None)
    choice = st.extra.get("launch_choice") if st is not None else None
    return choice.unavailable if choice is not None else None


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
            try:
                state(config)  # raises the usage error listing profiles
            except pytest.UsageError as exc:
                write_error_reports(config, str(exc))
                raise
        return
    # the fit gate needs no server and runs first; gates that load the server run last
    items.sort(key=_gate_rank)
    _pools_only(config, items)


def _pools_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A pools profile gates the router and the split (the pools gates); each pool is gated by its
    own profile (``--profile=<pool profile> --endpoint=<pool URL>``), so the other gates, which
    would judge the router against one pool's numbers, are deselected (the header says so)."""
    if state(config).profile.pools is None:
        return
    other = [it for it in items if (m := it.get_closest_marker("gate")) is not None and m.args[0] != "pools"]
    if other:
        items[:] = [it for it in items if it not in other]
        config.hook.pytest_deselected(items=other)


GATE_ORDER = ("fit", "deployment", "max-context", "max-tokens", "streaming", "requests", "disconnect", "concurrency",
              "latency", "priority", "autoscale-signal", "pools", "soak")


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
        shown = verdict.to_summary()
        item.user_properties.extend([("kvgate_verdict", verdict.status.value),
                                     ("kvgate_message", st.redactor.text(verdict.message)),
                                     ("kvgate_measured", st.redactor.text(json.dumps(shown["measured"], default=str))),
                                     ("kvgate_limit", st.redactor.text(json.dumps(shown["limit"], default=str)))])
        if verdict.not_checked_note():
            item.user_properties.append(("kvgate_not_checked", st.redactor.text(verdict.not_checked_note())))
        if allure is not None:
            allure.dynamic.label(outputs.RUN_ID_KEY, st.record.run_id)
        allure_meta.describe(verdict, st.redactor)
        st.record.add(item.nodeid, test_id(item), verdict,
                      [(k, v) for k, v in attachments.items() if isinstance(v, str)] if console else None)
        attach_verdict(verdict, st.redactor)
        for name, body in attachments.items():
            if isinstance(body, bytes):
                attach_png(name, body)
            else:
                attach_text(name, body, st.redactor, "csv" if name.endswith(".csv") else "text")
        if st.record.gate_mode == "record" and verdict.status in (Status.FAIL, Status.INVALID):
            # calibration: the value is recorded (summary, overlay), the run is not failed by it
            pytest.xfail(f"record mode, not enforced: {verdict.status.value}: " + st.redactor.text(verdict.message))
        if verdict.status is Status.FAIL:
            pytest.fail(st.redactor.text(verdict.message), pytrace=False)
        if verdict.status is Status.INVALID:
            pytest.fail("INVALID: " + st.redactor.text(verdict.message), pytrace=False)
        if verdict.status is Status.INCOMPLETE:
            pytest.fail("INCOMPLETE: " + st.redactor.text(verdict.message), pytrace=False)
        if verdict.status is Status.SKIP:
            pytest.skip(st.redactor.text(verdict.message))
        return verdict

    return record


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A gate whose exact-length prompt cannot be built here (no /tokenize and no local tokenizer:
    :class:`kvgate.http.prompts.PromptUnavailable`) is a SKIP with that reason, not a harness error."""
    from kvgate.http.prompts import PromptUnavailable

    try:
        return (yield)
    except PromptUnavailable as exc:
        st = pyfuncitem.config.stash.get(STATE, None)
        marker = pyfuncitem.get_closest_marker("gate")
        if st is None or marker is None:
            raise
        st.record.add(pyfuncitem.nodeid, test_id(pyfuncitem), Verdict(marker.args[0], Status.SKIP, f"{exc} -> SKIP"))
        pytest.skip(str(exc))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    rep = outcome.get_result()
    st = item.config.stash.get(STATE, None)
    if st is None or item.get_closest_marker("gate") is None:
        return
    if rep.when == "setup":  # allure-pytest named the result during setup: title and group it now
        allure_meta.decorate(test_id(item), st.profile.name, st.profile.source)
    if rep.when == "call" or rep.skipped or rep.failed:
        st.extra.setdefault("finished", set()).add(item.nodeid)
    reason = live_skip_reason(item.config)
    if rep.skipped and reason and item.nodeid not in st.record.entries:
        # the launcher cannot run here: each live gate is a named SKIP with the one reason
        st.record.add(item.nodeid, test_id(item),
                      Verdict(item.get_closest_marker("gate").args[0], Status.SKIP, f"{reason} -> SKIP"))
    if rep.failed and item.nodeid not in st.record.entries:
        # the harness or the server broke before a verdict: still a named result, never silent
        text = str(rep.longrepr.reprcrash.message) if hasattr(rep.longrepr, "reprcrash") and rep.longrepr.reprcrash \
            else str(rep.longrepr).splitlines()[-1] if rep.longrepr else "error"
        st.record.error(item.nodeid, test_id(item), f"{rep.when}: {text}")
        allure_meta.describe_error(f"{rep.when}: {text}", st.redactor)


@pytest.hookimpl(trylast=True)  # after pytest's JUnit plugin wrote its file, so it can be stamped
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    failed_start = session.config.stash.get(RUN_ERROR, None)
    if failed_start is not None:
        _, junit = failed_start
        if junit is not None and junit.is_file() and "kvgate_run_id" not in junit.read_text(errors="replace"):
            # pytest's JUnit plugin rewrote it after the usage error: put the error case back
            outputs.write_junit_problem(junit, session.config.stash[RUN_ID], "ERROR", failed_start[0])
        return
    st = session.config.stash.get(STATE, None)
    if st is None or session.config.option.collectonly:
        return
    finished = st.extra.get("finished", set())
    missing = [test_id(it) for it in session.items if it.get_closest_marker("gate") and it.nodeid not in finished]
    if exitstatus == pytest.ExitCode.INTERRUPTED or missing:
        st.record.complete = False
        st.record.not_run = missing
    if st.record.gate_mode == "record" and st.record.complete:
        st.extra["overlay_path"] = str(_write_overlay(st))
    path = st.record.write_summary(st.reports_dir / outputs.SUMMARY)
    st.extra["summary_path"] = str(path)
    _stamp_reports(session.config, st)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        # the gate mode decides: 6 INVALID only, 7 not certified, 0 in record mode (kvgate.run.modes)
        session.exitstatus = st.record.outcome().exit_code


def _write_overlay(st: KvgateState) -> Path:
    """Record mode: this run's measured values as a profile overlay (:func:`kvgate.run.modes.overlay`)."""
    source = Path(st.profile.source or st.profile.name)
    ref = st.profile.name if source.parent.resolve() == DEFAULT_PROFILE_DIR.resolve() else str(source.resolve())
    verdicts = [(e.test_id, e.verdict) for e in st.record.entries.values() if e.verdict is not None]
    text = overlay(ref, verdicts, run_id=st.record.run_id, endpoint=st.record.endpoint,
                   server_version=st.record.server_version)
    path = st.reports_dir / OVERLAY_FILE
    path.write_text(st.redactor.text(text))
    return path


def _stamp_reports(config: pytest.Config, st: KvgateState) -> None:
    """Put this run's id (and, for an incomplete run, an error case) into the JUnit file and the
    Allure results written beside summary.json, so all three say the same."""
    rec, reports = st.record, st.reports_dir
    overall = rec.final_status()
    problem = None
    if overall == "INCOMPLETE":
        where = f" (interrupted in {rec.interrupted_in})" if rec.interrupted_in else ""
        cut = [e.test_id for e in rec.entries.values() if e.status == "INCOMPLETE"]
        parts = ([f"{len(rec.not_run)} selected gate(s) did not run: {', '.join(rec.not_run[:5])}"] if rec.not_run
                 else []) + ([f"cut short: {', '.join(cut[:5])}"] if cut else [])
        problem = f"run incomplete{where}: {'; '.join(parts) or 'not every gate finished'}"
    elif overall == "ERROR":
        problem = rec.run_error
    xml = getattr(config.option, "xmlpath", None)
    if xml:
        outputs.stamp_junit(Path(xml), rec.run_id, overall, rec.redactor.text(problem) if problem else None)
    allure_dir = getattr(config.option, "allure_report_dir", None)
    if allure_dir:
        try:
            if problem:
                outputs.write_allure_problem(Path(allure_dir), rec.run_id, rec.redactor.text(problem),
                                             profile=rec.profile_name)
            allure_meta.tidy_results(Path(allure_dir))
            gate_mode = getattr(config.option, "kvgate_gate_mode", "enforce")
            allure_meta.write_metadata(Path(allure_dir), allure_meta.environment_props(rec.summary(), gate_mode),
                                       rec.redactor)
        except OSError:
            pass


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
    for line in st.record.phase_lines():
        tr.write_line(line)
    if "overlay_path" in st.extra:
        tr.write_line(f"record mode: measured values written as a profile overlay: {st.extra['overlay_path']}")
    if "summary_path" in st.extra:
        tr.write_line(f"summary: {st.extra['summary_path']}; allure: {st.reports_dir / 'allure-results'}")
