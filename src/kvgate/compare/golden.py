"""The golden set: fixed prompts answered at temperature 0 with logprobs, and how two answers to
the same prompt are told apart.

An answer is its token sequence (vLLM's ``return_tokens_as_token_ids`` makes each logprobs token
``token_id:N``, so two tokens that both decode to ``""`` -- common on a random tiny model -- still
differ) with each position's ``top_logprobs``. Two answers are compared up to the first position
where they part (:func:`kvgate.answers.tokendiff.compare_answers`); after it the contexts differ and nothing more can be
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.answers.tokendiff import Answer
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
