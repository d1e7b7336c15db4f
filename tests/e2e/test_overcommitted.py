"""End to end on the real embedded vLLM: ``tiny-cpu-overcommitted`` (an 8 MiB KV pool, 8 declared
concurrent long sequences) fails the fit gate for the right reason, and live the concurrent-long
gate shows the preemptions the arithmetic predicts. Both judge counts (tokens, preemptions), not
timings: the module runs beside the unit tests (tests/conftest.py E2E_BESIDE_UNITS). The live run
is ``overcommitted_run`` (tests/e2e/conftest.py), shared with test_report_browser.py -- the same
lane, so one start. Marked e2e."""

from __future__ import annotations

import pytest

from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_overcommitted_profile_fails_fit_for_the_right_reason(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", "tiny-cpu-overcommitted", "-m", "fit")
    assert proc.returncode == 1
    (gate,) = summary["gates"]
    assert gate["status"] == "FAIL"
    assert "profile declares 8" in gate["message"] and "4,096 tokens" in gate["message"]


def test_overcommitted_pool_shows_the_predicted_preemptions(overcommitted_run):
    """The 8 MiB pool holds 1 full-length sequence at once (fit arithmetic); 8 declared
    concurrent long sequences on the live server must preempt, and the gate must say so.
    (The run, shared with the sign-off report's browser test, is in tests/e2e/conftest.py.)"""
    proc, summary, _ = overcommitted_run
    gates = {g["id"]: g for g in summary["gates"]}
    live = gates["tiny-cpu-overcommitted/concurrency/long-sequences"]
    assert live["status"] == "FAIL", live["message"]
    pre = next(c for c in live["checks"] if c["gate"].endswith(".preemptions"))
    assert pre["status"] == "FAIL" and pre["measured"]["value"] >= 1 and pre["measured"]["unit"] == "preemptions"
    assert "preemptions" in live["message"]
    assert gates["tiny-cpu-overcommitted/fit/kv-pool"]["status"] == "FAIL"
