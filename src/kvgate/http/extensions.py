"""vLLM's request extensions kvgate's cases send, and whether this server takes them: :class:`Extensions`.

kvgate's cases lean on request fields OpenAI's API does not have: ``ignore_eos`` (generate past EOS,
so an output-length check gets its length), ``min_tokens``, ``stream_options.continuous_usage_stats``
and prompts given as token ids. A strict OpenAI-compatible server refuses each of them: HF
``transformers serve`` 5.x answers ``422 {"detail":"Unexpected fields in the request: {'ignore_eos'}"}``
(the same request without it: 200) and a token-id prompt ``400 {"detail":"prompt must be a string."}``
(measured 2026-12-03). Read as the server failing the case, that is kvgate's mistake, not the
server's. The rule:

- **Probed once per run, per extension, when first needed**: the first :func:`kvgate.http.probes.send`
  of a body carrying one sends a minimal request with it (completions, ``max_tokens`` 1; streamed for
  ``continuous_usage_stats``). 200: taken. 4xx: the same request without it; 200 there -> **refused**,
  with the status and the server's reason quoted (:class:`Refusal`). Any other outcome (a 5xx, no
  answer, the control refused too) decides nothing: the extension is sent as before. On vLLM that is one
  1-token request per extension the run uses.
- **Portable form where one exists**: ``ignore_eos: true`` refused -> the request goes without it and
  the case is judged on what came back (:data:`PORTABLE`): a generation that reached its length is
  as good a measurement; one that ended at EOS first is not (the case SKIPs naming the refusal,
  :func:`kvgate.gates.common.refused_verdict`).
- **No portable form** (``min_tokens``, ``continuous_usage_stats``, token-id prompts): the request goes
  as it is (the case may be about the extension itself) and a refusal makes the case SKIP naming the
  refused parameter and quoting the 4xx -- never a FAIL of the gate that needed it.

Only the well-formed value is adapted (``ignore_eos: true``); a hostile value a security case sends
goes as it is. Each exchange carries the refusals it met (``Exchange.refused``, ``Exchange.dropped``).
Thread-safe: one probe per extension however many gates ask at once.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.sse import error_message
from kvgate.http.text import clip

#: A :class:`kvgate.http.client.KvClient` (not imported: the client carries this module's record).
Client = Any

#: Extensions with a portable form: the field dropped when refused (the case is judged on what came back).
PORTABLE = ("ignore_eos",)
#: The token ids of the token-id probe prompt (:func:`kvgate.http.prompts.token_id_prompt`'s range:
#: ordinary ids well inside any vocabulary).
PROBE_TOKEN_IDS = (1000, 1001, 1002)
TOKEN_IDS = "token-id prompt"
#: The text prompt of every probe (one token of output asked).
PROBE_PROMPT = "kv"
CONTINUOUS_USAGE = "stream_options.continuous_usage_stats"
KNOWN = ("ignore_eos", "min_tokens", CONTINUOUS_USAGE, TOKEN_IDS)
#: Seconds a probe request may take (one token).
PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Refusal:
    """``param`` refused: ``status`` (the 4xx) and ``reason`` (the server's message, clipped) of the
    request with it, while the same request without it got 200."""

    param: str
    status: int
    reason: str

    def describe(self) -> str:
        """``the server refuses ignore_eos (422: Unexpected fields in the request: {'ignore_eos'})``."""
        return f"the server refuses {self.param} ({self.status}: {self.reason})"

    def evidence(self) -> dict[str, Any]:
        return {"param": self.param, "status": self.status, "reason": self.reason}


def used(body: dict[str, Any]) -> list[str]:
    """The extensions (names of :data:`KNOWN`) ``body`` carries in their well-formed value."""
    out = []
    if body.get("ignore_eos") is True:
        out.append("ignore_eos")
    if isinstance(body.get("min_tokens"), int) and not isinstance(body.get("min_tokens"), bool):
        out.append("min_tokens")
    so = body.get("stream_options")
    if isinstance(so, dict) and so.get("continuous_usage_stats") is True:
        out.append(CONTINUOUS_USAGE)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        out.append(TOKEN_IDS)
    return out


def _probe_body(model: str, param: str | None, with_param: bool) -> tuple[dict[str, Any], bool]:
    """The minimal request probing ``param`` (with it or without) and whether it is streamed."""
    body: dict[str, Any] = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    stream = param == CONTINUOUS_USAGE
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, **({"continuous_usage_stats": True} if with_param else {})}
    if not with_param:
        return body, stream
    if param == "ignore_eos":
        body["ignore_eos"] = True
    elif param == "min_tokens":
        body["min_tokens"] = 1
    elif param == TOKEN_IDS:
        body["prompt"] = list(PROBE_TOKEN_IDS)
    return body, stream


def _reason(reply: Any) -> str:
    msg = error_message(_json(reply.text))
    return clip(msg if msg is not None else " ".join(reply.text.split()), 160)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


@dataclass
class Extensions:
    """The run's record of which extensions the server refuses (one per run: ``Endpoint.extensions``).
    ``model``: the served name the probes ask for. ``probes``: each probe made, ``{param: outcome}``
    (``"taken"``, ``"refused 422"``, ``"undecided: ..."``), for the evidence."""

    model: str
    refusals: dict[str, Refusal] = field(default_factory=dict)
    probes: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def refusal(self, client: Client, param: str) -> Refusal | None:
        """Whether the server refuses ``param`` (a name of :data:`KNOWN`): probed on first ask, then
        remembered. ``client`` sends the probe (its answer never raises; no answer decides nothing)."""
        with self._lock:
            if param not in self.probes:
                self.probes[param] = self._probe(client, param)
            return self.refusals.get(param)

    def _probe(self, client: Client, param: str) -> str:
        """Raises what the client raises when nothing answers (``EndpointUnreachable``), as the
        request it stands before would have."""
        path = client.api("/completions")
        body, stream = _probe_body(self.model, param, True)
        r = client.stream(path, body, timeout_s=PROBE_TIMEOUT_S) if stream else \
            client.post(path, body, timeout_s=PROBE_TIMEOUT_S)
        if r.status == 200:
            return "taken"
        if not 400 <= r.status < 500:
            return f"undecided: answered {r.status or 'nothing'}"
        body, stream = _probe_body(self.model, param, False)
        c = client.stream(path, body, timeout_s=PROBE_TIMEOUT_S) if stream else \
            client.post(path, body, timeout_s=PROBE_TIMEOUT_S)
        if c.status != 200:
            return f"undecided: answered {r.status} with it and {c.status or 'nothing'} without it"
        self.refusals[param] = Refusal(param, r.status, _reason(r))
        return f"refused {r.status}"

    def adapt(self, client: Client, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Refusal], tuple[str, ...]]:
        """``(body to send, refusals met, fields dropped)``: ``body`` in its portable form for this
        server -- a refused extension of :data:`PORTABLE` dropped -- and every refusal of an extension
        it carries (probed on first use)."""
        met: dict[str, Refusal] = {}
        for param in used(body):
            ref = self.refusal(client, param)
            if ref is not None:
                met[param] = ref
        dropped = tuple(p for p in met if p in PORTABLE)
        if dropped:
            body = {k: v for k, v in body.items() if k not in dropped}
        return body, met, dropped

    def portable(self, body: dict[str, Any], client: Callable[[], Client]) -> dict[str, Any]:
        """``body`` in its portable form for this server (:meth:`adapt`'s first value), for a request
        built without a client at hand (the load client's): ``client()`` makes one (closed after)
        only when a probe is still to be made."""
        todo = [p for p in used(body) if p in PORTABLE]
        if not todo:
            return body
        with self._lock:
            probed = all(p in self.probes for p in todo)
        if probed:
            return {k: v for k, v in body.items() if not (k in todo and k in self.refusals)}
        with client() as c:
            return self.adapt(c, body)[0]

    def summary(self) -> dict[str, Any] | None:
        """For summary.json: ``{"probes": {...}, "refused": {param: {status, reason}}}``, None before any probe."""
        if not self.probes:
            return None
        return {"probes": dict(self.probes), "refused": {p: r.evidence() for p, r in self.refusals.items()}}
