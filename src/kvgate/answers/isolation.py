"""answers/isolation: one client's per-request sampling state never changes another's answer.

The *victims* (the profile's first goldens, temperature 0, with logprobs, each with its
``max_tokens``) are answered alone, one after the other (the answers suite shares these with the
determinism case); then again in *rounds*: each round sends the victims together with *polluters* --
requests on other connections whose per-request sampling state a batched engine keeps beside the
victims' (a tiny ``allowed_token_ids`` allowlist, a ``logit_bias`` forcing it, ``bad_words`` that
ban the victims' own first words, ``min_tokens``, a JSON schema, ``n`` > 1, other seeds and
penalties; a thinking budget and the LoRA adapters where the engine serves them, :func:`polluters`)
-- at most ``batch`` in flight, so they share the engine's batch. The round that carries the first
polluters (the allowlist, the bias, the bad words, ``min_tokens``) runs last and is followed by an
*after* wave: the victims, repeated to fill as many batch rows as the round used, sent the moment
the round ended, so they take the rows the polluters just left (a stale per-row state, such as an
allowlist row never cleared, reaches them). Each request's start and end times (the injected clock,
seconds) say which polluters were in flight beside a victim, or ended just before it started
(:func:`culprits`).

When a victim parts from its alone-answer beyond a near tie (:func:`parted`), two more kinds of
round measure why: a *control* round (the victims beside plain temperature-0 requests of the
polluters' prompt, no sampling parameters: the batch alone) and one *confirming* round per polluter
that was in flight (the victims beside copies of that polluter alone). Nothing more is sent on a
healthy server. The shapes (:class:`Flight`, :class:`IsolationObservation`) are judged by
:func:`kvgate.gates.answers.isolation_verdict`.

Public reports this exists for: a stale ``allowed_token_ids`` row applying one client's allowlist to
other clients' requests (CVE-2026-114049, vLLM < 0.31.0); out-of-vocabulary ``bad_words`` ids
corrupting concurrent requests' logits (PYSEC-2026-4000, through 0.29.0); a ``thinking_token_budget``
forcing the reasoning-end string into another request.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvgate.answers.observe import Asked, ask, body_for
from kvgate.answers.tokendiff import Difference, compare_answers
from kvgate.http.client import KvClient
from kvgate.http.rendering import tokenize
from kvgate.profile.models import GoldenSpec, Profile

#: The polluters' prompt (a chat turn unlike any golden's).
POLLUTER_PROMPT = "Name one animal that lives in Africa."
#: The word whose token ids are the polluters' tiny allowlist (``allowed_token_ids``) and the ids
#: ``logit_bias`` forces (+100), read from the server's ``/tokenize``.
ALLOW_WORD = " zebra"
#: The allowlist when the server has no ``/tokenize``: ids every vocabulary of more than 103 tokens holds.
FALLBACK_IDS = (100, 101, 102, 103)
#: [s] how long a round's threads wait for each other before they send.
START_WAIT_S = 5.0
#: The most confirming rounds after a change (one per polluter in flight beside a changed victim).
MAX_CONFIRM = 12


@dataclass(frozen=True)
class Polluter:
    """One polluter: ``name`` (its parameter: ``allowed_token_ids``, ``seed``, ``lora/a1``) and the
    chat ``body`` it sends (``model`` included)."""

    name: str
    body: dict[str, Any]


def polluters(profile: Profile, allowed: Sequence[int], bad_words: Sequence[str]) -> list[Polluter]:
    """The polluters for ``profile``, in order: ``allowed_token_ids`` (``allowed``), ``logit_bias``
    (+100 on ``allowed``), ``bad_words`` (``bad_words``: the victims' own first words), ``min_tokens``
    (all of ``polluter_max_tokens``), ``json_schema`` (``response_format``), ``n`` (2, temperature
    0.8, seed 11), ``seed`` (temperature 1, seed 12345), ``penalties`` (presence 1.5, frequency 1.0,
    repetition 1.3, temperature 0.7, seed 99); with ``engine.reasoning_parser``,
    ``thinking_token_budget`` (2, thinking on); with ``engine.enable_lora``, ``lora/NAME`` for each
    of the first two ``engine.lora_modules`` (temperature 0). Each generates
    ``answers.isolation.polluter_max_tokens``."""
    model, n = profile.model.served_name, profile.answers.isolation.polluter_max_tokens
    msgs = [{"role": "user", "content": POLLUTER_PROMPT}]

    def chat(temperature: float = 0.0, **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": msgs, "max_tokens": n, "temperature": temperature, **extra}

    schema = {"type": "object", "properties": {"animal": {"type": "string", "enum": ["zebra", "lion"]}},
              "required": ["animal"], "additionalProperties": False}
    out = [Polluter("allowed_token_ids", chat(allowed_token_ids=list(allowed))),
           Polluter("logit_bias", chat(logit_bias={str(i): 100 for i in allowed})),
           Polluter("bad_words", chat(bad_words=list(bad_words))),
           Polluter("min_tokens", chat(min_tokens=n)),
           Polluter("json_schema", chat(response_format={"type": "json_schema",
                                                         "json_schema": {"name": "animal", "schema": schema}})),
           Polluter("n", chat(0.8, n=2, seed=11)),
           Polluter("seed", chat(1.0, seed=12345)),
           Polluter("penalties", chat(0.7, seed=99, presence_penalty=1.5, frequency_penalty=1.0,
                                      repetition_penalty=1.3))]
    e = profile.engine
    if e.reasoning_parser:
        on = profile.features.reasoning.thinking_on or {}
        out.append(Polluter("thinking_token_budget", chat(thinking_token_budget=2, chat_template_kwargs=on)))
    if e.enable_lora:
        out += [Polluter(f"lora/{name}", {**chat(), "model": name}) for name in list(e.lora_modules)[:2]]
    return out


def plain_polluter(profile: Profile) -> Polluter:
    """The control round's filler: the polluters' prompt at temperature 0, no sampling parameter."""
    n = profile.answers.isolation.polluter_max_tokens
    return Polluter("plain", {"model": profile.model.served_name, "max_tokens": n, "temperature": 0,
                              "messages": [{"role": "user", "content": POLLUTER_PROMPT}]})


@dataclass
class Flight:
    """One request of a round: ``name`` (the victim's golden, or the polluter's parameter), ``role``
    (``victim`` or ``polluter``), what came back (``asked``) and when it was sent and answered
    (``t0``, ``t1``: seconds on the injected clock)."""

    name: str
    role: str
    asked: Asked
    t0: float
    t1: float
    #: ``beside`` (sent with the round's polluters) or ``after`` (sent once the round had ended)
    wave: str = "beside"

    def overlaps(self, other: "Flight") -> bool:
        """Whether the two were in flight at the same time."""
        return self.t0 < other.t1 and other.t0 < self.t1

    def to_dict(self) -> dict[str, Any]:
        a = self.asked
        return {"name": self.name, "role": self.role, "wave": self.wave, "status": a.status, "error": a.error,
                "text": a.text[:160], "t0_s": round(self.t0, 4), "t1_s": round(self.t1, 4)}


@dataclass
class IsolationObservation:
    """The case's answers: ``victims`` (golden names, in order), their ``alone`` answers, the
    ``rounds`` (each a list of :class:`Flight`, victims and polluters), ``batch`` (requests in
    flight per round: :func:`batch_size`, or the victims and one polluter when there are as many
    victims), the ``allowed`` ids and where they came from (``allowed_from``); after a
    change, the ``control`` round (victims beside plain requests) and the ``confirm`` rounds
    (polluter name -> the victims beside copies of it alone); None / empty when nothing changed."""

    victims: list[str]
    alone: dict[str, Asked]
    rounds: list[list[Flight]]
    batch: int
    allowed: list[int] = field(default_factory=list)
    allowed_from: str = ""
    control: list[Flight] | None = None
    confirm: dict[str, list[Flight]] = field(default_factory=dict)


def parted(alone: Asked, got: Asked, near_tie: float) -> Difference | None:
    """How ``got`` differs from the victim's ``alone`` answer: None when they are the same (equal
    tokens, or equal text without logprobs); else the :class:`~kvgate.answers.tokendiff.Difference`
    (``near-tie``: either side ranks the other's token within ``near_tie`` nats, as the compare
    gate tells them apart; ``drift``; ``error``: one side has no answer)."""
    if not alone.ok or not got.ok:
        return compare_answers(alone.answer(), got.answer(), near_tie)
    if got.text == alone.text and (not alone.tokens or not got.tokens or alone.tokens == got.tokens):
        return None
    d = compare_answers(alone.answer(), got.answer(), near_tie)
    return None if d.kind == "identical" else d


def culprits(f: Flight, rnd: Sequence[Flight]) -> list[str]:
    """The polluters of round ``rnd`` (answered) a victim ``f`` of it may owe a change to: for a
    victim sent beside them, those in flight with it (their start and end times overlapping its);
    for one of the after wave, those that ended before it started (their batch rows it took)."""
    pols = [p for p in rnd if p.role == "polluter" and p.asked.ok]
    near = [p for p in pols if (p.overlaps(f) if f.wave == "beside" else p.t1 <= f.t0)]
    return list(dict.fromkeys(p.name for p in near))


def changed(obs: IsolationObservation, flights: Sequence[Flight], near_tie: float) -> list[tuple[Flight, Difference]]:
    """The victims of ``flights`` that part from their alone-answers beyond a near tie (answered
    both times), each with its difference."""
    out = []
    for f in flights:
        alone = obs.alone.get(f.name)
        if f.role != "victim" or alone is None or not alone.ok or not f.asked.ok:
            continue
        d = parted(alone, f.asked, near_tie)
        if d is not None and d.kind == "drift":
            out.append((f, d))
    return out


def batch_size(profile: Profile) -> int:
    """[requests] in flight per round: ``answers.isolation.batch``, else ``engine.max_num_seqs``
    (8 when unset), at most 16."""
    iso = profile.answers.isolation
    return iso.batch if iso.batch is not None else min(16, profile.engine.max_num_seqs or 8)


def _first_word(text: str) -> str | None:
    m = re.search(r"[^\W_]+", text)
    return m.group(0) if m else None


def victim_body(g: GoldenSpec, model: str) -> dict[str, Any]:
    """A victim's request: the golden at temperature 0 with its ``max_tokens``, 5 logprobs a position
    (the answers gate's golden request)."""
    return body_for(g.route, model, messages=g.messages, prompt=g.prompt, max_tokens=g.max_tokens, logprobs=5)


class Rounds:
    """Sends the case's requests (``ask``: :func:`kvgate.answers.observe.ask`, injectable) and
    times them on ``clock`` (seconds)."""

    def __init__(self, client: KvClient, profile: Profile, victims: Sequence[GoldenSpec], *,
                 clock: Callable[[], float] = time.monotonic, ask_fn: Callable[..., Asked] = ask) -> None:
        self.client, self.profile, self.victims = client, profile, list(victims)
        self.clock, self.ask = clock, ask_fn
        self.timeout_s = profile.limits.request_timeout_s
        self.bodies = {g.name: victim_body(g, profile.model.served_name) for g in self.victims}

    def _flight(self, name: str, role: str, route: str, body: dict[str, Any], wave: str = "beside") -> Flight:
        t0 = self.clock()
        a = self.ask(self.client, route, body, timeout_s=self.timeout_s)
        return Flight(name, role, a, t0, self.clock(), wave)

    def alone(self) -> dict[str, Asked]:
        """Each victim asked alone, one after the other."""
        return {g.name: self._flight(g.name, "victim", g.route, self.bodies[g.name]).asked for g in self.victims}

    def round(self, extra: Sequence[Polluter], after: bool = False) -> list[Flight]:
        """The victims and ``extra`` sent together (the polluters first), all in flight at once;
        ``after``: then the after wave, the victims repeated to as many requests as the round sent,
        all at once."""
        jobs = [(p.name, "polluter", "chat", p.body, "beside") for p in extra] + \
            [(g.name, "victim", g.route, self.bodies[g.name], "beside") for g in self.victims]
        out = self._together(jobs)
        if after:
            cycle = [self.victims[i % len(self.victims)] for i in range(len(jobs))]
            out += self._together([(g.name, "victim", g.route, self.bodies[g.name], "after") for g in cycle])
        return out

    def _together(self, jobs: list[tuple[str, str, str, dict[str, Any], str]]) -> list[Flight]:
        """``jobs`` sent at once: each thread waits for the others (a barrier, at most
        :data:`START_WAIT_S`) before it sends."""
        start = threading.Barrier(len(jobs))

        def send(job: tuple[str, str, str, dict[str, Any], str]) -> Flight:
            try:
                start.wait(START_WAIT_S)
            except threading.BrokenBarrierError:  # a thread started late: send anyway (the times say what overlapped)
                pass
            return self._flight(*job)

        with cf.ThreadPoolExecutor(max_workers=len(jobs)) as ex:
            return list(ex.map(send, jobs))


def allowlist(client: KvClient, profile: Profile) -> tuple[list[int], str]:
    """``(ids, where from)``: the token ids of :data:`ALLOW_WORD` by the server's ``/tokenize``
    (no special tokens), else :data:`FALLBACK_IDS`."""
    r = tokenize(client, profile.model.served_name, prompt=ALLOW_WORD, add_special_tokens=False)
    if r.ok and r.ids:
        return list(r.ids), f"/tokenize of {ALLOW_WORD!r}"
    return list(FALLBACK_IDS), f"fixed ids ({r.error})"


def observe(client: KvClient, profile: Profile, victims: Sequence[GoldenSpec], *,
            alone: dict[str, Asked] | None = None, clock: Callable[[], float] = time.monotonic,
            ask_fn: Callable[..., Asked] = ask) -> IsolationObservation:
    """The case's observation (module docstring): the victims alone (``alone``: their answers to
    :func:`victim_body` already asked alone, by name; else asked here, one after the other), the
    rounds (the polluters ``batch - victims`` a round, at least one; the round of the first ones
    last, with its after wave), and after a change the control and confirming rounds (each with its
    after wave)."""
    iso = profile.answers.isolation
    r = Rounds(client, profile, victims, clock=clock, ask_fn=ask_fn)
    if alone is None or any(g.name not in alone for g in r.victims):
        alone = r.alone()
    alone = {g.name: alone[g.name] for g in r.victims}
    allowed, allowed_from = allowlist(client, profile)
    words = list(dict.fromkeys(w for a in alone.values() if a.ok and (w := _first_word(a.text))))
    pols = polluters(profile, allowed, words or ["the"])
    batch = batch_size(profile)
    per = max(1, batch - len(r.victims))
    obs = IsolationObservation([g.name for g in r.victims], alone, [], len(r.victims) + per, allowed, allowed_from)
    chunks = [pols[i:i + per] for i in range(0, len(pols), per)][::-1]
    obs.rounds = [r.round(c, after=k == len(chunks) - 1) for k, c in enumerate(chunks)]
    hit = [(f, rnd) for rnd in obs.rounds for f, _ in changed(obs, rnd, iso.near_tie_logprob)]
    if not hit:
        return obs
    obs.control = r.round([plain_polluter(profile)] * per, after=True)
    suspects = list(dict.fromkeys(name for f, rnd in hit for name in culprits(f, rnd)))
    by_name = {p.name: p for p in pols}
    for name in suspects[:MAX_CONFIRM]:
        obs.confirm[name] = r.round([by_name[name]] * per, after=True)
    return obs
