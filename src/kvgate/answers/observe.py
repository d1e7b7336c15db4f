"""Ask for answers: one prompt, non-streamed and streamed, at temperature 0 (or seeded), with
logprobs; many prompts at once on a thread pool (bounded in count and each by the client's timeout).

An :class:`Asked` is what came back, folded so the gate can compare paths: the non-streamed text and
token logprobs (:class:`kvgate.answers.tokendiff.Answer`), and for a stream its concatenated deltas,
its first content delta, its chunk count and whether it ended with ``[DONE]``. Nothing here raises
on a bad answer: an HTTP error, a body that is not JSON or a broken stream is an :class:`Asked`
with ``error`` set.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from kvgate.answers.tokendiff import Answer, answer_of, logprobs_of
from kvgate.http.client import KvClient
from kvgate.http.sse import classify, DONE


@dataclass
class Asked:
    """One request's answer. ``text`` (the content), ``finish_reason``, ``tokens`` (each position's
    decoded text) and ``top`` (each position's alternatives, token -> logprob, nats) when logprobs
    came; ``status`` (HTTP; 0 none); ``error`` (why there is no usable answer); for a stream:
    ``first_delta`` (the first non-empty content delta), ``chunks`` (content chunks) and ``done``.
    ``prompt_tokens``: ``usage.prompt_tokens`` when reported. Who answered (a non-streamed answer):
    ``model`` (the body's ``model``), ``system_fingerprint`` and ``identity`` (the response
    headers that name a server or revision, :data:`IDENTITY_HEADERS`) -- two answers differing in
    them came from different deployments. ``response_id`` and ``created`` (the body's ``id`` and
    ``created``, a non-streamed answer): one id answering two different requests is a cache's."""

    route: str
    stream: bool
    text: str = ""
    finish_reason: str | None = None
    tokens: list[str] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    status: int = 0
    error: str | None = None
    first_delta: str | None = None
    chunks: int = 0
    done: bool = False
    prompt_tokens: int | None = None
    model: str | None = None
    system_fingerprint: str | None = None
    identity: dict[str, str] = field(default_factory=dict)
    response_id: str | None = None
    created: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("top")
        d["text"] = d["text"][:400]
        d["tokens"] = d["tokens"][:64]
        return d

    def answer(self) -> Answer:
        """As a compare-gate :class:`~kvgate.answers.tokendiff.Answer` (tokens and alternatives), for
        :func:`kvgate.answers.tokendiff.compare_answers`."""
        return Answer(list(self.tokens), [dict(t) for t in self.top], self.text, self.finish_reason, self.status,
                      self.error)


def body_for(route: str, model: str, *, messages: list[dict[str, str]] | None = None, prompt: Any = None,
             max_tokens: int = 24, logprobs: int | None = 5, temperature: float = 0.0, seed: int | None = None,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request body: chat (``messages``) or completions (``prompt``: text or token ids),
    ``temperature`` (0: greedy), ``seed``, ``max_tokens``, and ``logprobs`` alternatives per
    position (None: none asked)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
    if route == "chat":
        body["messages"] = messages
        if logprobs:
            body.update(logprobs=True, top_logprobs=logprobs)
    else:
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = logprobs
    if seed is not None:
        body["seed"] = seed
    body.update(extra or {})
    return body


#: Response headers that name the server or revision that answered (``Server``, ``Via``, a
#: gateway's backend or a KServe/Knative revision header): per deployment, not per request (``Date``,
#: ``X-Request-Id`` and timings are left out).
IDENTITY_HEADERS = re.compile(r"^(server|via|x-served-by|x-backend(-server)?|x-upstream(-host)?|"
                              r"x-(kserve|knative)-revision|x-revision|x-model-version|x-canary|x-deployment)$")


def _path(route: str) -> str:
    return "/chat/completions" if route == "chat" else "/completions"


def ask(client: KvClient, route: str, body: dict[str, Any], *, stream: bool = False,
        timeout_s: float | None = None) -> Asked:
    """Send ``body`` to the chat or completions route, streamed or not, and fold the answer. A chat
    body carries the client's ``chat_template_kwargs`` (the profile's) unless it names its own, as
    :meth:`~kvgate.http.client.KvClient.tokenize` does: the prompt answered is the prompt rendered."""
    kwargs = getattr(client, "chat_template_kwargs", None)
    if route == "chat" and kwargs and "chat_template_kwargs" not in body:
        body = {**body, "chat_template_kwargs": kwargs}
    if not stream:
        r = client.post(client.api(_path(route)), {**body, "stream": False}, timeout_s=timeout_s)
        a: Answer = answer_of(route, r.status, r.json, r.text if r.status != 200 else "")
        out = Asked(route, False, status=r.status, error=a.error, text=a.text, finish_reason=a.finish_reason,
                    tokens=a.tokens, top=a.top)
        body_json = r.json if isinstance(r.json, dict) else {}
        usage = body_json.get("usage") if isinstance(body_json.get("usage"), dict) else {}
        out.prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
        out.model = body_json.get("model") if isinstance(body_json.get("model"), str) else None
        fp = body_json.get("system_fingerprint")
        out.system_fingerprint = fp if isinstance(fp, str) else None
        out.response_id = body_json.get("id") if isinstance(body_json.get("id"), str) else None
        out.created = body_json.get("created") if isinstance(body_json.get("created"), int) else None
        headers = getattr(r, "headers", None) or {}
        out.identity = {k.lower(): v for k, v in headers.items() if IDENTITY_HEADERS.match(k.lower())}
        if a.ok and route == "chat":  # the content only: reasoning and tool calls are not the answer here
            msg = ((body_json.get("choices") or [{}])[0] or {}).get("message") or {}
            out.text = str(msg.get("content") or "")
        return out
    sent = {"stream_options": {"include_usage": True}, **body, "stream": True}  # usage: prompt_tokens per path
    reply = client.stream(client.api(_path(route)), sent, timeout_s=timeout_s)
    out = Asked(route, True, status=reply.status)
    if reply.status != 200:
        out.error = f"HTTP {reply.status}: {reply.error_message[:200]}" if reply.status else \
            (reply.text or reply.transport_error or "no answer")[:200]
        return out
    parts: list[str] = []
    for _, data in reply.events:
        ev = classify(data)
        if ev.kind == DONE:
            out.done = True
            break
        if ev.kind != "chunk":
            out.error = f"a stream event that is not a chunk ({ev.kind}): {data[:120]!r}"
            continue
        if ev.usage and isinstance(ev.usage.get("prompt_tokens"), int):
            out.prompt_tokens = ev.usage["prompt_tokens"]
        for ch in ev.choices:
            if ch.text:
                parts.append(ch.text)
                if out.first_delta is None:
                    out.first_delta = ch.text
            if ch.text is not None:
                out.chunks += 1
            if ch.finish_reason:
                out.finish_reason = ch.finish_reason
        for choice in (ev.obj or {}).get("choices") or []:
            lp = (choice or {}).get("logprobs") if isinstance(choice, dict) else None
            if isinstance(lp, dict):
                tokens, top = logprobs_of(route, lp)
                out.tokens += tokens
                out.top += top
    out.text = "".join(parts)
    if reply.transport_error and not out.done:
        out.error = f"the stream broke: {reply.transport_error[:160]}"
    elif not out.done and out.error is None:
        out.error = f"the stream ended without [DONE] after {out.chunks} content chunks"
    elif out.chunks == 0 and out.error is None:
        out.error = "the stream carried no content chunk"
    return out


def echoed_prompt(client: KvClient, model: str, prompt: Any, *, add_special_tokens: bool | None = None,
                  timeout_s: float | None = None) -> list[int] | None:
    """The token ids of ``prompt`` (text or ids) as the server read it on ``/completions``: one
    token generated with ``echo`` and ``logprobs`` (the prompt's tokens come back in front of the
    answer's) as ids (``return_tokens_as_token_ids``, vLLM). None when the server does not echo
    them (an error, no logprobs, tokens that are not ``token_id:N``)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True,
                            "logprobs": 0, "return_tokens_as_token_ids": True}
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    r = client.post(client.api("/completions"), body, timeout_s=timeout_s)
    doc = r.json if isinstance(r.json, dict) else {}
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    n = usage.get("prompt_tokens")
    choice = ((doc.get("choices") or [None])[0]) if r.status == 200 else None
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    if not isinstance(n, int) or not isinstance(tokens, list) or len(tokens) < n:
        return None
    ids = []
    for t in tokens[:n]:
        m = re.fullmatch(r"token_id:(-?\d+)", t) if isinstance(t, str) else None
        if m is None:
            return None
        ids.append(int(m.group(1)))
    return ids


def ask_many(jobs: Sequence[Callable[[], Asked]], concurrency: int) -> list[Asked]:
    """Run ``jobs`` (each one :func:`ask`) with at most ``concurrency`` in flight; results in order."""
    if not jobs:
        return []
    with cf.ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as ex:
        return list(ex.map(lambda job: job(), jobs))


#: The multibyte prompts (name -> prompt): CJK, Hangul, Thai and emoji, each asking for an answer
#: in kind, so the characters travel both ways.
MULTIBYTE_PROMPTS: dict[str, str] = {
    "cjk": "请用中文回答：一年有几个月？",
    "hangul": "한국어로 대답해 주세요: 하늘은 무슨 색입니까?",
    "thai": "กรุณาตอบเป็นภาษาไทย: หนึ่งสัปดาห์มีกี่วัน?",
    "emoji": "Reply with three emoji about the sea 🌊🐟⛵ and say why.",
}


#: The scripts also asked at temperature 0.8 with a seed (streamed == non-streamed under sampling).
SAMPLED_SCRIPTS = ("cjk", "hangul")


def render(client: KvClient, model: str, messages: list[dict[str, str]]) -> tuple[list[int], str | None, str | None]:
    """``(ids, text, error)``: the conversation as the server's chat template renders it
    (``/tokenize`` with ``messages``) and those ids as text (``/detokenize``); ``error`` when
    either route is missing or refuses."""
    r = client.tokenize(model=model, messages=messages)
    body = r.json if isinstance(r.json, dict) else {}
    ids = body.get("tokens")
    if r.status != 200 or not isinstance(ids, list):
        return [], None, f"/tokenize answered {r.status}: {r.error_message[:120]}"
    d = client.post("/detokenize", {"model": model, "tokens": ids}, timeout_s=30.0)
    text = (d.json or {}).get("prompt") if isinstance(d.json, dict) else None
    if d.status != 200 or not isinstance(text, str):
        return ids, None, f"/detokenize answered {d.status}: {d.error_message[:120]}"
    return ids, text, None
