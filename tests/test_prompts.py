"""Exact-length prompts against fake tokenizers (no server), and an endpoint whose /tokenize
refuses the counts (httpx.MockTransport): a PreparationRefused naming what came back."""

from __future__ import annotations

import json

import httpx
import pytest

from kvgate.gates.common import preparation_verdict
from kvgate.http.client import Endpoint, KvClient
from kvgate.http.prompts import PreparationRefused, PromptError, exact_prompt, server_counter


def words_plus_bos(text: str) -> int:
    return 1 + len(text.split())


def merging(text: str) -> int:
    # a BPE-like tokenizer: "the kv" pairs merge into one token; BOS + template overhead 3
    ws = text.split()
    n, i = 0, 0
    while i < len(ws):
        i += 2 if ws[i:i + 2] == ["the", "kv"] else 1
        n += 1
    return 3 + n


@pytest.mark.parametrize("count", [words_plus_bos, merging])
@pytest.mark.parametrize("target", [3, 4, 17, 2032, 2049])
def test_exact_length_is_exact(count, target):
    p = exact_prompt(count, target)
    assert p.tokens == target == count(p.text)


def test_target_below_template_overhead_is_an_error():
    with pytest.raises(PromptError, match="already has 3 tokens"):
        exact_prompt(merging, 2)


def test_bounded_number_of_tokenize_calls():
    calls = []

    def counting(text):
        calls.append(text)
        return words_plus_bos(text)

    exact_prompt(counting, 2049)
    assert len(calls) <= 40


def test_chat_body_wraps_messages():
    p = exact_prompt(words_plus_bos, 5, api="chat")
    body = p.body("m", max_tokens=3)
    assert body["messages"][0]["content"] == p.text and body["max_tokens"] == 3


# ---- an endpoint that refuses the counts: PreparationRefused (the gate's FAIL, kvgate.plugin)

def test_tokenize_413_is_a_refusal_naming_status_body_bytes_and_the_prompt():
    page = "<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body></html>"
    sizes = []

    def gateway(request):  # a 4 KB body limit in front of a one-token-per-word /tokenize
        sizes.append(len(request.content))
        if len(request.content) > 4096:
            return httpx.Response(413, text=page, headers={"content-type": "text/html"})
        return httpx.Response(200, json={"count": 1 + len(json.loads(request.content)["prompt"].split())})

    client = KvClient(Endpoint("http://gw"), transport=httpx.MockTransport(gateway))
    with pytest.raises(PreparationRefused) as info:
        exact_prompt(server_counter(client, "m", "completions"), 2040)
    exc = info.value
    assert (exc.route, exc.status, exc.target_tokens, exc.api) == ("/tokenize", 413, 2040, "completions")
    assert exc.body_bytes == max(sizes) > 4096 and exc.answer == 'HTML: "413 Request Entity Too Large"'
    assert str(exc) == (f'/tokenize answered 413 for a {exc.body_bytes:,}-byte body (HTML: "413 Request Entity Too '
                        'Large") while building the 2,040-token completions prompt')
    v = preparation_verdict("max-context/completions", exc, 2048)
    assert v.status.value == "FAIL" and v.measured == 413 and v.evidence["body_bytes"] == exc.body_bytes
    assert v.message.endswith("-> FAIL (the endpoint refuses a body the profile allows: a 2,040-token prompt, "
                              "max_model_len 2,048)")
    assert "before the engine can judge" in preparation_verdict("g", exc.building(9, "chat"), 8).message  # kept: 2,040
    over = PreparationRefused("/tokenize", 413, 9000, "HTML", target_tokens=2049, api="chat")
    assert "refuses the body by its size before the engine can judge the prompt" in \
        preparation_verdict("max-context/over-length/chat", over, 2048).message


@pytest.mark.parametrize("status,text,ctype,said", [
    (500, '{"error": {"message": "EngineCore died", "type": "InternalServerError"}}', "application/json",
     'JSON error: "EngineCore died"'),
    (502, "<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html", 'HTML: "502 Bad Gateway"'),
    (200, "ok", "text/plain", 'text/plain: "ok"'),
    (200, '{"tokens": [1]}', "application/json", 'JSON: {"tokens": [1]}'),
    (503, "", "", "an empty body"),
])
def test_tokenize_answers_that_are_not_a_count_are_refusals(status, text, ctype, said):
    client = KvClient(Endpoint("http://gw"), transport=httpx.MockTransport(
        lambda r: httpx.Response(status, text=text, headers={"content-type": ctype} if ctype else {})))
    with pytest.raises(PreparationRefused) as info:
        server_counter(client, "m", "chat")("the kv cache")
    assert info.value.status == status and info.value.answer == said and info.value.body_bytes > 0
    assert info.value.target_tokens is None and "while building" not in str(info.value)


@pytest.mark.parametrize("count", [words_plus_bos, merging])
@pytest.mark.parametrize("target", [17, 384, 2049])
def test_a_hint_finds_the_same_prompt_in_fewer_calls(count, target):
    """The next prompt of a length (another prefix) starts where the last one's filler ended: the
    same text as the search from scratch (the longest filler that fits), a third of the calls."""
    calls = []

    def counting(text):
        calls.append(text)
        return count(text)

    first = exact_prompt(counting, target, prefix="long request 0: ")
    cold = len(calls)
    for prefix, hint in [("long request 1: ", first.filler_words), ("long request 12: ", first.filler_words),
                         ("x: ", first.filler_words + 7), ("a much longer prefix than before: ", 1)]:
        calls.clear()
        warm = exact_prompt(counting, target, prefix=prefix, hint=hint)
        assert warm == exact_prompt(count, target, prefix=prefix)  # the same boundary, verified the same way
        assert warm.tokens == target == count(warm.text)
        if hint == first.filler_words and prefix.startswith("long"):
            assert len(calls) <= 5 < cold, (len(calls), cold)


def test_build_prompt_hands_the_last_filler_length_to_the_next_prompt_of_that_length():
    from kvgate.http import probes

    counted = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            counted.append(1)
            return httpx.Response(200, json={"count": words_plus_bos(json.loads(request.content)["prompt"]),
                                             "max_model_len": 4096, "tokens": []})
        return httpx.Response(404, json={"error": "no"})

    client = KvClient(Endpoint(base_url="http://hinted.test"), transport=httpx.MockTransport(handler))
    probes._FILLER_HINTS.clear()
    first = probes.build_prompt(client, "m", "completions", 384, prefix="long request 0: ")
    cold, counted[:] = len(counted), []
    second = probes.build_prompt(client, "m", "completions", 384, prefix="long request 1: ")
    assert first.tokens == second.tokens == 384 and second.text.startswith("long request 1: ")
    assert len(counted) <= 4 < cold, (len(counted), cold)
