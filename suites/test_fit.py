"""Fit gate: does the declared concurrency fit the KV cache? Pure arithmetic; needs no server.

``pytest --profile NAME -m fit`` runs only this gate and prints the per-GPU fit table. The
live-pool check (predicted KV capacity vs vLLM's own ``vllm:cache_config_info``) needs a server
and runs with the deployment gate.
"""

import pytest

from kvgate.gates.deployment import served_max_model_len
from kvgate.gates.fit import fit_table, fit_verdict, live_pool_verdict
from kvgate.http.probes import observe_deployment
from kvgate.http.metrics import cache_config, parse
from kvgate.report.plots import checks_png
from kvgate.verdict import Status, Verdict


@pytest.mark.fit
@pytest.mark.gate("fit", cases=["kv-pool"])
def test_fit(case, kvgate_profile, kvgate_gate):
    """KV bytes/token x max_model_len x declared concurrency vs the KV pool; weights + KV + reserves vs memory."""
    verdict = fit_verdict(kvgate_profile)
    shown = {"fit-table.txt": fit_table(kvgate_profile),
             "fit.png": checks_png(verdict, f"{kvgate_profile.name}: what the KV pool holds vs what the profile declares")}
    assert kvgate_gate(verdict, attachments=shown, console=True).passed


@pytest.mark.deployment
@pytest.mark.gate("fit", cases=["live-pool"])
def test_predicted_pool_matches_vllm(case, kvgate_client, kvgate_profile, kvgate_gate):
    """The arithmetic's KV token capacity vs the one vLLM allocated (within one block when exact); a block count
    that differs is read back as the KV element size it means (2 B under a float32 profile: bfloat16 served)."""
    text = kvgate_client.metrics_text()
    labels = cache_config(parse(text)) if text else None
    if labels is None:
        kvgate_gate(Verdict("fit/live-pool", Status.SKIP, "server exposes no vllm:cache_config_info; "
                            "predicted KV pool not comparable"))  # skips the test
    served, source = None, ""
    if kvgate_profile.engine.max_model_len_auto:  # vLLM chose the length: the arithmetic uses the one it serves
        served, source = served_max_model_len(observe_deployment(kvgate_client, kvgate_profile.model.served_name),
                                              kvgate_profile)
        source = source if served is not None else f"not read: {source}"
    assert kvgate_gate(live_pool_verdict(kvgate_profile, labels, served, source)).passed
