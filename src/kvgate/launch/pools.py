"""Launch mode ``pools``: each pool's embedded vLLM and a real router in front -- nginx, routing by
request size (``$content_length``), on free loopback ports.

For a profile with a ``pools:`` section (``tiny-cpu-pools``): the short and the long pool each
get an :class:`~kvgate.launch.local.EmbeddedServer` rendered from the pool's own profile (same
command renderer as the embedded default), both started at once; nginx runs in the foreground as a
child (``master_process off``: one process, no privilege drop, no daemon), its config rendered
from ``pools.router_config`` (default ``ci/nginx-pools.conf``, the shipped example) with the
pools' ports and the threshold (:func:`render_nginx`). ``wait_ready`` returns the router's root
URL; :attr:`PoolsLauncher.pool_urls` holds each pool's own URL (where the pools gates read
``/metrics``). ``stop``/``kill`` stop nginx and both process groups (the life cycle calls them at
the end of the run and on Ctrl-C/SIGTERM). Logs and the rendered config go to ``pools/`` in the
reports directory.

nginx sees bytes, not tokens: only ``routing.by: request_bytes`` can be launched. Where nginx is
not installed, :meth:`PoolsLauncher.unavailable` says so (and how to get it) and the live gates
SKIP with that reason.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from kvgate.report.outputs import POOLS_DIR  # under the reports directory: rendered nginx.conf, nginx and vLLM logs
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, pool_profiles
from kvgate.launch.base import LaunchError
from kvgate.launch.local import LOOPBACK, EmbeddedServer, free_port, log_tail, wait_health

#: The checkout (``pools.router_config`` is relative to it).
CHECKOUT = DEFAULT_PROFILE_DIR.parent
NGINX_INSTALL = "apt-get install -y nginx (Debian/Ubuntu; .ci/run installs it when run as root)"


def above_regex(n: int) -> str:
    """A regular expression (no anchors) matching the decimal integers greater than ``n`` (no
    leading zeros, as a Content-Length is written): more digits, or as many digits and greater at
    the first digit that differs. nginx's ``map`` compares strings, so numeric thresholds are
    written this way. Raises ``ValueError`` for a negative ``n``."""
    if n < 0:
        raise ValueError(f"threshold must be >= 0, got {n}")
    s = str(n)
    alts = [f"[1-9][0-9]{{{len(s)},}}"]
    for i, ch in enumerate(s):
        if ch == "9":
            continue
        rest = len(s) - i - 1
        alts.append(f"{s[:i]}[{int(ch) + 1}-9]" + (f"[0-9]{{{rest}}}" if rest else ""))
    return "|".join(alts)


def render_nginx(template: str, *, listen: int, short: str, long: str, threshold: int, prefix: Path) -> str:
    """The nginx config: ``template`` with ``{{listen}}`` (port), ``{{short_upstream}}`` /
    ``{{long_upstream}}`` (``host:port``), ``{{threshold}}`` (bytes), ``{{above_threshold_regex}}``
    (:func:`above_regex`) and ``{{prefix}}`` (a writable directory for pid, logs and temp files)
    filled in. Raises ``ValueError`` naming a placeholder left unfilled."""
    values = {"listen": f"{LOOPBACK}:{listen}", "short_upstream": short, "long_upstream": long,
              "threshold": str(threshold), "above_threshold_regex": above_regex(threshold), "prefix": str(prefix)}
    out = template
    for key, value in values.items():
        out = out.replace("{{" + key + "}}", value)
    if "{{" in out:
        left = out[out.index("{{"):].split("}}")[0] + "}}"
        raise ValueError(f"nginx template has a placeholder kvgate does not fill: {left}")
    return out


def pool_cpus(allowed: list[int]) -> tuple[set[int] | None, set[int] | None]:
    """CPUs for the short and the long pool's vLLM, apart as separate deployments are: with 3 or
    more CPUs the last is kept for kvgate's client (and nginx) and the rest split, short pool
    first; with 2 each pool gets one and the client floats (measured on 2 cores: short TTFT p95
    through nginx 22-39 ms alone, 52-67 ms while the long pool served 4 x 1,900-token requests,
    1.7-2.4x, client on schedule; both pools on one CPU gave 3.7-4.2x); with 1, no pinning."""
    if len(allowed) < 2:
        return None, None
    rest = allowed[:-1] if len(allowed) >= 3 else allowed
    half = len(rest) // 2
    return set(rest[:half]), set(rest[half:])


class NginxRouter:
    """nginx in the foreground as a child process, rendered from ``template`` (:func:`render_nginx`)
    into ``directory`` (config, pid, logs, temp files), listening on a free loopback port.
    :meth:`start` returns its root URL once it answers; :meth:`stop` (SIGQUIT: in-flight requests
    finish, 2 s) and :meth:`kill` end it; an ``atexit`` hook kills it if the interpreter exits first."""

    def __init__(self, template: Path, directory: Path, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.template = template
        self.dir = directory
        self.sleep = sleep
        self.proc: subprocess.Popen | None = None
        self.command: list[str] = []
        self.base_url: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def error_log(self) -> Path:
        return self.dir / "nginx-error.log"

    def start(self, short_url: str, long_url: str, threshold: int, ready_s: float = 10.0) -> str:
        """Render, start, wait until ``GET /health`` through it answers 200 (the short pool's) within
        ``ready_s``. ``short_url``/``long_url``: the pools' root URLs (``http://host:port``).
        Raises :class:`LaunchError` naming the template, or with the error log's tail."""
        try:
            text = self.template.read_text()
        except OSError as exc:
            raise LaunchError(f"pools.router_config {self.template}: cannot read it ({exc.strerror})") from None
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        conf = self.dir / "nginx.conf"
        try:
            conf.write_text(render_nginx(text, listen=port, short=short_url.removeprefix("http://"),
                                         long=long_url.removeprefix("http://"), threshold=threshold, prefix=self.dir))
        except ValueError as exc:
            raise LaunchError(f"pools.router_config {self.template}: {exc}") from None
        self.command = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(self.dir), "-c", str(conf),
                        "-e", "stderr"]
        log = open(self.error_log, "wb")
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start nginx ({self.command[0]}): {exc}") from None
        finally:
            log.close()
        atexit.register(self.kill)
        url = f"http://{LOOPBACK}:{port}"
        try:
            wait_health(url, self.proc, time.monotonic() + ready_s, self.sleep, 0.05,
                        lambda code: f"nginx exited with code {code} at start; "
                                     f"{log_tail(self.error_log, time.monotonic() - t0, 'nginx')}",
                        lambda: f"nginx not answering on {url} after {ready_s:g} s; log {self.error_log}")
        except LaunchError:
            self.kill()
            raise
        self.base_url = url
        return url

    def _signal(self, sig: int, wait_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def stop(self) -> None:
        """SIGQUIT (graceful: in-flight requests finish), SIGKILL after 2 s. Idempotent."""
        self._signal(signal.SIGQUIT, 2.0)
        atexit.unregister(self.kill)

    def kill(self) -> None:
        """SIGKILL at once. Idempotent."""
        self._signal(signal.SIGKILL, 5.0)
        atexit.unregister(self.kill)


class PoolsLauncher:
    """Two embedded vLLM pools and nginx in front (see module doc). ``log_path``: the reports
    directory's ``vllm-server.log`` (the life cycle's choice); this launcher writes into
    ``pools/`` beside it. ``pool_urls``: ``{"short": root URL, "long": root URL}`` once ready."""

    mode = "pools"

    @classmethod
    def unavailable(cls, profile: Profile) -> str | None:
        """Why the pools cannot be launched here: no ``pools:`` section, a pool that is not the
        embedded tiny model, routing by tokens (nginx sees bytes), or no nginx on PATH."""
        if profile.pools is None:
            return f"profile {profile.name!r} has no pools: section to launch"
        if profile.pools.routing.by != "request_bytes":
            return ("nginx routes by request size only (its $content_length): pools.routing.by must be request_bytes "
                    "to launch the pools; gate a token-routing router with --endpoint")
        try:
            pools = pool_profiles(profile)
        except ProfileError as exc:
            return str(exc)
        for name, p in pools.items():
            if not p.embedded:
                return f"pool {name!r} ({p.name}) is not kvgate's embedded tiny model (model.embedded: true)"
        if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
            return f"nginx is not installed ({NGINX_INSTALL})"
        return None

    def __init__(self, profile: Profile, log_path: Path, *, startup_budget_s: float | None = None) -> None:
        self.profile = profile
        self.log_path = log_path
        self.dir = log_path.parent / POOLS_DIR
        self.startup_budget_s = startup_budget_s or 300.0
        self.pools: dict[str, EmbeddedServer] = {}
        self.router: NginxRouter | None = None
        self.command: list[str] = []
        self.startup_s: float | None = None
        self.base_url: str | None = None
        self.pool_urls: dict[str, str] = {}
        self._t0 = 0.0

    @property
    def pid(self) -> int | None:
        """nginx's pid (the vLLM pools are separate process groups, see :meth:`describe`)."""
        return self.router.pid if self.router is not None else None

    def describe(self) -> dict[str, Any]:
        """summary.json's ``launch`` entry: the router and each pool's command, CPUs and log."""
        return {"mode": self.mode, "startup_s": round(self.startup_s or 0, 2), "command": self.command,
                "log": str(self.dir / "nginx-error.log"), "router": self.base_url,
                "pools": {name: {**s.describe(), "url": self.pool_urls.get(name)} for name, s in self.pools.items()}}

    def launch(self) -> None:
        """Build the tiny model(s) and their ``embedded`` LoRA adapters, start both vLLM pools (no
        waiting). Idempotent. nginx starts in :meth:`wait_ready`, once the pools' ports are known.
        Raises :class:`LaunchError` (or :class:`~kvgate.launch.tinymodel.TinyModelError` from the
        model or adapter build)."""
        if self.pools:
            return
        from kvgate.launch.lora import ensure_adapters
        from kvgate.launch.realmodel import model_dir_for

        why = self.unavailable(self.profile)
        if why:
            raise LaunchError(why)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        short_cpus, long_cpus = pool_cpus(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [])
        for name, p in pool_profiles(self.profile).items():
            model_dir = model_dir_for(p)
            server = EmbeddedServer(p, model_dir, self.dir / f"vllm-{name}.log", startup_budget_s=self.startup_budget_s,
                                    lora_dirs=ensure_adapters(p.engine, model_dir))
            server.server_cpus = short_cpus if name == "short" else long_cpus
            self.pools[name] = server
            server.launch()

    def wait_ready(self) -> str:
        """Wait for both pools' ``/health``, then start nginx and wait until it answers. Returns
        the router's root URL. On any exception everything started is stopped first."""
        if self.base_url is not None:
            return self.base_url
        try:
            self.launch()
            for name, server in self.pools.items():
                self.pool_urls[name] = server.wait_ready()
            self._start_nginx()
        except BaseException:
            self.stop(grace_s=1.0)
            raise
        self.startup_s = time.monotonic() - self._t0
        return self.base_url

    def _start_nginx(self) -> None:
        pools = self.profile.pools
        assert pools is not None
        template = Path(pools.router_config)
        self.router = NginxRouter(template if template.is_absolute() else CHECKOUT / template, self.dir)
        self.base_url = self.router.start(self.pool_urls["short"], self.pool_urls["long"], pools.routing.threshold)
        self.command = self.router.command

    def stop(self, grace_s: float | None = None) -> None:
        """Stop nginx (SIGQUIT: finish what is in flight, 2 s) and both pools
        (:meth:`EmbeddedServer.stop`). Idempotent."""
        if self.router is not None:
            self.router.stop()
        for server in self.pools.values():
            server.stop(grace_s)

    def kill(self) -> None:
        """SIGKILL nginx and both pools' process groups. Idempotent."""
        if self.router is not None:
            self.router.kill()
        for server in self.pools.values():
            server.kill()
