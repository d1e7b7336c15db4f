"""The golden set: fixed prompts answered at temperature 0 with logprobs, and how two answers to
the same prompt are told apart.

An answer is its token sequence (vLLM's ``return_tokens_as_token_ids`` makes each logprobs token
``token_id:N``, so two tokens that both decode to ``""`` -- common on a random tiny model -- still
differ) with each position's ``top_logprobs``. Two answers are compared up to the first position
where they part (:func:`compare_answers`); after it the contexts differ and nothing more can be
said. The parting is a *near tie* when either side ranks the other's token within the tolerance
(nats) of its own choice -- what a cold vs warm prefix cache, a batch of another shape or another
kernel flips at temperature 0 (vllm#40896, PR#52701) -- else *drift*: the new revision says
something the old one would not have (fp8 KV cache garbage on multi-turn prompts, vllm#38652; an
adapter serving base-model output, vllm#55193; a changed chat template or tokenizer).

The golden file (:data:`GOLDEN_FILE`, JSON, beside summary.json) records one run's prompts and
answers, so a later run compares with it without a second server (``--baseline-reports DIR``), and
each prompt's *rendering*: the server's ``usage.prompt_tokens`` for it (in its answer) and its
``/tokenize`` ids and token strings (:class:`kvgate.http.rendering.Rendering`), so a changed chat
template or tokenizer is named as itself, not only as answers that drift. A file recorded before
kvgate recorded renderings reads as "not recorded", not as a failure.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvgate.http.rendering import Rendering
from kvgate.profile.models import Profile

#: The golden answers of a run, written beside its summary.json.
GOLDEN_FILE = "golden.json"
#: Its format version (a reader refuses another).
GOLDEN_VERSION = 1

SINGLE_TURN = (
    "Name three colours of the sea at dawn.",
    "Write one sentence about a lighthouse keeper.",
    "What is twelve times seven? Answer in words.",
)
SYSTEM = "You are a terse assistant. Answer in one short sentence."
MULTI_TURN = (
    ("user", "I am planning a trip to Oslo in March."),
    ("assistant", "March in Oslo is cold; pack warm layers."),
    ("user", "Which museum should I see first?"),
)


@dataclass(frozen=True)
class GoldenPrompt:
    """One prompt of the golden set: ``name`` (``single-turn/1``, ``multi-turn/system``,
    ``long-context``, ``tools/auto``, ``structured/<case>``), the ``route`` (``chat`` or
    ``completions``) and the request ``body`` without the sampling fields (:func:`request_body`
    adds them) and without ``model``."""

    name: str
    route: str
    body: dict[str, Any]


def long_prompt_tokens(profile: Profile) -> int:
    """[tokens] the long-context prompt: ``compare.long_prompt_tokens``, else half of
    ``max_model_len`` (at most 4,096), always leaving room for ``compare.max_tokens``."""
    c = profile.compare
    want = c.long_prompt_tokens or min(4096, profile.engine.max_model_len // 2)
    return max(1, min(want, profile.engine.max_model_len - c.max_tokens - 1))


def golden_set(profile: Profile, long_text: str) -> list[GoldenPrompt]:
    """The golden prompts for ``profile``: three single-turn chats, a multi-turn chat with a system
    prompt, one without, the ``long_text`` completion (about :func:`long_prompt_tokens` tokens,
    built by the caller against the server's tokenizer), and, for each serve feature the engine
    turns on, its request (tool calling with ``tool_choice`` auto or required; each structured
    output grammar of the battery; the reasoning parser with thinking on)."""
    from kvgate.gates.features import battery, feature_skips, reasoning_body, structured_body, tool_body

    out = [GoldenPrompt(f"single-turn/{i + 1}", "chat", {"messages": [{"role": "user", "content": p}]})
           for i, p in enumerate(SINGLE_TURN)]
    turns = [{"role": r, "content": c} for r, c in MULTI_TURN]
    out.append(GoldenPrompt("multi-turn/system", "chat", {"messages": [{"role": "system", "content": SYSTEM}] + turns}))
    out.append(GoldenPrompt("multi-turn/plain", "chat", {"messages": turns}))
    out.append(GoldenPrompt("long-context", "completions", {"prompt": long_text}))
    skips = feature_skips(profile)
    drop = ("model", "temperature", "max_tokens", "stream", "seed", "top_p", "top_k", "frequency_penalty",
            "presence_penalty", "repetition_penalty")

    def plain(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in drop}

    if skips["tools"] is None:
        case = "tools/auto" if profile.engine.enable_auto_tool_choice else "tools/required"
        out.append(GoldenPrompt(case, "chat", plain(tool_body(profile, case))))
    if skips["structured"] is None:
        for g in battery(profile.features):
            out.append(GoldenPrompt(f"structured/{g.name}", "chat", plain(structured_body(profile, g))))
    if skips["reasoning"] is None and profile.features.reasoning.thinking_on is not None:
        out.append(GoldenPrompt("reasoning/thinking-on", "chat", plain(reasoning_body(profile, "reasoning/thinking-on"))))
    return out


def request_body(prompt: GoldenPrompt, model: str, profile: Profile, logprobs: bool = True) -> dict[str, Any]:
    """The request sent to both endpoints: ``prompt.body`` with ``model``, temperature 0,
    ``compare.max_tokens`` generated whatever the EOS (``ignore_eos``, a vLLM extension), special
    tokens kept, and (``logprobs``) ``compare.top_logprobs`` alternatives per position with tokens
    as ids (``return_tokens_as_token_ids``, vLLM)."""
    c = profile.compare
    body = {**prompt.body, "model": model, "temperature": 0, "max_tokens": c.max_tokens, "ignore_eos": True,
            "skip_special_tokens": False}
    if logprobs:
        body["return_tokens_as_token_ids"] = True
        if prompt.route == "chat":
            body.update(logprobs=True, top_logprobs=c.top_logprobs)
        else:
            body["logprobs"] = c.top_logprobs
    return body


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


# ------------------------------------------------------------------------------------------------
# the golden file


class GoldenError(Exception):
    """A recorded baseline cannot be read (missing, not JSON, another version). One line."""


def write_golden(path: Path, *, run_id: str, profile: str, endpoint: str | None, server_version: str | None,
                 model: str, prompts: list[GoldenPrompt], answers: dict[str, Answer],
                 features: dict[str, str] | None = None, logprobs: bool = True,
                 redact: Any = None, contract: dict[str, Any] | None = None,
                 renderings: dict[str, Rendering] | None = None, long_context: list[dict[str, Any]] | None = None) -> Path:
    """Write the golden file: the run it comes from, each prompt (route, body) with its answer and
    its ``rendering`` (``/tokenize`` of it; absent when not measured), the features cases' statuses
    (case -> PASS/FAIL/..., for "features lost"), the contract gates' cases
    (``contract``: gate/case -> its record, :func:`kvgate.compare.contract.record_of`, for the contract diff),
    the pass-key retrieval (``long_context``: each prompt's
    :meth:`kvgate.answers.needle.NeedleObservation.record`, for the long-context diff). ``redact``: a ``str -> str``
    applied to the whole text (the run's redactor: no key in a report). Returns ``path``."""
    renderings = renderings or {}
    doc = {"kvgate_golden": GOLDEN_VERSION, "run_id": run_id, "profile": profile, "endpoint": endpoint,
           "server_version": server_version, "model": model, "logprobs": logprobs,
           "prompts": [{"name": p.name, "route": p.route, "body": p.body,
                        "answer": answers[p.name].to_dict() if p.name in answers else None,
                        **({"rendering": renderings[p.name].to_dict()} if p.name in renderings else {})}
                       for p in prompts],
           "features": features or {}, "contract": contract or {}, "long_context": long_context or []}
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    path.write_text(redact(text) if redact is not None else text, encoding="utf-8")
    return path


@dataclass
class Golden:
    """A golden file read back: where it came from (``run_id``, ``profile``, ``endpoint``,
    ``server_version``, ``model``), its ``prompts`` and their ``answers``, and the ``features`` statuses."""

    run_id: str | None
    profile: str | None
    endpoint: str | None
    server_version: str | None
    prompts: list[GoldenPrompt]
    answers: dict[str, Answer]
    features: dict[str, str]
    source: str
    #: The served model name the answers came from (None in a file that does not say).
    model: str | None = None
    #: The contract's cases (``gate/case`` -> record: status, what it said, its requests' or routes'
    #: outcomes, :mod:`kvgate.compare.contract`; a bare status in a file from before; empty in a file
    #: recorded before kvgate recorded them, or by a run that did not run those gates).
    contract: dict[str, Any] = field(default_factory=dict)
    #: Each prompt's ``/tokenize`` rendering on the recorded server (a prompt absent: not recorded --
    #: a file from before kvgate recorded them).
    renderings: dict[str, Rendering] = field(default_factory=dict)
    #: The pass-key retrieval recorded (one dict per prompt: tokens, depth, key, retrieved per path;
    #: empty in a file recorded before kvgate recorded it, or for a profile without answers.long_context).
    long_context: list[dict[str, Any]] = field(default_factory=list)


def read_golden(path: Path) -> Golden:
    """Read a golden file written by :func:`write_golden`. Raises :class:`GoldenError` naming the
    file and what is wrong."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GoldenError(f"{path}: no golden file (record one: pytest --profile NAME --gate-mode record "
                          "-m compare)") from None
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: not a readable golden file ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("kvgate_golden") != GOLDEN_VERSION:
        raise GoldenError(f"{path}: not a kvgate golden file of version {GOLDEN_VERSION} "
                          f"(kvgate_golden: {doc.get('kvgate_golden') if isinstance(doc, dict) else None!r})")
    items = doc.get("prompts")
    if not isinstance(items, list) or not items:
        raise GoldenError(f"{path}: holds no golden prompts ('prompts' is {'empty' if items == [] else 'missing'}"
                          f"{'' if items is None or items == [] else ' or not a list'}); record it again")
    prompts, answers, renderings = [], {}, {}
    for i, p in enumerate(items):
        try:
            gp = GoldenPrompt(str(p["name"]), str(p["route"]), dict(p["body"]))
            if p.get("answer") is not None:
                answers[gp.name] = Answer.from_dict(p["answer"])
            if isinstance(p.get("rendering"), dict):
                renderings[gp.name] = Rendering.from_dict(p["rendering"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            name = p.get("name") if isinstance(p, dict) else None
            raise GoldenError(f"{path}: prompt {i + 1} ({name or 'unnamed'}) is malformed "
                              f"({type(exc).__name__}: {exc})") from None
        prompts.append(gp)
    return Golden(doc.get("run_id"), doc.get("profile"), doc.get("endpoint"), doc.get("server_version"), prompts,
                  answers, {str(k): str(v) for k, v in (doc.get("features") or {}).items()}, str(path),
                  doc.get("model"), {str(k): (v if isinstance(v, dict) else str(v)) for k, v in (doc.get("contract") or {}).items()},
                  renderings, [c for c in doc.get("long_context") or [] if isinstance(c, dict)])
