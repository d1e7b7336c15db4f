"""The baseline the new revision is compared with, and the requests both get.

A baseline is either live (:class:`LiveBaseline`: ``--baseline URL``, or with ``--isvc`` the
revision serving today, :func:`kvgate.launch.kserve.discover_baseline`) or recorded
(:class:`RecordedBaseline`: ``--baseline-reports DIR``, an earlier run's golden file). The golden
prompts go to a live baseline and the new endpoint interleaved, one request at a time, alternating
which goes first (:func:`answer_both`); against a recorded baseline only the new endpoint is asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from kvgate.answers.tokendiff import Answer, answer_of
from kvgate.compare.golden import GOLDEN_FILE, Golden, GoldenError, GoldenPrompt, read_golden, request_body
from kvgate.http.client import Endpoint, KvClient
from kvgate.http.rendering import Rendering, concurrently, tokenize
from kvgate.http.prompts import PromptError, exact_prompt, filler, server_counter
from kvgate.profile.models import Profile


@dataclass(frozen=True)
class LiveBaseline:
    """A running endpoint serving the baseline; ``how`` says where it came from (``--baseline``,
    the KServe object's serving revision)."""

    endpoint: Endpoint
    how: str

    @property
    def label(self) -> str:
        return f"baseline {self.endpoint.display} ({self.how})"


@dataclass(frozen=True)
class RecordedBaseline:
    """An earlier run's golden file (``--baseline-reports DIR``)."""

    golden: Golden
    directory: Path

    @property
    def label(self) -> str:
        g = self.golden
        return (f"recorded baseline {self.directory} (run {g.run_id}, profile {g.profile}, "
                f"{g.endpoint or 'endpoint unknown'}, server {g.server_version or 'version unknown'})")


def recorded(directory: str | Path) -> RecordedBaseline:
    """The recorded baseline in ``directory`` (its :data:`~kvgate.compare.golden.GOLDEN_FILE`).
    Raises :class:`~kvgate.compare.golden.GoldenError` (one line) when it is not there or unreadable."""
    d = Path(directory)
    if not d.is_dir():
        raise GoldenError(f"{d}: no such directory (give the reports directory of a run recorded with "
                          "--gate-mode record -m compare)")
    return RecordedBaseline(read_golden(d / GOLDEN_FILE), d)


def sized_text(client: KvClient, model: str, tokens: int) -> str:
    """A completions prompt of ``tokens`` tokens by the server's ``/tokenize`` (exact), else, without
    it, ``tokens // 2`` filler words (no tokenizer packs fewer than ~1 token a word, so it fits)."""
    try:
        return exact_prompt(server_counter(client, model, "completions"), tokens).text
    except PromptError:
        return filler(max(1, tokens // 2))


def _ask(client: KvClient, prompt: GoldenPrompt, model: str, profile: Profile, logprobs: bool,
         timeout_s: float) -> Answer:
    path = client.api("/chat/completions" if prompt.route == "chat" else "/completions")
    body = request_body(prompt, model, profile, logprobs)
    if prompt.route == "chat" and client.chat_template_kwargs and "chat_template_kwargs" not in body:
        body["chat_template_kwargs"] = client.chat_template_kwargs
    r = client.post(path, body, timeout_s=timeout_s)
    return answer_of(prompt.route, r.status, r.json, r.error_message if r.status != 200 else "")


def refuses_logprobs(a: Answer) -> bool:
    """Whether an answer is the server refusing logprobs (vLLM's 400 for ``--max-logprobs`` below
    what was asked: "Requested sample logprobs of 5, which is greater than max allowed: 0")."""
    return a.status == 400 and "logprob" in (a.error or "").lower()


def answer_both(new: KvClient, base: KvClient | None, prompts: list[GoldenPrompt], model: str, profile: Profile,
                timeout_s: float) -> tuple[dict[str, Answer], dict[str, Answer], bool]:
    """Each golden prompt to ``new`` and (when live) ``base``, one request at a time, alternating
    which goes first, each within ``timeout_s`` seconds. Returns ``(new answers, base answers,
    logprobs)``; ``logprobs`` False when an endpoint refused them (every request is then sent again
    without: answers compared as text). Bounded: once a side gives no answer at all (status 0: a
    timeout, a dropped connection), nothing more is sent to it -- its later prompts are answers
    with ``error`` ``not sent: ...`` -- so a hung endpoint costs one timeout, not one per prompt."""
    for logprobs in (True, False):
        got: dict[str, dict[str, Answer]] = {"new": {}, "base": {}}
        dead: dict[str, str] = {}
        refused = False
        for i, p in enumerate(prompts):
            order = [("new", new), ("base", base)] if i % 2 == 0 else [("base", base), ("new", new)]
            for side, client in order:
                if client is None:
                    continue
                if side in dead:
                    got[side][p.name] = Answer(status=0, error=f"not sent: {dead[side]}")
                    continue
                a = _ask(client, p, model, profile, logprobs, timeout_s)
                got[side][p.name] = a
                if a.status == 0:
                    dead[side] = f"the {'baseline' if side == 'base' else 'new endpoint'} stopped answering at " \
                                 f"{p.name} ({(a.error or '')[:120]})"
                refused = refused or (logprobs and refuses_logprobs(a))
            if refused:
                break
        if not refused:
            return got["new"], got["base"], logprobs
    return got["new"], got["base"], False


def render_prompts(client: KvClient, prompts: list[GoldenPrompt], model: str, concurrency: int) -> dict[str, Rendering]:
    """Each golden prompt as ``client``'s server renders it (``/tokenize``: a chat's messages through
    its chat template with the body's tools and ``chat_template_kwargs``, a completion's text), up to
    ``concurrency`` at once; a rendering with ``error`` set where the server has no ``/tokenize``."""
    def one(p: GoldenPrompt) -> Rendering:
        b = p.body
        if p.route == "chat":
            return tokenize(client, model, messages=b.get("messages"), tools=b.get("tools"),
                            chat_template_kwargs=b.get("chat_template_kwargs"))
        if isinstance(b.get("prompt"), str):
            return tokenize(client, model, prompt=b["prompt"])
        return Rendering(error="a prompt of token ids: nothing to render")

    got = concurrently([lambda p=p: one(p) for p in prompts], concurrency)
    return {p.name: r for p, r in zip(prompts, got)}


def features_statuses(client: KvClient, profile: Profile) -> dict[str, str]:
    """Case -> status (PASS, FAIL, SKIP, ...) of every features case against ``client``'s endpoint
    (:func:`kvgate.gates.features.observe` then :func:`~kvgate.gates.features.decide`)."""
    from kvgate.gates.features import cases, decide, observe

    observed = observe(client, profile)
    return {c: decide(c, profile, observed).status.value for c in cases(profile)}


__all__ = ["LiveBaseline", "RecordedBaseline", "answer_both", "features_statuses", "recorded", "refuses_logprobs",
           "render_prompts", "sized_text"]
