"""``kvgate lint PROFILE``: what a profile asks of vLLM that cannot work, before anything starts.

Each rule (:data:`RULES`) returns :class:`Finding` objects naming the field, the values and where
the rule comes from. Severity ``error``: vLLM refuses the command line or cannot start (or the
argument does not exist in the declared version); ``warning``: it starts, but not as written.
Engine arguments are checked against vLLM's own serve parser for the declared version
(:mod:`kvgate.launch.vllm_args`: a snapshot of the parser, plus the documented changes table).

A finding the profile's author has thought about is *explained* in the file with a comment
naming the rule and the reason, anywhere in the profile (or a profile it ``extends``)::

    # kvgate-lint: allow engine-default-changed -- this profile shows vLLM's defaults on purpose

An explained finding is listed but does not count. An allow without a reason is itself a
finding (``lint-allow-reason``).

The gate run lints its profile first (:func:`kvgate.plugin`): findings are printed as warnings,
and under ``--gate-mode certify`` an unexplained finding stops the run.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, TextIO

from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, load_profile, resolve_profile
from kvgate.launch.vllm_args import (CHANGES, FIELD_FLAGS, VllmArgs, declared_version, installed_version,
                                     load_snapshot, parse_version, snapshot_note, version_tuple)

ERROR, WARNING = "error", "warning"
_ALLOW = re.compile(r"#\s*kvgate-lint:\s*allow\s+([a-z0-9-]+)\s*(?:--|:)?\s*(.*)$")


@dataclass(frozen=True)
class Finding:
    """One lint finding: ``rule`` id, ``severity`` (``error``/``warning``), the profile ``field``
    path it concerns, a one-line ``message`` with the values, and ``explained`` (the reason
    given in the profile's allow comment, or ``None``)."""

    rule: str
    severity: str
    field: str
    message: str
    explained: str | None = None

    @property
    def counts(self) -> bool:
        """True unless the profile explains it."""
        return self.explained is None

    def line(self) -> str:
        tail = f" [explained: {self.explained}]" if self.explained else ""
        return f"{self.severity} {self.rule} ({self.field}): {self.message}{tail}"


@dataclass(frozen=True)
class Context:
    """What the rules read: the profile, the vLLM parser snapshot for its declared version, that
    version, and whether the parser snapshot is the declared version's own."""

    profile: Profile
    args: VllmArgs
    declared_version: str
    exact_parser: bool

    @property
    def on_gpu(self) -> bool:
        return self.profile.hardware.gpu.lower() != "cpu"

    @property
    def vllm(self) -> bool:
        return self.profile.engine.runtime == "vllm"


# --------------------------------------------------------------------------------------------
# helpers


def _flags_in(extra_args: Iterable[str]) -> list[str]:
    """The option names in an extra_args list (``--x=1`` -> ``--x``)."""
    return [a.split("=", 1)[0] for a in extra_args if a.startswith("-") and not re.fullmatch(r"-\d.*", a)]


def _set_fields(profile: Profile) -> dict[str, object]:
    e = profile.engine
    out: dict[str, object] = {}
    for name in FIELD_FLAGS:
        value = getattr(e, name, None)
        default = type(e).model_fields[name].get_default(call_default_factory=True)
        if value is not None and value != default:
            out[name] = value
    out["max_model_len"] = e.max_model_len
    return out


def _chunked_prefill(profile: Profile) -> bool | None:
    flags = _flags_in(profile.engine.extra_args)
    if "--no-enable-chunked-prefill" in flags:
        return False
    if "--enable-chunked-prefill" in flags:
        return True
    return None


# --------------------------------------------------------------------------------------------
# rules: each takes the Context and yields findings


def rule_vllm_version(c: Context) -> Iterable[Finding]:
    """A declared vLLM version that is not a version (``engine.vllm_version: banana``): every
    engine-argument rule would silently check against an arbitrary snapshot."""
    try:
        parse_version(c.declared_version)
    except ValueError as exc:
        field = "engine.vllm_version" if c.profile.engine.vllm_version else "(version)"
        yield Finding("vllm-version", ERROR, field, f"{exc}; the engine arguments were checked against the "
                      f"{c.args.version} snapshot instead")


def rule_engine_arg_unknown(c: Context) -> Iterable[Finding]:
    """Engine fields the launcher renders as flags, and ``engine.extra_args`` flags, that the
    declared version's parser does not accept (and no documented change explains)."""
    if not c.vllm:
        return
    documented = {ch.flag for ch in CHANGES}
    for name in _set_fields(c.profile):
        flag = FIELD_FLAGS[name]
        if flag not in c.args.by_flag and flag not in documented:
            yield Finding("engine-arg-unknown", ERROR, f"engine.{name}",
                          f"engine.{name} is rendered as {flag}, which vLLM {c.args.version}'s parser does not accept")
    for flag in _flags_in(c.profile.engine.extra_args):
        if flag in c.args.by_flag or flag in documented:
            continue
        close = difflib.get_close_matches(flag, list(c.args.by_flag), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        how = ("its own parser" if c.exact_parser else
               f"the parser of vLLM {c.args.version} (the nearest snapshot kvgate has)")
        yield Finding("engine-arg-unknown", ERROR, "engine.extra_args",
                      f"{flag} is not a vllm serve argument in vLLM {c.declared_version} ({how}){hint}")


def rule_engine_arg_changed(c: Context) -> Iterable[Finding]:
    """Flags removed or renamed by the declared version (from :data:`kvgate.launch.vllm_args.CHANGES`)."""
    if not c.vllm:
        return
    flags = set(_flags_in(c.profile.engine.extra_args))
    v = version_tuple(c.declared_version)
    for ch in CHANGES:
        if ch.kind not in ("removed", "renamed") or ch.flag not in flags:
            continue
        if v >= version_tuple(ch.version):
            instead = f"; use {ch.replacement}" if ch.replacement else ""
            yield Finding(f"engine-arg-{ch.kind}", ERROR, "engine.extra_args",
                          f"{ch.flag} was {ch.kind} in vLLM {ch.version} ({ch.detail}); the profile declares "
                          f"{c.declared_version}{instead} [source: {ch.source}]")
        elif ch.kind == "renamed":
            yield Finding("engine-arg-renamed", WARNING, "engine.extra_args",
                          f"{ch.flag} is accepted by vLLM {c.declared_version} but refused from {ch.version} "
                          f"(use {ch.replacement}) [source: {ch.source}]")


def rule_engine_arg_value(c: Context) -> Iterable[Finding]:
    """Engine field values outside the choices the declared version's parser allows."""
    if not c.vllm:
        return
    for name in ("kv_cache_dtype", "dtype", "tool_strict_level", "max_lora_rank"):
        value = getattr(c.profile.engine, name, None)
        flag = FIELD_FLAGS[name]
        spec = c.args.by_flag.get(flag)
        if value is None or spec is None or not spec.choices or str(value) in spec.choices:
            continue
        yield Finding("engine-arg-value", ERROR, f"engine.{name}",
                      f"{flag} {value} is not accepted by vLLM {c.args.version}'s parser (choices: "
                      f"{', '.join(spec.choices)})")


def rule_engine_default_changed(c: Context) -> Iterable[Finding]:
    """GPU profiles that leave a field to vLLM's default where that default changed across
    versions: the deployment's value then depends on the image, not the profile."""
    if not (c.vllm and c.on_gpu):
        return
    for ch in CHANGES:
        if ch.kind != "default" or ch.field is None:
            continue
        if getattr(c.profile.engine, ch.field, None) is None and not (
                ch.field == "gpu_memory_utilization" and c.profile.engine.kv_cache_memory_bytes):
            yield Finding("engine-default-changed", WARNING, f"engine.{ch.field}",
                          f"left to vLLM's default, which changed ({ch.detail}); write the value down "
                          f"[source: {ch.source}]")


def rule_extra_args_duplicate(c: Context) -> Iterable[Finding]:
    """A flag in ``extra_args`` that an engine field already sets: two values on one command line."""
    set_fields = _set_fields(c.profile)
    by_flag = {flag: name for name, flag in FIELD_FLAGS.items()}
    for flag in _flags_in(c.profile.engine.extra_args):
        base = flag.replace("--no-", "--", 1)
        name = by_flag.get(base)
        if name is not None and name in set_fields:
            yield Finding("extra-args-duplicate", ERROR, "engine.extra_args",
                          f"{flag} repeats engine.{name} ({set_fields[name]!r}); set it in one place")


def rule_batched_below_len(c: Context) -> Iterable[Finding]:
    """``max_num_batched_tokens < max_model_len`` without chunked prefill, and
    ``max_num_batched_tokens < max_num_seqs``: vLLM's ``SchedulerConfig.verify_max_model_len``
    raises ValueError for both (config/scheduler.py, 0.32)."""
    e = c.profile.engine
    if not c.vllm or e.max_num_batched_tokens is None:
        return
    if e.max_num_batched_tokens < e.max_model_len and _chunked_prefill(c.profile) is False:
        yield Finding("batched-below-len", ERROR, "engine.max_num_batched_tokens",
                      f"max_num_batched_tokens {e.max_num_batched_tokens:,} < max_model_len {e.max_model_len:,} with "
                      "chunked prefill disabled (--no-enable-chunked-prefill): vLLM refuses to start "
                      "(config/scheduler.py::verify_max_model_len); raise it or enable chunked prefill")
    if e.max_num_seqs is not None and e.max_num_batched_tokens < e.max_num_seqs:
        yield Finding("batched-below-len", ERROR, "engine.max_num_batched_tokens",
                      f"max_num_batched_tokens {e.max_num_batched_tokens:,} < max_num_seqs {e.max_num_seqs}: vLLM "
                      "refuses to start (config/scheduler.py::verify_max_model_len)")


def rule_tp_heads(c: Context) -> Iterable[Finding]:
    """TP must divide the attention heads (``config/model.py::verify_with_parallel_config``) and
    either divide the KV heads or be a multiple of them (``QKVParallelLinear``: ``divide(tp,
    kv_heads)`` when TP >= kv_heads, else ``divide(kv_heads, tp)``)."""
    arch = c.profile.model.architecture
    tp = c.profile.engine.tensor_parallel_size
    if not c.vllm or arch is None or tp == 1:
        return
    if arch.attention_heads % tp:
        yield Finding("tp-heads", ERROR, "engine.tensor_parallel_size",
                      f"TP {tp} does not divide the {arch.attention_heads} attention heads: vLLM refuses to start "
                      "(config/model.py::verify_with_parallel_config)")
    if arch.kv_heads % tp and tp % arch.kv_heads:
        yield Finding("tp-heads", ERROR, "engine.tensor_parallel_size",
                      f"TP {tp} neither divides the {arch.kv_heads} KV heads nor is a multiple of them: the QKV "
                      "projection cannot be split (model_executor/layers/linear.py::QKVParallelLinear)")


def rule_tp_gpu_count(c: Context) -> Iterable[Finding]:
    """``tensor_parallel_size`` above ``hardware.count`` on a GPU profile."""
    tp, count = c.profile.engine.tensor_parallel_size, c.profile.hardware.count
    if c.vllm and c.on_gpu and tp > count:
        yield Finding("tp-gpu-count", ERROR, "engine.tensor_parallel_size",
                      f"TP {tp} needs {tp} GPUs; hardware.count is {count}")


def rule_kv_pool_below_sequence(c: Context) -> Iterable[Finding]:
    """A KV pool that cannot hold one ``max_model_len`` sequence next to vLLM's null block (the
    fit arithmetic, :func:`kvgate.gates.fit.plan`)."""
    from kvgate.gates.fit import fmt_bytes, plan
    from kvgate.kv.arithmetic import KvMathError

    if not c.vllm:
        return
    try:
        p = plan(c.profile)
    except (KvMathError, ValueError):
        return
    pool = p.pool
    if pool is None:
        return
    if pool.usable_blocks < pool.blocks_per_sequence:
        yield Finding("kv-pool-below-sequence", ERROR, "engine.max_model_len",
                      f"the KV pool ({fmt_bytes(pool.pool_bytes)}{'/GPU' if p.on_gpu else ''}, {pool.usable_blocks:,} "
                      f"usable blocks of {pool.block_size}) holds fewer than one {p.max_model_len:,}-token sequence "
                      f"({pool.blocks_per_sequence:,} blocks): vLLM refuses to start or never schedules it")


def rule_enforce_eager_gpu(c: Context) -> Iterable[Finding]:
    """``enforce_eager`` on a GPU profile: no CUDA graphs, so decode is slower; say why in the file."""
    if c.vllm and c.on_gpu and c.profile.engine.enforce_eager:
        yield Finding("enforce-eager-gpu", WARNING, "engine.enforce_eager",
                      "enforce_eager on a GPU deployment turns CUDA graphs off (slower decode); explain it with "
                      "'# kvgate-lint: allow enforce-eager-gpu -- <reason>'")


def rule_len_over_positions(c: Context) -> Iterable[Finding]:
    """``max_model_len`` above the model's ``max_position_embeddings``: vLLM refuses unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (config/model.py::_get_and_verify_max_len)."""
    arch = c.profile.model.architecture
    e = c.profile.engine
    if not c.vllm or arch is None or not arch.max_position_embeddings:
        return
    if e.max_model_len > arch.max_position_embeddings and e.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        yield Finding("len-over-positions", ERROR, "engine.max_model_len",
                      f"max_model_len {e.max_model_len:,} > the model's max_position_embeddings "
                      f"{arch.max_position_embeddings:,}: vLLM refuses to start (set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                      "in engine.env only if the model really extrapolates)")


def rule_serve_feature(c: Context) -> Iterable[Finding]:
    """Serve-feature fields that cannot work together: ``enable_auto_tool_choice`` without
    ``tool_call_parser`` (vLLM refuses to start: entrypoints/launchers/cli_args.py::
    validate_parsed_serve_args); ``lora_modules`` with ``enable_lora`` off (the static adapters
    load at start-up and fail: v1/worker/lora_model_runner_mixin.py, "LoRA is not enabled");
    a ``lora_modules`` value ``embedded`` on a model kvgate does not build (only the embedded
    tiny model gets built adapters, :func:`kvgate.launch.lora.ensure_adapters`)."""
    from kvgate.launch.lora import EMBEDDED

    e = c.profile.engine
    if not c.vllm:
        return
    if e.enable_auto_tool_choice and not e.tool_call_parser:
        yield Finding("serve-feature", ERROR, "engine.enable_auto_tool_choice",
                      "enable_auto_tool_choice: true without tool_call_parser: vLLM refuses to start "
                      "(--enable-auto-tool-choice requires --tool-call-parser; "
                      "entrypoints/launchers/cli_args.py::validate_parsed_serve_args); set tool_call_parser "
                      "(hermes, llama3_json, mistral, ...)")
    if e.lora_modules and not e.enable_lora:
        yield Finding("serve-feature", ERROR, "engine.lora_modules",
                      f"lora_modules ({', '.join(e.lora_modules)}) with enable_lora false: vLLM fails at start-up "
                      "loading them (\"LoRA is not enabled. Use --enable-lora\", "
                      "v1/worker/lora_model_runner_mixin.py); set enable_lora: true")
    if not c.profile.embedded:
        for name, value in e.lora_modules.items():
            if value == EMBEDDED:
                yield Finding("serve-feature", ERROR, f"engine.lora_modules.{name}",
                              f"lora_modules.{name}: {EMBEDDED} on model {c.profile.model.served_name!r}, which "
                              "kvgate does not build (model.embedded is false): only the embedded tiny model "
                              "gets built adapters; give the adapter's path (or HF id) as the server sees it")


def rule_dtype_mismatch(c: Context) -> Iterable[Finding]:
    """``engine.dtype`` (``--dtype``) a different float dtype than ``model.dtype``: vLLM casts the
    weights to ``--dtype`` as it loads them (``config/model.py::_get_and_verify_dtype``) and, with
    ``kv_cache_dtype: auto``, caches KV in it -- so the server is not the model the profile
    describes, and the fit arithmetic (KV at ``engine.dtype``, weights at ``model.dtype``) mixes
    the two. Quantised weights (``q4_k_m``, ``awq``) under a 16-bit ``--dtype`` are not flagged."""
    from kvgate.kv.arithmetic import canonical_dtype, vllm_kv_dtype_bytes

    e, m = c.profile.engine, c.profile.model
    served, declared = canonical_dtype(e.dtype), canonical_dtype(m.dtype)
    if not c.vllm or served is None or declared is None or served == declared:
        return
    got, said = vllm_kv_dtype_bytes("auto", served), vllm_kv_dtype_bytes("auto", declared)
    kv = (f"; with kv_cache_dtype auto its KV elements are {got} B, not {said} B"
          if e.kv_cache_dtype == "auto" and got != said else "")
    yield Finding("dtype-mismatch", WARNING, "engine.dtype",
                  f"engine.dtype {e.dtype} differs from model.dtype {m.dtype}: vLLM casts the weights to {served} as "
                  f"it loads them{kv}; the fit arithmetic counts the weights at model.dtype and the KV at "
                  "engine.dtype -- state one dtype, or explain it with '# kvgate-lint: allow dtype-mismatch -- "
                  "<reason>'")


RULES: dict[str, Callable[[Context], Iterable[Finding]]] = {
    "vllm-version": rule_vllm_version,
    "engine-arg-unknown": rule_engine_arg_unknown,
    "engine-arg-changed": rule_engine_arg_changed,
    "engine-arg-value": rule_engine_arg_value,
    "engine-default-changed": rule_engine_default_changed,
    "extra-args-duplicate": rule_extra_args_duplicate,
    "batched-below-len": rule_batched_below_len,
    "tp-heads": rule_tp_heads,
    "tp-gpu-count": rule_tp_gpu_count,
    "kv-pool-below-sequence": rule_kv_pool_below_sequence,
    "enforce-eager-gpu": rule_enforce_eager_gpu,
    "len-over-positions": rule_len_over_positions,
    "serve-feature": rule_serve_feature,
    "dtype-mismatch": rule_dtype_mismatch,
}


# --------------------------------------------------------------------------------------------
# the run


def allows_in(texts: Iterable[str]) -> dict[str, str]:
    """``{rule: reason}`` from ``# kvgate-lint: allow RULE -- reason`` comments (reason may be '')."""
    out: dict[str, str] = {}
    for text in texts:
        for line in text.splitlines():
            m = _ALLOW.search(line)
            if m:
                out[m.group(1)] = m.group(2).strip()
    return out


def _chain_texts(path: Path, profile_dir: Path) -> list[str]:
    """The text of ``path`` and of every profile it ``extends`` (best effort)."""
    import yaml

    texts, seen, cur = [], set(), path
    while cur is not None and cur not in seen:
        seen.add(cur)
        try:
            text = cur.read_text()
        except OSError:
            break
        texts.append(text)
        try:
            parent = (yaml.safe_load(text) or {}).get("extends")
        except yaml.YAMLError:
            break
        if not isinstance(parent, str):
            break
        try:
            local = cur.parent / f"{parent}.yaml"
            cur = local if local.exists() else resolve_profile(parent, profile_dir)
        except ProfileError:
            break
    return texts


def lint_profile(profile: Profile, texts: Iterable[str] = (), version: str | None = None,
                 args: VllmArgs | None = None) -> list[Finding]:
    """Run every rule on ``profile``. ``texts``: the profile file(s)' text, read for allow
    comments. ``version``: the vLLM version to check against (default :func:`declared_version`);
    ``args``: the parser snapshot to use (default :func:`kvgate.launch.vllm_args.load_snapshot` of it).
    Findings come errors first; explained ones are marked, not dropped."""
    ver = version or declared_version(profile)[0]
    args = args or load_snapshot(ver)
    ctx = Context(profile, args, ver, version_tuple(args.version) == version_tuple(ver))
    allows = allows_in(texts)
    findings: list[Finding] = []
    for rule in RULES.values():
        findings.extend(rule(ctx))
    out = []
    for f in findings:
        reason = allows.get(f.rule)
        out.append(replace(f, explained=reason) if reason else f)
    for rule, reason in allows.items():
        if not reason:
            out.append(Finding("lint-allow-reason", WARNING, "(comment)",
                               f"'# kvgate-lint: allow {rule}' gives no reason; write one after '--'"))
        elif rule not in {f.rule for f in findings}:
            out.append(Finding("lint-allow-unused", WARNING, "(comment)",
                               f"'# kvgate-lint: allow {rule}' explains a finding this profile does not have"))
    return sorted(out, key=lambda f: (f.severity != ERROR, f.explained is not None, f.rule))


def lint_file(name_or_path: str, profile_dir: Path = DEFAULT_PROFILE_DIR,
              version: str | None = None) -> tuple[Profile, list[Finding]]:
    """Load (raises :class:`ProfileError`) and lint a profile by name or path."""
    path = resolve_profile(name_or_path, Path(profile_dir))
    profile = load_profile(str(path), Path(profile_dir))
    return profile, lint_profile(profile, _chain_texts(path, Path(profile_dir)), version)


def summary_line(findings: list[Finding]) -> str:
    """``2 errors, 1 warning (1 explained)``."""
    errs = sum(1 for f in findings if f.counts and f.severity == ERROR)
    warns = sum(1 for f in findings if f.counts and f.severity == WARNING)
    expl = sum(1 for f in findings if not f.counts)
    s = f"{errs} error{'s' * (errs != 1)}, {warns} warning{'s' * (warns != 1)}"
    return s + (f" ({expl} explained in the profile)" if expl else "")


# --------------------------------------------------------------------------------------------
# command line


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``kvgate lint PROFILE...``."""
    p = sub.add_parser("lint", help="check profiles for engine arguments and combinations that cannot work",
                       description="Lint deployment profiles: engine arguments the declared vLLM version does not "
                                   "accept (its own parser + documented changes), and combinations that cannot work.")
    p.add_argument("profiles", nargs="+", metavar="PROFILE", help="a name in profiles/ or a YAML file")
    p.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR")
    p.add_argument("--vllm-version", default=None, metavar="X.Y.Z", type=vllm_version_arg,
                   help="check against this vLLM version (default: the profile's, else the installed one)")
    p.add_argument("--strict", action="store_true", help="warnings fail too (what --gate-mode certify does)")
    p.set_defaults(run=run)


def vllm_version_arg(text: str) -> str:
    """``--vllm-version``'s argparse type: ``text`` when :func:`kvgate.launch.vllm_args.parse_version`
    reads it, else a usage error (exit 2) naming the value and the accepted form."""
    try:
        parse_version(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Exit 0 when clean (explained findings allowed), 1 with unexplained errors (or warnings
    with ``--strict``), 2 when a profile cannot be read."""
    out, err = out or sys.stdout, err or sys.stderr
    worst = 0
    for name in args.profiles:
        try:
            profile, findings = lint_file(name, Path(args.profile_dir), args.vllm_version)
        except ProfileError as exc:
            print(f"kvgate lint: {exc}", file=err)
            worst = max(worst, 2)
            continue
        ver, where = (args.vllm_version, "--vllm-version") if args.vllm_version else declared_version(profile)
        print(f"{profile.name}: vLLM {ver} ({where}): {summary_line(findings)}", file=out)
        note = _snapshot_note(ver)
        if note:
            print(f"  note: {note}", file=out)
        for f in findings:
            print(f"  {f.line()}", file=out)
        failing = [f for f in findings if f.counts and (f.severity == ERROR or args.strict)]
        if failing:
            worst = max(worst, 1)
    return worst


def _snapshot_note(version: str) -> str | None:
    """:func:`kvgate.launch.vllm_args.snapshot_note` for a version that parses (the
    ``vllm-version`` finding speaks for one that does not)."""
    try:
        parse_version(version)
    except ValueError:
        return None
    return snapshot_note(version)


# --------------------------------------------------------------------------------------------
# the gate run


#: Rules whose findings mean the launched server cannot start (vLLM refuses the command line, or
#: kvgate cannot build what it names): a run that would launch it is refused up front (exit 4)
#: instead of starting vLLM to watch it fail -- and print its traceback once per gate (206 console
#: lines for a max_num_batched_tokens below max_num_seqs). Not ``kv-pool-below-sequence``: a pool
#: of exactly one sequence starts (vLLM never schedules it), which the fit gate FAILs on a live server.
LAUNCH_FATAL = frozenset({"serve-feature", "batched-below-len", "tp-heads"})


def lint_for_run(profile: Profile, profile_dir: Path, gate_mode: str = "enforce") -> tuple[list[Finding], str | None]:
    """Lint at the start of a gate run: ``(findings, refusal)``. ``refusal`` is a one-paragraph
    usage error under ``gate_mode == "certify"`` when any finding is unexplained (a certified
    run cannot rest on a profile vLLM would refuse or change), else ``None``: the findings are
    then printed as warnings in the run's header (:func:`header_lines`)."""
    texts = _chain_texts(Path(profile.source), profile_dir) if profile.source else []
    findings = lint_profile(profile, texts)
    counted = [f for f in findings if f.counts]
    if gate_mode == "certify" and counted:
        lines = "\n".join(f"  {f.line()}" for f in counted)
        return findings, (f"profile {profile.name}: kvgate lint found {summary_line(findings)}; --gate-mode certify "
                          f"treats every unexplained lint finding as an error (fix it, or explain it in the profile "
                          f"with '# kvgate-lint: allow RULE -- reason'):\n{lines}")
    return findings, None


def header_lines(findings: list[Finding]) -> list[str]:
    """The run header's lint lines: one per unexplained finding, as warnings."""
    counted = [f for f in findings if f.counts]
    if not counted:
        return []
    return [f"kvgate lint: {summary_line(findings)} (warnings here; errors under --gate-mode certify)"] + [
        f"  lint warning: {f.rule} ({f.field}): {f.message}" for f in counted]
