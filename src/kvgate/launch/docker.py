"""The docker launcher: the profile's server image started with testcontainers on this machine,
for GPU CI runners (``pytest --profile llama70b-tp4`` starts its own ``vllm/vllm-openai``).

- **Image and command**: ``launch.image`` (default :data:`DEFAULT_IMAGE`); the command line is
  rendered from the profile's ``engine`` section by the same renderer as the embedded launcher
  (:func:`kvgate.launch.local.render_command`), with ``launch.python`` as the interpreter and
  ``--model launch.model`` (default ``model.served_name``), set as the container's entrypoint.
- **GPUs**: a device request (:func:`device_requests`): ``launch.gpus`` ``all``, a count or device
  ids; default ``hardware.count`` GPUs when ``hardware.gpu`` names a GPU. ``ipc_mode="host"``
  (vLLM's workers share memory through /dev/shm).
- **Network**: host networking and a free loopback port kvgate picks and passes as ``--port``
  (no published ports: dockerd may run without a bridge, ``--bridge=none``).
- **Mounts**: ``launch.mounts`` (model directory, HF cache), read-only by default. kvgate's own
  cache is not mounted, so an ``engine.lora_modules`` value ``embedded`` (an adapter kvgate builds)
  is a :class:`LaunchError`: give the adapter's path inside the container.
- **Secrets**: ``launch.pass_env`` (default ``HF_TOKEN``) copied from this machine's environment
  when set; :meth:`DockerLauncher.describe` and every message name the variables, never their
  values, and :attr:`DockerLauncher.secrets` lets the run's redactor hide them.
- **Readiness**: ``GET /health`` 200 *and* one generation (``POST /v1/completions``,
  ``max_tokens`` 1) answered 200 with a choice -- a bound port is not ready -- within
  ``launch.startup_budget_s`` (default 1800 s, far above testcontainers' 120 s: a 70B model
  loads for minutes). A container that exits, or a budget spent, raises :class:`LaunchError` with
  the container log's tail.
- **Clean-up**: testcontainers' reaper (Ryuk) is disabled -- its image cannot be pulled where
  nothing can be -- so the launcher removes its container itself: :meth:`stop` at the end of the
  run, on Ctrl-C and on SIGTERM (the plugin turns SIGTERM into ``KeyboardInterrupt``; the life
  cycle stops the launcher), and an ``atexit`` hook as the last resort. The container log is
  written to ``log_path`` (``reports/vllm-server.log``) before the container goes. Containers
  carry the label ``kvgate.launcher=docker``.

Tested for real (``tests/e2e/test_docker_launch.py``) on a locally built image: Debian bookworm
from ``debootstrap`` + ``docker import``, with a ``vllm.entrypoints.openai.api_server`` shim that
runs the fake vLLM.
"""

from __future__ import annotations

import atexit
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

import httpx

from kvgate.profile.models import Profile
from kvgate.launch.base import LaunchError, Launcher
from kvgate.launch.local import LOOPBACK, free_port, ready_peak, render_command, tree_watch
from kvgate.launch.lora import EMBEDDED as EMBEDDED_ADAPTER

#: The image when the profile names none: vLLM's own OpenAI server at the version kvgate targets.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
LABEL = {"kvgate.launcher": "docker"}
LOG_TAIL_LINES = 40


def _disable_reaper() -> None:
    """testcontainers' Ryuk reaper image cannot be pulled here; the launcher cleans up itself."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.config import testcontainers_config

    testcontainers_config.ryuk_disabled = True


def wanted_gpus(profile: Profile) -> str | int | list[str] | None:
    """``launch.gpus``, else ``hardware.count`` when ``hardware.gpu`` is a GPU, else None (no GPU)."""
    spec = profile.launch
    if spec is not None and spec.gpus is not None:
        return spec.gpus
    if profile.hardware.gpu.lower() != "cpu":
        return profile.hardware.count
    return None


def device_requests(profile: Profile) -> list[Any]:
    """docker's ``device_requests`` for the profile's GPUs (``[]`` for none): ``all`` -> count -1,
    an integer -> that count, a list -> those device ids; capabilities ``[["gpu"]]`` (what
    ``docker run --gpus`` sends)."""
    from docker.types import DeviceRequest

    gpus = wanted_gpus(profile)
    if gpus is None or gpus == 0:
        return []
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if isinstance(gpus, int):
        return [DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])]


def passed_env(profile: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``launch.pass_env`` that are set here, with their values (secrets: never shown)."""
    names = profile.launch.pass_env if profile.launch is not None else ["HF_TOKEN"]
    return {n: environ[n] for n in names if environ.get(n)}


def container_command(profile: Profile, port: int) -> list[str]:
    """The server's command line in the container (the embedded launcher's renderer, GPU defaults).
    ``engine.lora_modules`` values are passed as written: paths (or HF ids) as the container sees
    them. Raises :class:`LaunchError` for the value ``embedded``: kvgate builds such an adapter
    in its own cache on this machine, which the container does not mount."""
    for name, value in profile.engine.lora_modules.items():
        if value == EMBEDDED_ADAPTER:
            raise LaunchError(f"docker launcher: engine.lora_modules.{name} is {EMBEDDED_ADAPTER!r}, but the "
                              f"container cannot see the adapters kvgate builds in its cache; give a path inside "
                              f"the container (mounted with launch.mounts) or an HF id")
    spec = profile.launch
    model = (spec.model if spec is not None and spec.model else None) or profile.model.served_name
    python = spec.python if spec is not None else "python3"
    return render_command(profile, model, port, python, default_dtype=None)


def container_kwargs(profile: Profile, port: int, environ: Mapping[str, str]) -> dict[str, Any]:
    """Everything the container is created with beyond image and environment (pure; asserted in
    tests): entrypoint, host network, host IPC, device requests, labels, read-only mounts."""
    spec = profile.launch
    volumes = {}
    for m in (spec.mounts if spec is not None else []):
        volumes[str(Path(m.source).expanduser())] = {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
    return {"entrypoint": container_command(profile, port), "network_mode": "host", "ipc_mode": "host",
            "device_requests": device_requests(profile), "labels": dict(LABEL), "volumes": volumes}


def docker_unavailable(ping: Callable[[], Any] | None = None) -> str | None:
    """Why no Docker engine can be used here (one line), or None when one answers a ping."""
    try:
        if ping is None:
            import docker

            client = docker.from_env(timeout=5)
            try:
                client.ping()
            finally:
                client.close()
        else:
            ping()
    except Exception as exc:  # docker.errors.DockerException, connection errors, no socket
        detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return f"no Docker engine reachable (DOCKER_HOST or /var/run/docker.sock): {detail}"
    return None


def gpus_unavailable(profile: Profile, count_gpus: Callable[[], int] | None = None) -> str | None:
    """Why this machine cannot give the profile its GPUs (one line), or None. Counts NVIDIA GPUs
    with NVML (pynvml); ``count_gpus`` is injectable for tests."""
    gpus = wanted_gpus(profile)
    if gpus is None or gpus == 0:
        return None
    need = 1 if gpus == "all" else gpus if isinstance(gpus, int) else len(gpus)
    try:
        have = count_gpus() if count_gpus is not None else _nvml_count()
    except Exception as exc:
        return f"no NVIDIA GPU here (NVML: {str(exc).splitlines()[0][:120] or type(exc).__name__}); the profile " \
               f"needs {need} ({profile.hardware.count} x {profile.hardware.gpu})"
    if have < need:
        return f"the profile needs {need} GPU(s) ({profile.hardware.gpu}), NVML sees {have}"
    return None


def _nvml_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


class DockerLauncher(Launcher):
    """The profile's server in a container (see module doc). :class:`kvgate.launch.base.Launcher`.

    ``environ``: where ``launch.pass_env`` values come from (default ``os.environ``);
    ``container_factory``: ``image -> DockerContainer`` (injectable; default testcontainers');
    ``http``: an ``httpx.Client`` for readiness polls; ``sleep``/``clock`` injectable.
    """

    mode: ClassVar[str] = "docker"
    #: Reads the container's process tree on this host while it loads (:data:`kvgate.launch.local.TreeReader`;
    #: the run sets it); None: not sampled.
    tree_reader: Any = None
    #: ready -> serving as the start-up loop times it (:meth:`_generation`); None until then
    _ready_rec: Any = None

    def __init__(self, profile: Profile, log_path: Path, *, startup_budget_s: float | None = None,
                 environ: Mapping[str, str] | None = None, container_factory: Callable[[str], Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 1.0) -> None:
        self.profile = profile
        self.log_path = log_path
        spec = profile.launch
        self.image = (spec.image if spec is not None and spec.image else None) or DEFAULT_IMAGE
        self.startup_budget_s = startup_budget_s or (spec.startup_budget_s if spec is not None else 1800.0)
        self.environ = os.environ if environ is None else environ
        self.container_factory = container_factory
        self.sleep, self.clock, self.poll_s = sleep, clock, poll_s
        self.command: list[str] = []
        self.startup_s: float | None = None
        self.base_url: str | None = None
        self.container: Any = None
        self.container_id: str | None = None
        #: The model load's memory peak (the container's tree on this host, sampled once per poll); None: not sampled.
        self.load_peak: Any = None
        self._healthy = False
        self._port = 0
        self._t0 = 0.0

    # -- the Launcher interface ------------------------------------------------------------
    @classmethod
    def unavailable(cls, profile: Profile) -> str | None:
        """Why this launcher cannot run here: no Docker engine, or fewer GPUs than the profile needs."""
        return docker_unavailable() or gpus_unavailable(profile)

    @property
    def pid(self) -> int | None:
        return None  # a container: the soak reads the server's memory from /metrics instead

    @property
    def secrets(self) -> list[str]:
        """Values passed into the container that must never be shown (for the run's redactor)."""
        return list(passed_env(self.profile, self.environ).values())

    def describe(self) -> dict[str, Any]:
        """summary.json's ``launch`` entry: image, container, command, GPUs, mounts, the names (only)
        of the variables passed, start-up seconds, log path."""
        spec = self.profile.launch
        return {"mode": "docker", "image": self.image, "container": self.container_id, "command": self.command,
                "gpus": wanted_gpus(self.profile), "network": "host", "port": self._port,
                "mounts": [f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in (spec.mounts if spec else [])],
                "env_passed": sorted(passed_env(self.profile, self.environ)),
                "startup_s": round(self.startup_s, 2) if self.startup_s is not None else None,
                "log": str(self.log_path)}

    def launch(self) -> None:
        """Create and start the container (no waiting). Raises :class:`LaunchError` (image missing
        and not pullable, GPU driver refused the device request, ...) after removing what was made."""
        if self.container is not None:
            return
        _disable_reaper()
        self._port = free_port()
        kwargs = container_kwargs(self.profile, self._port, self.environ)
        self.command = list(kwargs["entrypoint"])
        self._t0 = self.clock()
        try:
            if self.container_factory is not None:
                container = self.container_factory(self.image)
            else:
                from testcontainers.core.container import DockerContainer

                container = DockerContainer(self.image)
            self.container = container
            for name, value in passed_env(self.profile, self.environ).items():
                container.with_env(name, value)
            for host, mount in kwargs.pop("volumes").items():
                container.with_volume_mapping(host, mount["bind"], mount["mode"])
            container.with_kwargs(**kwargs)
            atexit.register(self.stop)
            container.start()
        except Exception as exc:
            message = self._secret_free(str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc))
            self._remove()
            raise LaunchError(f"docker launcher: container from {self.image} did not start: {message}") from None
        self.container_id = self._wrapped().id[:12] if self._wrapped() is not None else None

    def _launched(self) -> bool:
        return self.container is not None

    def stop(self, grace_s: float | None = None) -> None:
        """Save the container's log to ``log_path``, then remove the container (force). Idempotent."""
        self._save_log()
        self._remove()

    def kill(self) -> None:
        """Remove the container at once (force), without saving its log."""
        self._remove()

    def terminate(self) -> str:
        """``docker stop -t GRACE`` in a background thread (docker sends SIGTERM to the container's
        main process and SIGKILL after GRACE, ``rollout.grace_period_s``, as the kubelet does with
        terminationGracePeriodSeconds); returns at once with the command in words."""
        import threading

        grace = self.profile.rollout.grace_s if self.profile.rollout is not None else 10.0
        wrapped = self._wrapped()
        self._stopper = threading.Thread(target=lambda: wrapped.stop(timeout=int(math.ceil(grace))),
                                         name="kvgate-docker-stop", daemon=True)
        self._stopper.start()
        return f"docker stop -t {math.ceil(grace)} {self.container_id}"

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``docker stop`` to return; True when the container
        exited on its own (not SIGKILLed at the grace period: exit code 137)."""
        stopper = getattr(self, "_stopper", None)
        if stopper is None:
            return False
        stopper.join(max(timeout_s, 0.0))
        if stopper.is_alive():
            return False
        wrapped = self._wrapped()
        try:
            wrapped.reload()
            return wrapped.attrs.get("State", {}).get("ExitCode") != 137
        except Exception:  # the container is gone: it exited
            return True

    # -- internals -------------------------------------------------------------------------
    def _wrapped(self) -> Any:
        return getattr(self.container, "_container", None)

    def _secret_free(self, text: str) -> str:
        for value in self.secrets:
            text = text.replace(value, "***")
        return text

    def _logs(self, tail: int | None = None) -> str:
        wrapped = self._wrapped()
        if wrapped is None:
            return ""
        try:
            raw = wrapped.logs(tail=tail) if tail else wrapped.logs()
        except Exception:
            return ""
        return self._secret_free(raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))

    def _save_log(self) -> None:
        text = self._logs()
        if text:
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self.log_path.write_text(text)
            except OSError:
                pass

    def _remove(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            try:
                container.stop(force=True, delete_volume=True)
            except Exception:
                wrapped = getattr(container, "_container", None)
                if wrapped is not None:
                    try:
                        wrapped.remove(force=True)
                    except Exception:
                        pass
        atexit.unregister(self.stop)

    def _failed(self, why: str) -> LaunchError:
        return LaunchError(f"docker launcher: {why}; container log ({self.log_path}), last lines:\n"
                           f"{self._logs(LOG_TAIL_LINES)}")

    def _wait(self) -> str:
        """Poll ``/health`` then one generation until both answer 200 within the budget, watching
        the container. Returns ``http://127.0.0.1:PORT``; :meth:`wait_ready` removes the
        container on any exception (``KeyboardInterrupt`` included) before it propagates."""
        url = f"http://{LOOPBACK}:{self._port}"
        deadline = self._t0 + self.startup_budget_s
        body = {"model": self.profile.model.served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        healthy = False
        watch = None  # the container's process tree on this host (State.Pid): the model load's memory peak
        try:
            with httpx.Client(timeout=httpx.Timeout(10.0)) as http:
                while True:
                    wrapped = self._wrapped()
                    if wrapped is not None:
                        wrapped.reload()
                        if wrapped.status in ("exited", "dead"):
                            code = wrapped.attrs.get("State", {}).get("ExitCode")
                            raise self._failed(f"the server's container exited with code {code} during start-up")
                        watch = watch or self._tree_watch(wrapped)
                    if watch is not None:
                        watch.sample()
                    if self._poll(http, url, body, healthy, deadline):
                        break
                    healthy = self._healthy
                    self.sleep(self.poll_s)
        finally:
            ready_peak(self, watch)
        self.startup_s = self.clock() - self._t0
        self.base_url = url
        return url

    def _tree_watch(self, wrapped: Any) -> Any:
        """A :func:`kvgate.launch.local.tree_watch` over the container's processes as this host sees
        them (``State.Pid``, the container's first process); None before it has one."""
        pid = (wrapped.attrs.get("State") or {}).get("Pid") if isinstance(getattr(wrapped, "attrs", None), dict) else None
        if not isinstance(pid, int) or pid <= 0:
            return None
        return tree_watch(self.tree_reader, pid, phase="during model load (container start to the first generation)",
                          label=f"container {self.container_id or ''}".strip(), clock=self.clock, t0=self._t0)

    def _poll(self, http: httpx.Client, url: str, body: dict[str, Any], healthy: bool, deadline: float) -> bool:
        """One readiness poll: ``/health`` until 200, then one generation; True once it answers.
        Raises :class:`LaunchError` past ``deadline``."""
        self._healthy = healthy
        try:
            if not healthy:
                healthy = self._healthy = http.get(f"{url}/health").status_code == 200
            if healthy and self._generation(http, url, body):
                return True
        except (httpx.HTTPError, ValueError):
            pass
        if self.clock() > deadline:
            what = "answered /health but no generation" if healthy else "not healthy"
            raise self._failed(f"{what} after {self.startup_budget_s:g} s (launch.startup_budget_s)")
        return False

    def _generation(self, http: httpx.Client, url: str, body: dict[str, Any]) -> bool:
        """After ``/health`` 200: ready -> serving timed here (:mod:`kvgate.http.readiness`; the
        base's watch is then skipped) -- ``GET /v1/models`` until it lists the model (the ready
        instant), and this poll's generation recorded as served or refused. True once one served
        (:attr:`readiness` set). Raises ``httpx.HTTPError`` only from the model list."""
        from kvgate.http.readiness import Attempt, Recorder

        rec = self._ready_rec
        if rec is None:
            rec = self._ready_rec = Recorder("the docker launcher", onset_seen=True, bound_s=self.startup_budget_s,
                                             poll_s=self.poll_s, clock=self.clock)
        if rec.ready_at is None:
            models = http.get(f"{url}/v1/models")
            data = models.json().get("data") if models.status_code == 200 else None
            if isinstance(data, list) and self.profile.model.served_name in [m.get("id") for m in data
                                                                           if isinstance(m, dict)]:
                rec.ready()
        t0 = self.clock()
        try:
            r = http.post(f"{url}/v1/completions", json=body)
            served = r.status_code == 200 and bool(r.json().get("choices"))
            attempt = Attempt(served, r.status_code, "served" if served else
                              f"/v1/completions: {r.status_code} ({r.text[:120]})", self.clock() - t0)
        except (httpx.HTTPError, ValueError) as exc:
            attempt = Attempt(False, 0, f"/v1/completions: no answer ({type(exc).__name__})", self.clock() - t0)
        rec.attempt(attempt)
        if attempt.served:
            self.readiness = rec.out
        return attempt.served
