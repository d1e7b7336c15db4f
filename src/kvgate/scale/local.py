"""``--workers local:N``: N worker processes on this box (``python -m kvgate worker``), so the
split, the barrier, the clock exchange, the shipping and the merge run end to end without a
cluster. They share this machine's CPUs with the coordinator (and an embedded server): local
workers prove the protocol, they add no client capacity a second machine would.

Each worker's output goes to ``run_dir/worker-KKK.log``. The endpoint's API key reaches the
workers in their environment (:data:`KEY_ENV`), never on a command line or in a file.
:meth:`LocalWorkers.liveness` is the coordinator's ``liveness``: a worker whose process ended
before its part came is lost, with its exit status (``killed by SIGKILL``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

#: The environment variable a local worker reads the endpoint's API key from.
KEY_ENV = "KVGATE_WORKER_API_KEY"


def exit_text(code: int) -> str:
    """``exited with code 1`` / ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LocalWorkers:
    """N ``kvgate worker`` processes for a coordinator at ``url``. ``run_dir``: logs (and the
    shared volume with ``ship_dir=True``); ``api_key``: passed in :data:`KEY_ENV`;
    ``heartbeat_s``; ``python``: the interpreter (default this one); ``extra``: more worker
    arguments."""

    def __init__(self, n: int, url: str, run_dir: Path, *, api_key: str | None = None, heartbeat_s: float = 1.0,
                 ship_dir: bool = False, python: str | None = None, extra: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.n, self.url, self.run_dir = n, url, Path(run_dir)
        self.api_key, self.heartbeat_s, self.ship_dir = api_key, heartbeat_s, ship_dir
        self.python = python or sys.executable
        self.extra = list(extra)
        self.env = env
        self.procs: dict[int, subprocess.Popen[Any]] = {}
        self._logs: list[Any] = []

    def command(self, k: int) -> list[str]:
        cmd = [self.python, "-m", "kvgate", "worker", f"--coordinator={self.url}", f"--worker={k}/{self.n}",
               f"--heartbeat-s={self.heartbeat_s:g}"]
        if self.api_key:
            cmd.append(f"--api-key-env={KEY_ENV}")
        if self.ship_dir:
            cmd.append(f"--ship={self.run_dir}")
        return cmd + self.extra

    def start(self) -> "LocalWorkers":
        env = dict(os.environ if self.env is None else self.env)
        env.pop(KEY_ENV, None)
        if self.api_key:
            env[KEY_ENV] = self.api_key
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for k in range(self.n):
            log = open(self.run_dir / f"worker-{k:03d}.log", "w")  # noqa: SIM115 - closed in stop()
            self._logs.append(log)
            self.procs[k] = subprocess.Popen(self.command(k), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, start_new_session=True)
        return self

    def liveness(self, k: int) -> str | None:
        """None while worker ``k`` runs; else how it ended, with its pid."""
        p = self.procs.get(k)
        if p is None:
            return "was never started"
        code = p.poll()
        return None if code is None else f"its process (pid {p.pid}) {exit_text(code)}"

    def pid(self, k: int) -> int:
        return self.procs[k].pid

    def stop(self, timeout_s: float = 10.0, grace_s: float = 2.0) -> dict[int, int | None]:
        """Stop every worker still running after ``grace_s`` (told it is done, a worker exits by
        itself): SIGTERM, then SIGKILL after ``timeout_s``; close the logs. Returns each worker's
        exit code."""
        end = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        codes: dict[int, int | None] = {}
        for k, p in self.procs.items():
            try:
                codes[k] = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[k] = p.wait(timeout=timeout_s)
        for log in self._logs:
            log.close()
        self._logs.clear()
        return codes

    def __enter__(self) -> "LocalWorkers":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
