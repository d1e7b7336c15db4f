"""End to end: short/long pools on the real embedded vLLM behind real nginx.

``pytest --profile tiny-cpu-pools`` launches both pools (two vLLMs at once) and nginx from
ci/nginx-pools.conf, and both pools gates PASS; nothing outlives the run (SIGTERM mid-run:
test_sigterm.py, beside the unit tests).
(Each pool gated against its own profile with ``--endpoint``, which holds on a busy machine:
test_pools_endpoint.py, beside the unit tests.) Skips, saying so, where nginx is not installed
(``.ci/run`` installs it as root).

Slow (two pool launches, ~1 min each on 2 cores); timing-sensitive (pools/isolation judges the short
pool's TTFT); marked e2e.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil
import pytest

from kvgate.launch.pools import NGINX_INSTALL

from .test_embedded import main_job, vllm_processes

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(NGINX is None, reason=f"nginx is not installed ({NGINX_INSTALL})")]


def children_of(marker: str) -> list[psutil.Process]:
    """Processes whose command line mentions ``marker`` (a reports dir): vLLMs and nginx of one run."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(marker in c for c in (p.info["cmdline"] or [])):
            out.append(p)
    return out


@pytest.fixture(scope="module")
def pools_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pools")
    proc, summary = main_job(tmp, "--profile", "tiny-cpu-pools")
    return proc, summary, tmp / "reports"


def test_pools_profile_launches_two_pools_and_nginx_and_passes(pools_run):
    proc, summary, reports = pools_run
    gates = {g["id"]: g for g in summary["gates"]}
    assert sorted(gates) == ["tiny-cpu-pools/pools/isolation", "tiny-cpu-pools/pools/routing"], proc.stdout[-3000:]
    assert proc.returncode == 0 and summary["overall"] == "PASS", [g["message"] for g in gates.values()]
    routing = gates["tiny-cpu-pools/pools/routing"]["message"]
    assert "8 requests through the router (rule: at most 2,048 bytes -> short pool, more -> long pool" in routing
    assert "4/4 short on the short pool, 4/4 long on the long pool" in routing
    assert "short-request TTFT p95 through the router" in gates["tiny-cpu-pools/pools/isolation"]["message"]
    launch = summary["launch"]
    assert launch["mode"] == "pools" and sorted(launch["pools"]) == ["long", "short"]
    assert "nginx" in launch["command"][0] and (reports / "pools" / "nginx.conf").is_file()
    assert "pool=kvgate_long" in (reports / "pools" / "access.log").read_text()
    assert "pools profile: the pools gates only" in proc.stdout


def test_pools_run_left_no_process_behind(pools_run):
    _, summary, reports = pools_run
    assert children_of(str(reports)) == []  # nginx (its command line names the reports dir)
    for pool in summary["launch"]["pools"].values():
        port = pool["command"][pool["command"].index("--port") + 1]
        assert vllm_processes(port) == [], f"vLLM processes outlived the run: {pool['url']}"

