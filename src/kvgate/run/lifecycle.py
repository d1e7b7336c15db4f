"""The run's life cycle, wired into pytest: the embedded server started early, the phases timed,
interrupts turned into a named phase instead of a traceback.

Registered by :mod:`kvgate.plugin` (``pytest_configure``); inert without a profile. Works on the run's
:class:`kvgate.run.session.Run` (``config.stash[RUN]``).

- **Early launch.** At ``pytest_sessionstart`` (before collection) the embedded vLLM is built (the
  tiny model, cached) and its process started *without waiting*; collection, the fit arithmetic and
  anything else that needs no server run while vLLM loads (~30 s on 2 cores). The
  ``kvgate_endpoint`` fixture then only waits for ``/health`` (:func:`embedded_endpoint`). When
  the selection needs no server after all (``-m fit``, ``-k``, ``--collect-only``), nothing is
  started, or what was started is stopped right after collection.
- **Phases.** ``prepare model``, ``collect``, ``launch`` (the part of vLLM's start-up that was
  *not* overlapped: the wait in the fixture; the entry also carries ``startup_s``, Popen to
  healthy), ``gate PROFILE/GATE/CASE`` (each test's call), ``teardown`` (server stop), in
  :attr:`kvgate.report.record.RunRecord.phases` -> ``summary.json`` ``phases`` and the console.
- **Interrupts.** Ctrl-C / SIGTERM (the plugin turns SIGTERM into ``KeyboardInterrupt``) during
  start-up stops the server with a 1 s grace, so the run ends within a second or two; the phase it
  hit is recorded (``interrupted_in``). During teardown, after every gate has its verdict, an
  interrupt kills the server group (SIGKILL) and is recorded, not re-raised: the verdicts stand and
  exit code and summary agree. Once the server is gone at the end of the run (or the summary is
  being written), SIGINT/SIGTERM are ignored, so nothing can leave a summary that disagrees with
  the exit code; a server the fixture never took over (start-up interrupted or failed) is stopped
  then, not in a config cleanup where a second Ctrl-C could cut the stop short. A Ctrl-C while the model is prepared (``pytest_sessionstart``,
  where pytest would skip ``pytest_sessionfinish`` and so every report) is re-raised as collection
  begins, so the run still ends INCOMPLETE with its reports.

Proven without vLLM in ``tests/test_lifecycle.py`` (a fake server in place of :func:`_build`), with
the real embedded vLLM in ``tests/e2e/test_interrupts.py``.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Generator

import pytest

from kvgate.http.client import Endpoint
from kvgate.launch.base import LAUNCHERS, Launcher, launcher_class
from kvgate.launch.local import EmbeddedServer, LaunchError, embedded_key
from kvgate.launch.lora import ensure_adapters
from kvgate.launch.realmodel import RealModelError, is_built, model_dir_for
from kvgate.launch.release import Release, ReleaseError, ensure_release
from kvgate.launch.tinymodel import TinyModelError, cache_root, ensure_model
from kvgate.run.session import LAUNCH_ERROR_KEY, RUN, SERVER_KEY, Run, current, test_id, write_error_reports
from kvgate.run.memory import tree_reader

#: Set once the fixture has the server healthy: from then on the fixture's teardown stops it.
OWNED_KEY = "embedded_server_owned"
#: A Ctrl-C that hit ``pytest_sessionstart``: pytest would skip ``pytest_sessionfinish`` (no reports
#: written, the summary left RUNNING), so it is raised again at the start of collection.
DEFERRED_INTERRUPT_KEY = "deferred_interrupt"
SIGNALS_IGNORED_KEY = "signals_ignored"
#: Set by the drain gate once it signalled the server (the signal in words): the server is gone,
#: the teardown only reaps what is left (no second SIGTERM, no wait).
TERMINATED_KEY = "server_terminated"


def _state(config: pytest.Config) -> Run | None:
    return config.stash.get(RUN, None)


def _wants_server(config: pytest.Config, st: Run | None) -> bool:
    """Whether to launch at session start: the run needs a server (:meth:`Run.needs_server`, the
    one decision), none was given, and the chosen launcher can run here."""
    if st is None or st.endpoint is not None or config.option.collectonly or not st.needs_server():
        return False
    return st.launch_mode in LAUNCHERS and st.live_skip_reason is None


def _build(st: Run) -> Launcher:
    """An unstarted launcher for the run (:data:`kvgate.launch.base.LAUNCHERS`); for ``embedded``
    the profile's model (the tiny one with the parser markers the engine needs, or the real one:
    :func:`kvgate.launch.realmodel.model_dir_for`) and its
    ``embedded`` LoRA adapters are built first (once each, cached). Raises :class:`TinyModelError`."""
    log = st.reports_dir / "vllm-server.log"
    mode = st.launch_mode
    if mode != "embedded":
        launcher = launcher_class(mode)(st.profile, log, startup_budget_s=st.startup_budget_s)
        for secret in getattr(launcher, "secrets", ()):
            st.redactor.add(secret)
        if mode == "docker":  # the model load's memory peak of the container's tree (deployment/memory-peak)
            launcher.tree_reader = tree_reader
        return launcher
    key = embedded_key(st.profile, st.config.getoption("kvgate_api_key_env"))
    st.redactor.add(key)
    model_dir = model_dir_for(st.profile, build_tiny=ensure_model)
    release = _release(st) if st.vllm_version else None
    server = EmbeddedServer(st.profile, model_dir, log, startup_budget_s=st.startup_budget_s or 240.0,
                            lora_dirs=ensure_adapters(st.profile.engine, model_dir), api_key=key, release=release)
    server.tree_reader = tree_reader  # the model load's memory peak of its process tree (deployment/memory-peak)
    return server


def _release(st: Run) -> Release:
    """The run's ``--vllm-version`` release, installed once in kvgate's cache (:mod:`kvgate.launch.release`);
    a progress line on the console while it installs. Raises :class:`ReleaseError` (one line)."""
    reporter = st.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda line: reporter.write_line(line)) if reporter is not None else (lambda line: None)
    return ensure_release(st.vllm_version, cache_root(), say=say)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    st = _state(session.config)
    if not _wants_server(session.config, st):
        return
    server: Launcher | None = None
    if st.launch_mode == "embedded" and st.profile.model.embedded_model != "tiny" and not is_built():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"kvgate: fetching and converting the real model {st.profile.model.embedded_model} "
                                "once (~40 s; cached in the kvgate cache)")
    try:
        with st.record.phase("prepare model"):
            server = _build(st)
            st.extra[SERVER_KEY] = server
            session.config.add_cleanup(server.stop)  # last resort; see pytest_sessionfinish
            server.launch()
    except RealModelError as exc:  # nothing can be gated here: a usage error, one line, no gate runs
        msg = f"the real model cannot be had: {exc}"
        write_error_reports(session.config, msg)
        raise pytest.UsageError(msg) from None
    except ReleaseError as exc:  # the release asked for cannot be served here: the same, one line
        msg = f"--vllm-version: {exc}"
        write_error_reports(session.config, msg)
        raise pytest.UsageError(msg) from None
    except (TinyModelError, LaunchError) as exc:
        _launch_failed(st, server, str(exc))  # every live gate reports it (see embedded_endpoint)
    except KeyboardInterrupt as exc:
        # raised here, pytest would end the run without pytest_sessionfinish: no reports at all
        st.extra[DEFERRED_INTERRUPT_KEY] = exc


def _launch_failed(st: Run, server: Launcher | None, message: str) -> None:
    st.extra[LAUNCH_ERROR_KEY] = message
    if server is not None:
        server.stop()
    st.extra.pop(SERVER_KEY, None)
    st.record.launch = {"mode": st.launch_mode, "error": message,
                        "command": getattr(server, "command", None) or [],
                        "log": str(server.log_path) if server is not None else None}


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, Any, Any]:
    st = _state(session.config)
    if st is None:
        return (yield)
    if DEFERRED_INTERRUPT_KEY in st.extra:  # Ctrl-C during "prepare model": end the run here
        raise st.extra.pop(DEFERRED_INTERRUPT_KEY)
    with st.record.phase("collect"):
        return (yield)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    st = _state(config)
    server = st.extra.get(SERVER_KEY) if st is not None else None
    if server is not None and not st.needs_server(items):
        server.stop()  # the selection needs no server (e.g. -k fit): do not keep one running
        st.extra.pop(SERVER_KEY)  # only now: a stop cut short by Ctrl-C is finished at sessionfinish
    if st is not None and st.endpoint is not None and not config.option.collectonly:
        from kvgate.run.readiness import first_look, selects_case

        if selects_case(items):  # a given endpoint: ready -> serving timed from here, before the first gate
            first_look(st)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """One phase per gate: setup + call + teardown (a suite may measure in a fixture), less the
    nested ``launch``/``teardown`` phases. A failed or skipped gate is a *done* phase; only an
    interrupt or a harness crash marks it otherwise."""
    st = _state(item.config)
    if st is None or item.get_closest_marker("gate") is None:
        return (yield)
    if st.watch is not None:
        st.watch.gate = test_id(item)  # where a hang or a stall is classified, if it is
    st.drop_previous_golden()
    with st.record.phase(f"gate {test_id(item)}"):
        return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Generator[None, Any, Any]:
    """From here on the verdicts are decided: ignore SIGINT/SIGTERM while the reports are written
    (restored at unconfigure), so no late Ctrl-C leaves a traceback or a summary that disagrees
    with the exit code.

    A server the ``kvgate_endpoint`` fixture never took over (its start-up was interrupted or
    failed, the selected gates never reached it, ``--setup-plan``) is stopped here, before the
    reports, while signals are ignored -- not in a config cleanup, where a second Ctrl-C would cut
    the stop short and leave vLLM running. One the fixture owns is stopped by the fixture's teardown
    (which pytest runs inside this hook for an interrupted run); whatever is still left after that
    (a teardown cut short) is stopped last.
    """
    st = _state(session.config)
    if st is None:
        return (yield)
    if exitstatus == pytest.ExitCode.INTERRUPTED and st.record.interrupted_in is None:
        last = st.record.phases[-1]["name"] if st.record.phases else "start-up"
        st.record.interrupted_in = f"between phases (after {last})"
    _ignore_signals(session.config, st)
    if SERVER_KEY in st.extra and not st.extra.get(OWNED_KEY):
        with st.record.phase("teardown"):
            st.extra.pop(SERVER_KEY).stop()
    try:
        return (yield)
    finally:
        leftover = st.extra.pop(SERVER_KEY, None)
        if leftover is not None:
            leftover.stop()


def _ignore_signals(config: pytest.Config, st: Run) -> None:
    """Ignore SIGINT/SIGTERM from now on (the previous handlers come back at unconfigure). Idempotent."""
    if st.extra.get(SIGNALS_IGNORED_KEY) or threading.current_thread() is not threading.main_thread():
        return
    st.extra[SIGNALS_IGNORED_KEY] = True
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    config.add_cleanup(lambda: [signal.signal(s, h) for s, h in previous.items()])


def embedded_endpoint(config: pytest.Config) -> Generator[Endpoint, None, None]:
    """The ``kvgate_endpoint`` fixture's body for the embedded server: wait for the server launched
    at session start (or launch it now), yield its :class:`Endpoint`, stop it at the end.

    Fails the requesting test (``pytest.fail``, one line with the log's tail) when the model cannot
    be built or vLLM does not come up within ``--startup-budget`` seconds.
    """
    st = current(config)
    if LAUNCH_ERROR_KEY in st.extra:
        pytest.fail(st.extra[LAUNCH_ERROR_KEY], pytrace=False)
    server: Launcher | None = st.extra.get(SERVER_KEY)
    try:
        if server is None:  # not started at session start (e.g. the fixture used outside a run)
            with st.record.phase("prepare model"):
                server = _build(st)
            st.extra[SERVER_KEY] = server
        with st.record.phase("launch") as entry:
            url = server.wait_ready()  # stops the server itself on failure or interrupt
            entry["startup_s"] = round(server.startup_s or 0.0, 3)
    except (TinyModelError, LaunchError) as exc:
        _launch_failed(st, server, str(exc))
    if LAUNCH_ERROR_KEY in st.extra:  # failed outside the except: one line, no chained exception
        pytest.fail(st.extra[LAUNCH_ERROR_KEY], pytrace=False)
    st.extra[OWNED_KEY] = True
    # a local process tree (the embedded vLLM) is watched for host contention; a router's pid is not the server's
    pids = (server.pid,) if server.pid is not None and st.launch_mode == "embedded" else ()
    # the command line a single launched server was given (not a pools router's): deployment/served-config reads it
    argv = tuple(getattr(server, "command", None) or ()) if st.launch_mode in ("embedded", "docker") else ()
    st.endpoint = Endpoint(base_url=url, managed=True, server_pids=pids, api_key=getattr(server, "api_key", None),
                           server_argv=argv, launched_by=st.launch_mode if argv else None,
                           load_peak=getattr(server, "load_peak", None) if argv else None)
    st.record.endpoint = st.endpoint.display
    st.record.launch = server.describe()
    if server.pid is not None:
        st.extra["server_pids"] = [server.pid]  # the soak watches this process tree's memory
    _preflight_embedded(config, st, server)
    try:
        yield st.endpoint
    finally:
        _teardown(config, st, server)


def _preflight_embedded(config: pytest.Config, st: Run, server: Launcher) -> None:
    """The same preflight as ``--endpoint`` gets (:func:`kvgate.http.preflight.preflight`: ``/v1/models``
    in OpenAI's shape, serving the profile's model), once the embedded server is healthy. On a
    failure the server is stopped, the run's reports say ERROR, and pytest exits as a usage error
    (exit 4) with one line."""
    from kvgate.http.preflight import PreflightError, preflight

    try:
        preflight(st.endpoint, st.profile, None)
        st.adopt_served_len()
        _served_release(st, server)
    except PreflightError as exc:
        _teardown(config, st, server)
        write_error_reports(config, str(exc))
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)


def _served_release(st: Run, server: Launcher) -> None:
    """A ``--vllm-version`` server must say that release on ``GET /version`` (read back, not assumed);
    raises :class:`PreflightError` naming both when it does not."""
    from kvgate.http.client import KvClient
    from kvgate.http.preflight import PreflightError

    release = getattr(server, "release", None)
    if release is None or st.endpoint is None:
        return
    with KvClient(st.endpoint, timeout_s=st.profile.limits.canary_deadline_s) as client:
        said = client.version()
    if said is None or said.split("+")[0] != release.version:
        raise PreflightError(f"--vllm-version {release.version}: the server kvgate started from {release.env} "
                             f"says {'no version' if said is None else repr(said[:40])} on GET /version", "version")


def launched_server(config: pytest.Config) -> Launcher | None:
    """The server this run launched and the ``kvgate_endpoint`` fixture took over, if it can be
    signalled (:meth:`Launcher.terminate`, for the drain gate); None for ``--endpoint`` (a server
    kvgate does not own), a launcher that cannot be signalled (pools), or none started."""
    st = current(config)
    server = st.extra.get(SERVER_KEY)
    if st.endpoint is None or not st.endpoint.managed or not st.extra.get(OWNED_KEY) or server is None:
        return None
    return server if callable(getattr(server, "terminate", None)) and callable(getattr(server, "wait_exit", None)) \
        else None


def server_terminated(config: pytest.Config, signal_words: str | None) -> None:
    """Record that the drain gate signalled the launched server (it is gone or being killed): the
    teardown notes it and only reaps what is left."""
    current(config).extra[TERMINATED_KEY] = signal_words or "signalled"


def _teardown(config: pytest.Config, st: Run, server: Launcher) -> None:
    """Stop the server (the ``teardown`` phase). A session fixture is torn down only when the
    session ends, so every gate has its verdict: an interrupt kills the server instead and is
    recorded, and once the server is gone SIGINT/SIGTERM are ignored -- nothing that is left to do
    (reports) may turn a finished run into an interrupted one."""
    interrupted = False
    with st.record.phase("teardown") as entry:
        if TERMINATED_KEY in st.extra:
            entry["note"] = f"the server was already stopped by the drain gate ({st.extra[TERMINATED_KEY]})"
        try:
            server.stop()
        except KeyboardInterrupt:
            # every gate already has its verdict: finish the stop hard and let the verdicts stand
            interrupted = True
            server.kill()
        finally:
            st.extra.pop(SERVER_KEY, None)
    if interrupted:
        entry["status"] = "interrupted"
        entry["note"] = "interrupted: the server's process group was killed (SIGKILL) instead of stopped"
        st.record.interrupted_in = st.record.interrupted_in or "teardown"
    _ignore_signals(config, st)
