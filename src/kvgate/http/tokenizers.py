"""Which tokenize endpoint a server has, how kvgate counts prompt tokens with it, and what the
server is (for the message when it has none).

Exact-length prompts (:mod:`kvgate.http.prompts`) need the served tokenizer. Servers expose it
differently, so :func:`detect` asks once per client, in this order, and keeps the first that
answers a token count:

1. vLLM's ``POST /tokenize`` ``{"model", "prompt" | "messages"}`` -> ``{"count", "tokens"}``
   (vllm/entrypoints/openai/api_server.py): text and chat (it renders the chat template).
2. llama.cpp's ``POST /tokenize`` ``{"content", "add_special"}`` -> ``{"tokens": [ids]}``
   (ggml-org/llama.cpp tools/server/README.md; a vLLM-shaped body gets ``{"tokens": []}``). Text is
   counted with ``add_special: true`` (a string prompt gets BOS when the model's metadata says so,
   as ``/v1/completions`` does); chat with ``POST /apply-template`` ``{"messages"}`` -> ``{"prompt"}``
   (the server's own chat template) and that text tokenized the same way, as llama-server
   tokenizes a rendered chat prompt. No ``/apply-template``: chat is not counted by the server.
3. llama-cpp-python's ``POST /extras/tokenize`` ``{"input", "model"}`` -> ``{"tokens"}``
   (abetlen/llama-cpp-python llama_cpp/server/app.py: ``Llama.tokenize(input, special=True)``, BOS
   added as ``create_completion`` adds it): text only -- it has no chat-template endpoint.
4. The profile's local Hugging Face tokenizer (``model.tokenizer``): text and chat
   (:func:`kvgate.http.prompts.local_counter`), for what the server cannot count.

A route "is absent" when it answers 404, 405 or 501 (FastAPI / llama.cpp / python -m
http.server for a route or method they do not have). Any other non-count answer from vLLM's
``/tokenize`` (a gateway's 413, a 5xx) keeps that route, so counting with it fails with what came
back (:class:`kvgate.http.prompts.PromptError`) rather than quietly using another tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.http.client import KvClient, Reply

#: Statuses meaning "this server has no such route or method".
ABSENT = (404, 405, 501)
#: ``/v1/models`` ``owned_by`` values and ``Server`` headers that name a server.
OWNERS = {"vllm": "vLLM", "llamacpp": "llama.cpp", "me": "llama-cpp-python"}
SERVER_HEADERS = {"llama.cpp": "llama.cpp", "simplehttp": "a static file server (python -m http.server)"}
#: A model card field only one server writes: HF ``transformers serve`` adds ``"status": {"value":
#: "loaded" | "unloaded"}`` to each card (transformers/cli/serving/model_manager.py), not an OpenAI field.
CARD_SHAPES = {"status.value": "HF transformers serve"}


@dataclass(frozen=True)
class ServerIdentity:
    """What a server says it is: ``owned_by`` of the profile's model in ``/v1/models``, the
    ``Server`` header, ``/version``'s version. ``name``: the server those point to, or None."""

    owned_by: str | None = None
    server_header: str | None = None
    version: str | None = None
    #: The server a model card's own shape names when nothing else does (:data:`CARD_SHAPES`).
    card_says: str | None = None

    @property
    def name(self) -> str | None:
        h = (self.server_header or "").lower()
        for key, name in SERVER_HEADERS.items():
            if h.startswith(key):
                return name
        return OWNERS.get(self.owned_by or "") or self.card_says

    def summary(self) -> dict[str, Any]:
        """For summary.json's ``server``: ``{"name", "version", "server_header", "owned_by"}`` (None where not said)."""
        return {"name": self.name, "version": self.version, "server_header": self.server_header,
                "owned_by": self.owned_by}

    def describe(self) -> str:
        """``llama.cpp, Server: llama.cpp; /v1/models owned_by llamacpp`` (what is known)."""
        facts = [f"Server: {self.server_header}" if self.server_header else "no Server header"]
        if self.version:
            facts.append(f"/version {self.version}")
        head = f"{self.name}, " if self.name else ""
        owned = f"/v1/models owned_by {self.owned_by}" if self.owned_by else "/v1/models names no owned_by"
        return f"{head}{', '.join(facts)}; {owned}"


@dataclass
class Tokenizers:
    """The outcome of :func:`detect`: ``route`` counts text (``"vllm"``, ``"llama.cpp"``,
    ``"llama-cpp-python"`` or None), ``chat`` whether it also counts chat prompts; ``tried``: each
    probed route with its status (``"/tokenize 404"``); ``identity``: what the server said it is."""

    route: str | None
    chat: bool
    tried: list[str] = field(default_factory=list)
    identity: ServerIdentity = field(default_factory=ServerIdentity)

    def missing(self, api: str) -> str:
        """One clause: why this server cannot count an ``api`` prompt (for a SKIP reason)."""
        who = f"the server ({self.identity.describe()})"
        if self.route is None:
            return f"{who} has no tokenize endpoint ({', '.join(self.tried)})"
        return (f"{who} counts text tokens at {ROUTE_PATHS[self.route]} but cannot render its chat template there "
                f"({', '.join(t for t in self.tried if 'template' in t) or 'no chat-template endpoint'})")


ROUTE_PATHS = {"vllm": "/tokenize", "llama.cpp": "/tokenize", "llama-cpp-python": "/extras/tokenize"}


def _ids(reply: Reply) -> list[Any] | None:
    body = reply.json
    tokens = body.get("tokens") if reply.status == 200 and isinstance(body, dict) else None
    return tokens if isinstance(tokens, list) else None


def identify(client: KvClient, model: str, reply: Reply | None = None) -> ServerIdentity:
    """The server's :class:`ServerIdentity` from ``/v1/models`` (its ``owned_by`` for ``model``,
    and its ``Server`` header unless ``reply`` carries one) and ``/version``."""
    models = client.models()
    body = models.json
    cards = body.get("data") if isinstance(body, dict) else None
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    card = next((c for c in cards if c.get("id") == model), cards[0] if cards else {})
    owned = card.get("owned_by")

    def header(r: Reply | None) -> str | None:
        return next((v for k, v in (r.headers if r is not None else {}).items() if k.lower() == "server"), None)

    status = card.get("status")
    says = CARD_SHAPES["status.value"] if isinstance(status, dict) and status.get("value") in ("loaded", "unloaded") \
        else None
    return ServerIdentity(str(owned) if owned is not None else None, header(reply) or header(models),
                          client.version(), says)


def detect(client: KvClient, model: str) -> Tokenizers:
    """Which tokenize endpoint this server has (module docstring), asked once per client."""
    known = getattr(client, "_kvgate_tokenizers", None)
    if known is not None:
        return known
    tried: list[str] = []
    r = client.tokenize(model=model, prompt="kv")
    body = r.json
    if r.status not in ABSENT and not (r.status == 200 and isinstance(body, dict) and "count" not in body):
        found = Tokenizers("vllm", True, ["/tokenize 200" if r.status == 200 else f"/tokenize {r.status}"])
    else:
        found = None
        if r.status == 200:  # a /tokenize without a count: llama.cpp's shape?
            lr = client.post("/tokenize", {"content": "kv", "add_special": True}, timeout_s=30.0)
            if _ids(lr):
                t = client.post("/apply-template", {"messages": [{"role": "user", "content": "kv"}]}, timeout_s=30.0)
                has_template = t.status == 200 and isinstance(t.json, dict) and isinstance(t.json.get("prompt"), str)
                found = Tokenizers("llama.cpp", has_template, ["/tokenize 200 (llama.cpp's {content} shape)",
                                                               f"/apply-template {t.status}"])
            else:
                tried.append("/tokenize 200 without a count or tokens")
        else:
            tried.append(f"/tokenize {r.status}")
        if found is None:
            er = client.post("/extras/tokenize", {"input": "kv", "model": model}, timeout_s=30.0)
            if _ids(er):
                found = Tokenizers("llama-cpp-python", False, [*tried, "/extras/tokenize 200",
                                                               "no chat-template endpoint"])
            else:
                tried.append(f"/extras/tokenize {er.status}")
                found = Tokenizers(None, False, tried)
    if found.route != "vllm":  # only asked when the message may need it
        found.identity = identify(client, model, r)
    client._kvgate_tokenizers = found
    return found


def server_text_counter(client: KvClient, model: str, route: str):
    """A ``count(text)`` for a completions prompt with ``route``'s endpoint (module docstring).
    Raises :class:`kvgate.http.prompts.PromptError` when an answer carries no tokens."""
    from kvgate.http.prompts import PromptError

    def count(text: str) -> int:
        if route == "llama.cpp":
            r = client.post("/tokenize", {"content": text, "add_special": True, "parse_special": True}, timeout_s=30.0)
        else:
            r = client.post("/extras/tokenize", {"input": text, "model": model}, timeout_s=30.0)
        ids = _ids(r)
        if ids is None:
            raise PromptError(f"{ROUTE_PATHS[route]} answered {r.status}: {r.text[:200]!r}; cannot build exact-length "
                              "prompts")
        return len(ids)

    return count


def llamacpp_chat_counter(client: KvClient):
    """A ``count(text)`` for a chat prompt on llama.cpp: the user message rendered by the server's
    ``/apply-template`` (with the client's ``chat_template_kwargs``), then tokenized as a text prompt."""
    from kvgate.http.prompts import PromptError

    text_count = server_text_counter(client, "", "llama.cpp")

    def count(text: str) -> int:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        if client.chat_template_kwargs:
            body["chat_template_kwargs"] = client.chat_template_kwargs
        r = client.post("/apply-template", body, timeout_s=30.0)
        prompt = r.json.get("prompt") if r.status == 200 and isinstance(r.json, dict) else None
        if not isinstance(prompt, str):
            raise PromptError(f"/apply-template answered {r.status}: {r.text[:200]!r}; cannot build exact-length prompts")
        return text_count(prompt)

    return count
