"""The accuracy case through lm-eval (``answers.accuracy.lm_eval``; kvgate.answers.lmeval): kvgate's
JSONL task as a generated lm-eval task YAML scored by kvgate's rule; the verdict on lm-eval's
per-sample scores; the child's offline guard; the key kept out of argv, files and reports; and,
with lm-eval itself (0.4.13, offline, in its child process) against the answering fake, both ways:
right answers PASS, the ``garbage_answers`` fault FAILs naming them. A task whose data is not
local SKIPs in one line naming what it would fetch; a task name lm-eval does not know is a usage
error (exit 4) before anything runs. Each real lm-eval run costs 5-10 s (its import and the
child's start), the task index listing 7-14 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvgate.answers.lmeval.child import HEADERS_ENV, classify, samples_of
from kvgate.answers.lmeval.runner import (CHAT, LmEvalUsage, Outcome, check_task, installed_version, known_tasks, plan,
                                          run_task)
from kvgate.answers.lmeval.task import process_results, route_of, task_yaml
from kvgate.answers.task import TaskError, load_task
from kvgate.gates.answers import lm_eval_verdict
from kvgate.profile.models import AccuracySpec, AnswersSpec, LmEvalSpec, ProfileError, load_profile
from kvgate.run.modes import recorded_accuracy
from kvgate.verdict import Status

from .conftest import REPO, assert_passes_measured
from .fakes.fake_vllm import FakeConfig, FakeVLLM, _garbage
from .test_answers_vs_fake import ANSWERS
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-answers-lm-eval.yaml"
QUESTIONS = REPO / "tests" / "data" / "answers" / "fake-questions.jsonl"
MIXED = REPO / "tests" / "data" / "answers" / "fake-short-answers.jsonl"
SUITE = ["suites/test_answers.py"]
KEY = "sk-lm-eval-0123456789"
needs_lm_eval = pytest.mark.skipif(installed_version() is None, reason="lm-eval is not installed (pip install 'kvgate[lm-eval]')")


def acc_spec(**lm) -> AccuracySpec:
    return AccuracySpec(file=str(QUESTIONS), lm_eval=LmEvalSpec(**lm), recorded_correct=8, recorded_items=8)


# ---------------------------------------------------------------------------- the generated task (pure)

def test_the_generated_task_reads_the_local_jsonl_and_asks_as_kvgate_does():
    text = task_yaml(QUESTIONS, "chat", 24, {"enable_thinking": False})
    cfg = yaml.safe_load(text.replace("!function ", ""))
    assert cfg["dataset_path"] == "json" and cfg["dataset_kwargs"] == {"data_files": {"test": str(QUESTIONS)}}
    assert cfg["test_split"] == "test" and cfg["doc_to_text"] == "{{question}}" and cfg["output_type"] == "generate_until"
    assert cfg["generation_kwargs"] == {"until": [], "max_gen_toks": 24, "temperature": 0, "do_sample": False,
                                        "chat_template_kwargs": {"enable_thinking": False}}
    assert cfg["process_results"] == "kvgate_scorer.process_results" and cfg["task"] == "kvgate-fake-questions"
    assert yaml.safe_load(task_yaml(QUESTIONS, "completions", 8).replace("!function ", ""))["doc_to_text"] == "{{prompt}}"


def test_the_generated_task_scores_by_kvgates_regex_rule():
    doc = {"id": "days-week", "question": "How many days are in a week?", "answer": r"\b(seven|7)\b"}
    assert process_results(doc, ["It has SEVEN days."]) == {"acc": 1.0}  # searched, case-insensitive
    assert process_results(doc, ["It has sevenish days."]) == {"acc": 0.0}
    assert process_results(doc, [None]) == {"acc": 0.0}


def test_lm_eval_asks_a_kvgate_task_by_one_route():
    assert route_of(load_task(QUESTIONS), None, "q") == "chat"
    with pytest.raises(TaskError, match="item 'system/capital-peru' is a conversation"):
        route_of(load_task(MIXED), None, "fake-short-answers.jsonl")
    with pytest.raises(TaskError, match="item 'completion/counting' is a completions item after chat items"):
        route_of([i for i in load_task(MIXED) if not i.id.startswith("system/")], None, "t")
    with pytest.raises(TaskError, match="its items are chat items; answers.accuracy.lm_eval.route says completions"):
        route_of(load_task(QUESTIONS), "completions", "q")


def test_a_task_lm_eval_cannot_ask_is_the_profiles_error_in_one_line(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": str(REPO / "tests" / "data" / "fake-answers.yaml"),
                                    "answers": {"accuracy": {"lm_eval": {}}}}))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(prof))
    assert str(exc.value) == (f"{prof}: field 'answers.accuracy.file': accuracy task fake-short-answers.jsonl: item "
                              "'system/capital-peru' is a conversation ('messages'); through lm-eval an item is one "
                              "user turn ('question') or a completion ('prompt')")
    prof.write_text(yaml.safe_dump({"extends": str(PROFILE), "answers": {"accuracy": {"lm_eval": {"task": "gsm8k"}}}}))
    with pytest.raises(ProfileError, match="give one task: file '.*fake-questions.jsonl' or lm_eval.task 'gsm8k', not both"):
        load_profile(str(prof))
    prof.write_text(yaml.safe_dump({"extends": str(PROFILE), "answers": {"accuracy": {"lm_eval": {"num_fewshot": 2}}}}))
    with pytest.raises(ProfileError, match="lm_eval.num_fewshot': kvgate's task file holds answer regexes"):
        load_profile(str(prof))
    prof.write_text(yaml.safe_dump({"extends": str(PROFILE), "answers": {"accuracy": {"file": None,
                                                                                      "lm_eval": {"task": "t.yaml"}}}}))
    with pytest.raises(ProfileError, match=r"field 'answers.accuracy.lm_eval.task': no task YAML '.*t\.yaml'"):
        load_profile(str(prof))


def test_the_plan_for_a_named_task_and_for_a_task_yaml(tmp_path):
    p = plan(AccuracySpec(lm_eval=LmEvalSpec(task="gsm8k", limit=50)))
    assert (p.task, p.model, p.include_defaults, p.docs, p.files) == ("gsm8k", "local-completions", True, 50, {})
    own = tmp_path / "mine.yaml"
    own.write_text("task: my-task\ndataset_path: json\nprocess_results: !function utils.process_results\n")
    p = plan(AccuracySpec(lm_eval=LmEvalSpec(task=str(own), route="chat")))
    assert (p.task, p.shown, p.model, p.include_path, p.include_defaults, p.cwd) == (
        str(own), "mine.yaml", CHAT, None, False, str(tmp_path))  # loaded from its path, run beside it


# ---------------------------------------------------------------------------- the verdict (pure)

def outcome(scores, **kw) -> Outcome:
    samples = [{"id": f"item-{i}", "score": s, "answer": f"answer {i}", "expected": r"\bx\b"} for i, s in enumerate(scores)]
    return Outcome(**{"task": "fake-questions.jsonl", "model": CHAT, "version": "0.4.13", "metric": "acc,none",
                      "samples": samples, "seconds": 6.5, "concurrency": 4, **kw})


def test_lm_eval_scores_are_judged_with_kvgates_interval_both_ways():
    a = AnswersSpec(accuracy=acc_spec().model_copy(update={"min_accuracy": 0.65}))
    v = lm_eval_verdict(a, outcome([1.0] * 8))
    assert v.status is Status.PASS and v.message.startswith(
        "8 of 8 items right on fake-questions.jsonl (lm-eval 0.4.13, local-chat-completions, acc,none): accuracy 100.0% "
        "(95% CI 63.1%..100.0%)")
    assert v.evidence["lm_eval"] == {"task": "fake-questions.jsonl", "version": "0.4.13", "model": CHAT,
                                     "metric": "acc,none", "seconds": 6.5, "num_concurrent": 4}
    v = lm_eval_verdict(a, outcome([0.0] * 8))
    assert v.status is Status.FAIL and "0 of 8 items right" in v.message
    assert "95% one-sided upper bound 31.2% < 65.0% (answers.accuracy.min_accuracy) -> FAIL; e.g. item-0: 'answer 0'" \
        in v.message
    assert (v.measured, v.limit) == (0.0, 0.65)
    # against the recorded 8/8 alone: a non-inferiority test 8 items cannot decide; a bool score counts
    v = lm_eval_verdict(AnswersSpec(accuracy=acc_spec()), outcome([True] * 8))
    assert v.status is Status.INCONCLUSIVE and "8 items cannot tell -> INCONCLUSIVE" in v.message, v.message
    v = lm_eval_verdict(AnswersSpec(accuracy=acc_spec()), outcome([False] * 8))
    assert v.status is Status.FAIL and "worse than the recorded run by more than the tolerance" in v.message


def test_no_lm_eval_score_is_skip_or_invalid_never_pass():
    a = AnswersSpec(accuracy=acc_spec())
    v = lm_eval_verdict(a, outcome([], download="DatasetNotFoundError: Couldn't reach 'openai/gsm8k' on the Hub "
                                                "(OfflineModeIsEnabled)"))
    assert v.status is Status.SKIP and v.message.startswith(
        "fake-questions.jsonl through lm-eval 0.4.13, local-chat-completions needs a download: DatasetNotFoundError: "
        "Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled); kvgate runs lm-eval offline")
    v = lm_eval_verdict(a, outcome([], error="a request failed: HTTP 500 Internal Server Error (lm-eval stops at the "
                                             "first failed request)"))
    assert v.status is Status.INVALID and "no score (a request failed: HTTP 500" in v.message
    assert lm_eval_verdict(a, outcome([])).status is Status.INVALID  # no sample: nothing measured
    v = lm_eval_verdict(a, outcome([1.0, 0.43, 0.0]))
    assert v.status is Status.INVALID and "scores 1 of 3 samples other than 0 or 1 (item-1: 0.43)" in v.message


def test_record_mode_records_the_lm_eval_accuracy():
    v = lm_eval_verdict(AnswersSpec(accuracy=acc_spec()), outcome([1.0] * 6 + [0.0] * 2))
    k, n, how = recorded_accuracy([("p/answers/accuracy", v)])
    assert (k, n) == (6, 8) and how.startswith("measured 6 of 8 right on fake-questions.jsonl (lm-eval 0.4.13, "
                                               "local-chat-completions, acc,none) (75.0%")


# ---------------------------------------------------------------------------- the child's pieces

def test_samples_are_read_for_the_named_metric_and_filter():
    res = {"results": {"gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.5, "exact_match_stderr,strict-match": "N/A",
                                 "exact_match,flexible-extract": 1.0}},
           "samples": {"gsm8k": [
               {"doc_id": 0, "doc": {"question": "q0"}, "filter": "strict-match", "exact_match": 1.0,
                "filtered_resps": ["72"], "target": "72"},
               {"doc_id": 0, "doc": {"question": "q0"}, "filter": "flexible-extract", "exact_match": 1.0,
                "filtered_resps": ["72"], "target": "72"},
               {"doc_id": 1, "doc": {"question": "q1"}, "filter": "strict-match", "exact_match": 0.0,
                "filtered_resps": ["[invalid]"], "target": "10"}]}}
    got = samples_of(res, None)
    assert got["metric"] == "exact_match,strict-match" and [s["score"] for s in got["samples"]] == [1.0, 0.0]
    assert got["samples"][1] == {"task": "gsm8k", "doc_id": 1, "id": "doc-1", "score": 0.0, "answer": "[invalid]",
                                 "generated": True, "expected": "10"}
    assert samples_of(res, "exact_match,flexible-extract")["metric"] == "exact_match,flexible-extract"
    assert samples_of(res, "bleu")["error"] == ("the task reports exact_match,flexible-extract, exact_match,strict-match; "
                                                "answers.accuracy.lm_eval.metric 'bleu' is none of them")


def test_a_failure_is_classified_in_one_line():
    try:
        try:
            raise FileNotFoundError("Dataset openai/gsm8k is not cached")
        except FileNotFoundError as inner:
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)") from inner
    except ConnectionError as exc:
        assert classify(exc, [], "task") == {"download": "the task's data (ConnectionError: Couldn't reach "
                                                         "'openai/gsm8k' on the Hub (OfflineModeIsEnabled))"}
        assert classify(exc, ["raw.githubusercontent.com:443"], "task")["download"].startswith(
            "the task's data: it reached for raw.githubusercontent.com:443 (ConnectionError: Couldn't reach")
        assert classify(exc, [], "model")["download"].startswith("a tokenizer (lm-eval's huggingface tokenizer backend")
    assert classify(KeyError("Spec 'nope' is not a registered task/group/tag name or valid YAML path"), []) == {
        "unknown": "KeyError: \"Spec 'nope' is not a registered task/group/tag name or valid YAML path\""}
    assert classify(ValueError("bad\nconfig"), [], "task") == {"error": "ValueError: bad config (while loading the task)"}


def test_the_offline_guard_refuses_every_host_but_the_endpoint():
    """In a child of its own (the guard patches the socket module for good)."""
    code = ("import json, socket, urllib.request\n"
            "from kvgate.answers.lmeval.child import guard\n"
            "refused = guard(['127.0.0.1'])\n"
            "out = []\n"
            "for url in ('http://huggingface.co/x', 'http://127.0.0.2:81/'):\n"
            "    try: urllib.request.urlopen(url, timeout=2)\n"
            "    except OSError as exc: out.append(str(exc))\n"
            "s = socket.socket(); s.settimeout(2)\n"
            "out.append(s.connect_ex(('127.0.0.1', 9)) != 0)\n"  # allowed: refused by nobody listening, not the guard
            "print(json.dumps([refused, out]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    refused, out = json.loads(done.stdout)
    assert refused == ["huggingface.co:80", "127.0.0.2:81"]
    assert "kvgate runs lm-eval offline: huggingface.co:80 is not the endpoint" in out[0] and out[2] is True


def test_a_run_that_does_not_use_lm_eval_does_not_import_it():
    code = ("import sys\n"
            "import kvgate.plugin, kvgate.run.session, kvgate.gates.answers, kvgate.answers.lmeval.runner\n"
            "print(sorted(m for m in ('lm_eval', 'datasets', 'evaluate') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.stdout.strip() == "[]", done.stderr


def test_the_key_travels_in_the_environment_only_and_is_masked_in_what_comes_back():
    seen = {}

    def fake_run(argv, *, cwd, env, timeout, **kw):
        req = Path(argv[-1]).read_text()
        seen.update(argv=argv, req=req, headers=env.get(HEADERS_ENV), offline=env.get("HF_DATASETS_OFFLINE"))
        out = json.loads(req)["out"]
        Path(out).write_text(json.dumps({"version": "0.4.13", "error": f"401 for Bearer {KEY}"}))
        return subprocess.CompletedProcess(argv, 0, "", "")

    o = run_task(acc_spec(), base_url="http://127.0.0.1:1", route_prefix="/v1", headers={"Authorization": f"Bearer {KEY}"},
                 model="m", concurrency=4, request_timeout_s=10, run=fake_run)
    assert KEY not in " ".join(seen["argv"]) and KEY not in seen["req"]
    assert json.loads(seen["headers"]) == {"Authorization": f"Bearer {KEY}"} and seen["offline"] == "1"
    req = json.loads(seen["req"])
    assert req["model_args"] == {"base_url": "http://127.0.0.1:1/v1/chat/completions", "model": "m", "num_concurrent": 4,
                                 "max_retries": 1, "timeout": 10, "tokenized_requests": False, "tokenizer_backend": None}
    assert req["tokenizer"] is None  # no model.tokenizer: a loglikelihood task would use the endpoint's /tokenize
    assert req["allow_hosts"] == ["127.0.0.1"] and req["task"] == "kvgate-fake-questions" and not req["include_defaults"]
    assert o.error == "401 for Bearer ***"


def test_a_child_that_writes_nothing_or_hangs_is_an_error_outcome():
    def crashed(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "Traceback ...\nSegmentation fault\n")

    def hung(argv, *, timeout, **kw):
        raise subprocess.TimeoutExpired(argv, timeout)

    kw = dict(base_url="http://127.0.0.1:1", route_prefix="/v1", headers={}, model="m", concurrency=4, request_timeout_s=10)
    assert run_task(acc_spec(), run=crashed, **kw).error == ("lm-eval's process ended (exit 1) without a result: "
                                                             "Segmentation fault")
    # 8 documents, 4 in flight: 2 rounds of 10 s after the 300 s start
    assert run_task(acc_spec(), run=hung, **kw).error == "lm-eval did not finish in 320 s (stopped)"


# ---------------------------------------------------------------------------- the task name

def test_an_unknown_task_name_is_refused_with_how_to_find_one(tmp_path):
    names = lambda: frozenset({"gsm8k", "gsm8k_cot", "mmlu"})  # noqa: E731
    with pytest.raises(LmEvalUsage) as exc:
        check_task(AccuracySpec(lm_eval=LmEvalSpec(task="gsm9k")), names=names)
    assert str(exc.value) == (f"answers.accuracy.lm_eval.task 'gsm9k': lm-eval {installed_version()} knows no task of "
                              "that name; close: gsm8k (`lm-eval ls tasks` lists the names lm-eval knows; a "
                              "path ending .yaml runs a task YAML of your own)")
    check_task(AccuracySpec(lm_eval=LmEvalSpec(task="mmlu")), names=names)
    check_task(acc_spec(), names=lambda: pytest.fail("kvgate's own task needs no lookup"))


@needs_lm_eval
def test_an_unknown_task_name_is_a_usage_error_before_anything_runs(pytester, tmp_path, monkeypatch):
    """Exit 4 in one line, no server contacted (the endpoint does not exist); the names come from
    the per-version cache, written here as lm-eval's listing would."""
    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path))
    (tmp_path / f"lm-eval-{installed_version()}-tasks.json").write_text(json.dumps(["gsm8k", "mmlu"]))
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": str(REPO / "tests" / "data" / "fake-answers.yaml"),
                                    "answers": {"accuracy": {"file": None, "lm_eval": {"task": "gsm8kk"}}}}))
    result, summary, _ = run_suites(pytester, "http://127.0.0.1:9", suites=SUITE, profile=prof)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = ("answers.accuracy.lm_eval.task 'gsm8kk': lm-eval 0.4.13 knows no task of that name; close: gsm8k "
            "(`lm-eval ls tasks` lists the names lm-eval knows; a path ending .yaml runs a task YAML of your own)")
    assert f"ERROR: {line}" in result.stderr.lines and summary["overall"] == "ERROR"
    assert "Traceback" not in result.stderr.str()


@needs_lm_eval
def test_lm_evals_task_list_is_read_once_and_cached(tmp_path):
    names = known_tasks(cache_dir=tmp_path)  # lm-eval's own index, in the child (7-14 s)
    assert {"gsm8k", "mmlu", "hellaswag"} <= names and len(names) > 1000
    again = known_tasks(cache_dir=tmp_path, run=lambda *a, **k: pytest.fail("listed again"))
    assert again == names


# ---------------------------------------------------------------------------- lm-eval itself, against the fake

def run(pytester, url, *extra, profile=PROFILE):
    result, summary, gates = run_suites(pytester, url, "-k", "accuracy", *extra, suites=SUITE, profile=profile)
    return result, summary, gates[f"{profile.stem}/answers/accuracy"]


@needs_lm_eval
def test_the_task_through_lm_eval_passes_on_right_answers_with_the_runs_key(pytester, monkeypatch):
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), api_key=KEY)) as fake:
        result, summary, gate = run(pytester, fake.url, "--api-key-env=KVGATE_TEST_KEY")
        asked = [r for r in fake.state.requests if r.endpoint == "chat"]
    assert gate["status"] == "PASS", gate["message"]
    assert gate["message"] == ("8 of 8 items right on fake-questions.jsonl (lm-eval 0.4.13, local-chat-completions, "
                               "acc,none): accuracy 100.0% (95% CI 63.1%..100.0%); vs recorded 8/8 (100.0%): +0.0 points "
                               "(95% CI -32.4..+32.4) (context, not judged: answers.accuracy.min_accuracy decides); 95% one-sided "
                               "lower bound 68.8% >= 65.0% "
                               "(answers.accuracy.min_accuracy) -> PASS")
    assert len(asked) == 8 and {r.max_tokens for r in asked} == {24} and {r.status for r in asked} == {200}
    assert gate["evidence"]["lm_eval"]["num_concurrent"] == 4 and gate["evidence"]["lm_eval"]["seconds"] > 0
    assert_passes_measured(summary)
    reports = pytester.path / "reports"
    assert not [p for p in reports.rglob("*") if p.is_file() and KEY in p.read_text(errors="replace")]
    assert KEY not in result.stdout.str() + result.stderr.str()


@needs_lm_eval
def test_the_task_through_lm_eval_fails_on_wrong_answers_quoting_them(pytester):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), faults={"garbage_answers"})) as fake:
        result, summary, gate = run(pytester, fake.url)
    assert gate["status"] == "FAIL", gate["message"]
    assert gate["message"].startswith("0 of 8 items right on fake-questions.jsonl (lm-eval 0.4.13, "
                                      "local-chat-completions, acc,none): accuracy 0.0% (95% CI 0.0%..36.9%)")
    assert ("95% one-sided upper bound 31.2% < 65.0% (answers.accuracy.min_accuracy) -> FAIL; e.g. capital-italy: "
            f"{_garbage('It is Rome, in Italy.', 'What is the capital of Italy?')!r}") in gate["message"]
    assert gate["measured"] == {"value": 0.0, "unit": "fraction"}


@needs_lm_eval
def test_a_task_whose_data_is_not_local_skips_in_one_line(pytester, tmp_path):
    """A task YAML over a Hub dataset: offline, lm-eval cannot load it; the SKIP names it."""
    (tmp_path / "hub-task.yaml").write_text(
        "task: kvgate-hub-only\ndataset_path: kvgate-test/not-in-any-cache\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n- metric: exact_match\n")
    prof = tmp_path / "hub.yaml"
    prof.write_text(yaml.safe_dump({"extends": str(REPO / "tests" / "data" / "fake-answers.yaml"),
                                    "answers": {"accuracy": {"file": None, "lm_eval": {"task": "hub-task.yaml",
                                                                                        "route": "chat"}}}}))
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS))) as fake:
        result, summary, gate = run(pytester, fake.url, profile=prof)
        assert not fake.state.requests  # nothing was asked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub-task.yaml", "hub.yaml"]  # nothing written beside it
    assert gate["status"] == "SKIP"
    assert gate["message"].startswith("hub-task.yaml through lm-eval 0.4.13, local-chat-completions needs a download: ")
    assert "kvgate-test/not-in-any-cache" in gate["message"] and "kvgate runs lm-eval offline" in gate["message"]
    assert "\n" not in gate["message"] and "Traceback" not in gate["message"]


@needs_lm_eval
def test_a_task_yaml_of_your_own_runs_over_its_local_data(pytester, tmp_path):
    """lm-eval's own filters and metric (a regex filter, exact_match) over a JSONL beside the YAML,
    named relative to it: the metric read is the task's first (exact_match with its filter)."""
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "capitals.jsonl").write_text(
        '{"question": "What is the capital of Italy?", "city": "Rome"}\n'
        '{"question": "What is the capital of Spain?", "city": "Madrid"}\n'
        '{"question": "What is the capital of Egypt?", "city": "Alexandria"}\n')
    (evals / "capitals.yaml").write_text(
        "task: my-capitals\ndataset_path: json\ndataset_kwargs: {data_files: {test: capitals.jsonl}}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{city}}'\n"
        "generation_kwargs: {until: [], max_gen_toks: 16}\n"
        "filter_list:\n- name: city\n  filter:\n  - {function: regex, regex_pattern: '(Rome|Madrid|Cairo|Alexandria)'}\n"
        "  - {function: take_first}\n"
        "metric_list:\n- {metric: exact_match, aggregation: mean, higher_is_better: true}\n")
    prof = tmp_path / "own.yaml"
    # 2 of 3 right: its one-sided 95% lower bound 13.5% PASSes a floor of 10% (3 items cannot show 60%)
    prof.write_text(yaml.safe_dump({"extends": str(REPO / "tests" / "data" / "fake-answers.yaml"),
                                    "answers": {"accuracy": {"file": None, "min_accuracy": 0.1, "recorded_correct": None,
                                                             "recorded_items": None,
                                                             "lm_eval": {"task": "evals/capitals.yaml", "route": "chat"}}}}))
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS))) as fake:
        result, summary, gate = run(pytester, fake.url, profile=prof)
    assert gate["status"] == "PASS", gate["message"]
    assert gate["message"].startswith("2 of 3 items right on capitals.yaml (lm-eval 0.4.13, local-chat-completions, "
                                      "exact_match,city): accuracy 66.7%")
    assert gate["evidence"]["wrong"] == [{"id": "doc-2", "correct": False, "answer": "Cairo", "expected": "Alexandria",
                                          "answered": True}]
