"""Input *paths* that have killed engines: not a hostile value in a known field, but a request that
takes the server down a road it should not (the security gate's ``input-paths`` case). Each is sent
once with a small token budget; the case wants a 4xx or a bounded 200 in time, the canary and
``/health`` after each.

Sources: a request-supplied ``chat_template`` rendered without a time or size bound on one worker
thread blocks every chat user (PYSEC-2026-4349, vLLM 0.16.0 until 0.32.0; ``/v1/responses`` took
``chat_template_kwargs[chat_template]`` past ``--trust-request-chat-template``); pure
``prompt_embeds`` and empty structured-output values reached EngineCore's fatal path
(PYSEC-2026-2303, PYSEC-2026-4199); the legacy ``guided_*`` fields, removed, are answered 200 with
unconstrained output (vllm#53975). vLLM 0.32 filters ``chat_template`` out of
``chat_template_kwargs`` (responses/protocol.py) and refuses a request's ``chat_template`` 400
unless trusted (chat_completion/serving.py).

The template sent is :data:`EXPANDING_TEMPLATE`: it renders the conversation then
:data:`TEMPLATE_WORDS` more words -- it always terminates (one bounded loop), and a server that
rendered it counts at least :data:`RENDERED_RISE` more prompt tokens than the same request without
it, which is how "rendered" is told from "ignored". Never a template that does not terminate.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable

#: Words the expanding template appends to the conversation (each at least one token).
TEMPLATE_WORDS = 160
#: A request's template that renders the conversation, then ``TEMPLATE_WORDS`` words: bounded.
EXPANDING_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                      "{% for i in range(" + str(TEMPLATE_WORDS) + ") %} kv{% endfor %}")
#: [tokens] a rise in counted prompt tokens at least this large over the same request without the
#: template says the server rendered it (the template adds ``TEMPLATE_WORDS`` words, >= 1 token each).
RENDERED_RISE = TEMPLATE_WORDS // 2
#: ``max_tokens`` (``max_output_tokens``) every request asks for.
MAX_TOKENS = 4
#: The routes, as the OpenAI-compatible paths under the route prefix.
ROUTES = {"chat": "/chat/completions", "completions": "/completions", "responses": "/responses",
          "messages": "/messages"}
#: A schema-less backend name no server has.
NO_BACKEND = "kvgate-no-such-backend"


def plain(route: str, model: str) -> dict[str, Any]:
    """The route's plain request ("Say OK.", :data:`MAX_TOKENS`): the baseline the probes add to."""
    if route == "responses":
        return {"model": model, "input": "Say OK.", "max_output_tokens": MAX_TOKENS}  # OpenAI's floor of 16: not vLLM's
    if route == "messages":
        return {"model": model, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "Say OK."}]}
    if route == "completions":
        return {"model": model, "prompt": "Say OK.", "max_tokens": MAX_TOKENS}
    return {"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": MAX_TOKENS}


@dataclass(frozen=True)
class PathProbe:
    """One input path: ``name`` (the evidence key), ``route`` (:data:`ROUTES`), ``what`` in words,
    ``extra(model)`` -> the fields added to (or replacing) :func:`plain`'s body; ``template``: it
    carries :data:`EXPANDING_TEMPLATE` (judged against ``security.request_chat_template``)."""

    name: str
    route: str
    what: str
    extra: Callable[[str], dict[str, Any]]
    template: bool = False
    drop: tuple[str, ...] = ()

    def body(self, model: str) -> dict[str, Any]:
        out = {k: v for k, v in plain(self.route, model).items() if k not in self.drop}
        return {**out, **self.extra(model)}


_EMBEDS = base64.b64encode(b"kvgate: not a tensor").decode()


def _templates() -> list[PathProbe]:
    out = []
    for route in ("chat", "responses", "messages"):
        out.append(PathProbe(f"chat_template/{route}", route, f"a request chat_template on {route}",
                             lambda m: {"chat_template": EXPANDING_TEMPLATE}, template=True))
        out.append(PathProbe(f"chat_template_kwargs/{route}", route,
                             f"chat_template_kwargs.chat_template on {route}",
                             lambda m: {"chat_template_kwargs": {"chat_template": EXPANDING_TEMPLATE}}, template=True))
    return out


PATH_PROBES: tuple[PathProbe, ...] = (
    *_templates(),
    PathProbe("prompt_embeds", "completions", "pure prompt_embeds (no prompt)",
              lambda m: {"prompt_embeds": _EMBEDS}, drop=("prompt",)),
    PathProbe("json_schema-empty", "chat", "an empty json_schema (schema {})",
              lambda m: {"response_format": {"type": "json_schema", "json_schema": {"name": "empty", "schema": {}}}}),
    PathProbe("structured-json-empty", "chat", "structured_outputs.json {}",
              lambda m: {"structured_outputs": {"json": {}}}),
    PathProbe("structured-regex-empty", "chat", "an empty structured_outputs.regex",
              lambda m: {"structured_outputs": {"regex": ""}}),
    PathProbe("structured-grammar-empty", "chat", "an empty structured_outputs.grammar",
              lambda m: {"structured_outputs": {"grammar": ""}}),
    PathProbe("structured-backend-unknown", "chat", f"an unknown structured-output backend ({NO_BACKEND})",
              lambda m: {"structured_outputs": {"regex": "OK", "backend": NO_BACKEND},
                         "guided_decoding_backend": NO_BACKEND}),
    PathProbe("guided-legacy", "chat", "the legacy guided_json / guided_regex / guided_choice / guided_grammar fields",
              lambda m: {"guided_json": {"type": "object"}, "guided_regex": "", "guided_choice": [],
                         "guided_grammar": ""}),
    PathProbe("mm_processor_kwargs", "chat", "mm_processor_kwargs on a text request (num_crops 10^9)",
              lambda m: {"mm_processor_kwargs": {"num_crops": 10**9, "max_pixels": 10**12}}),
)

NAMES = tuple(p.name for p in PATH_PROBES)

__all__ = ["EXPANDING_TEMPLATE", "MAX_TOKENS", "NAMES", "PATH_PROBES", "PathProbe", "RENDERED_RISE", "ROUTES",
           "TEMPLATE_WORDS", "plain"]
