"""The profile JSON Schema and the field reference: generated from the models, checked in, current,
referenced by every shipped profile, and as strict as the loader."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from kvgate.profile import schema as ps
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, available_profiles

REGENERATE = "regenerate with: .venv/bin/kvgate schema profile --write"


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(ps.PROFILE_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_checked_in_schema_and_reference_are_current():
    stale = ps.stale()
    assert not stale, f"stale: {[str(p) for p in stale]}; {REGENERATE}"


def test_staleness_is_detected(tmp_path):
    schema, ref = tmp_path / "s.json", tmp_path / "r.md"
    ps.write(schema, ref)
    assert ps.stale(schema, ref) == []
    ref.write_text(ref.read_text().replace("max_model_len", "max_len", 1))
    assert ps.stale(schema, ref) == [ref]


@pytest.mark.parametrize("name", available_profiles())
def test_schema_validates_every_shipped_profile(name):
    path = DEFAULT_PROFILE_DIR / f"{name}.yaml"
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_points_editors_at_the_schema(name):
    path = DEFAULT_PROFILE_DIR / f"{name}.yaml"
    first = path.read_text().splitlines()[0]
    assert first == ps.modeline_for(path)
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert target == ps.PROFILE_SCHEMA.resolve()


def test_schema_rejects_a_misspelt_key():
    data = yaml.safe_load((DEFAULT_PROFILE_DIR / "llama70b-tp4.yaml").read_text())
    data["engine"]["max_model_lenn"] = data["engine"].pop("max_model_len")
    errors = list(validator().iter_errors(data))
    text = " ".join(e.message for e in errors)
    assert "max_model_lenn" in text and "Additional properties are not allowed" in text


def test_schema_rejects_a_misspelt_key_in_an_extending_profile():
    errors = list(validator().iter_errors({"extends": "tiny-cpu", "engine": {"kv_cache_memory_byte": 1}}))
    assert errors and "kv_cache_memory_byte" in " ".join(e.message for e in errors)
    assert list(validator().iter_errors({"extends": "tiny-cpu", "engine": {"kv_cache_memory_bytes": 1}})) == []


def test_schema_requires_sections_without_extends_and_checks_types():
    v = validator()
    assert any("'engine' is a required property" in e.message for e in v.iter_errors({"model": {"served_name": "m"}}))
    bad = yaml.safe_load((DEFAULT_PROFILE_DIR / "tiny-cpu.yaml").read_text())
    bad["engine"]["max_model_len"] = "long"
    assert any("'long' is not valid under any of the given schemas" in e.message for e in v.iter_errors(bad))  # int or auto
    bad["engine"]["max_model_len"] = 0
    assert list(v.iter_errors(bad))  # gt=0 carried into the schema


def test_every_field_is_in_the_reference_with_its_unit():
    ref = ps.field_reference()
    for section in ("engine", "limits", "slo", "hardware"):
        model = Profile.model_fields[section].annotation
        for name in model.model_fields:
            assert f"`{section}.{name}`" in ref, f"{section}.{name} missing from the field reference"
    line = next(row for row in ref.splitlines() if row.startswith("| `engine.max_model_len`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:4] == ['int or "auto"', "tokens", "**required**"]
    assert "--max-model-len" in cells[4]
    assert "| `workloads.<name>.prompt_tokens` | int | tokens |" in ref


def test_numeric_fields_state_their_unit():
    """A number without a unit cannot be written correctly: every int/float field's description
    starts with ``[unit]`` (see kvgate.profile.schema.split_unit)."""
    nominal = {"`soak.seed`", "`priority.high`", "`priority.low`"}  # numbers that name or order, not measure
    missing = []
    for row in ps.field_reference().splitlines():
        if row.startswith("| `"):
            field, typ, unit = [c.strip() for c in row.strip("|").split("|")][:3]
            if typ.split(" or ")[0] in ("int", "float") and not unit and field not in nominal:
                missing.append(field)
    assert missing == [], f"give these a '[unit] ...' description in kvgate/profile.py: {missing}"


def test_split_unit():
    assert ps.split_unit("[tokens] prompt + output") == ("tokens", "prompt + output")
    assert ps.split_unit("no unit here") == ("", "no unit here")
    assert ps.split_unit(None) == ("", "")


def test_cli_prints_and_writes_the_schema(tmp_path, capsys):
    from kvgate.cli.main import main

    assert main(["schema", "profile"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == ps.profile_json_schema()
    out_schema, out_ref = tmp_path / "p.json", tmp_path / "f.md"
    assert main(["schema", "profile", "--write", f"--schema-path={out_schema}", f"--reference-path={out_ref}"]) == 0
    assert json.loads(out_schema.read_text()) == printed
    assert out_ref.read_text() == ps.field_reference()
    assert main(["schema", "profile", "--check", f"--schema-path={out_schema}", f"--reference-path={out_ref}"]) == 0
    out_ref.write_text("stale")
    assert main(["schema", "profile", "--check", f"--schema-path={out_schema}", f"--reference-path={out_ref}"]) == 1
    assert "stale" in capsys.readouterr().err
