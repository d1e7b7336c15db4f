"""Prompts of an exact token length, verified against the server's own tokenizer.

Token counts depend on the served tokenizer (BPE merges, BOS, chat template), so lengths are
never guessed: :func:`exact_prompt` searches the number of filler words with a ``count`` function
— normally :func:`server_counter`, which calls vLLM's ``POST /tokenize`` — until the count is
exactly the target, then returns the text with its verified count. A target that cannot be hit
(e.g. the chat template alone is longer) raises :class:`PromptError`; an endpoint whose
``/tokenize`` *answers* something unusable (a gateway's 413 page, a 5xx, HTML, non-JSON) raises
:class:`PreparationRefused`, which the plugin turns into the asking gate's FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from kvgate.http.client import KvClient, Reply
from kvgate.http.text import describe_answer

Api = Literal["completions", "chat"]
CountFn = Callable[[str], int]

#: Filler that most BPE vocabularies split into ~1 token per word; the search does not rely on it.
FILLER_WORDS = ("the", "kv", "cache", "block", "token", "pool", "gate", "load")
#: Short tails tried to close a gap of one or two tokens after the search.
TAILS = (" a", " x", ".", "a", " the", " kv", "!", "?", " 1", "1", ",", " and")


class PromptError(Exception):
    """No prompt of the requested length exists or the tokenizer endpoint misbehaved."""


class PromptUnavailable(PromptError):
    """An exact-length prompt cannot be built here at all (the server has no ``/tokenize`` and no
    local tokenizer is configured for chat): what needs it is not checked (a SKIP with this reason)."""


class PreparationRefused(PromptError):
    """The endpoint answered a request kvgate sent to prepare a gate (a ``/tokenize`` count, a
    probe) with something it cannot use: a status other than 200 (a gateway's 413, a 5xx) or a 200
    that is not the expected JSON. Not a harness error: the gate whose preparation it broke FAILs
    with this (:func:`kvgate.gates.common.preparation_verdict`, wired in :mod:`kvgate.plugin`).

    ``route``: the path asked; ``status``: its HTTP status (0: no answer); ``body_bytes``: the
    request body's size in bytes as sent (None when unknown); ``answer``: what came back, a few
    words (:func:`kvgate.http.text.describe_answer`); ``target_tokens`` / ``api``: the prompt being
    built when it happened (set by :func:`exact_prompt`)."""

    def __init__(self, route: str, status: int, body_bytes: int | None, answer: str, *,
                 target_tokens: int | None = None, api: str | None = None) -> None:
        self.route, self.status, self.body_bytes, self.answer = route, status, body_bytes, answer
        self.target_tokens, self.api = target_tokens, api
        super().__init__(self.describe())

    @classmethod
    def of(cls, route: str, reply: Reply) -> "PreparationRefused":
        """The refusal ``reply`` (an answer to ``route``) is."""
        return cls(route, reply.status, reply.sent_bytes, describe_answer(reply.status, reply.text, reply.headers))

    def describe(self) -> str:
        """``/tokenize answered 413 for a 6,144-byte body (HTML: "413 Request Entity Too Large")
        while building the 2,032-token completions prompt``."""
        size = f" for a {self.body_bytes:,}-byte body" if self.body_bytes is not None else ""
        said = "gave no answer" if self.status == 0 else f"answered {self.status}"
        what = f" while building the {self.target_tokens:,}-token {self.api} prompt" if self.target_tokens else ""
        return f"{self.route} {said}{size} ({self.answer}){what}"

    def building(self, target_tokens: int, api: str) -> "PreparationRefused":
        """This refusal, naming the prompt being built (the first caller to know it wins)."""
        if self.target_tokens is None:
            self.target_tokens, self.api = target_tokens, api
            self.args = (self.describe(),)
        return self


#: Token ids of token-id prompts (``/completions`` accepts ``prompt: [ids]``; vLLM adds no BOS to
#: them): small ids, present in every vocabulary, cycled.
TOKEN_IDS = tuple(range(100, 164))


@dataclass(frozen=True)
class ExactPrompt:
    """``text`` whose server-side token count (``tokens``) equals the request, for ``api``."""

    text: str
    tokens: int
    api: Api
    #: Set for a token-id prompt (``/completions`` ``prompt: [ids]``): exact by construction.
    token_ids: tuple[int, ...] | None = None
    #: How many filler words the text holds after its prefix (:func:`exact_prompt`; the next
    #: prompt of this length starts its search there). None for a token-id prompt.
    filler_words: int | None = None

    def body(self, model: str, **params: object) -> dict:
        """Request body for ``/v1/completions`` or ``/v1/chat/completions``."""
        if self.api == "chat":
            return {"model": model, "messages": [{"role": "user", "content": self.text}], **params}
        return {"model": model, "prompt": list(self.token_ids) if self.token_ids is not None else self.text, **params}


def token_id_prompt(tokens: int, seed: str = "") -> ExactPrompt:
    """A completions prompt of exactly ``tokens`` token ids (no tokenizer needed: the count is the
    list's length). ``seed`` (a request's prefix) shifts the ids, so requests meant to occupy the KV
    pool separately share no prefix blocks."""
    import zlib

    off = zlib.crc32(seed.encode()) % len(TOKEN_IDS)
    ids = tuple(TOKEN_IDS[(off + i) % len(TOKEN_IDS)] for i in range(tokens))
    return ExactPrompt(f"<{tokens} token ids>", tokens, "completions", ids)


def local_counter(tokenizer_path: str, api: Api) -> CountFn:
    """A ``count(text)`` with the Hugging Face tokenizer at ``tokenizer_path`` (the profile's
    ``model.tokenizer``): chat renders the tokenizer's chat template with the generation prompt,
    as vLLM does for ``/v1/chat/completions``; completions adds the special tokens (BOS) as vLLM
    does. Raises :class:`PromptUnavailable` when transformers or the tokenizer cannot be loaded."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as exc:  # ImportError, OSError (no such directory), ValueError
        raise PromptUnavailable(f"model.tokenizer {tokenizer_path!r} cannot be loaded ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None

    def count(text: str) -> int:
        if api == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return len(ids)
        return len(tok(text)["input_ids"])

    return count


def filler(n: int, words: Sequence[str] = FILLER_WORDS) -> str:
    """``n`` filler words (``words`` cycled), deterministic."""
    return " ".join(words[i % len(words)] for i in range(n))


def server_counter(client: KvClient, model: str, api: Api) -> CountFn:
    """A ``count(text)`` that asks ``/tokenize`` (chat: with the chat template and generation
    prompt, as the server renders ``/v1/chat/completions``). Raises :class:`PreparationRefused`
    when ``/tokenize`` answers anything but a 200 with an integer ``count`` (the status, the body's
    size in bytes and what came back, e.g. a gateway's 413 page for a long prompt)."""

    def count(text: str) -> int:
        if api == "chat":
            r = client.tokenize(model=model, messages=[{"role": "user", "content": text}])
        else:
            r = client.tokenize(model=model, prompt=text)
        body = r.json
        if r.status != 200 or not isinstance(body, dict) or not isinstance(body.get("count"), int):
            raise PreparationRefused.of("/tokenize", r)
        return body["count"]

    return count


def exact_prompt(count: CountFn, target: int, api: Api = "completions", max_calls: int = 64,
                 prefix: str = "", hint: int | None = None, words: Sequence[str] = FILLER_WORDS) -> ExactPrompt:
    """Text whose ``count`` is exactly ``target`` tokens, starting with ``prefix``.

    Binary search on the number of filler words for the longest text with ``count <= target``,
    then close any remaining gap with short tails. At most ``max_calls`` calls of ``count``.
    A distinct ``prefix`` per request keeps prefix caching from sharing KV blocks between
    requests that are meant to occupy the pool separately. ``hint``: a filler word count to
    bracket from (the :attr:`ExactPrompt.filler_words` of a prompt of this length with another
    prefix): steps of 1, 2, 4, ... from it instead of from ``target`` -- the same boundary (the
    longest filler that fits), found in ~4 calls instead of ~12 (384 tokens); the result is
    verified by ``count`` either way. ``words``: the filler's words (cycled).
    """
    calls = 0
    seen: dict[int, int] = {}

    def c(text: str) -> int:
        nonlocal calls
        calls += 1
        if calls > max_calls:
            raise PromptError(f"no {target}-token prompt found within {max_calls} /tokenize calls")
        try:
            return count(text)
        except PreparationRefused as exc:
            raise exc.building(target, api) from None

    def fits(n: int) -> bool:  # the prompt with n filler words is at most target tokens (counted once)
        if n not in seen:
            seen[n] = c(prefix + filler(n, words))
        return seen[n] <= target

    base = c(prefix)
    if base > target:
        raise PromptError(f"the bare {api} prompt {prefix!r} already has {base} tokens (> {target})")
    seen[0] = base
    if hint is not None and 0 < hint:
        step = 1
        if fits(hint):  # lo fits, hi does not: walk up from the hint
            lo, hi = hint, hint + 1
            while fits(hi):
                lo, step = hi, step * 2
                hi = lo + step
        else:  # walk down to a length that fits (0 does)
            lo, hi = max(0, hint - 1), hint
            while not fits(lo):
                hi, step = lo, step * 2
                lo = max(0, hi - step)
    else:
        lo, hi = 0, max(1, target)
        while fits(hi):  # make sure hi overshoots
            lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    text = prefix + filler(lo, words)
    n = seen[lo] if lo in seen else c(text)
    for _ in range(target):
        if n == target:
            return ExactPrompt(text, n, api, filler_words=lo)
        for tail in TAILS:
            m = c(text + tail)
            if n < m <= target:
                text, n = text + tail, m
                break
        else:
            break
    if n == target:
        return ExactPrompt(text, n, api, filler_words=lo)
    raise PromptError(f"could not build a {target}-token {api} prompt (closest {n})")
