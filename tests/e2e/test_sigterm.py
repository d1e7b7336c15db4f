"""SIGTERM mid-run against real embedded vLLMs, the signal sent on an event, not at a time: the run's
own tiny-cpu launch once vLLM is up (test_embedded.py's run; its start-up case, timed from the run's
start, stays there), and the tiny-cpu-pools launch once the routing gate is sending through nginx
(test_pools.py's profile). Each asserts where the signal landed, that the summary says INCOMPLETE and
that no process the run spawned outlives it -- the teardown, whatever the host's load: a busy core
makes the launch slower, not the assertions wrong, so the module runs beside the unit tests
(tests/conftest.py E2E_BESIDE_UNITS) instead of with the machine to itself (~2 min of CI's serial lane).
One tiny-cpu start, one pools start (two vLLMs and nginx). Marked e2e."""

from __future__ import annotations

import psutil
import pytest

from .test_embedded import sigterm_run
from .test_pools import NGINX, NGINX_INSTALL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_sigterm_mid_run_tears_down_server_and_writes_incomplete_summary(tmp_path):
    sigterm_run(tmp_path, "mid-run")


@pytest.mark.skipif(NGINX is None, reason=f"nginx is not installed ({NGINX_INSTALL})")
def test_sigterm_mid_run_stops_both_pools_and_nginx(tmp_path):
    """SIGTERM once the routing gate is sending (nginx's access log has lines): the run ends
    INCOMPLETE and no vLLM or nginx process outlives it."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from ..conftest import REPO, validate_summary

    reports = tmp_path / "reports"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--kvgate-reports={reports}",
                             "--profile", "tiny-cpu-pools", "-q"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    access = reports / "pools" / "access.log"
    seen: set[int] = set()
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None:  # remember every process the run spawns
        try:
            seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            break
        if access.is_file() and "POST /v1/completions" in access.read_text():
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before the routing gate sent anything"
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0].decode(errors="replace")
    time.sleep(1)
    alive = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes outlived SIGTERM: {alive}"
    summary = validate_summary(json.loads((reports / "summary.json").read_text()))
    assert summary["overall"] == "INCOMPLETE", out[-2000:]
