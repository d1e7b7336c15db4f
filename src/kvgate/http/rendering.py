"""What the server's tokenizer makes of an input: a conversation through its chat template, or a
text with or without its special tokens -- vLLM's ``POST /tokenize`` asked for the token strings
(``return_token_strs``) -- and where two such renderings first part.

The answers gate compares these renderings with what the server counted on the generation route
(``usage.prompt_tokens``) to tell a system turn that never arrived from a second BOS; the compare
gate records them in golden.json so a changed chat template or tokenizer is named as itself.
A server without vLLM's ``/tokenize`` (404, 405, 501, or a body without ``tokens``) gives a
:class:`Rendering` with ``error`` set; nothing here raises on what the server answers.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from kvgate.http.client import KvClient

T = TypeVar("T")


#: Token-string marks of a space, newline and tab: byte-level BPE's (GPT-2, Llama 3, SmolLM) and
#: SentencePiece's word start.
_MARKS = str.maketrans({"\u0120": " ", "\u010a": "\n", "\u0109": "\t", "\u2581": " "})


@dataclass(frozen=True)
class Rendering:
    """One input as the server's tokenizer rendered it: ``ids`` (token ids), ``strs`` (their token
    strings; None when the server returned none) and ``error`` (why there is no rendering: the
    route's status and message)."""

    ids: tuple[int, ...] = ()
    strs: tuple[str, ...] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def count(self) -> int | None:
        """[tokens] the rendering's length; None without a rendering."""
        return len(self.ids) if self.ok else None

    def token(self, i: int) -> str:
        """Position ``i`` quoted for a message: its string (``'<|im_start|>'``), else ``id 5``;
        ``the end`` past the last token."""
        if i >= len(self.ids):
            return "the end"
        if self.strs is not None and i < len(self.strs):
            return repr(self.strs[i])
        return f"id {self.ids[i]}"

    def text(self, n: int | None = None) -> str | None:
        """The first ``n`` tokens (all: None) as text, for a reader: byte-level BPE strings
        (``Ġare``, ``Ċ``) and SentencePiece's (``▁are``) joined as the text they spell, other
        strings (one a word) joined by spaces; None without token strings."""
        if self.strs is None:
            return None
        strs = self.strs if n is None else self.strs[:n]
        if any(chr(m) in t for t in strs for m in _MARKS):
            return "".join(strs).translate(_MARKS)
        return " ".join(strs)

    def to_dict(self) -> dict[str, Any]:
        """Report form: ``count``, ``tokens`` (ids), ``token_strs`` (or None), ``error``."""
        return {"count": self.count, "tokens": list(self.ids), "token_strs": list(self.strs) if self.strs is not None
                else None, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Rendering":
        """The inverse of :meth:`to_dict`. Raises ``TypeError``/``ValueError`` on a malformed one."""
        if d.get("error") is not None:
            return cls(error=str(d["error"]))
        strs = d.get("token_strs")
        return cls(tuple(int(i) for i in d.get("tokens") or []), tuple(str(x) for x in strs) if strs is not None else None)


def tokenize(client: KvClient, model: str, *, messages: list[dict[str, Any]] | None = None, prompt: str | None = None,
             add_special_tokens: bool | None = None, tools: list[Any] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None) -> Rendering:
    """``POST /tokenize`` of ``messages`` (through the chat template, with the generation prompt and
    the client's ``chat_template_kwargs`` unless given; ``tools`` rendered too) or of ``prompt``
    (``add_special_tokens``: None leaves the server's default -- vLLM adds them to a prompt, not to
    a conversation), asking for the token strings."""
    body: dict[str, Any] = {"model": model, "return_token_strs": True}
    if messages is not None:
        body.update(messages=messages, add_generation_prompt=True)
        kwargs = chat_template_kwargs if chat_template_kwargs is not None else getattr(client, "chat_template_kwargs",
                                                                                          None)
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        if tools:
            body["tools"] = tools
    else:
        body["prompt"] = prompt
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    r = client.post("/tokenize", body, timeout_s=30.0)
    doc = r.json if isinstance(r.json, dict) else {}
    ids = doc.get("tokens")
    if r.status != 200 or not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return Rendering(error=f"/tokenize answered {r.status}: {r.error_message[:120]}" if r.status else
                         f"/tokenize gave no answer: {r.text[:120]}")
    strs = doc.get("token_strs")
    ok_strs = isinstance(strs, list) and len(strs) == len(ids) and all(isinstance(s, str) for s in strs)
    return Rendering(tuple(ids), tuple(strs) if ok_strs else None)


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first position where ``a`` and ``b`` part (the shorter one's length when it is the
    other's prefix); None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def parting(here: Rendering, there: Rendering) -> tuple[int, str, str] | None:
    """``(position, here's token, there's token)`` where two renderings first part (by token
    strings when both have them, else by ids), or None when they are the same."""
    if here.strs is not None and there.strs is not None:
        i = first_difference(here.strs, there.strs)
    else:
        i = first_difference(here.ids, there.ids)
    return None if i is None else (i, here.token(i), there.token(i))


def concurrently(jobs: Sequence[Callable[[], T]], concurrency: int) -> list[T]:
    """Run ``jobs`` with at most ``concurrency`` in flight; results in order."""
    if not jobs:
        return []
    with cf.ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as ex:
        return list(ex.map(lambda job: job(), jobs))


__all__ = ["Rendering", "concurrently", "first_difference", "parting", "tokenize"]
