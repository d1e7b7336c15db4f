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
            return self._wait()
        except BaseException:
            self.stop(grace_s=self.ready_stop_grace_s)
            raise

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
