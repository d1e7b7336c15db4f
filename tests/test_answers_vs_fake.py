"""The answers gate (suites/test_answers.py) against the fault-injecting fake vLLM in answering mode
(``FakeConfig.answers``: every prompt of tests/data/fake-answers.yaml, its accuracy task and the
multibyte prompts mapped to an answer): every case PASSES on the healthy fake; each answers fault
FAILS exactly its cases, the message quoting the offending answer, and leaves every other case PASS;
the faults a cause is measured for (a template dropping roles, a gateway dropping the system turn or
the sampling parameters) name that cause on every case they FAIL. Suites run through pytester with
``--endpoint``; verdicts are read back from summary.json. One suite run per test (a second of fake
traffic each; nondeterministic_concurrency a few)."""

from __future__ import annotations

import json

import httpx
import pytest

from kvgate.answers.observe import MULTIBYTE_PROMPTS
from kvgate.profile.models import load_profile

from .conftest import REPO, assert_passes_measured
from .fakes.fake_vllm import FakeConfig, FakeVLLM, _garbage, answer_key
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-answers.yaml"
SUITE = ["suites/test_answers.py"]
CASES = ["temperature-zero", "system-message", "golden", "accuracy", "multibyte", "input-paths", "multi-turn",
         "determinism", "isolation", "long-context", "degeneration"]
SPEC = load_profile(str(PROFILE)).answers
MEMORY = {g.name: g.messages for g in SPEC.memory}

#: prompt key -> answer. A golden's expected word comes first, an accuracy or memory answer's second
#: or third (see the profile's header): so shift_one_token flips the goldens only, and
#: repetition_loop (the first three tokens over and over) keeps every expectation met.
ANSWERS = {
    # goldens
    "What is the capital of France?": "Paris is the capital of France.",
    "What is the capital of Japan?": "Tokyo is the capital of Japan.",
    "What is the opposite of up?": "Down is the opposite of up.",
    "What is the plural of mouse?": "Mice is the plural of mouse.",
    "And what is the capital of Germany?": "Berlin is the capital of Germany.",
    "The capital of France is": " Paris, a city on the Seine.",
    # memory: the whole conversation remembers the fact; its last turn alone does not know it
    answer_key(MEMORY["name-alice"]): "It is Alice, as you told me.",
    "What is my name?": "I do not know your name yet.",
    answer_key(MEMORY["dog-max"]): "It is Max, your dog.",
    "What is my dog's name?": "You have not told me about a dog.",
    # the accuracy task (tests/data/answers/fake-short-answers.jsonl)
    "What is the capital of Italy?": "It is Rome, in Italy.",
    "What is the capital of Spain?": "It is Madrid, in Spain.",
    "What is the capital of Egypt?": "It is Cairo, on the Nile.",
    "What is the opposite of hot?": "It is cold, the opposite of hot.",
    "How many days are in a week?": "It has seven days.",
    "Which planet is known as the Red Planet?": "It is Mars, the fourth planet.",
    "What is the chemical symbol for water?": "It is H2O, water.",
    "What is the largest ocean on Earth?": "The Pacific Ocean is the largest.",
    "One, two, three, four,": " then five, six.",
    "What is the capital of Peru?": "It is Lima, in Peru.",
    # the system golden as a template that drops roles renders it (template_drops_roles): the run-together
    # text, which the "model" answers otherwise (an accuracy item with a system turn stays unanswered)
    "You are a concise assistant. What is the capital of Japan?": "You are right, I will be brief.",
    # the multibyte prompts (kvgate.answers.observe.MULTIBYTE_PROMPTS)
    MULTIBYTE_PROMPTS["cjk"]: "一年有十二个月。",
    MULTIBYTE_PROMPTS["hangul"]: "하늘은 파란색입니다.",
    MULTIBYTE_PROMPTS["thai"]: "หนึ่งสัปดาห์มีเจ็ดวัน",
    MULTIBYTE_PROMPTS["emoji"]: "🌊 🐟 ⛵ because the sea is full of life.",
}


#: The needle the fake retrieves (the profile's default needle: "The pass key is {key}. ...").
NEEDLE = r"pass key is (\d+)"


@pytest.fixture
def answering_fake():
    with FakeVLLM(FakeConfig(max_tokens_cap=64, answers=dict(ANSWERS), needle=NEEDLE)) as f:
        yield f


def run(pytester, url, *extra, profile=PROFILE):
    """The answers suite once; gates keyed by case (``golden``), without ``PROFILE/answers/``."""
    result, summary, gates = run_suites(pytester, url, *extra, suites=SUITE, profile=profile)
    prefix = f"{profile.stem}/answers/"
    assert all(k.startswith(prefix) for k in gates), list(gates)
    return result, summary, {k.removeprefix(prefix): g for k, g in gates.items()}


# ---------------------------------------------------------------------------- the fake itself

def test_answering_fake_answers_alike_on_every_input_path(answering_fake):
    """What the input-paths case relies on: /tokenize (messages) and /detokenize agree with the chat
    route's rendering; the chat, rendered-text and token-id paths give the same answer with
    usage.prompt_tokens equal to the rendered count; logprobs carry a 3-nat margin; an unmatched
    prompt keeps the tok{k} words."""
    url, model = answering_fake.base_url, "fake-model"
    msgs = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of Japan?"}]
    with httpx.Client(base_url=url, timeout=10) as c:
        ids = c.post("/tokenize", json={"model": model, "messages": msgs, "add_generation_prompt": True}).json()["tokens"]
        text = c.post("/detokenize", json={"model": model, "tokens": ids}).json()["prompt"]
        assert text == "<s> <|system|> You are a concise assistant. <|user|> What is the capital of Japan? <|assistant|>"
        chat = c.post("/v1/chat/completions", json={"model": model, "messages": msgs, "temperature": 0, "max_tokens": 24,
                                                    "logprobs": True, "top_logprobs": 2}).json()
        by_text = c.post("/v1/completions", json={"model": model, "prompt": text, "temperature": 0, "max_tokens": 24,
                                                  "add_special_tokens": False}).json()
        by_ids = c.post("/v1/completions", json={"model": model, "prompt": ids, "temperature": 0, "max_tokens": 24,
                                                 "logprobs": 2}).json()
        other = c.post("/v1/completions", json={"model": model, "prompt": "Nobody asked this", "max_tokens": 3}).json()
    answer = "Tokyo is the capital of Japan."
    assert chat["choices"][0]["message"]["content"] == answer and chat["choices"][0]["finish_reason"] == "stop"
    assert by_text["choices"][0]["text"] == answer == by_ids["choices"][0]["text"]
    assert {r["usage"]["prompt_tokens"] for r in (chat, by_text, by_ids)} == {len(ids)} == {15}
    assert chat["usage"]["completion_tokens"] == 7  # 6 words, then the EOS
    first = chat["choices"][0]["logprobs"]["content"][0]
    assert first["token"] == "Tokyo" and [a["logprob"] for a in first["top_logprobs"]] == [0.0, -3.0]
    assert by_ids["choices"][0]["logprobs"]["top_logprobs"][1] == {" is": 0.0, "<alt1>": -3.0}
    assert other["choices"][0]["text"].startswith(" tok") and other["choices"][0]["finish_reason"] == "length"


def test_answering_fake_streams_the_answer_it_answers(answering_fake):
    with httpx.Client(base_url=answering_fake.base_url, timeout=10) as c:
        with c.stream("POST", "/v1/chat/completions", json={
                "model": "fake-model", "messages": [{"role": "user", "content": MULTIBYTE_PROMPTS["cjk"]}],
                "temperature": 0.8, "seed": 1, "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    chunks = [json.loads(ln[6:])["choices"][0] for ln in lines]
    assert "".join(ch["delta"].get("content") or "" for ch in chunks) == "一年有十二个月。"
    assert [ch["delta"].get("content") for ch in chunks] == ["", "一年有十", "二个月。", ""]
    assert chunks[-1]["finish_reason"] == "stop"


# ---------------------------------------------------------------------------- the gate

def test_healthy_answering_fake_passes_every_answers_case(pytester, answering_fake):
    result, summary, gates = run(pytester, answering_fake.url)
    assert list(gates) == CASES
    assert {c: g["status"] for c, g in gates.items()} == dict.fromkeys(CASES, "PASS"), \
        {c: g["message"] for c, g in gates.items() if g["status"] != "PASS"}
    assert summary["overall"] == "PASS" and result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=11)
    msg = {c: g["message"] for c, g in gates.items()}
    assert msg["golden"].startswith("6 of 6 goldens right, streamed == non-streamed (e.g. 'What is the capital of "
                                    "France?' -> 'Paris is the capital of France.'")
    assert msg["accuracy"].startswith("10 of 10 items right on fake-short-answers.jsonl: accuracy 100.0%")
    assert "95% one-sided lower bound 74.1% >= 65.0% (answers.accuracy.min_accuracy) -> PASS" in msg["accuracy"]
    assert msg["multibyte"].startswith("6 prompt pairs (cjk, emoji, hangul, thai; temperature 0, 0.8)")
    # capital-france renders to 9 tokens, system/capital-japan to 15: on chat, rendered text and ids alike
    assert msg["input-paths"].startswith("2 conversations, 6 paths each (chat, chat/stream, ids, ids/stream, text, "
                                         "text/stream): the same prompt_tokens as rendered (9, 15)")
    assert "name-alice: 'It is Alice, as you told me.'" in msg["multi-turn"]
    assert msg["determinism"].startswith("2 prompts x 3 answers (alone, then in 2 concurrent batches of 8): at most 1 "
                                         "distinct output per prompt")
    # the longest golden answer asked twice alone; system/capital-japan counted 15 = its rendering with the system
    # turn (9 without)
    assert msg["temperature-zero"] == ("multi-turn/capital-germany asked twice alone at temperature 0 (max_tokens 24): "
                                       "the same 7 tokens both times ('Berlin is the capital of Germany.') -> PASS")
    assert msg["system-message"] == ("system/capital-japan: the server counted 15 prompt tokens = the rendering with "
                                     "the system turn (15 with the system turn, 9 without) -> PASS")
    # 12 golden, 2 temperature-zero, 10 task, 6 multibyte, 12 input-path and 2 memory answers, 4 in a determinism batch
    assert msg["degeneration"].startswith("48 answers checked") and "no U+FFFD" in msg["degeneration"]
    # 4 goldens alone, then beside the 8 polluters, 4 a round (the profile leaves batch at 8)
    assert msg["isolation"].startswith("4 goldens answered alone, then 8 times in 2 rounds of 8 beside ")
    assert msg["isolation"].endswith("every answer equal to its alone-answer -> PASS")
    assert gates["isolation"]["evidence"]["allowed_from"] == "/tokenize of ' zebra'"
    assert msg["long-context"] == ("pass key retrieved in 12 of 12 answers (6 prompts of 128 and 230 tokens, 50% and "
                                   "90% of max_model_len 256, at depths 10/50/90%, completions, streamed and not): "
                                   "every depth retrieved, 100% >= min_retrieved 50% -> PASS")
    cells = gates["long-context"]["evidence"]["cells"]
    assert [(c["tokens"], c["depth"]) for c in cells][:2] == [(128, 0.1), (230, 0.1)]  # by the key's position
    assert cells[0]["answers"] == {"non-streamed": f" {cells[0]['key']}.", "streamed": f" {cells[0]['key']}."}
    assert not any(g.get("cause") for g in gates.values())  # a PASS carries no cause
    golden = gates["golden"]["evidence"]["goldens"]
    assert golden["capital-france"]["margin"] == 3.0  # the fake's alternatives sit 3 nats below
    assert gates["accuracy"]["measured"] == {"value": 1.0, "unit": "fraction"}
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


# fault -> {case that must FAIL: fragments its message must hold (the offending answer quoted)}
FAULT_CASES = {
    "garbage_answers": {
        "golden": ["confident flip", repr(_garbage("Paris is the capital of France.", "What is the capital of France?"))],
        "accuracy": ["95% one-sided upper bound 25.9% < 65.0%", "0 of 10 items right",
                     repr(_garbage("It is Rome, in Italy.", "What is the capital of Italy?"))],
        "multi-turn": ["2 of 2 answers forget an earlier turn",
                       repr(_garbage("It is Alice, as you told me.", answer_key(MEMORY["name-alice"])))],
    },
    "inject_fffd": {
        "multibyte": ["cjk@t=0 non-streamed: 1 U+FFFD in '一年有十\ufffd二个月。'"],
        "degeneration": ["48 of 48 answers degenerate", "golden/capital-france: 1 U+FFFD replacement "
                         "characters (first at char 5: 'Paris\ufffd is the capital of ') in "
                         "'Paris\ufffd is the capital of France.'"],
    },
    "repetition_loop": {
        "degeneration": ["golden/capital-france: a repetition loop: 'Paris is the' repeated over 100% of the answer "
                         "(answers.max_repeat_fraction 50%) in 'Paris is the Paris is the"],
    },
    "shift_one_token": {
        "golden": ["0 of 6 goldens right; 5 confident flips, 1 fragile",
                   "capital-france ('What is the capital of France?' -> ' is the capital of France.', "
                   "expected /\\bParis\\b/i; reference margin 2.50 nats)",
                   # a system message is no turn; the multi-turn golden's last question is its turn 3
                   "system/capital-japan ('What is the capital of Japan?' -> ' is the capital of Japan.'",
                   "multi-turn/capital-germany ('And what is the capital of Germany? (turn 3)' -> "],
    },
    "double_bos_ids": {
        # the count names a second BOS because the server's echo of its prompt shows it (id 1, the tokenizer's BOS)
        "input-paths": ["capital-france ids: prompt_tokens 10 vs 9 rendered (+1: a second BOS: the server's prompt, as "
                        "it echoed it, is id 1 ('<s>') then the 9 rendered tokens)",
                        "capital-france ids answers otherwise than chat at char 0: 'Paris is the capital' vs ' tok"],
    },
    "echo_prompt_first_delta": {
        "input-paths": ["capital-france ids/stream: the first streamed delta carries the prompt's text "
                        "('<s> <|user|> What is the capital of France? <|assistant|>...')",
                        "capital-france ids/stream answers otherwise than chat at char 0: 'Paris is the capital' vs "
                        "'<s> <|user|> What is'"],
    },
    "nondeterministic_concurrency": {
        "determinism": ["temperature-0 outputs change under concurrency: capital-france: 2 distinct outputs in 3 "
                        "('Paris is the capital of France.' alone vs 'Paris indeed is the capital of France.' in "
                        "a batch of 8)", "answers.determinism.max_distinct 1 -> FAIL"],
    },
    "forget_first_turn": {
        "multi-turn": ["name-alice: turn 1 said 'My name is Alice. Please remember it.'; asked 'What is my name? "
                       "(turn 3)' -> 'I do not know your name yet.', expected /\\bAlice\\b/i"],
    },
    "template_drops_roles": {
        "golden": ["2 confident flips", "system/capital-japan ('What is the capital of Japan?' -> 'You are right, I "
                   "will be brief.'", "multi-turn/capital-germany ('And what is the capital of Germany? (turn 3)' -> "
                   "' tok"],
        "multi-turn": ["2 of 2 answers forget an earlier turn"],
    },
    "gateway_drops_system": {
        "system-message": ["system/capital-japan: the server counted 9 prompt tokens = the rendering without the system "
                           "turn (15 with the system turn, 9 without) -> FAIL"],
        "input-paths": ["system/capital-japan chat: prompt_tokens 9 vs 15 rendered (-6: = the rendering without the "
                        "system turn)"],
    },
    # two deployments behind one URL (issue 48): B's template leaves the system turn out -- the counts of a dropped
    # system turn, named as the split the answers' system_fingerprint shows (tests/test_causes_lookalike.py)
    "split_fleet": {
        "system-message": ["system/capital-japan: the answer counted 9 prompt tokens (= the rendering without it, as a "
                           "dropped system turn would count), not the rendering with the system turn (15 with the "
                           "system turn, 9 without)"],
        "input-paths": ["system/capital-japan chat: prompt_tokens 9 vs 15 rendered (-6: = the rendering without the "
                        "system turn)"],
    },
    "gateway_keeps_last_turn": {
        "multi-turn": ["2 of 2 answers forget an earlier turn", "name-alice: turn 1 said 'My name is Alice. Please "
                       "remember it.'; asked 'What is my name? (turn 3)' -> 'I do not know your name yet.'"],
    },
    # a polluter's allowlist applied to the others while it is in flight: the victims beside it change; copies of it
    # alone change them again, copies of the others do not
    "contaminating": {
        # round 2 (the last) carries allowed_token_ids, logit_bias, bad_words and min_tokens; its after wave comes once
        # they ended: those victims are answered as alone
        "isolation": ["of 16 victim answers changed beside polluters beyond a near tie (0.1 nats): ",
                      " (round 2) at token 0: ", " alone vs 'zebra' beside allowed_token_ids, logit_bias, bad_words, "
                      "min_tokens", "beside copies of allowed_token_ids, logit_bias alone they changed again; beside "
                      "bad_words, min_tokens alone they did not -> FAIL"],
    },
    # a polluter's allowlist row left uncleared when it ends: the next victim admitted takes it -- one of the after
    # wave's, or of round 2's own when a loaded host starts it after the polluter ended (both seen in CI-like runs),
    # so the round is not asserted; the confirming rounds name the polluters either way
    "stale_allowlist": {
        "isolation": ["of 16 victim answers changed beside polluters beyond a near tie (0.1 nats): ",
                      " at token 0: ", " alone vs 'zebra' ", "beside copies of allowed_token_ids, "
                      "logit_bias alone they changed again; beside bad_words, min_tokens alone they did not -> FAIL"],
    },
    "bad_words_500": {
        "isolation": ["1 polluter of 8 answered with a 5xx or not at all (limit 0): bad_words: HTTP 500 after",
                      "EngineCore encountered an issue (injected bad_words_500 fault)",
                      "-> FAIL (a request the server does not take must be refused 4xx)"],
    },
    "compress_prompt": {  # keeps the first 5% and the last 30% of a long prompt's words: depths 10% and 50% dropped
        "long-context": ["pass key retrieved in 4 of 12 answers", "not retrieved: depth 10% at no length, streamed or "
                         "not (128 tokens, key at token 35: ' unknown.'; 230 tokens, key at token 45: ' unknown.'); "
                         "depth 50% at no length, streamed or not (128 tokens, key at token 67: ' unknown.'; 230 "
                         "tokens, key at token 118: ' unknown.')", "answers.long_context: every depth retrieved at "
                         "one length at least -> FAIL"],
    },
    "sampling_dropped": {
        "temperature-zero": ["multi-turn/capital-germany asked twice alone at temperature 0 (max_tokens 24): different "
                             "text, first difference at token 7: ' 12)' vs ' 13)' ('Berlin is the capital of Germany. "
                             "(take 12)' vs 'Berlin is the capital of Germany. (take 13)') -> FAIL"],
        "golden": ["6 streamed answers part from the non-streamed ones"],
        "multibyte": ["cjk@t=0: streamed differs from non-streamed"],
        "input-paths": ["capital-france text answers otherwise than chat"],
        "determinism": ["capital-france: 3 distinct outputs in 3"],
    },
}
#: fault -> the cause every case it FAILs (or leaves INCONCLUSIVE) names, measured by the cases that measure causes
ROLES = ("the chat template drops roles: /tokenize renders a system turn and a user turn alike (12 tokens either way: "
         "'<s> You are a concise assistant. What is the capital of Japan?'): the model cannot tell who said what")
FAULT_CAUSES = {
    "template_drops_roles": ROLES,
    "gateway_drops_system": "the system message never reached the server (a gateway dropping it?); the server "
                            "rendered 9 tokens = the rendering without it",
    "sampling_dropped": "temperature 0 is not honoured: the same request answered twice alone gave different text "
                        "(first difference at token 7)",
    "contaminating": "the per-request sampling state of allowed_token_ids, logit_bias reaches other requests: beside "
                     "each alone the victims changed again, beside plain requests they did not",
    "stale_allowlist": "the per-request sampling state of allowed_token_ids, logit_bias reaches other requests: beside "
                       "each alone the victims changed again, beside plain requests they did not",
    "compress_prompt": "the prompt was shortened before the model: the server counted 45 prompt tokens of the 128-token "
                       "prompt sent (128 tokens at depth 10%, non-streamed)",
    "split_fleet": "more than one deployment answers behind the endpoint (a canary split?): the answers carry 2 "
                   "identities: system_fingerprint None on capital-france, opposite-up, multi-turn/capital-germany; "
                   "system_fingerprint 'fp-b' on system/capital-japan, plural-mouse, completion/capital-france",
    "gateway_keeps_last_turn": "the earlier turns never reached the server (a gateway keeping only the last user "
                               "turn?): the server counted 7 prompt tokens for name-alice = the rendering of its last "
                               "user turn alone (21 with its earlier turns, by /tokenize)",
    "double_bos_ids": "a second BOS on the ids path: the server puts the tokenizer's BOS (id 1 ('<s>')) in front of a "
                      "prompt that already begins with the template's",
}
#: fault -> {case: status} of the cases it leaves neither PASS nor FAIL: the accuracy item with a system turn is
#: answered wrong under a template that drops roles, 9 of 10 right, too few items to tell
#: under batch variance (and sampling dropped) the victims change beside plain requests too (isolation's control
#: round): which polluter changed them cannot be told
FAULT_UNDECIDED = {"template_drops_roles": {"accuracy": "INCONCLUSIVE"},
                   "nondeterministic_concurrency": {"isolation": "INCONCLUSIVE"},
                   "sampling_dropped": {"isolation": "INCONCLUSIVE"}}
#: (fault, case) -> the cause that case names in place of FAULT_CAUSES' (measured by the case itself)
CASE_CAUSES = {("nondeterministic_concurrency", "isolation"): "the evidence cannot tell: the victims changed beside "
               "plain temperature-0 requests too (no sampling parameter in flight)"}


@pytest.mark.parametrize("fault", list(FAULT_CASES))
def test_answers_fault_fails_exactly_its_cases(pytester, answering_fake, fault):
    answering_fake.config.faults.add(fault)
    result, summary, gates = run(pytester, answering_fake.url)
    must_fail = FAULT_CASES[fault]
    assert list(gates) == CASES
    undecided = FAULT_UNDECIDED.get(fault, {})
    assert {c for c, g in gates.items() if g["status"] == "FAIL"} == set(must_fail), \
        {c: g["message"] for c, g in gates.items() if g["status"] != "PASS"}
    assert {c: g["status"] for c, g in gates.items() if c not in must_fail and g["status"] != "PASS"} == undecided
    for case, fragments in must_fail.items():
        msg = gates[case]["message"]
        assert msg.endswith("-> FAIL") or "-> FAIL" in msg, msg
        for f in fragments:
            assert f in msg, (f, msg)
    # the cause: measured where a case measures it, on every case the fault breaks; none where nothing points at one
    causes = {c: gates[c].get("cause") for c in [*must_fail, *undecided]}
    assert causes == {c: CASE_CAUSES.get((fault, c), FAULT_CAUSES.get(fault)) for c in causes}, causes  # garbage answers: nothing measured names why
    assert all(g.get("cause") is None for c, g in gates.items() if g["status"] == "PASS")
    assert summary["overall"] == "FAIL" and result.ret == pytest.ExitCode.TESTS_FAILED


def test_without_tokenize_the_rendering_cases_skip_saying_so(pytester, answering_fake):
    """A server without /tokenize (KServe's huggingface runtime): the system message's arrival, the
    input paths and the pass-key prompts' exact lengths cannot be measured -- each SKIPs naming what
    answered -- and the rest still PASS."""
    answering_fake.config.faults.add("no_tokenize")
    result, summary, gates = run(pytester, answering_fake.url)
    assert {c: g["status"] for c, g in gates.items() if g["status"] != "PASS"} == {"system-message": "SKIP",
                                                                                 "input-paths": "SKIP",
                                                                                 "long-context": "SKIP"}
    assert gates["long-context"]["message"].startswith("no pass-key prompt of an exact length can be built here (")
    assert gates["long-context"]["message"].endswith("and the profile sets no model.tokenizer: a pass-key prompt of an "
                                                     "exact length cannot be built) -> SKIP")
    assert gates["system-message"]["message"] == ("the server renders no conversation for kvgate to count (/tokenize "
                                                  "answered 404: {\"detail\":\"Not Found\"}): the system message's "
                                                  "arrival cannot be measured without /tokenize -> SKIP")
    assert result.ret == pytest.ExitCode.OK


def test_input_paths_render_with_the_profiles_chat_template_kwargs(pytester, answering_fake, tmp_path):
    """A profile whose clients send chat_template_kwargs (enable_thinking false: the fake's template
    then ends in an empty think block, two tokens): the gate's chat requests carry them as its
    /tokenize does, so every path counts the same prompt."""
    text = PROFILE.read_text().replace("  request_timeout_s: 10\n", "  request_timeout_s: 10\n  chat_template_kwargs: "
                                       "{enable_thinking: false}\n")
    text = text.replace("file: answers/", f"file: {PROFILE.parent}/answers/")
    profile = tmp_path / "fake-answers-kwargs.yaml"
    profile.write_text(text)
    result, summary, gates = run(pytester, answering_fake.url, "-k", "input-paths", profile=profile)
    assert list(gates) == ["input-paths"]
    g = gates["input-paths"]
    assert g["status"] == "PASS", g["message"]
    assert "the same prompt_tokens as rendered (11, 17)" in g["message"]  # 9 and 15, each with <think> </think>
