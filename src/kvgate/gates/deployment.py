"""Gate ``deployment``: the live server matches the profile -- served model name, ``max_model_len``
(``/v1/models`` and ``/tokenize``), cache config (``vllm:cache_config_info``). Asserted by
``suites/test_deployment.py``; observations come from :func:`kvgate.http.probes.observe_deployment`.
"""

from __future__ import annotations

from typing import Any

from kvgate.http.metrics import MetricsError, cache_config, parse
from kvgate.http.probes import DeploymentObservation
from kvgate.profile.models import Profile
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, SKIP, json_body, num




def served_model_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """The profile's ``model.served_name`` is listed by ``/v1/models``."""
    gate, want = "deployment/served-model", profile.model.served_name
    body = json_body(obs.models)
    ev = {"status": obs.models.status, "body": obs.models.text[:800], "version": obs.version}
    if obs.models.status != 200 or body is None or not isinstance(body.get("data"), list):
        return Verdict(gate, FAIL, f"{obs.models_path} answered {obs.models.status} without a model list "
                       f"({obs.models.text[:120]!r}) -> FAIL", measured=obs.models.status, limit=200, unit="HTTP status",
                       evidence=ev)
    ids = [m.get("id") for m in body["data"] if isinstance(m, dict)]
    if want not in ids:
        return Verdict(gate, FAIL, f"served models {ids}; profile declares {want!r} -> FAIL (model not served)",
                       measured=", ".join(str(i) for i in ids) or "no models", limit=want, evidence=ev)
    return Verdict(gate, PASS, f"serves {want!r} (vLLM {obs.version or 'version unknown'}) -> PASS",
                   measured=want, limit=want, evidence=ev)


def max_model_len_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """``max_model_len`` advertised by the ``/v1/models`` card and by ``/tokenize`` equals the
    profile's ``engine.max_model_len`` (tokens). Either source may be absent (KServe's route has
    no ``max_model_len``); both absent -> SKIP with the reason."""
    gate, want = "deployment/max-model-len", profile.engine.max_model_len
    seen: dict[str, Any] = {}
    body = json_body(obs.models)
    if body and isinstance(body.get("data"), list):
        for card in body["data"]:
            if isinstance(card, dict) and card.get("id") == profile.model.served_name and "max_model_len" in card:
                seen["/v1/models"] = card["max_model_len"]
    if obs.tokenize is not None:
        tb = json_body(obs.tokenize)
        if obs.tokenize.status == 200 and tb and "max_model_len" in tb:
            seen["/tokenize"] = tb["max_model_len"]
    ev = {"advertised": seen, "profile": want, "version": obs.version}
    if not seen:
        return Verdict(gate, SKIP, "server advertises no max_model_len (/v1/models card and /tokenize lack it); "
                       "the max-context gate checks enforcement instead", limit=want, unit="tokens", evidence=ev)
    wrong = {src: v for src, v in seen.items() if v != want}
    if wrong:
        parts = ", ".join(f"{src} says {num(v)}" for src, v in wrong.items())
        return Verdict(gate, FAIL, f"max_model_len: {parts}; profile declares {num(want)} tokens -> FAIL",
                       measured=next(iter(wrong.values())), limit=want, unit="tokens", evidence=ev)
    srcs = " and ".join(seen)
    return Verdict(gate, PASS, f"max_model_len {num(want)} tokens per {srcs} -> PASS", measured=want, limit=want,
                   unit="tokens", evidence=ev)


#: profile engine field -> vllm:cache_config_info label
CACHE_LABELS = {
    "block_size": "block_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_dtype": "cache_dtype",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
}
#: unit of each checked cache setting
CACHE_UNITS = {"block_size": "tokens", "gpu_memory_utilization": "ratio", "kv_cache_dtype": None,
               "kv_cache_memory_bytes": "bytes"}


def _label_value(label: str | None) -> Any:
    """A ``vllm:cache_config_info`` label as a number when it is one, else the string."""
    try:
        f = float(label)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return label
    return int(f) if f.is_integer() else f


def _same(declared: Any, label: str) -> bool:
    try:
        return abs(float(declared) - float(label)) < 1e-9
    except (TypeError, ValueError):
        return str(declared) == label


def cache_config_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """Cache settings the profile states (block_size, gpu_memory_utilization, kv_cache_dtype,
    kv_cache_memory_bytes) equal the labels of ``vllm:cache_config_info``. Settings the profile
    leaves unset are not checked; a server without that metric -> SKIP, named."""
    gate = "deployment/cache-config"
    declared = {f: getattr(profile.engine, f) for f in CACHE_LABELS if getattr(profile.engine, f) is not None}
    if obs.metrics_text is None:
        return Verdict(gate, SKIP, "server exposes no /metrics; cache config not verifiable", limit=declared)
    try:
        labels = cache_config(parse(obs.metrics_text))
    except MetricsError as exc:
        return Verdict(gate, FAIL, f"{exc} -> FAIL", evidence={"metrics_head": obs.metrics_text[:500]})
    if labels is None:
        return Verdict(gate, SKIP, "/metrics has no vllm:cache_config_info; cache config not verifiable",
                       limit=declared)
    ev = {"cache_config_info": labels, "declared": declared, "version": obs.version}
    wrong = {f: (v, labels.get(CACHE_LABELS[f])) for f, v in declared.items()
             if not _same(v, labels.get(CACHE_LABELS[f], ""))}
    checks = tuple(Verdict(f"cache-config.{f}", FAIL if f in wrong else PASS,
                           f"{f} is {labels.get(CACHE_LABELS[f])!r}, profile declares {v!r} -> "
                           f"{'FAIL' if f in wrong else 'PASS'}", measured=_label_value(labels.get(CACHE_LABELS[f])),
                           limit=v, unit=CACHE_UNITS[f]) for f, v in declared.items())
    if wrong:
        parts = ", ".join(f"{f} is {got!r}, profile declares {want!r}" for f, (want, got) in wrong.items())
        first = next(c for c in checks if c.status is FAIL)
        return Verdict(gate, FAIL, f"cache config: {parts} -> FAIL", measured=first.measured, limit=first.limit,
                       unit=first.unit, evidence=ev, parts=checks)
    shown = ", ".join(f"{f}={v}" for f, v in declared.items()) or "nothing stated"
    return Verdict(gate, PASS, f"cache config matches ({shown}; block_size {labels.get('block_size')}, "
                   f"{labels.get('num_gpu_blocks')} blocks) -> PASS", evidence=ev, parts=checks)
