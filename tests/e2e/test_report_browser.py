"""The sign-off report as a release owner sees it: ``kvgate report`` renders real runs' results with
the Allure 3 CLI and headless Chromium (Debian's ``chromium``) opens the pages, served over HTTP
from 127.0.0.1 on a free port (the report is a single-page app).

- a real run on the embedded vLLM (``tiny-cpu-overcommitted``: fit and concurrent-long FAIL, the
  deployment gates PASS; shared with test_overcommitted.py, see conftest.py): the overview's counts,
  name and environment block, a FAILed gate's page (message, measured, limit, attachments), the
  history carried into a second render;
- a run against the fake server (a FAIL, an INVALID, a PASS; an API key in play): the categories
  page separates the deployment defect from the untrusted measurement, and no page, file or
  signoff.md of it holds the key.

Screenshots go to ``<the run's reports dir>/screenshots/``. The module skips, saying why, only
where Chromium or the Allure CLI (Node) is not installed (``.ci/run`` installs Chromium with apt;
``./bootstrap`` installs the Allure CLI when Node is present). Chromium runs the pages on virtual
time (``--virtual-time-budget``) and nothing here is timed, so the module runs beside the unit tests
(tests/conftest.py E2E_BESIDE_UNITS).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from kvgate.report.render import NO_ALLURE, find_allure
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from ..conftest import REPO, validate_summary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
SECRET = "sk-kvgate-browser-5c4b3a29"
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
#: ms of virtual time Chromium lets the single-page app run before it dumps the DOM / screenshots.
RENDER_BUDGET_MS = 8000


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it "
                    "as root) -- the rendered report cannot be opened")
    return path


@pytest.fixture(scope="module")
def tools() -> tuple[str, list[str]]:
    allure = find_allure()
    if allure is None:
        pytest.skip(f"cannot render the HTML report: {NO_ALLURE}")
    return chromium(), allure


def kvgate_report(reports: Path, allure: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kvgate", "report", f"--reports={reports}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "KVGATE_ALLURE": allure[0]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@contextmanager
def served(directory: Path) -> Iterator[str]:
    """``directory`` over HTTP on 127.0.0.1, a free port; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def page(browser: str, url: str, shot: Path | None = None) -> str:
    """The rendered page's visible text (Chromium ``--dump-dom``, tags and scripts stripped); with
    ``shot``, also a 1400x1400 screenshot there."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--virtual-time-budget={RENDER_BUDGET_MS}", "--window-size=1400,1400"]
    if shot is not None:
        shot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*cmd, f"--screenshot={shot}", url], capture_output=True, timeout=120)
        assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot of {url}"
    dom = subprocess.run([*cmd, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")
    return re.sub(r"\s+", " ", text)


def result_id(report: Path, title: str) -> str:
    """The report's id of the result titled ``title`` (its page is ``#/<id>``)."""
    for p in (report / "data" / "test-results").glob("*.json"):
        if json.loads(p.read_text()).get("name") == title:
            return p.stem
    raise AssertionError(f"no result titled {title!r} in {report}")


# ---------------------------------------------------------------------------------- real run
@pytest.fixture(scope="module")
def real_report(overcommitted_run, tools):
    _, summary, reports = overcommitted_run
    t0 = time.monotonic()
    kvgate_report(reports, tools[1])
    return summary, reports, time.monotonic() - t0


def test_overview_shows_the_run_its_counts_and_environment(real_report, tools):
    summary, reports, render_s = real_report
    counts = summary["counts"]
    assert counts["FAIL"] >= 2 and counts["PASS"] >= 3, counts
    with served(reports / "allure-report") as url:
        text = page(tools[0], url, reports / "screenshots" / "overview.png")
    assert f"kvgate tiny-cpu-overcommitted @ {summary['endpoint']} — FAIL" in text
    assert f"Total {len(summary['gates'])}" in text
    assert f"Failed {counts['FAIL']}" in text and f"Passed {counts['PASS']}" in text
    assert "profile tiny-cpu-overcommitted" in text and f"server_version {summary['server_version']}" in text
    assert "Quality Gates" in text and "suites" not in text.split("Sort by")[1][:200], "grouped by gate, not 'suites'"
    for gate in ("fit", "concurrency", "deployment"):
        assert f" {gate} " in text
    print(f"kvgate report (signoff.md + allure generate) took {render_s:.1f} s")


def test_failed_gate_page_shows_message_measured_limit_and_attachments(real_report, tools):
    summary, reports, _ = real_report
    gate = next(g for g in summary["gates"] if g["id"] == "tiny-cpu-overcommitted/fit/kv-pool")
    assert gate["status"] == "FAIL"
    report = reports / "allure-report"
    with served(report) as url:
        text = page(tools[0], f"{url}#/{result_id(report, gate['id'])}", reports / "screenshots" / "failed-gate.png")
    assert gate["id"] in text and "Failed" in text and "Critical" in text
    assert gate["message"][:60].replace("  ", " ") in text
    measured = f"{gate['measured']['value']:,} {gate['measured']['unit']}"
    limit = f"{gate['limit']['value']:,} {gate['limit']['unit']}"
    assert f"measured {measured}" in text and f"limit {limit}" in text, (measured, limit)
    assert "Attachments" in text and "fit-table.txt" in text and "verdict fit" in text
    assert "host " not in text and "thread " not in text and "<lambda>" not in text
    assert "Category: Deployment defects (FAIL)" in text


def test_history_is_carried_into_the_next_report(real_report, tools):
    _, reports, _ = real_report
    report = reports / "allure-report"
    kvgate_report(reports, tools[1])  # the same run rendered again: the first render is now history
    lines = (report / "history.jsonl").read_text().splitlines()
    assert len(lines) == 2
    fit = json.loads((report / "data" / "test-results" / f"{result_id(report, 'tiny-cpu-overcommitted/fit/kv-pool')}.json")
                     .read_text())
    assert [h["status"] for h in fit["history"]] == ["failed"]
    with served(report) as url:
        text = page(tools[0], f"{url}#/{result_id(report, 'tiny-cpu-overcommitted/fit/kv-pool')}/history",
                    reports / "screenshots" / "history.png")
    assert re.search(r"History 1 .*\d+/\d+/\d{4} at \d+:\d+", text), "the earlier render is listed in History"


# ---------------------------------------------------------------------------------- fake run
@pytest.fixture(scope="module")
def fake_reports(tmp_path_factory, tools):
    """A run against the fake: TTFT 700 ms vs a 500 ms SLO (FAIL), a disconnect that cannot be
    told from completion (INVALID), the served model (PASS); the API key in $KVGATE_BROWSER_KEY."""
    reports = tmp_path_factory.mktemp("fake-run") / "reports"
    with FakeVLLM(FakeConfig(max_tokens_cap=64, ttft_s=0.7, api_key=SECRET)) as fake:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--profile={FAKE_PROFILE}",
             f"--endpoint={fake.url}", "--api-key-env=KVGATE_BROWSER_KEY", f"--kvgate-reports={reports}",
             "suites/test_deployment.py", "suites/test_streaming.py", "suites/test_disconnect.py",
             "-k", "served or ttft/chat or mid-request"],
            cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "KVGATE_BROWSER_KEY": SECRET})
    summary = validate_summary(json.loads((reports / "summary.json").read_text()))
    assert {g["status"] for g in summary["gates"]} == {"PASS", "FAIL", "INVALID"}, proc.stdout[-3000:]
    kvgate_report(reports, tools[1])
    return reports


def test_categories_separate_a_deployment_defect_from_an_untrusted_measurement(fake_reports, tools):
    report = fake_reports / "allure-report"
    with served(report) as url:
        cats = page(tools[0], f"{url}#/categories", fake_reports / "screenshots" / "categories.png")
        invalid = page(tools[0], f"{url}#/{result_id(report, 'fake-vllm/disconnect/mid-request')}")
    assert "Deployment defects (FAIL) 1" in cats and "Untrusted measurements (INVALID) 1" in cats
    assert "Category: Untrusted measurements (INVALID)" in invalid


def test_no_secret_in_any_rendered_page_file_or_signoff(fake_reports, tools):
    report = fake_reports / "allure-report"
    for p in [*report.rglob("*"), fake_reports / "signoff.md"]:
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
    with served(report) as url:  # the files hold every page's data; two pages as the browser shows them
        pages = [page(tools[0], url), page(tools[0], f"{url}#/{result_id(report, 'fake-vllm/streaming/ttft/chat')}")]
    assert all(SECRET not in text for text in pages) and "fake-vllm/streaming/ttft/chat" in pages[1]
    assert "— FAIL" in (fake_reports / "signoff.md").read_text().splitlines()[0]
