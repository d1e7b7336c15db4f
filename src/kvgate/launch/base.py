"""The one launcher interface: how a server for the run comes to exist when no ``--endpoint``
(or ``KVGATE_ENDPOINT``) is given.

A launcher is a module in ``kvgate.launch`` with a class implementing :class:`Launcher`, named in
:data:`LAUNCHERS`. Today: ``embedded`` (:class:`kvgate.launch.local.EmbeddedServer`, kvgate's tiny
vLLM on the CPU) and ``docker`` (:class:`kvgate.launch.docker.DockerLauncher`, the profile's
image via testcontainers on this machine's GPUs). A new server (SGLang, llama.cpp's server) is
one more module and one more line in :data:`LAUNCHERS`.

Which one runs (:func:`choose`): ``--endpoint``/``KVGATE_ENDPOINT`` wins (no launcher), else
``--launch``, else the profile's ``launch.mode`` (:attr:`kvgate.profile.models.Profile.launch_mode`).
Where the chosen launcher cannot run here (no Docker engine, fewer GPUs than the profile needs),
:meth:`Launcher.unavailable` says why in one line; the run still does its arithmetic (the fit
gate) and every live gate SKIPs with that reason.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol

from kvgate.profile.models import Profile

#: launch mode -> "module:Class" implementing :class:`Launcher`.
LAUNCHERS: dict[str, str] = {
    "embedded": "kvgate.launch.local:EmbeddedServer",
    "docker": "kvgate.launch.docker:DockerLauncher",
    "pools": "kvgate.launch.pools:PoolsLauncher",
}
MODES = (*LAUNCHERS, "none")
ENDPOINT_ENV = "KVGATE_ENDPOINT"


class LaunchError(RuntimeError):
    """A launched server did not come up. The message carries the last log lines."""


class Launcher(Protocol):
    """What the life cycle (:mod:`kvgate.run.lifecycle`) needs of a launched server.

    ``launch()`` starts it and returns at once; ``wait_ready()`` blocks until it serves (returns
    the root URL, ``http://127.0.0.1:PORT``; raises :class:`LaunchError` with the log's tail, and
    stops the server itself on any exception); ``stop(grace_s)`` / ``kill()`` remove it
    (idempotent); ``describe()`` is summary.json's ``launch`` entry (no secrets). ``pid`` is a
    local process whose tree the soak may watch, or None (a container).

    A launcher that subclasses this class gets :meth:`wait_ready` as written here and supplies
    :meth:`_launched` and :meth:`_wait` (and :attr:`ready_stop_grace_s`); one that does not (the
    pools launcher, test fakes) implements ``wait_ready`` itself.
    """

    mode: ClassVar[str]
    log_path: Path
    command: list[str]
    startup_s: float | None
    base_url: str | None
    #: seconds :meth:`wait_ready` lets a server that failed to come up stop before SIGKILL;
    #: ``None``: the launcher's own ``stop()`` default
    ready_stop_grace_s: ClassVar[float | None] = None
    #: ready -> serving as timed at start-up (:class:`kvgate.http.readiness.Readiness`), or None:
    #: not timed (set by :meth:`_watch_serving`, or by a launcher's own start-up loop)
    readiness: Any = None

    @property
    def pid(self) -> int | None: ...

    def launch(self) -> None: ...

    def wait_ready(self) -> str:
        """The root URL once the server serves: the known one if it already did, else
        :meth:`launch` (when not yet launched) and :meth:`_wait`. On any exception
        (``KeyboardInterrupt`` included) the server is stopped, with :attr:`ready_stop_grace_s`,
        before the exception propagates."""
        if self.base_url is not None:
            return self.base_url
        if not self._launched():
            self.launch()
        try:
            url = self._wait()
            self._watch_serving(url)
            return url
        except BaseException:
            self.stop(grace_s=self.ready_stop_grace_s)
            raise

    def _watch_serving(self, url: str) -> None:
        """Time ready -> serving on the server just seen healthy (:mod:`kvgate.http.readiness`):
        look for ``/health`` 200 and the profile's model listed, then try a 1-token generation
        every 0.25 s until one completes, at most :func:`kvgate.http.readiness.watch_bound_s`
        (``limits.ready_to_serving_max_s``) seconds; the result in :attr:`readiness` for the
        health/ready-to-serving case. Skipped for a launcher that timed it in its own loop (the
        docker launcher: :attr:`readiness` already set) or has no ``profile``. Costs one 1-token
        generation on a server that serves at once. Never raises for the server's answers."""
        profile = getattr(self, "profile", None)
        if getattr(self, "readiness", None) is not None or profile is None:
            return
        from kvgate.http.client import Endpoint, KvClient
        from kvgate.http.readiness import watch_bound_s, watch_client

        clock = getattr(self, "clock", None) or time.monotonic
        sleep = getattr(self, "sleep", None) or time.sleep
        bound = watch_bound_s(profile.limits.ready_to_serving_max_s)
        with KvClient(Endpoint(url, api_key=getattr(self, "api_key", None)), timeout_s=bound, clock=clock) as client:
            self.readiness = watch_client(client, profile.model.served_name, where=f"the {self.mode} launcher",
                                          launched=True, bound_s=bound, clock=clock, sleep=sleep)

    def _launched(self) -> bool:
        """Whether :meth:`launch` has started the server (a process, a container)."""
        raise NotImplementedError

    def _wait(self) -> str:
        """Block until the launched server serves, within its start-up budget; set ``base_url``
        and ``startup_s`` and return the URL. Raises :class:`LaunchError` (with the log's tail)."""
        raise NotImplementedError

    def stop(self, grace_s: float | None = None) -> None: ...

    def kill(self) -> None: ...

    def terminate(self) -> str:
        """What a rolling update does to the old pod: send the server SIGTERM (``docker stop`` for
        a container) and return at once, with the signal in words for the evidence. The drain gate
        (:mod:`kvgate.http.drain`) calls it; :meth:`wait_exit` then tells when the server is gone."""
        raise NotImplementedError

    def wait_exit(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds until the server's main process (the container) has
        exited after :meth:`terminate`; True once it has."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]: ...


def launcher_class(mode: str) -> Any:
    """The class registered for ``mode`` in :data:`LAUNCHERS`. Raises ``KeyError`` for ``none`` or an unknown mode."""
    module, _, name = LAUNCHERS[mode].partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Choice:
    """How this run gets its server: ``mode`` (embedded, docker, none, or ``endpoint``), ``source``
    (which option or profile field decided), and ``unavailable``: why the launcher cannot run
    here (one line), or None."""

    mode: str
    source: str
    unavailable: str | None = None


def choose(profile: Profile, *, endpoint: str | None, launch: str | None,
           environ: Mapping[str, str] | None = None, check: bool = True) -> Choice:
    """Decide the run's launcher (see module doc). ``check``: ask the launcher whether it can run
    here (:meth:`unavailable`); off for ``-m fit`` and ``--collect-only``, which start nothing."""
    environ = os.environ if environ is None else environ
    if endpoint:
        return Choice("endpoint", "--endpoint")
    if environ.get(ENDPOINT_ENV):
        return Choice("endpoint", ENDPOINT_ENV)
    mode, source = (launch, "--launch") if launch else (profile.launch_mode, "the profile's launch.mode"
                                                        if profile.launch else "the profile's model.embedded")
    if mode not in MODES:
        raise ValueError(f"--launch {mode!r}: valid values: {', '.join(MODES)}")
    if mode == "none" or not check:
        return Choice(mode, source)
    why = launcher_class(mode).unavailable(profile)
    return Choice(mode, source, f"{mode} launcher cannot run here: {why}" if why else None)
