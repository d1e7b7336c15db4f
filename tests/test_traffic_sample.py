"""kvgate.traffic.sample: every format read (JSONL, OpenAI request log, ShareGPT, /metrics text),
told apart from the content, each bad record one error naming file:line and field; percentiles,
provenance, the overlong callout, the busiest arrival windows, and the shipped sample's invariants."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from kvgate.traffic import sample as ts
from kvgate.traffic.synth import SynthSpec, jsonl_text, synth

from .conftest import REPO

DATA = REPO / "tests" / "data" / "traffic"
SHIPPED = REPO / "profiles" / "traffic" / "tiny-chat.jsonl"


def words(text: str) -> int:
    """A stand-in tokenizer: one token a word (the gates pass the server's /tokenize)."""
    return len(text.split())


def write(tmp_path, text, name="t.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- the formats


def test_jsonl_sessions_prefixes_arrivals_and_usage_rows():
    s = ts.load_sample(DATA / "sessions.jsonl")
    assert s.format == "jsonl" and len(s.requests) == 4 and s.notes == ()
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in s.requests] == [
        (300, 20, 0.0), (100, 10, 0.5), (330, 40, 2.0), (50, 5, 4.0)]
    assert [(r.turn, r.prompt_tokens) for r in s.sessions()["a"]] == [(0, 300), (1, 330)]
    assert {(r.prefix_id, r.prefix_tokens) for r in s.requests if r.session} == {("sys", 256)}
    assert [r.line for r in s.requests] == [1, 2, 3, 4]


def test_openai_log_usage_is_exact_else_counted_and_max_tokens_is_the_output():
    s = ts.load_sample(DATA / "openai-log.jsonl", count=words)
    assert s.format == "openai-log" and len(s.requests) == 4
    first, second, third, fourth = s.requests
    # response usage: exact; no usage: the message contents counted, max_tokens / max_completion_tokens as sent
    assert (first.prompt_tokens, first.output_tokens) == (31, 17)
    assert (second.prompt_tokens, second.output_tokens) == (5 + 4 + 4 + 4, 48)
    assert (third.prompt_tokens, third.output_tokens) == (5 + 4, 32)  # a list of text parts
    assert (fourth.prompt_tokens, fourth.output_tokens) == (5, 20)  # a completion prompt
    assert [r.line for r in s.requests] == [1, 2, 4, 5]  # the blank line 3 skipped
    # sessions: conversation_id (turns in file order), user; none for the fourth
    assert [(r.session, r.turn) for r in s.requests] == [("c1", 0), ("c1", 1), ("u7", 0), (None, None)]
    # ISO timestamps and epoch seconds on one clock
    assert second.arrival_s - first.arrival_s == pytest.approx(2.5) and fourth.arrival_s - first.arrival_s == 4.0
    # the messages kept as sent, the shared system prompt a prefix (its counted tokens)
    assert second.messages[-1] == {"role": "user", "content": "order 42 please check"}
    assert {r.prefix_id for r in s.requests[:3]} == {"sys-" + hashlib.sha256(b"You are a support agent.").hexdigest()[:8]}
    assert {r.prefix_tokens for r in s.requests[:3]} == {5} and fourth.prefix_id is None and fourth.messages is None
    assert any("counted from the message text with the given tokenizer" in n for n in s.notes)
    assert any("output tokens of 3 requests are max_tokens as sent" in n for n in s.notes)


def test_text_without_a_tokenizer_is_estimated_and_the_note_says_so():
    s = ts.load_sample(DATA / "openai-log.jsonl")
    assert s.requests[3].prompt_tokens == ts.estimate_tokens("Summarise: the quick brown fox") == 8  # 30 bytes / 4
    assert any("estimated as UTF-8 bytes / 4" in n and "/tokenize" in n for n in s.notes)


def test_token_id_prompts_are_exact(tmp_path):
    s = ts.load_sample(write(tmp_path, '{"prompt": [1, 2, 3, 4], "max_tokens": 8}\n'), "openai-log")
    assert (s.requests[0].prompt_tokens, s.requests[0].output_tokens) == (4, 8)
    assert not any("estimated" in n for n in s.notes)


def test_sharegpt_array_each_answered_human_turn_is_a_request_with_the_history():
    s = ts.load_sample(DATA / "sharegpt.json", count=words)
    assert s.format == "sharegpt" and not s.has_arrivals
    a = s.sessions()["conv-a"]
    # prompt = system + every earlier turn + this one; output = the gpt turn after it
    assert [(r.turn, r.prompt_tokens, r.output_tokens) for r in a] == [(0, 2 + 2, 5), (1, 2 + 2 + 5 + 4, 1)]
    assert a[1].messages[-1] == {"role": "user", "content": "reset my password please"}
    assert [(r.turn, r.prompt_tokens, r.output_tokens) for r in s.sessions()["conv-b"]] == [(0, 6, 6)]
    assert [r.line for r in s.requests] == [2, 2, 10]  # the line each conversation starts on
    assert {(r.prefix_id, r.prefix_tokens) for r in s.requests} == {
        ("sys-" + hashlib.sha256(b"be brief").hexdigest()[:8], 2)}
    assert any("1 human turn without a following gpt reply left out" in n for n in s.notes)


def test_sharegpt_as_json_lines():
    s = ts.load_sample(DATA / "sharegpt.jsonl", count=words)
    assert s.format == "sharegpt"
    assert [(r.session, r.prompt_tokens, r.output_tokens, r.line) for r in s.requests] == [
        ("x1", 3, 2, 1), ("x2", 1, 4, 2)]


def test_metrics_text_is_quantile_rows_paired_prompt_with_output():
    s = ts.load_sample(DATA / "metrics.txt")
    assert s.format == "metrics" and len(s.requests) == ts.METRICS_ROWS and s.represents == 100
    assert not s.has_arrivals and not s.sessions()
    assert 1000 < s.percentiles("prompt_tokens", (99,))["p99"] <= 2000  # inside the (1000, 2000] bucket
    assert 20 < s.percentiles("prompt_tokens", (50,))["p50"] <= 50
    prompts = [r.prompt_tokens for r in s.requests]
    outputs = [r.output_tokens for r in s.requests]
    assert prompts == sorted(prompts) and outputs == sorted(outputs)  # paired level by level
    assert any("paired by quantile" in n and "100 requests" in n for n in s.notes)


# ---------------------------------------------------------------------------- telling the format


@pytest.mark.parametrize("name,fmt", [("sessions.jsonl", "jsonl"), ("openai-log.jsonl", "openai-log"),
                                      ("sharegpt.json", "sharegpt"), ("sharegpt.jsonl", "sharegpt"),
                                      ("metrics.txt", "metrics")])
def test_auto_tells_each_format_from_the_content(name, fmt):
    assert ts.detect_format((DATA / name).read_text())[0] == fmt
    assert ts.load_sample(DATA / name).format == fmt


def test_auto_knows_bare_vllm_histogram_lines_and_the_openai_wrapper():
    assert ts.detect_format('vllm:request_prompt_tokens_bucket{le="+Inf"} 3\n')[0] == "metrics"
    assert ts.detect_format('\n{"request": {"prompt": "x"}}\n')[0] == "openai-log"
    assert ts.detect_format('{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')[0] == "jsonl"


@pytest.mark.parametrize("text,why", [
    ("hello world\n", "line 1 is neither JSON nor Prometheus text"),
    ('{"tokens": 3}\n', "line 1 has none of the fields conversations, prompt_tokens"),
    ("\n\n[1]\n".replace("[1]", '"a string"'), "line 3 is a JSON str, not an object"),
], ids=["text", "unknown-fields", "not-an-object"])
def test_nothing_matches_says_which_formats_were_tried(tmp_path, text, why):
    with pytest.raises(ts.TrafficError) as exc:
        ts.load_sample(write(tmp_path, text), shown="t.jsonl")
    assert str(exc.value).startswith("traffic sample t.jsonl: cannot tell its format "
                                     "(tried jsonl, openai-log, sharegpt, metrics): " + why)


# ---------------------------------------------------------------------------- bad records: file:line and field

GOOD = '{"prompt_tokens": 10, "output_tokens": 5}\n'


@pytest.mark.parametrize("fmt,text,message", [
    ("jsonl", GOOD + '{"prompt_tokens": "ten", "output_tokens": 1}\n',
     "t.jsonl:2: field 'prompt_tokens' must be a non-negative integer, got 'ten'"),
    ("jsonl", GOOD + '{"prompt_tokens": 10}\n',
     "t.jsonl:2: missing field 'output_tokens' (or 'completion_tokens', 'usage.completion_tokens')"),
    ("jsonl", GOOD + '{"prompt_tokens": 10, "output_tokens": 1, "arrival_s": "soon"}\n',
     "t.jsonl:2: field 'arrival_s' must be a number of seconds, got 'soon'"),
    ("jsonl", GOOD + '{"prompt_tokens": 10, "output_tokens": 1, "prefix_tokens": 11}\n',
     "t.jsonl:2: field 'prefix_tokens' 11 exceeds prompt_tokens 10"),
    ("jsonl", GOOD + "{oops\n", "t.jsonl:2: not JSON (Expecting property name enclosed in double quotes)"),
    ("openai-log", '{"messages": [{"role": "user", "content": "hi"}]}\n',
     "t.jsonl:1: missing field 'max_tokens' (or 'max_completion_tokens', 'response.usage.completion_tokens')"),
    ("openai-log", '{"request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}}\n',
     "t.jsonl:1: field 'request.max_tokens' must be a non-negative integer, got -1"),
    ("openai-log", '{"request": {"model": "m", "max_tokens": 3}}\n',
     "t.jsonl:1: missing field 'request.messages' (or 'request.prompt'): not an OpenAI request"),
    ("openai-log", '{"messages": [{"content": "hi"}], "max_tokens": 3}\n', "t.jsonl:1: field 'messages[0].role' missing"),
    ("openai-log", '{"messages": [{"role": "user", "content": 7}], "max_tokens": 3}\n',
     "t.jsonl:1: field 'messages[0].content' must be text or a list of content parts, got 7"),
    ("openai-log", '{"prompt": ["a", "b"], "max_tokens": 3}\n',
     "t.jsonl:1: field 'prompt' must be text or a list of token ids (one request)"),
    ("openai-log", '{"prompt": "x", "max_tokens": 3, "timestamp": "yesterday"}\n',
     "t.jsonl:1: field 'timestamp' must be seconds or ISO 8601 text, got 'yesterday'"),
    ("openai-log", '{"prompt": "x", "max_tokens": 3, "response": {"usage": {"prompt_tokens": 1.5}}}\n',
     "t.jsonl:1: field 'response.usage.prompt_tokens' must be a non-negative integer, got 1.5"),
    ("sharegpt", '[\n {"id": 1, "conversations": [{"from": "human", "value": "a"}]},\n {"id": 2}\n]\n',
     "t.jsonl:3: missing field 'conversations'"),
    ("sharegpt", '[\n {"id": 1,\n  "conversations": [{"from": "robot", "value": "a"}]}\n]\n',
     "t.jsonl:2: field 'conversations[0].from' must be one of assistant, bard, bing, chatgpt, gpt, human, model, "
     "system, user, got 'robot'"),
    ("sharegpt", '{"id": 1, "conversations": [{"from": "human", "value": null}]}\n',
     "t.jsonl:1: field 'conversations[0].value' must be text, got None"),
    ("sharegpt", '[{"id": 1, "conversations": []}\n {"id": 2, "conversations": []}]\n',
     "t.jsonl:2: expected ',' or ']' after an array element"),
    ("sharegpt", '[{"id": 1, "conversations": []},\n', "t.jsonl: the JSON array is not closed"),
    ("metrics", "# HELP something\nsomething 1\n", "t.jsonl: no vllm:request_prompt_tokens or "
     "vllm:request_generation_tokens histogram (is it vLLM's /metrics?"),
    ("metrics", "vllm:request_prompt_tokens_bucket{le=oops} 1\n", "t.jsonl: not Prometheus text"),
], ids=["jsonl/prompt_tokens", "jsonl/output_tokens", "jsonl/arrival_s", "jsonl/prefix_tokens", "jsonl/not-json",
        "openai-log/max_tokens", "openai-log/request.max_tokens", "openai-log/messages", "openai-log/role",
        "openai-log/content", "openai-log/prompt", "openai-log/timestamp", "openai-log/usage",
        "sharegpt/conversations", "sharegpt/from", "sharegpt/value", "sharegpt/comma", "sharegpt/unclosed",
        "metrics/histogram", "metrics/not-prometheus"])
def test_a_bad_record_is_one_error_naming_file_line_and_field(tmp_path, fmt, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ts.TrafficError) as exc:
        ts.load_sample(path, fmt, shown="t.jsonl")
    assert str(exc.value).startswith(message), str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("bare", ["NaN", "Infinity", "-Infinity"])
def test_a_bare_nan_or_infinity_arrival_is_an_error_not_unrecorded(tmp_path, bare):
    # Python's json reads them; they were taken as "arrivals not recorded"
    for fmt, row in (("jsonl", '{"prompt_tokens": 4, "output_tokens": 2, "arrival_s": %s}'),
                     ("openai-log", '{"prompt": "x", "max_tokens": 3, "timestamp": %s}')):
        path = write(tmp_path, row % bare + "\n")
        with pytest.raises(ts.TrafficError, match=r"^t.jsonl:1: field '(arrival_s|timestamp)' must be "):
            ts.load_sample(path, fmt, shown="t.jsonl")


def test_arrivals_out_of_file_order_are_said_not_sorted_silently(tmp_path):
    rows = [(0.0, 4), (3.0, 4), (1.0, 4), (2.0, 4), (5.0, 4)]
    text = "".join('{"prompt_tokens": %d, "output_tokens": 2, "arrival_s": %s}\n' % (p, a) for a, p in rows)
    sample = ts.load_sample(write(tmp_path, text), "jsonl", shown="t.jsonl")
    assert sample.notes == ("arrivals out of file order: 1 request arriving before the request above (first: line 3); "
                            "replayed in time order",)
    ordered = ts.load_sample(write(tmp_path, text.replace('"arrival_s": 1.0', '"arrival_s": 4.0')
                                   .replace('"arrival_s": 2.0', '"arrival_s": 4.5')), "jsonl", shown="t.jsonl")
    assert not any("out of file order" in n for n in ordered.notes)


def test_empty_unreadable_and_unknown_format(tmp_path):
    with pytest.raises(ts.TrafficError, match=r"^traffic sample e.jsonl: no requests in it \(the file is empty\)"):
        ts.load_sample(write(tmp_path, "\n  \n"), shown="e.jsonl")
    with pytest.raises(ts.TrafficError, match=r"cannot read it \(No such file or directory\)"):
        ts.load_sample(tmp_path / "missing.jsonl")
    with pytest.raises(ts.TrafficError, match="format 'csv' is not one of auto, jsonl, openai-log, sharegpt, metrics"):
        ts.load_sample(DATA / "sessions.jsonl", "csv")
    with pytest.raises(ts.TrafficError, match=r"no requests in it \(sharegpt\)"):  # only unanswered turns
        ts.load_sample(write(tmp_path, '[{"id": 1, "conversations": [{"from": "human", "value": "a"}]}]'))


# ---------------------------------------------------------------------------- numbers and provenance


def test_percentiles_are_lengths_some_request_had(tmp_path):
    rows = "".join(json.dumps({"prompt_tokens": p, "output_tokens": 10}) + "\n" for p in range(1, 101))
    s = ts.load_sample(write(tmp_path, rows))
    assert s.percentiles() == {"p50": 50, "p90": 90, "p99": 99}
    assert s.percentiles("total", (50,)) == {"p50": 60}
    assert s.percentiles("output_tokens") == {"p50": 10, "p90": 10, "p99": 10}


def test_provenance_sha256_is_of_the_bytes_and_stable_across_copies(tmp_path):
    copy = tmp_path / "copy.jsonl"
    shutil.copy(DATA / "sessions.jsonl", copy)
    a, b = ts.load_sample(DATA / "sessions.jsonl"), ts.load_sample(copy, shown="elsewhere.jsonl")
    assert a.sha256 == b.sha256 == hashlib.sha256((DATA / "sessions.jsonl").read_bytes()).hexdigest()
    prov = b.provenance()
    assert prov["path"] == "elsewhere.jsonl" and prov["requests"] == 4 and prov["sessions"] == 1
    assert prov["prompt_tokens"] == {"p50": 100, "p90": 330, "p99": 330}


def test_rate_windows_name_the_burst(tmp_path):
    # 1 request/s for 20 s, then 10 in half a second at t=12
    arrivals = sorted([float(t) for t in range(21)] + [12.0 + 0.05 * i for i in range(1, 11)])
    s = ts.load_sample(write(tmp_path, "".join(json.dumps({"prompt_tokens": 8, "output_tokens": 4, "arrival_s": t})
                                               + "\n" for t in arrivals)))
    busiest, *rest = s.rate_windows(1.0)
    assert (busiest.start_s, busiest.end_s, busiest.requests) == (12.0, 13.0, 11)
    assert s.arrival_rate() == pytest.approx(31 / 20)
    assert busiest.ratio == pytest.approx(11 / (31 / 20))
    assert busiest.describe() == "11 requests in 12.0-13.0 s (11.0/s, 7.1x the mean 1.55/s)"
    assert len(rest) == 2 and all(w.requests <= 2 and not (w.start_s < 13 and 12 < w.end_s) for w in rest)
    assert ts.load_sample(DATA / "sharegpt.json").rate_windows() == []  # no arrival times


def test_overlong_callout_names_the_limits_and_the_first_line(tmp_path):
    rows = [{"prompt_tokens": 100, "output_tokens": 10}] * 97 + [{"prompt_tokens": 2000, "output_tokens": 64}] * 3
    s = ts.load_sample(write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows)), shown="t.jsonl")
    found = ts.overlong(s, 2048, 512)
    assert found == {"requests": 3, "share": 0.03, "prompt_p99": 2000, "limit": 2048 - 64, "first_line": 98}
    assert ts.overlong_message(found, s, 2048, 512, where="profile tiny-cpu") == (
        "traffic sample t.jsonl: 3 requests (3.0%) do not fit profile tiny-cpu: prompt + output over "
        "engine.max_model_len 2,048 or output over limits.max_tokens_cap 512 (first at line 98); prompt p99 2,000 "
        "tokens > 1,984 (max_model_len - p99 output)")
    assert ts.overlong(s, 4096, 512) is None
    assert ts.overlong_message(None, s, 4096, 512) == (
        "traffic sample t.jsonl: every request fits the profile (prompt + output <= engine.max_model_len 4,096 and "
        "output <= limits.max_tokens_cap 512)")


# ---------------------------------------------------------------------------- the shipped sample


@pytest.fixture(scope="module")
def shipped():
    return ts.load_sample(SHIPPED, shown="traffic/tiny-chat.jsonl")


def test_shipped_sample_is_the_seeded_synth_with_defaults_byte_for_byte():
    assert SHIPPED.read_text(encoding="utf-8") == jsonl_text(synth(SynthSpec(seed=0)))
    assert jsonl_text(synth(SynthSpec(seed=1))) != jsonl_text(synth(SynthSpec(seed=0)))


def test_shipped_sample_size_arrivals_and_fit(shipped):
    assert shipped.format == "jsonl" and shipped.has_arrivals and shipped.notes == ()
    assert 270 <= len(shipped.requests) <= 330
    t = [r.arrival_s for r in shipped.requests]
    assert t == sorted(t) and 130 <= t[-1] - t[0] <= 170
    assert 1.6 <= shipped.arrival_rate() <= 2.4
    # every request well inside tiny-cpu's max_model_len 2,048; outputs 16-96; a few long prompts
    assert max(r.prompt_tokens + r.output_tokens for r in shipped.requests) <= 1500
    assert {r.output_tokens for r in shipped.requests} <= set(range(16, 97))
    assert 5 <= sum(1 for r in shipped.requests if r.session is None and r.prompt_tokens >= 1000) <= 12
    assert ts.overlong(shipped, 2048, 512) is None


def test_shipped_sample_sessions_grow_by_what_was_said_and_share_one_system_prompt(shipped):
    sessions = shipped.sessions()
    assert 45 <= len(sessions) <= 55
    for sid, turns in sessions.items():
        assert 2 <= len(turns) <= 5, sid
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert 300 <= turns[0].prompt_tokens <= 700
        for a, b in zip(turns, turns[1:]):
            assert 8 <= b.prompt_tokens - (a.prompt_tokens + a.output_tokens) <= 120, (sid, b.turn)
            assert b.arrival_s - a.arrival_s >= 1.0  # think time after the reply
        assert {(r.prefix_id, r.prefix_tokens) for r in turns} == {("sys-support", 256)}
    singles = [r for r in shipped.requests if r.session is None]
    assert {r.prefix_id for r in singles} == {"sys-support", None}  # single-turn requests with and without it
    assert all(r.prefix_tokens == 256 for r in singles if r.prefix_id)


def test_sample_for_resolves_the_path_beside_the_profile_and_names_the_field(tmp_path):
    from types import SimpleNamespace

    (tmp_path / "traffic").mkdir()
    shutil.copy(DATA / "openai-log.jsonl", tmp_path / "traffic" / "log.jsonl")

    def profile(path):
        spec = SimpleNamespace(path=path, format="auto")
        return SimpleNamespace(source=str(tmp_path / "p.yaml"), name="p",
                               workloads={"chat": SimpleNamespace(traffic=spec), "plain": SimpleNamespace(traffic=None)})

    s = ts.sample_for(profile("traffic/log.jsonl"), "chat", count=words)
    assert s.path == "traffic/log.jsonl" and s.requests[1].prompt_tokens == 17  # counted with the given counter
    assert ts.sample_for(profile("traffic/log.jsonl"), "plain") is None
    with pytest.raises(ts.TrafficError, match=r"p.yaml: field 'workloads.chat.traffic': traffic sample "
                                              r"traffic/gone.jsonl: cannot read it"):
        ts.sample_for(profile("traffic/gone.jsonl"), "chat")


def test_summary_counts_one_of_a_kind_in_the_singular(tmp_path):
    """One session of one turn and one single request a second later: no "1 requests", "1 turns"."""
    from kvgate.traffic.sample import load_sample
    f = tmp_path / "one.jsonl"
    f.write_text('{"prompt_tokens": 10, "output_tokens": 5, "arrival_s": 0, "session": "a", "turn": 0}\n'
                 '{"prompt_tokens": 10, "output_tokens": 5, "arrival_s": 1}\n')
    text = load_sample(f).summary()
    assert "(1 session of 1 turn, 1 request; 1 without a session)" in text, text
    assert "busiest 1-s window: 1 request in 0.0-1.0 s" in text, text
    f.write_text('{"prompt_tokens": 10, "output_tokens": 5, "prefix_id": "p", "prefix_tokens": 4}\n')
    assert "prefix    p: 4 tokens, shared by 1 request\n" in load_sample(f).summary() + "\n"
