"""Shared fixtures for kvgate's own tests."""

from __future__ import annotations

import json
import signal
from pathlib import Path

# Import lazily-loaded HTTP stacks up front: pytester's in-process runs drop modules first
# imported inside them, and httpx imports httpcore lazily -- a re-imported httpcore then has new
# exception classes that httpx no longer maps (httpcore.ConnectError escaping as an INTERNALERROR).
import httpcore  # noqa: F401
import httpx  # noqa: F401
import openai  # noqa: F401
import pytest

httpx.HTTPTransport()  # instantiating triggers httpx's own lazy imports of httpcore internals

REPO = Path(__file__).resolve().parents[1]

# A shell starts a backgrounded job (`.ci/run &`, nohup, some CI runners) with SIGINT ignored, and
# an ignored signal stays ignored across exec: the interrupt tests' Ctrl-C (to this process and to
# the pytest/kvgate subprocesses they start) would then never arrive. kvgate's own tests need a
# working Ctrl-C, so give this process Python's handler back; children then start with SIGINT at
# its default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def write_profile(tmp_path: Path):
    """Write a YAML profile into tmp_path and return its path."""

    def write(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p

    return write


MINIMAL = """\
model:
  served_name: m
  architecture: {layers: 2, attention_heads: 4, kv_heads: 2, head_dim: 64}
engine:
  max_model_len: 256
"""


# ---------------------------------------------------------------------------- summary schema
def validate_summary(summary: dict) -> dict:
    """Validate a summary.json document against kvgate's JSON Schema; return it. Every test that
    makes kvgate write a summary reads it through here (or :func:`read_summary`)."""
    import jsonschema

    from kvgate.report.record import SUMMARY_SCHEMA

    schema = json.loads(SUMMARY_SCHEMA.read_text())
    jsonschema.validate(summary, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return summary


def read_summary(reports: Path) -> dict:
    """``reports/summary.json``, parsed and validated against the schema."""
    return validate_summary(json.loads((reports / "summary.json").read_text()))


# ---------------------------------------------------------------------------- the checkout's reports/
CHECKOUT_REPORTS = REPO / "reports"


def reports_snapshot(root: Path = CHECKOUT_REPORTS) -> dict[str, tuple[int, int]] | None:
    """``{relative path: (mtime_ns, size)}`` of every file under ``root`` (None when absent)."""
    if not root.exists():
        return None
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session", autouse=True)
def checkout_reports_untouched():
    """kvgate's own tests never write into the checkout's ``reports/`` (a user's last real run
    lives there): every pytester/subprocess run must pass ``--kvgate-reports`` a tmp dir. Checked
    once, at the end of the session."""
    before = reports_snapshot()
    yield
    after = reports_snapshot()
    assert after == before, (f"kvgate's own tests wrote into {CHECKOUT_REPORTS}: "
                             f"{sorted(set((after or {}).items()) ^ set((before or {}).items()))[:10]}")
