"""The accuracy task: a local JSONL file of short-answer items, scored per item. The binomial
intervals a verdict needs live in :mod:`kvgate.stats.proportion` (``interval`` and
``difference_interval`` stay importable from here).

One item a line: ``{"id": "capital-france", "question": "What is the capital of France?",
"answer": "\\\\bParis\\\\b"}`` -- ``question`` (one user turn), or ``messages`` (a conversation), or
``prompt`` (a completion); ``answer`` a regex a right reply matches (case-insensitive, searched).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.stats.proportion import difference_interval, interval  # noqa: F401 -- kept importable from here


class TaskError(Exception):
    """The task file cannot be used (missing, a line not JSON, an item without a prompt or answer).
    One line naming the file and the line."""


@dataclass(frozen=True)
class Item:
    """One task item: ``route`` chat or completions, ``messages`` or ``prompt``, ``answer`` regex."""

    id: str
    route: str
    messages: list[dict[str, str]] | None
    prompt: str | None
    answer: str


def load_task(path: Path) -> list[Item]:
    """The items of a JSONL task file, in order. Raises :class:`TaskError`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskError(f"accuracy task {path}: cannot read it ({exc.strerror or exc})") from None
    items: list[Item] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise TaskError(f"accuracy task {path}:{n}: not JSON ({exc})") from None
        if not isinstance(d, dict) or not isinstance(d.get("answer"), str):
            raise TaskError(f"accuracy task {path}:{n}: an item needs an 'answer' regex")
        try:
            re.compile(d["answer"])
        except re.error as exc:
            raise TaskError(f"accuracy task {path}:{n}: answer {d['answer']!r} is not a regex ({exc})") from None
        iid = str(d.get("id") or f"item-{n}")
        if isinstance(d.get("question"), str):
            items.append(Item(iid, "chat", [{"role": "user", "content": d["question"]}], None, d["answer"]))
        elif isinstance(d.get("messages"), list):
            items.append(Item(iid, "chat", d["messages"], None, d["answer"]))
        elif isinstance(d.get("prompt"), str):
            items.append(Item(iid, "completions", None, d["prompt"], d["answer"]))
        else:
            raise TaskError(f"accuracy task {path}:{n}: an item needs 'question', 'messages' or 'prompt'")
    if not items:
        raise TaskError(f"accuracy task {path}: holds no items")
    return items


def correct(item: Item, text: str) -> bool:
    """Whether ``text`` answers ``item`` right (its regex found, case-insensitive)."""
    return matches(item.answer, text)


def matches(answer: str, text: str) -> bool:
    """kvgate's rule: the ``answer`` regex found in ``text``, case-insensitive (also lm-eval's
    score of kvgate's task: :func:`kvgate.answers.lmeval.task.process_results`)."""
    return re.search(answer, text, re.IGNORECASE) is not None


def scored(items: list[Item], texts: list[str | None]) -> list[dict[str, Any]]:
    """Per item: ``{"id", "correct", "answer" (clipped), "expected"}``; ``None`` text = no answer."""
    out = []
    for it, t in zip(items, texts):
        out.append({"id": it.id, "correct": t is not None and correct(it, t), "answer": (t or "")[:160],
                    "expected": it.answer, "answered": t is not None})
    return out
