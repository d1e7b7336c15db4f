"""The profile's JSON Schema and field reference, generated from the pydantic models in
:mod:`kvgate.profile.models` (never hand-written).

* :func:`profile_json_schema` -- JSON Schema 2020-12 of a profile *file*: unknown keys are errors
  (the models' ``extra="forbid"``), ``name`` may be left out (the loader takes the file stem),
  ``source`` is not written (the loader sets it). A file with ``extends:`` is deep-merged over
  its parent, so nothing in it is required (the ``then`` branch: the same properties, no
  ``required``); a file without it needs ``model`` and ``engine`` and each section's required
  fields. Checked-in copy: :data:`PROFILE_SCHEMA` (shipped with the package); every shipped
  profile's first line points editors at it (``# yaml-language-server: $schema=...``).
* :func:`field_reference` -- a Markdown table per section: field path, type, unit, default,
  what it changes. Units come from the fields' descriptions, written ``[unit] meaning``
  (:func:`split_unit`). Checked-in copy: :data:`FIELD_REFERENCE` (``docs/profile-fields.md``).

Regenerate both after changing a model: ``kvgate schema profile --write`` (a test fails while
either checked-in copy is stale).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from kvgate.profile.models import Profile

#: The checked-in profile schema (shipped with the package, beside summary.schema.json).
PROFILE_SCHEMA = Path(__file__).resolve().parents[1] / "schema" / "profile.schema.json"
#: The generated field reference, in the checkout's docs.
FIELD_REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "profile-fields.md"
SCHEMA_ID = "https://kvgate.invalid/schema/profile.schema.json"
#: The comment that points YAML editors (yaml-language-server) at the schema; ``{path}`` is the
#: schema's path relative to the profile file.
MODELINE = "# yaml-language-server: $schema={path}"
#: Fields the loader fills in; a profile file does not write them.
_LOADER_FIELDS = ("source",)
_UNIT = re.compile(r"^\[([^\]]+)\]\s*(.*)$", re.S)


def split_unit(description: str | None) -> tuple[str, str]:
    """``("tokens", "prompt + output")`` from ``"[tokens] prompt + output"``; ``("", text)``
    when the description names no unit."""
    m = _UNIT.match(description or "")
    return (m.group(1), m.group(2)) if m else ("", description or "")


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_without_required(v) for v in node]
    return node


def _retarget(node: Any, suffix: str) -> Any:
    if isinstance(node, dict):
        return {k: (v + suffix if k == "$ref" and isinstance(v, str) else _retarget(v, suffix))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_retarget(v, suffix) for v in node]
    return node


def profile_json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a profile file, as a dict (see the module docstring)."""
    raw = Profile.model_json_schema(mode="validation")
    defs = raw.pop("$defs", {})
    top = copy.deepcopy(raw)
    for name in _LOADER_FIELDS:
        top["properties"].pop(name, None)
    top["required"] = [r for r in top.get("required", []) if r not in ("name", *_LOADER_FIELDS)]
    top.pop("title", None)
    top.pop("description", None)
    full_defs = dict(defs, Profile=top)
    partial_defs = {f"{k}Partial": _retarget(_without_required(v), "Partial") for k, v in full_defs.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "kvgate deployment profile",
        "description": ("A kvgate deployment profile (profiles/*.yaml): how a model is deployed and what the "
                        "endpoint promises. Generated from kvgate.profile.models by `kvgate schema profile`; field "
                        "reference: docs/profile-fields.md. A file with `extends:` is merged over its parent, so "
                        "none of its fields is required."),
        "type": "object",
        "if": {"required": ["extends"]},
        "then": {"$ref": "#/$defs/ProfilePartial"},
        "else": {"$ref": "#/$defs/Profile"},
        "$defs": {**full_defs, **partial_defs},
    }


def schema_text() -> str:
    """:func:`profile_json_schema` as the checked-in file's text (sorted keys, 1-space indent)."""
    return json.dumps(profile_json_schema(), indent=1, sort_keys=True) + "\n"


# --------------------------------------------------------------------------------------------
# the field reference


def _type_of(node: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in node:
        return " or ".join(_type_of(n, defs) for n in node["anyOf"])
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    t = node.get("type")
    if t == "array":
        return f"list of {_type_of(node.get('items', {}), defs)}"
    if t == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return f"map of name -> {_type_of(extra, defs)}"
        return "mapping"
    return {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null"}.get(t, str(t))


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    for n in node.get("anyOf", [node]):
        for key, sym in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
            if key in n:
                parts.append(f"{sym} {n[key]:g}")
    return ", ".join(parts)


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in node:
        if "$ref" in node:
            return "(section defaults)"
        return {"array": "`[]`", "object": "`{}`"}.get(node.get("type"), "-")
    d = node["default"]
    if d is None:
        return "null"
    if isinstance(d, dict) and d:
        return "(section defaults)"
    if isinstance(d, float):
        return f"{d:g}"
    return f"`{json.dumps(d)}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(model: dict[str, Any], defs: dict[str, Any], prefix: str) -> tuple[list[list[str]], list[tuple[str, str]]]:
    rows: list[list[str]] = []
    nested: list[tuple[str, str]] = []
    required = set(model.get("required", []))
    for name, node in model.get("properties", {}).items():
        path = f"{prefix}{name}"
        unit, meaning = split_unit(node.get("description"))
        limits = _constraints(node)
        if limits:
            meaning = f"{meaning} ({limits})" if meaning else limits
        rows.append([f"`{path}`", _cell(_type_of(node, defs)), unit, _default(node, name in required), _cell(meaning)])
        for target in _section_targets(node):
            nested.append((target, path + (".<name>." if node.get("type") == "object" or
                                           _is_map(node) else ".")))
    return rows, nested


def _is_map(node: dict[str, Any]) -> bool:
    return any(isinstance(n.get("additionalProperties"), dict) for n in node.get("anyOf", [node]))


def _section_targets(node: dict[str, Any]) -> list[str]:
    out = []
    for n in node.get("anyOf", [node]):
        if "$ref" in n:
            out.append(n["$ref"].rsplit("/", 1)[-1])
        extra = n.get("additionalProperties")
        if isinstance(extra, dict) and "$ref" in extra:
            out.append(extra["$ref"].rsplit("/", 1)[-1])
    return out


def field_reference() -> str:
    """The Markdown field reference: one table per section (field, type, unit, default, what it
    changes), in the order the models declare them."""
    schema = profile_json_schema()
    defs = schema["$defs"]
    out = [
        "# Profile field reference",
        "",
        "<!-- generated by `kvgate schema profile --write` from src/kvgate/profile/models.py; do not edit by hand -->",
        "",
        "Every field a deployment profile (`profiles/*.yaml`) may have. Unknown keys are errors. The JSON Schema "
        "is `src/kvgate/schema/profile.schema.json` (`kvgate schema profile`); shipped profiles point editors at "
        "it with `# yaml-language-server: $schema=...`. Units: GiB = 2**30 bytes, MB = 10**6 bytes. A file with "
        "`extends:` needs none of the required fields (its parent gives them).",
        "",
    ]
    queue: list[tuple[str, str]] = [("Profile", "")]
    seen: set[str] = set()
    while queue:
        name, prefix = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        model = defs[name]
        title = "top level" if not prefix else f"`{prefix.rstrip('.')}`"
        out += [f"## {title}", ""]
        doc = (model.get("description") or "").strip().split("\n\n")[0]
        if doc and name != "Profile":
            out += [_cell(doc.replace("``", "`")), ""]
        out += ["| field | type | unit | default | what it changes |", "|---|---|---|---|---|"]
        rows, nested = _rows(model, defs, prefix)
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
        queue += nested
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# writing and checking


def modeline_for(profile_path: Path, schema_path: Path = PROFILE_SCHEMA) -> str:
    """The ``# yaml-language-server: $schema=...`` line for a profile at ``profile_path``: the
    schema's path relative to the profile's directory, wherever the profile is written (from
    ``profiles/``: ``../src/kvgate/schema/profile.schema.json``, as the shipped profiles have it).
    Never an absolute path or ``file://`` URI: the line stays true when the checkout moves with
    the profile. Where no relative path exists (another drive on Windows): the schema's path
    inside the checkout, ``src/kvgate/schema/profile.schema.json``."""
    import os

    here = Path(profile_path).resolve().parent
    schema = schema_path.resolve()
    try:
        rel = os.path.relpath(schema, here)
    except ValueError:
        root = Path(__file__).resolve().parents[3]
        rel = str(schema.relative_to(root)) if schema.is_relative_to(root) else schema.name
    return MODELINE.format(path=Path(rel).as_posix())


def write(schema_path: Path = PROFILE_SCHEMA, reference_path: Path = FIELD_REFERENCE) -> list[Path]:
    """Write the schema and the field reference; returns the paths written."""
    schema_path.parent.mkdir(parents=True, exist_ok=True)
    reference_path.parent.mkdir(parents=True, exist_ok=True)
    schema_path.write_text(schema_text())
    reference_path.write_text(field_reference())
    return [schema_path, reference_path]


def stale(schema_path: Path = PROFILE_SCHEMA, reference_path: Path = FIELD_REFERENCE) -> list[Path]:
    """The checked-in files whose text differs from what the models generate now."""
    out = []
    for path, text in ((schema_path, schema_text()), (reference_path, field_reference())):
        if not path.is_file() or path.read_text() != text:
            out.append(path)
    return out
