"""End to end: the short and the long pool of ``tiny-cpu-pools`` (two embedded vLLMs behind nginx,
started with :class:`kvgate.launch.pools.PoolsLauncher`) each gated against its own profile with
``--endpoint`` (the design: a pool's section is a full profile), its deployment and max-context
gates PASS. Those judge the served configuration and whether the longest prompt completes -- no
timing -- so this module runs beside the unit tests (tests/conftest.py E2E_BESIDE_UNITS); the pools
gates themselves, which judge TTFT, are test_pools.py's (with the machine to themselves). Skips,
saying so, where nginx is not installed (``.ci/run`` installs it as root).

One pools start (two tiny vLLMs, each pinned to a CPU of its own on 2 cores: beside a unit worker
they start slower, within the launcher's 300 s budget); marked e2e.
"""

from __future__ import annotations

import pytest

from kvgate.launch.pools import NGINX_INSTALL, PoolsLauncher
from kvgate.profile.models import load_profile

from .test_embedded import main_job
from .test_pools import NGINX

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(NGINX is None, reason=f"nginx is not installed ({NGINX_INSTALL})")]


@pytest.fixture(scope="module")
def pools_up(tmp_path_factory):
    reports = tmp_path_factory.mktemp("pools-up")
    launcher = PoolsLauncher(load_profile("tiny-cpu-pools"), reports / "vllm-server.log")
    try:
        launcher.wait_ready()
        yield launcher
    finally:
        launcher.stop()


@pytest.mark.parametrize("pool", ["short", "long"])
def test_each_pool_passes_its_own_profile_with_endpoint(pools_up, pool, tmp_path):
    url = pools_up.pool_urls[pool] + "/v1"
    proc, summary = main_job(tmp_path, f"--profile=tiny-cpu-pool-{pool}", f"--endpoint={url}",
                             "-m", "deployment or max_context")
    assert proc.returncode == 0 and summary["overall"] == "PASS", proc.stdout[-3000:]
    mml = {"short": 1024, "long": 2048}[pool]
    deployment = [g for g in summary["gates"] if g["id"].startswith(f"tiny-cpu-pool-{pool}/deployment")]
    assert deployment and any(f"{mml:,}" in g["message"] or str(mml) in g["message"] for g in deployment)

