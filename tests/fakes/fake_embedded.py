"""A fake of :class:`kvgate.launch.local.EmbeddedServer` for the life-cycle tests: the same interface
(``launch()``, ``wait_ready() -> url``, ``stop()``, ``kill()``, ``pid``, ``startup_s``, ``command``,
``log_path``, ``server_cpus``), "serving" a :class:`tests.fakes.fake_vllm.FakeVLLM` that already runs
at ``url``, with scripted misbehaviour:

- ``wait``: ``ready`` (after ``ready_s`` seconds), ``interrupt`` (raises ``KeyboardInterrupt``, as a
  Ctrl-C during start-up would), ``error`` (raises ``LaunchError``), ``never`` (polls until
  ``budget_s``, like a vLLM that never becomes healthy; a real signal ends it);
- ``stop``: ``ok``, ``interrupt`` (raises ``KeyboardInterrupt`` once, as a Ctrl-C during teardown
  would), ``block`` (waits until a signal arrives, like a vLLM slow to shut down).

``terminate()`` / ``wait_exit(s)`` (the drain gate's SIGTERM) call the served fake's
:meth:`~tests.fakes.fake_vllm.FakeVLLM.sigterm` / ``wait_exit`` when ``fake`` (the in-process
FakeVLLM) is given; without it, ``terminate()`` posts ``/_fake/sigterm`` and ``wait_exit`` polls
until the port refuses connections.

Every call is logged in ``events`` as ``(name, open phases)`` -- the names of the run's phases
running at that moment (``record``: the run's :class:`kvgate.report.record.RunRecord`) -- and, when
``events_file`` is set, appended to it as one JSON line, so a test can watch a run in another process.

In-process (pytester): ``monkeypatch.setattr(kvgate.run.lifecycle, "_build", lambda st: FakeEmbeddedServer(...))``.
In a subprocess: ``python -m pytest -p tests.fakes.fake_embedded ...`` with ``KVGATE_FAKE_EMBEDDED`` set
to the JSON of the keyword arguments (``url``, ``wait``, ``stop``, ``events_file``, ...).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from kvgate.launch.local import LaunchError

ENV = "KVGATE_FAKE_EMBEDDED"


class FakeEmbeddedServer:
    def __init__(self, url: str, log_path: Path | str, *, wait: str = "ready", stop: str = "ok",
                 ready_s: float = 0.0, budget_s: float = 60.0, record: Any = None,
                 events: list | None = None, events_file: str | None = None, fake: Any = None) -> None:
        assert wait in ("ready", "interrupt", "error", "never") and stop in ("ok", "interrupt", "block")
        self.url, self.log_path = url, Path(log_path)
        self.wait_mode, self.stop_mode, self.ready_s, self.budget_s = wait, stop, ready_s, budget_s
        self.record = record
        self.events = events if events is not None else []
        self.events_file = events_file
        self.command = ["fake-vllm", "--url", url]
        self.server_cpus: set[int] | None = None
        self.startup_s: float | None = None
        self.launched = self.running = False
        self.killed = False
        self.fake = fake
        self._t0 = 0.0

    @property
    def pid(self) -> int | None:
        return os.getpid() if self.launched else None

    def _event(self, name: str) -> None:
        phases = tuple(p["name"] for p in self.record.phases if p["status"] == "running") if self.record else ()
        self.events.append((name, phases))
        if self.events_file:
            with open(self.events_file, "a") as f:
                f.write(json.dumps({"event": name, "phases": phases, "t": time.monotonic()}) + "\n")

    def launch(self) -> None:
        self._event("launch")
        if not self.launched:
            self.launched = self.running = True
            self._t0 = time.monotonic()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(f"fake embedded vLLM for {self.url}\n")

    def wait_ready(self) -> str:
        self._event("wait_ready")
        if not self.launched:
            self.launch()
        if self.wait_mode == "interrupt":
            raise KeyboardInterrupt
        if self.wait_mode == "error":
            raise LaunchError("embedded vLLM exited with code 1 during startup (fake); log in vllm-server.log")
        if self.wait_mode == "never":
            deadline = time.monotonic() + self.budget_s
            while time.monotonic() < deadline:
                time.sleep(0.02)
            raise LaunchError(f"embedded vLLM not healthy after {self.budget_s:g} s (fake)")
        time.sleep(self.ready_s)
        self.startup_s = time.monotonic() - self._t0
        return self.url

    def stop(self, grace_s: float | None = None) -> None:
        if not self.running:  # idempotent, like EmbeddedServer.stop (a stopped or killed group is gone)
            return
        self._event("stop")
        if self.stop_mode == "interrupt":
            self.stop_mode = "ok"
            raise KeyboardInterrupt
        if self.stop_mode == "block":
            self.stop_mode = "ok"
            deadline = time.monotonic() + self.budget_s
            while time.monotonic() < deadline:
                time.sleep(0.02)
        self.running = False

    def describe(self) -> dict:
        """summary.json's ``launch`` entry, as :meth:`kvgate.launch.local.EmbeddedServer.describe`."""
        return {"mode": "embedded", "startup_s": round(self.startup_s or 0, 2), "command": self.command,
                "log": str(self.log_path), "server_cpus": "all"}

    def terminate(self) -> str:
        self._event("terminate")
        if self.fake is not None:
            self.fake.sigterm()
        else:
            import httpx

            httpx.post(f"{self.url}/_fake/sigterm", timeout=5)
        return "SIGTERM to the fake vLLM"

    def wait_exit(self, timeout_s: float) -> bool:
        self._event("wait_exit")
        if self.fake is not None:
            return self.fake.wait_exit(timeout_s)
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"{self.url}/health", timeout=1)
            except httpx.ConnectError:
                return True
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def kill(self) -> None:
        self._event("kill")
        self.killed, self.running = True, False


def pytest_configure(config: Any) -> None:
    """With ``-p tests.fakes.fake_embedded`` and :data:`ENV` set: kvgate's launcher builds this fake."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    import kvgate.run.lifecycle

    kwargs = json.loads(spec)
    kvgate.run.lifecycle._build = lambda st: FakeEmbeddedServer(log_path=st.reports_dir / "vllm-server.log",
                                                            record=st.record, **kwargs)
