"""``kvgate report``: render ``reports/allure-results`` into the HTML report
``reports/allure-report/`` with the Allure 3 CLI (npm package ``allure``) and write
``reports/signoff.md``.

The report is named after the run (``kvgate tiny-cpu @ http://127.0.0.1:8000/v1 — PASS``), groups
results by epic/feature/story (profile/gate/case), uses the results' ``categories.json``
(:data:`kvgate.report.allure_meta.CATEGORIES`) and carries Allure's history from the previous report in
the same directory (``allure-report/history.jsonl``), so the trend shows when a gate started
failing. The Allure CLI is found by :func:`find_allure`; ``./bootstrap`` installs it into
``.venv/allure`` when Node.js is present.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from kvgate.report.allure_meta import CATEGORIES

REPORT_DIR = "allure-report"
HISTORY = "history.jsonl"
#: The Allure CLI version ./bootstrap installs (npm ``allure``).
ALLURE_VERSION = "3.18.0"


class RenderError(Exception):
    """The HTML report could not be rendered: no Allure CLI, no results, or the CLI failed (one line)."""


def find_allure(env: Mapping[str, str] | None = None, prefix: str | None = None,
                which: Callable[[str], str | None] = shutil.which) -> list[str] | None:
    """The Allure 3 CLI as a command list: ``$KVGATE_ALLURE`` if set, else the one ``./bootstrap``
    installed (``<venv>/allure/node_modules/.bin/allure``), else ``allure`` on PATH. None when
    there is none (or no ``node`` to run the bootstrap one)."""
    env = os.environ if env is None else env
    if env.get("KVGATE_ALLURE"):
        return [env["KVGATE_ALLURE"]]
    local = Path(prefix or sys.prefix) / "allure" / "node_modules" / ".bin" / "allure"
    if local.is_file() and which("node"):
        return [str(local)]
    on_path = which("allure")
    return [on_path] if on_path else None


def open_command(allure: list[str] | None, output: Path) -> str:
    """The shell command that serves the HTML report in ``output``, runnable as printed: the Allure
    CLI :func:`find_allure` found (the one ``./bootstrap`` installed, which works offline -- ``npx
    allure`` would try to download it, as on a GPU runner without a registry), each word quoted
    for the shell (a path with spaces). Without a CLI, ``allure open DIR`` after installing one."""
    return shlex.join([*(allure or ["allure"]), "open", str(output)])


NO_ALLURE = ("the Allure 3 CLI was not found: install Node.js (>= 20) and re-run ./bootstrap (it installs the npm "
             f"package allure@{ALLURE_VERSION} into .venv/allure), or `npm install -g allure@3`, or set "
             "KVGATE_ALLURE to its path")


def report_name(summary: Mapping[str, Any] | None) -> str:
    """``kvgate PROFILE @ ENDPOINT — OVERALL`` from a summary.json (``kvgate run`` without one)."""
    if not summary:
        return "kvgate run"
    where = f" @ {summary['endpoint']}" if summary.get("endpoint") else ""
    return f"kvgate {summary.get('profile') or '(no profile)'}{where} — {summary.get('overall') or '?'}"


def allure_config(name: str, history: Path, categories: list[dict[str, Any]], single_file: bool = False
                  ) -> dict[str, Any]:
    """The ``allurerc.json`` kvgate renders with: report name, history file, categories, and the
    Awesome report grouped by epic/feature/story (profile/gate/case)."""
    return {
        "name": name,
        "historyPath": str(history),
        "categories": categories,
        "plugins": {"awesome": {"options": {"groupBy": ["epic", "feature", "story"], "singleFile": single_file,
                                            "reportName": name}}},
    }


def render(results: Path, output: Path, name: str, allure: Sequence[str], single_file: bool = False,
           run: Callable[..., subprocess.CompletedProcess] = subprocess.run, timeout_s: float = 300) -> Path:
    """Render ``results`` into ``output`` (replaced as a whole, its ``history.jsonl`` carried over
    and extended by this run). Returns ``output``. Raises :class:`RenderError` when ``results``
    has no results or the CLI fails (its last output lines in the message)."""
    # absolute: the CLI runs in a temporary directory, where a relative path would not resolve
    results, output = Path(results).resolve(), Path(output).resolve()
    if not results.is_dir() or not any(results.glob("*-result.json")):
        raise RenderError(f"no Allure results in {results} (run the gates first: pytest --profile NAME)")
    cats_file = results / "categories.json"
    try:
        categories = json.loads(cats_file.read_text()) if cats_file.is_file() else CATEGORIES
    except ValueError:
        categories = CATEGORIES
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".allure-render-", dir=output.parent) as tmp:
        work = Path(tmp)
        history = work / HISTORY
        if (output / HISTORY).is_file():
            shutil.copyfile(output / HISTORY, history)
        config = work / "allurerc.json"
        config.write_text(json.dumps(allure_config(name, history, categories, single_file), indent=2))
        fresh = work / "report"
        try:
            proc = run([*allure, "generate", "--config", str(config), "--output", str(fresh), str(results.resolve())],
                       cwd=work, capture_output=True, text=True, timeout=timeout_s,
                       env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"})
        except subprocess.TimeoutExpired:
            raise RenderError(f"allure generate did not finish in {timeout_s:.0f} s") from None
        except OSError as exc:
            raise RenderError(f"cannot run {allure[0]}: {exc.strerror or exc}") from None
        if proc.returncode != 0 or not (fresh / "index.html").is_file():
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            # the error line itself, not only the stack under it
            said = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("at ")]
            tail = " | ".join(dict.fromkeys((said[-3:] if said else []) + lines[-2:]))
            raise RenderError(f"allure generate failed (exit {proc.returncode}): {tail}")
        if history.is_file():
            shutil.copyfile(history, fresh / HISTORY)
        if output.exists():
            shutil.rmtree(output)
        fresh.rename(output)
    return output
