"""Runs of the real embedded vLLM shared by several e2e modules (one vLLM start each per session)."""

from __future__ import annotations

import pytest

from .test_embedded import main_job


@pytest.fixture(scope="session")
def overcommitted_run(tmp_path_factory):
    """``pytest --profile tiny-cpu-overcommitted`` on the embedded vLLM: the fit gate and the
    concurrent-long gate FAIL (8 MiB of KV for 8 declared long sequences), the deployment gates
    PASS. ``(proc, summary, reports dir)``."""
    tmp = tmp_path_factory.mktemp("overcommitted")
    proc, summary = main_job(tmp, "--profile", "tiny-cpu-overcommitted", "-k", "long_sequences or kv-pool or deployment")
    return proc, summary, tmp / "reports"
