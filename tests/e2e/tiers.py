"""Which e2e runs CI makes: the tier switch, in a module of its own so that test_embedded.py (which
conftest.py imports) can use it too."""

from __future__ import annotations

import os

#: ``KVGATE_E2E_FULL=1``: the extras CI does not make, none of them a proof of its own -- the
#: attention families that share Llama's geometry started live (Qwen3, Mixtral; their predictions
#: are asserted always) and the main job's soak at tiny-cpu's own length instead of 48 s. Every
#: other e2e proof runs in CI. Before a release: ``KVGATE_E2E_FULL=1 .venv/bin/pytest tests/e2e``.
FULL = os.environ.get("KVGATE_E2E_FULL") == "1"
