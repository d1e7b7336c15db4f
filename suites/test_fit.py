"""Fit gate: does the declared concurrency fit the KV cache? Pure arithmetic; needs no server.

``pytest --profile NAME -m fit`` runs only this gate and prints the per-GPU fit table.
"""

import pytest

from kvgate.fit import fit_table, fit_verdict

pytestmark = pytest.mark.fit


def test_fit(kvgate_profile, kvgate_gate):
    """KV bytes/token x max_model_len x declared concurrency vs the KV pool; weights + KV + reserves vs memory."""
    kvgate_gate(fit_verdict(kvgate_profile), attachments={"fit-table.txt": fit_table(kvgate_profile)}, console=True)
