"""The session guard on the checkout's reports/ (tests/conftest.py): it counts what a gate run
writes there (summary.json, junit.xml, allure-results/, vllm-server.log, ...), never what a user's
``kvgate report`` writes meanwhile (signoff.md, allure-report/)."""

from __future__ import annotations

import os

from kvgate.report import outputs

from .conftest import reports_changes, reports_guard_message, reports_snapshot


def _touch(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))  # a later mtime even on coarse clocks


def _last_run(root):
    for name in ("summary.json", "junit.xml", "vllm-server.log", "allure-results/a-result.json"):
        _touch(root / name, "{}")
    _touch(root / "signoff.md", "# kvgate tiny-cpu — PASS")
    _touch(root / "allure-report" / "index.html", "<html>")


def test_kvgate_report_in_the_same_checkout_is_not_counted(tmp_path):
    _last_run(tmp_path)
    before = reports_snapshot(tmp_path)
    # what `kvgate report` does: signoff.md rewritten, allure-report/ replaced, a render dir on the way
    _touch(tmp_path / "signoff.md", "# kvgate tiny-cpu — PASS (again)")
    (tmp_path / "allure-report" / "index.html").unlink()
    _touch(tmp_path / "allure-report" / "index.html", "<html>new")
    _touch(tmp_path / "allure-report" / "history.jsonl", "{}\n")
    _touch(tmp_path / ".allure-render-abc" / "allurerc.json", "{}")
    _touch(tmp_path / "notes.txt", "mine")  # and a user's own file
    assert reports_changes(before, reports_snapshot(tmp_path)) == []


def test_a_gate_run_in_the_checkout_is_counted(tmp_path):
    _last_run(tmp_path)
    before = reports_snapshot(tmp_path)
    _touch(tmp_path / "summary.json", '{"overall": "PASS", "run": "new"}')  # rewritten
    (tmp_path / "vllm-server.log").unlink()  # a run clears the previous log
    _touch(tmp_path / "allure-results" / "b-result.json", "{}")  # new results
    _touch(tmp_path / "soak-rounds.csv", "round\n")
    changes = reports_changes(before, reports_snapshot(tmp_path))
    assert changes == ["+ allure-results/b-result.json", "+ soak-rounds.csv", "~ summary.json",
                       "- vllm-server.log"]
    msg = reports_guard_message(changes, tmp_path)
    assert str(tmp_path) in msg and "~ summary.json" in msg and "--kvgate-reports" in msg
    assert "`kvgate report`'s signoff.md and allure-report/ are not counted" in msg


def test_reports_dir_appearing_with_run_outputs_is_counted_and_without_them_not(tmp_path):
    root = tmp_path / "reports"
    before = reports_snapshot(root)
    assert before is None
    _touch(root / "signoff.md")
    assert reports_changes(before, reports_snapshot(root)) == []
    _touch(root / "junit.xml")
    assert reports_changes(before, reports_snapshot(root)) == ["+ junit.xml"]


def test_the_guard_watches_every_run_output_but_signoff():
    from .conftest import _run_outputs

    watched = set(_run_outputs())
    assert {outputs.SUMMARY, outputs.JUNIT, outputs.ALLURE, outputs.SERVER_LOG, outputs.OVERLAY,
            outputs.POOLS_DIR, *outputs.SOAK_FILES} <= watched
    assert outputs.SIGNOFF not in watched and "allure-report" not in watched
