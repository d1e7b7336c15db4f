"""Which e2e runs CI makes: the tier switch, in a module of its own so that test_embedded.py (which
conftest.py imports) can use it too."""

from __future__ import annotations

import os

import pytest

#: ``KVGATE_E2E_FULL=1``: also the e2e runs CI leaves out for its 30-minute budget, each a second
#: real-vLLM proof of something a fake-based test or another e2e run already shows (their skip
#: reasons say which). Before a release, run ``KVGATE_E2E_FULL=1 .venv/bin/pytest tests/e2e``.
FULL = os.environ.get("KVGATE_E2E_FULL") == "1"


def full_only(why: str):
    """Skip unless ``KVGATE_E2E_FULL=1``, saying what already proves it."""
    return pytest.mark.skipif(not FULL, reason=f"{why}; runs with KVGATE_E2E_FULL=1 (CI's 30-minute budget)")
