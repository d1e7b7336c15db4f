"""Profile loading: names, paths, extends, and error messages that name file, field and type."""

from __future__ import annotations

import pytest

from kvgate.profile.models import ProfileError, available_profiles, load_profile, resolve_profile

from .conftest import MINIMAL


def test_shipped_profiles_all_load():
    names = available_profiles()
    assert "tiny-cpu" in names
    for name in names:
        p = load_profile(name)
        assert p.name == name
        assert p.engine.max_model_len > 0


def test_tiny_cpu_is_embedded_and_states_its_kv_pool():
    p = load_profile("tiny-cpu")
    assert p.embedded
    assert p.engine.kv_cache_memory_bytes == 64 * 2**20
    assert p.model.architecture.head_dim % 32 == 0  # vLLM CPU attention needs it


def test_unknown_name_lists_available_profiles():
    with pytest.raises(ProfileError) as exc:
        resolve_profile("nosuch")
    msg = str(exc.value)
    assert "unknown profile 'nosuch'" in msg
    assert "tiny-cpu" in msg


def test_close_name_gets_a_suggestion():
    with pytest.raises(ProfileError, match="did you mean 'tiny-cpu'"):
        resolve_profile("tiny-cpv")


def test_path_to_yaml_works(write_profile):
    path = write_profile("mine", MINIMAL)
    p = load_profile(str(path))
    assert p.name == "mine" and p.source == str(path)


def test_wrong_type_names_file_field_and_expected_type(write_profile):
    path = write_profile("bad", MINIMAL.replace("max_model_len: 256", "max_model_len: lots"))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    msg = str(exc.value)
    assert str(path) in msg
    assert "engine.max_model_len" in msg
    assert "integer" in msg and "'lots'" in msg


def test_unknown_key_is_an_error_not_ignored(write_profile):
    path = write_profile("typo", MINIMAL + "limits:\n  max_token_cap: 5\n")
    with pytest.raises(ProfileError, match=r"limits\.max_token_cap.*[Ee]xtra"):
        load_profile(str(path))


def test_capacity_start_above_the_cap_is_an_error_naming_both(write_profile):
    # was accepted silently: the suite then measured one step at start_concurrency and nothing else
    path = write_profile("capinv", MINIMAL + "capacity:\n  start_concurrency: 64\n  max_concurrency: 8\n")
    with pytest.raises(ProfileError, match=r"field 'capacity': .*start_concurrency 64 > max_concurrency 8") as exc:
        load_profile(str(path))
    assert str(path) in str(exc.value)
    load_profile(str(write_profile("capok", MINIMAL + "capacity:\n  start_concurrency: 8\n  max_concurrency: 8\n")))


def test_missing_required_section(write_profile):
    path = write_profile("nomodel", "engine:\n  max_model_len: 5\n")
    with pytest.raises(ProfileError, match="field 'model': Field required"):
        load_profile(str(path))


def test_not_yaml_mapping(write_profile):
    with pytest.raises(ProfileError, match="must be a YAML mapping"):
        load_profile(str(write_profile("list", "- a\n- b\n")))
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(write_profile("broken", "model: [\n")))


def test_malformed_yaml_is_one_line_positioned_in_the_file(write_profile):
    # PyYAML's 7 lines positioned in "<unicode string>", the source echoed
    with pytest.raises(ProfileError) as exc:
        load_profile(str(write_profile("broken", "model:\n  served_name: [x\nengine: {max_model_len: 1}\n")))
    assert str(exc.value).endswith("broken.yaml: not valid YAML: line 3, column 7: expected ',' or ']', but got ':' "
                                   "(while parsing a flow sequence started at line 2, column 16)")
    assert "\n" not in str(exc.value) and "unicode string" not in str(exc.value)


def test_a_key_given_twice_is_refused_naming_both_lines(write_profile):
    """YAML keeps the last of two equal keys silently: two engine sections would gate half the profile."""
    text = "extends: tiny-cpu\nname: dup\nengine:\n  max_model_len: 256\nengine:\n  max_num_seqs: 2\n"
    with pytest.raises(ProfileError) as exc:
        load_profile(str(write_profile("dup", text)))
    assert str(exc.value).endswith("dup.yaml: not valid YAML: line 5, column 1: key 'engine' given twice (first at "
                                   "line 3); YAML would keep only the last")
    nested = "extends: tiny-cpu\nname: dup2\nengine: {max_model_len: 256, max_model_len: 512}\n"
    with pytest.raises(ProfileError, match=r"line 3, column 30: key 'max_model_len' given twice \(first at line 3\)"):
        load_profile(str(write_profile("dup2", nested)))
    merged = "extends: tiny-cpu\nname: merged\nbase: &b {max_model_len: 256}\nengine:\n  <<: *b\n"
    with pytest.raises(ProfileError) as other:  # a merge key is not a duplicate (what follows is the schema's say)
        load_profile(str(write_profile("merged", merged)))
    assert "given twice" not in str(other.value)


def test_a_missing_profile_dir_is_named_not_listed_as_none(tmp_path):
    with pytest.raises(ProfileError) as exc:
        load_profile("tiny-cpu", tmp_path / "nowhere")
    assert str(exc.value) == (f"unknown profile 'tiny-cpu': the profile directory {tmp_path / 'nowhere'} does not exist "
                              "(--profile-dir=DIR; default the checkout's profiles/)")


def test_extends_deep_merges_child_wins(write_profile):
    write_profile("base", MINIMAL + "limits:\n  max_tokens_cap: 64\n  reject_deadline_s: 3\n")
    child = write_profile("child", "extends: base\nengine:\n  max_model_len: 512\nlimits:\n  max_tokens_cap: 32\n")
    p = load_profile(str(child))
    assert p.name == "child"
    assert p.engine.max_model_len == 512
    assert p.limits.max_tokens_cap == 32
    assert p.limits.reject_deadline_s == 3  # inherited
    assert p.model.served_name == "m"


def test_extends_cycle_is_reported(write_profile):
    write_profile("a", "extends: b\n")
    b = write_profile("b", "extends: a\n")
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(str(b))


def test_head_dim_derived_from_hidden_size(write_profile):
    path = write_profile("hd", MINIMAL.replace("head_dim: 64", "hidden_size: 512"))
    assert load_profile(str(path)).model.architecture.head_dim == 128


def test_missing_parent_names_the_child_file(write_profile):
    child = write_profile("orphan", "extends: nosuch-parent\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(child))
    assert str(child) in str(exc.value) and "field 'extends'" in str(exc.value)


def test_directory_is_not_a_profile(tmp_path):
    with pytest.raises(ProfileError, match="is a directory"):
        resolve_profile(str(tmp_path) + "/")


def test_misspelt_key_gets_did_you_mean(write_profile):
    p = write_profile("typo", MINIMAL.replace("max_model_len: 256", "max_model_lenn: 256\n  max_model_len: 256")
                      + "limts: {}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    msg = str(e.value)
    assert "field 'engine.max_model_lenn': Extra inputs are not permitted; got 256; did you mean 'max_model_len'?" in msg
    assert "field 'limts': Extra inputs are not permitted" in msg and "did you mean 'limits'?" in msg


def test_misspelt_key_in_a_list_item_gets_did_you_mean_and_a_string_for_a_list_says_list(write_profile):
    # metrics.consumed is a tuple of items: the suggestion reaches inside it; YAML has lists, not tuples
    p = write_profile("items", MINIMAL + "metrics:\n  consumed:\n    - {name: 'vllm:x', labelz: [a]}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    assert "field 'metrics.consumed.0.labelz': Extra inputs are not permitted; got ['a']; did you mean 'labels'?" \
        in str(e.value), str(e.value)
    p = write_profile("scalar", MINIMAL + "metrics:\n  consumed: 'vllm:num_requests_waiting'\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    assert "field 'metrics.consumed': Input should be a list; got 'vllm:num_requests_waiting'" in str(e.value), \
        str(e.value)


def test_far_off_key_lists_the_known_ones(write_profile):
    p = write_profile("far", MINIMAL + "workloads:\n  chat: {prompt_tokens: 8, output_tokens: 8, zzz: 1}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    assert "field 'workloads.chat.zzz'" in str(e.value) and "known keys in workloads.chat: " in str(e.value)
    assert "prompt_tokens" in str(e.value).split("known keys in workloads.chat: ")[1]


@pytest.mark.parametrize("functions, fragment", [
    ("[{description: no name}]", "functions[0] needs a 'name' (a non-empty string), got None"),
    ("[{name: f, parameters: nope}]", "functions[0] (f): parameters must be a JSON Schema object, got 'nope'"),
    ("[{name: f, parameters: {type: objekt}}]", "functions[0] (f): parameters is not a valid JSON Schema"),
    ("[{name: f}, {name: f}]", "functions[1]: the name 'f' is offered twice"),
    ("[]", "functions: [] offers no tool"),
])
def test_a_bad_tool_function_is_a_profile_error_naming_file_and_field(write_profile, functions, fragment):
    """Not a KeyError at collection, an AttributeError in the verdict, nor a FAIL blamed on the server."""
    path = write_profile("tools", MINIMAL + f"features:\n  tools:\n    functions: {functions}\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert str(path) in str(exc.value) and "field 'features.tools'" in str(exc.value)
    assert fragment in str(exc.value)


def test_auto_expect_must_be_an_offered_function(write_profile):
    path = write_profile("tools", MINIMAL + "features:\n  tools:\n    auto_expect: nope\n")
    with pytest.raises(ProfileError, match=r"auto_expect 'nope' is not among the functions offered \(get_weather, get_time\)"):
        load_profile(str(path))


@pytest.mark.parametrize("sample, expected", [
    (None, "field 'workloads.w.traffic': traffic sample t.jsonl: cannot read it (No such file or directory)"),
    ('{"prompt_tokens": 10, "output_tokens": 5}\n{"prompt_tokens": "x"}\n',
     "field 'workloads.w.traffic': t.jsonl:2: field 'prompt_tokens' must be a non-negative integer, got 'x'"),
    ('{"prompt_tokens": 10, "output_tokens": 5}\n',
     "field 'workloads.w.traffic.replay': open replays the recorded arrival times, but 1 of 1 requests of t.jsonl"),
], ids=["missing", "malformed-line", "open-without-arrivals"])
def test_a_traffic_sample_that_cannot_be_replayed_is_the_profiles_error(write_profile, sample, expected):
    """The sample is read when the profile loads: its error names the profile file, the field and
    the sample's line -- before any gate runs (not a harness error in the first gate replaying it)."""
    path = write_profile("replay", MINIMAL + "workloads:\n  w: {prompt_tokens: 10, output_tokens: 5, traffic: t.jsonl}\n")
    if sample is not None:
        (path.parent / "t.jsonl").write_text(sample)
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert str(exc.value).startswith(f"{path}: ") and expected in str(exc.value)


def test_a_base_profiles_traffic_path_is_relative_to_the_base_file_not_the_child(tmp_path):
    """``traffic: t.jsonl`` is relative to the file that declares it: a profile in another
    directory that extends it (e.g. ``extends: tiny-cpu-replay`` from /tmp) still finds the
    sample, and a child's ``traffic: {replay: closed}`` merges into a base's plain-string path."""
    base_dir, child_dir = tmp_path / "base", tmp_path / "elsewhere"
    base_dir.mkdir()
    child_dir.mkdir()
    (base_dir / "t.jsonl").write_text('{"prompt_tokens": 10, "output_tokens": 5}\n')
    (base_dir / "base.yaml").write_text(
        MINIMAL + "workloads:\n  w: {prompt_tokens: 10, output_tokens: 5, traffic: t.jsonl}\n")
    child = child_dir / "child.yaml"
    child.write_text(f"extends: {base_dir / 'base.yaml'}\nworkloads:\n  w:\n    traffic: {{replay: closed}}\n")
    p = load_profile(str(child))
    assert p.workloads["w"].traffic.path == str((base_dir / "t.jsonl").resolve())
    assert p.workloads["w"].traffic.replay == "closed"
    # the shipped replay profile, extended from outside profiles/
    (child_dir / "ext.yaml").write_text("extends: tiny-cpu-replay\nslo:\n  requests: 16\n")
    ext = load_profile(str(child_dir / "ext.yaml"))
    assert ext.workloads["chat-replay"].traffic.path.endswith("profiles/traffic/tiny-chat.jsonl")


def test_a_traffic_path_in_the_same_directory_is_kept_as_written(write_profile):
    """Within one directory (profiles/) nothing is rebased: verdicts keep naming ``traffic/x.jsonl``."""
    write_profile("base", MINIMAL + "workloads:\n  w: {prompt_tokens: 10, output_tokens: 5, traffic: t.jsonl}\n")
    child = write_profile("child", "extends: base\n")
    (child.parent / "t.jsonl").write_text('{"prompt_tokens": 10, "output_tokens": 5, "arrival_s": 0}\n')
    assert load_profile(str(child)).workloads["w"].traffic.path == "t.jsonl"


def test_pass_confidence_floor_above_confidence_is_an_error_naming_both(write_profile):
    path = write_profile("floorhigh", MINIMAL + "slo:\n  confidence: 0.9\n  pass_confidence_floor: 0.95\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    msg = str(exc.value)
    assert "slo.pass_confidence_floor 0.95" in msg and "slo.confidence 0.9" in msg
    # below (and equal to) slo.confidence loads
    ok = load_profile(str(write_profile("floorok", MINIMAL + "slo:\n  confidence: 0.95\n  pass_confidence_floor: 0.6\n")))
    assert ok.slo.pass_confidence_floor == 0.6 and ok.slo.confidence == 0.95


@pytest.mark.parametrize("value, says", [
    ("1.0e-9", "greater than or equal to 0.000001"), ("0.5", "less than 0.5"), ("true", "valid number"),
    ('"1%"', "valid number"), ("0", "greater than or equal to 0.000001")])
def test_a_false_alarm_budget_out_of_range_is_one_line_naming_the_field(write_profile, value, says):
    """verdicts.false_alarm_budget: below 1e-6 a FAIL level rounds to certainty (1 - 1e-15/9/4
    is 1.0 in floating point: a harness error mid-run); a boolean is not 1.0."""
    p = write_profile("b", MINIMAL + f"verdicts:\n  false_alarm_budget: {value}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    msg = str(e.value)
    assert f"field 'verdicts.false_alarm_budget': Input should be" in msg and says in msg, msg


def test_a_bare_verdicts_section_is_no_budget_and_a_loose_budget_moves_nothing(write_profile):
    bare = load_profile(str(write_profile("bare", MINIMAL + "verdicts:\n  # false_alarm_budget: 0.01\n")))
    assert bare.verdicts.false_alarm_budget is None and not bare.verdicts.raises(0.95)
    loose = load_profile(str(write_profile("loose", MINIMAL + "verdicts:\n  false_alarm_budget: 0.45\n")))
    assert loose.verdicts.fail_confidence(0.95) == 0.95 and not loose.verdicts.raises(0.95)  # 5% a family = its own
    main = load_profile("smollm2-cpu")
    assert main.verdicts.raises(0.95) and main.verdicts.fail_confidence(0.95) == pytest.approx(1 - 0.01 / 9)
