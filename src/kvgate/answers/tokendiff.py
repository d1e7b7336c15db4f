"""How two answers to the same prompt are told apart, token by token: used by the answers gate's
measurement, the answers, requests and compare gates, and the golden set (:mod:`kvgate.compare.golden`).

An answer is its token sequence (vLLM's ``return_tokens_as_token_ids`` makes each logprobs token
``token_id:N``, so two tokens that both decode to ``""`` -- common on a random tiny model -- still
differ) with each position's ``top_logprobs`` (:class:`Answer`, read by :func:`answer_of` /
:func:`logprobs_of`). Two answers are compared up to the first position where they part
(:func:`compare_answers`); after it the contexts differ and nothing more can be said. The parting
is a *near tie* when either side ranks the other's token within the tolerance (nats) of its own
choice -- what a cold vs warm prefix cache, a batch of another shape or another kernel flips at
temperature 0 (vllm#40896, PR#52701) -- else *drift* (:class:`Difference`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Answer:
    """One endpoint's answer to a golden prompt: ``tokens`` (``token_id:N`` strings, else the token
    texts; empty without logprobs), ``top`` (per position: token -> logprob, nats), ``text`` (the
    content, plus reasoning and tool calls, as a reader sees it), ``finish_reason``, ``status`` (HTTP;
    0 no answer), ``error`` (why there is no answer) and ``prompt_tokens`` (``usage.prompt_tokens``:
    the prompt as the server counted it; None when not reported, or in a file that predates it)."""

    tokens: list[str] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    prompt_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Answer":
        return cls(tokens=list(d.get("tokens") or []), top=[dict(t) for t in d.get("top") or []],
                   text=str(d.get("text") or ""), finish_reason=d.get("finish_reason"),
                   status=int(d.get("status") or 0), error=d.get("error"),
                   prompt_tokens=d["prompt_tokens"] if isinstance(d.get("prompt_tokens"), int) else None)


def answer_of(route: str, status: int, body: Any, error_text: str = "") -> Answer:
    """An :class:`Answer` from a non-streamed chat or completions response (``body``: the parsed
    JSON, None when it was not JSON). A non-200, or a 200 without ``choices``, is an answer with
    ``error`` saying what came back."""
    if status != 200 or not isinstance(body, dict) or not body.get("choices"):
        what = f"HTTP {status}" if status else "no answer"
        return Answer(status=status, error=f"{what}: {error_text[:200]}" if error_text else what)
    choice = body["choices"][0] or {}
    lp = choice.get("logprobs") or {}
    if route == "chat":
        msg = choice.get("message") or {}
        parts = [str(msg.get("reasoning") or msg.get("reasoning_content") or ""), str(msg.get("content") or "")]
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append(f"<call {fn.get('name')}>{fn.get('arguments')}")
        text = "".join(p for p in parts if p)
    else:
        text = str(choice.get("text") or "")
    tokens, top = logprobs_of(route, lp)
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    counted = usage.get("prompt_tokens")
    return Answer(tokens, top, text, choice.get("finish_reason"), status,
                  prompt_tokens=counted if isinstance(counted, int) and not isinstance(counted, bool) else None)


def logprobs_of(route: str, lp: dict[str, Any]) -> tuple[list[str], list[dict[str, float]]]:
    """``(tokens, top)`` of one choice's ``logprobs`` object (a whole answer's, or one stream chunk's):
    each position's token and its alternatives (token -> logprob, nats, the chosen one included).
    Chat's shape (``content: [{token, logprob, top_logprobs: [{token, logprob}]}]``) or completions'
    (``tokens``, ``token_logprobs``, ``top_logprobs: [{token: logprob}]``)."""
    tokens: list[str] = []
    top: list[dict[str, float]] = []
    if route == "chat":
        for pos in lp.get("content") or []:
            tokens.append(str(pos.get("token")))
            alts = {str(a.get("token")): float(a.get("logprob")) for a in pos.get("top_logprobs") or []
                    if a.get("logprob") is not None}
            if pos.get("logprob") is not None:
                alts.setdefault(str(pos.get("token")), float(pos["logprob"]))
            top.append(alts)
        return tokens, top
    tokens = [str(t) for t in lp.get("tokens") or []]
    chosen = lp.get("token_logprobs") or []
    for i, alts in enumerate(lp.get("top_logprobs") or []):
        d = {str(k): float(v) for k, v in (alts or {}).items() if v is not None}
        if i < len(tokens) and i < len(chosen) and chosen[i] is not None:
            d.setdefault(tokens[i], float(chosen[i]))
        top.append(d)
    return tokens, top


@dataclass(frozen=True)
class Difference:
    """How the new answer differs from the baseline's: ``kind`` ``identical``, ``near-tie``,
    ``drift`` or ``error`` (one side has no answer); ``position`` (0-based token index where they
    part), ``base_token``/``new_token`` there, ``gap`` (nats: how far below its own choice the
    side that ranks the other's token puts it; None when neither does), ``by`` (``baseline``,
    ``new`` or None: whose logprobs showed the near tie), and ``how`` (how it was compared:
    ``tokens`` or ``text``)."""

    kind: str
    position: int | None = None
    base_token: str | None = None
    new_token: str | None = None
    gap: float | None = None
    by: str | None = None
    how: str = "tokens"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gap(top: dict[str, float], chosen: str, other: str) -> float | None:
    """Nats between ``chosen``'s logprob and ``other``'s in one position's alternatives (None when
    either is missing)."""
    if chosen not in top or other not in top:
        return None
    return top[chosen] - top[other]


def compare_answers(base: Answer, new: Answer, tolerance: float) -> Difference:
    """Classify ``new`` against ``base`` (:class:`Difference`). Tokens are compared when both have
    them, else the texts (no logprobs: a difference cannot be told from a near tie and counts as
    drift). ``tolerance``: nats (``compare.near_tie_logprob``)."""
    if not base.ok or not new.ok:
        return Difference("error", how="none")
    if not base.tokens or not new.tokens:
        if base.text == new.text:
            return Difference("identical", how="text")
        i = next((k for k, (a, b) in enumerate(zip(base.text, new.text)) if a != b), min(len(base.text), len(new.text)))
        return Difference("drift", i, base.text[i:i + 12], new.text[i:i + 12], None, None, "text")
    n = min(len(base.tokens), len(new.tokens))
    i = next((k for k in range(n) if base.tokens[k] != new.tokens[k]), None)
    if i is None:
        if len(base.tokens) == len(new.tokens):
            return Difference("identical")
        i = n  # one stopped where the other went on: the end itself is the parting
    b = base.tokens[i] if i < len(base.tokens) else "<end>"
    w = new.tokens[i] if i < len(new.tokens) else "<end>"
    gaps = []
    if i < len(base.top) and (g := _gap(base.top[i], b, w)) is not None:
        gaps.append((g, "baseline"))
    if i < len(new.top) and (g := _gap(new.top[i], w, b)) is not None:
        gaps.append((g, "new"))
    if gaps:
        gap, by = min(gaps)
        gap = abs(gap)
        if gap <= tolerance or math.isclose(gap, tolerance):
            return Difference("near-tie", i, b, w, round(gap, 4), by)
        return Difference("drift", i, b, w, round(gap, 4), by)
    return Difference("drift", i, b, w, None, None)
