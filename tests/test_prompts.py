"""Exact-length prompts against fake tokenizers (no server)."""

from __future__ import annotations

import pytest

from kvgate.http.prompts import PromptError, exact_prompt


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
