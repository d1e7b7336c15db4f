"""Replaying a traffic sample against the endpoint: the plan (which requests, when) and the run.

:func:`plan_replay` turns a :class:`~kvgate.traffic.sample.TrafficSample` and the workload's
``traffic:`` into a :class:`ReplayPlan`; :func:`run_replay` builds exact-length prompts for it,
sends it with :func:`kvgate.load.sessions.run_sessions` and returns a :class:`ReplayResult`: the
:class:`~kvgate.load.LoadResult`, the plan, per-request rows (planned vs actual prompt tokens) and
the per-turn cache effect.

**Units.** A session (every request with the same ``session`` id, in ``turn`` order) is planned
and sent as a unit: it is kept or dropped whole, never its later turns without its first. A
request without a session is a unit of one.

**Open loop** (``replay: open``): on the recorded arrival times, offsets from the sample's first
arrival divided by ``speedup``. A unit is kept when every one of its turns falls within
``max_duration_s`` of the sped-up schedule and it fits in what is left of the request cap (the
smaller of the gate's ``max_requests`` and ``traffic.max_requests``); units are taken in order of
their first arrival, one that does not fit is left out and the next is tried. **Closed loop**
(``replay: closed``): the units in an order drawn with ``numpy.random.default_rng(seed)`` (same
seed, same plan), taken while they fit under the cap, each at most once; ``concurrency`` workers
each run a whole session, turn after turn, then take the next unit.

**Content** (synthetic; the lengths are the sample's). A completions prompt as a plain-text
transcript::

    System[<prefix_id><salt>]: <filler>          exactly prefix_tokens tokens (counted alone), the
                                                 same text for every request with that prefix_id
    User[<tag> <key><salt>]: <filler>            turn 0 (or a single request); the key makes it
    Assistant:<the server's reply to turn 0>     the session's own
    User: <filler>                               turn n: the whole previous prompt, its reply, and a
    Assistant:                                   new user message sized to the recorded prompt_tokens

The ``System`` block (and its newline) is there only for requests with a ``prefix_id`` and
``prefix_tokens > 0``: it is all that requests of different sessions share. **A sample that
carries text** (``TraceRequest.messages``: an OpenAI request log, a ShareGPT conversation) has
its own words sent instead of filler: turn 0 (or a single request) renders its messages in the same
layout (its own system message as ``System<salt>: ...`` when no ``prefix_id`` stands in for it;
the first user message keeps the ``User[<tag> <key><salt>]:`` label), a later turn adds what its
user said after the last assistant message; filler then pads the prompt to the recorded length
(the text is counted by this server's tokenizer, which need not be the one that recorded it: a
longer text is sent whole and the row records the deviation). Turn ``n + 1``'s
prompt begins with turn ``n``'s prompt and reply text verbatim, so prefix caching can hit them.
What the cache can hit: whole KV blocks only (``block_size`` tokens; vLLM on CPU uses 128), so
a system prompt shorter than a block is never a hit, and turn ``n + 1`` hits turn ``n``'s *prompt*
blocks; the blocks that held turn ``n``'s generated tokens hit only where the reply's text
re-tokenizes into the same tokens (a real chat client resends text too, so this is what production
sees). Measured on the embedded tiny-cpu vLLM (block 128; 120/220/320-token turns, 64-token
system prompt): turn 1 cached 0 tokens (turn 0's prompt is under one block), turn 2 cached 128.
Every length is counted by the server's tokenizer (``/tokenize``, as
:func:`kvgate.http.probes.build_prompt` counts: vLLM's, llama.cpp's, llama-cpp-python's, else the
profile's local ``model.tokenizer``); when the history alone already exceeds the recorded length,
the new user message is a few filler words (:data:`MIN_USER_WORDS`) and the row records the
deviation. A later turn's prompt needs the earlier reply, so it is built during the run, in a
worker thread (the event loop goes on); everything else is built before the clock starts. On a
server nothing can count with, prompts are token ids (exact by construction): the shared system
prompt is a shared id run, and a later turn continues the previous turn's ids with a stand-in run
as long as the reply was (``usage.completion_tokens``) -- the reply's text itself cannot be put
into ids without a tokenizer (``ReplayResult.cache["content"]`` says which was used).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient
from kvgate.http.metrics import scrape_value
from kvgate.http.prompts import CountFn, PreparationRefused, exact_prompt, filler, local_counter, server_counter, token_id_prompt
from kvgate.load import LoadResult, RequestRecord, RequestSpec, completion_request
from kvgate.load.sessions import SessionPlan, SessionRun, sessions_loop
from kvgate.traffic.sample import TraceRequest, TrafficError, TrafficSample

#: Filler words of a later turn's user message when the history alone reaches the recorded length.
MIN_USER_WORDS = 3
#: The transcript's labels (see the module docstring).
ASSISTANT = "\nAssistant:"
NEXT_USER = "\nUser: "


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a replay: the recorded ``trace`` row, ``offset_s`` (open loop: seconds from
    the replay's start; None in a closed loop), ``key`` (a stable id: ``r<i>`` for the sample's
    ``i``-th request (0-based file order) or ``<session>/<turn>``), ``session`` (the session's
    id; None for a single request) and ``turn`` (0-based position in it)."""

    trace: TraceRequest
    offset_s: float | None
    key: str
    session: str | None = None
    turn: int = 0


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay sends: ``items`` in send order (open loop: by offset; closed loop: by unit,
    a session's turns together), ``mode`` (``open``/``closed``), ``concurrency`` (closed loop),
    ``speedup`` (open loop), ``sample`` (provenance), ``seed`` (closed-loop draw and content),
    ``left_out`` (what the caps cut: ``requests``, ``sessions_over_duration`` -- sessions that
    began in the window but ran past ``max_duration_s`` --, ``sessions_over_cap``)."""

    sample: TrafficSample
    mode: str
    items: tuple[PlannedRequest, ...]
    concurrency: int
    speedup: float = 1.0
    seed: int = 0
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def sessions(self) -> int:
        """Sessions in the plan (whole)."""
        return len({it.session for it in self.items if it.session is not None})

    def units(self) -> list[list[int]]:
        """Item indices per unit (a session's turns in order; a single request alone), in the
        order of each unit's first item."""
        out: dict[str, list[int]] = {}
        for i, it in enumerate(self.items):
            out.setdefault(f"s:{it.session}" if it.session is not None else f"r:{it.key}", []).append(i)
        for idx in out.values():
            idx.sort(key=lambda i: self.items[i].turn)
        return list(out.values())

    def describe(self) -> str:
        """One line: what was replayed, how, from which sample."""
        how = (f"open loop on recorded arrivals at {self.speedup:g}x" if self.mode == "open"
               else f"closed loop at concurrency {self.concurrency}, seed {self.seed}")
        ses = f", {self.sessions} whole sessions" if self.sessions else ""
        return (f"{len(self.items):,} of {len(self.sample.requests):,} requests{ses} replayed ({how}) from "
                f"{self.sample.describe()}")

    def provenance(self) -> dict[str, Any]:
        """What a verdict's evidence records: the sample's provenance plus how it was drawn."""
        return {**self.sample.provenance(), "drawn": len(self.items), "mode": self.mode,
                "concurrency": self.concurrency, "speedup": self.speedup, "seed": self.seed,
                "sessions_drawn": self.sessions, "left_out": dict(self.left_out)}


def sample_units(sample: TrafficSample) -> list[tuple[str | None, int, list[TraceRequest]]]:
    """``(session id or None, file index of its first row, rows in turn order)`` per unit, in
    file order of each unit's first row (the soak draws from these too)."""
    by_session = sample.sessions()
    seen: set[str] = set()
    out: list[tuple[str | None, int, list[TraceRequest]]] = []
    for i, r in enumerate(sample.requests):
        if r.session is None:
            out.append((None, i, [r]))
        elif r.session not in seen:
            seen.add(r.session)
            out.append((r.session, i, by_session[r.session]))
    return out


def _items(sid: str | None, i: int, rows: list[TraceRequest], offsets: list[float | None]) -> list[PlannedRequest]:
    if sid is None:
        return [PlannedRequest(rows[0], offsets[0], f"r{i}")]
    return [PlannedRequest(r, off, f"{sid}/{n}", sid, n) for n, (r, off) in enumerate(zip(rows, offsets))]


def plan_replay(sample: TrafficSample, spec: Any, concurrency: int, max_requests: int | None = None) -> ReplayPlan:
    """The replay of ``sample`` per ``spec`` (a :class:`~kvgate.profile.models.TrafficSpec`;
    see the module docstring for how units are kept). ``max_requests``: the gate's own cap (the
    smaller of it and ``spec.max_requests`` applies). Raises :class:`TrafficError` for an
    open-loop replay of a sample without arrival times."""
    cap = min(x for x in (max_requests, spec.max_requests, len(sample.requests)) if x is not None)
    units = sample_units(sample)
    left = {"requests": 0, "sessions_over_duration": 0, "sessions_over_cap": 0}
    kept: list[PlannedRequest] = []
    seed = int(getattr(spec, "seed", 0) or 0)

    def take(sid: str | None, i: int, rows: list[TraceRequest], offs: list[float | None]) -> None:
        if spec.replay == "open" and spec.max_duration_s is not None and max(o or 0.0 for o in offs) > spec.max_duration_s:
            left["requests"] += len(rows)
            if sid is not None and (offs[0] or 0.0) <= spec.max_duration_s:
                left["sessions_over_duration"] += 1
            return
        if len(kept) + len(rows) > cap:
            left["requests"] += len(rows)
            left["sessions_over_cap"] += sid is not None
            return
        kept.extend(_items(sid, i, rows, offs))

    if spec.replay == "open":
        if not sample.has_arrivals:
            raise TrafficError(f"traffic sample {sample.path}: replay open needs arrival_s on every request "
                               "(replay: closed draws from it at the workload's concurrency instead)")
        t0 = min(r.arrival_s or 0.0 for r in sample.requests)
        units.sort(key=lambda u: (u[2][0].arrival_s or 0.0, u[1]))
        for sid, i, rows in units:
            take(sid, i, rows, [((r.arrival_s or 0.0) - t0) / spec.speedup for r in rows])
        order = sorted(range(len(kept)), key=lambda k: (kept[k].offset_s or 0.0, k))
        return ReplayPlan(sample, "open", tuple(kept[k] for k in order), concurrency, spec.speedup, seed, left)
    rng = np.random.default_rng(seed)
    for u in rng.permutation(len(units)):
        sid, i, rows = units[int(u)]
        take(sid, i, rows, [None] * len(rows))
    return ReplayPlan(sample, "closed", tuple(kept), concurrency, 1.0, seed, left)


# ----------------------------------------------------------------------------- content


def text_counter(client: KvClient, model: str) -> CountFn | None:
    """A ``count(text)`` of a completions prompt by the server's tokenizer, chosen as
    :func:`kvgate.http.probes.build_prompt` chooses (vLLM's ``/tokenize``, llama.cpp's,
    llama-cpp-python's, else the profile's local ``model.tokenizer``); None when nothing can
    count (prompts are then token ids)."""
    from kvgate.http.tokenizers import detect, server_text_counter

    found = detect(client, model)
    if found.route == "vllm":
        return server_counter(client, model, "completions")
    if found.route is not None:
        return server_text_counter(client, model, found.route)
    path = getattr(client.endpoint, "tokenizer", None)
    return local_counter(path, "completions") if path else None


def fit_text(count: CountFn, head: str, target: int, suffix: str = "") -> tuple[str, int]:
    """``head + filler + suffix`` of exactly ``target`` tokens by ``count`` (a guess from the
    token gap first -- the filler words are ~1 token each --, then
    :func:`kvgate.http.prompts.exact_prompt`'s search). When even ``MIN_USER_WORDS`` filler words
    reach ``target``, returns that minimum and its count (> ``target``: the caller records the
    deviation)."""
    try:
        return _fit(count, head, target, suffix)
    except PreparationRefused as exc:  # name the prompt being built, as exact_prompt does
        raise exc.building(target, "completions") from None


def _fit(count: CountFn, head: str, target: int, suffix: str) -> tuple[str, int]:
    least = head + filler(MIN_USER_WORDS) + suffix
    n_least = count(least)
    if n_least >= target:
        return least, n_least
    k = MIN_USER_WORDS + (target - n_least)
    for _ in range(4):
        text = head + filler(k) + suffix
        n = count(text)
        if n == target:
            return text, n
        k = max(MIN_USER_WORDS, k + (target - n))
    p = exact_prompt(lambda t: count(t + suffix), target, prefix=head + filler(MIN_USER_WORDS) + " ")
    return p.text + suffix, p.tokens


@dataclass
class _Built:
    """One request's prompt as built: ``prompt`` (text or ids), ``tokens`` (its count)."""

    prompt: str | list[int]
    tokens: int


class ReplayContent:
    """Builds the replay's prompts (module docstring). Thread-safe enough for its use: the
    system prompts are built before the run; each session's turns are built one at a time."""

    def __init__(self, count: CountFn | None, tag: str, salt: str) -> None:
        self.count, self.tag, self.salt = count, tag, salt
        self.systems: dict[str, _Built] = {}

    def system(self, tr: TraceRequest) -> _Built | None:
        if tr.prefix_id is None or tr.prefix_tokens <= 0:
            return None
        if tr.prefix_id not in self.systems:
            head = f"System[{tr.prefix_id}{self.salt}]: "
            if self.count is None:
                ids = token_id_prompt(tr.prefix_tokens, seed=f"system {head}").token_ids or ()
                self.systems[tr.prefix_id] = _Built(list(ids), len(ids))
            else:
                text, n = fit_text(self.count, head, tr.prefix_tokens)
                self.systems[tr.prefix_id] = _Built(text, n)
        return self.systems[tr.prefix_id]

    def first(self, it: PlannedRequest) -> _Built:
        target = it.trace.prompt_tokens
        sys_ = self.system(it.trace)
        seed = f"{self.tag} {it.key}{self.salt}"
        if self.count is None:
            base = list(sys_.prompt) if sys_ is not None else []  # type: ignore[arg-type]
            own = token_id_prompt(max(1, target - len(base)), seed=seed).token_ids or ()
            return _Built(base + list(own), len(base) + len(own))
        msgs = list(it.trace.messages or ())
        own_system = next((_text(m) for m in msgs if m.get("role") == "system"), None)
        if sys_ is not None:
            head = f"{sys_.prompt}\n"
        elif own_system is not None:  # the sample's own system text (shared where the sample shares it)
            head = f"System{self.salt}: {own_system}\n"
        else:
            head = ""
        said = _said([m for m in msgs if m.get("role") != "system"], f"User[{seed}]: ")
        head += said if said else f"User[{seed}]: "
        return _Built(*fit_text(self.count, head, target, ASSISTANT))

    def follow(self, it: PlannedRequest, prev: _Built, reply: RequestRecord) -> _Built:
        target = it.trace.prompt_tokens
        if self.count is None:
            stand_in = token_id_prompt(max(1, reply.tokens or 1), seed=f"reply {it.key}{self.salt}").token_ids or ()
            base = list(prev.prompt) + list(stand_in)  # type: ignore[arg-type]
            own = token_id_prompt(max(MIN_USER_WORDS, target - len(base)), seed=f"{it.key}{self.salt}").token_ids or ()
            return _Built(base + list(own), len(base) + len(own))
        msgs = list(it.trace.messages or ())
        last_reply = max((k for k, m in enumerate(msgs) if m.get("role") == "assistant"), default=-1)
        said = _said(msgs[last_reply + 1:], NEXT_USER)  # what the sample's user said this turn
        head = f"{prev.prompt}{reply.text}" + (said if said else NEXT_USER)
        return _Built(*fit_text(self.count, head, target, ASSISTANT))




def session_plans(items: Sequence[PlannedRequest], units: Sequence[Sequence[int]], content: ReplayContent,
                  spec: Callable[[str | list[int], PlannedRequest], RequestSpec],
                  offsets_s: Sequence[float] | None = None, built: dict[int, _Built] | None = None
                  ) -> list[SessionPlan]:
    """One :class:`~kvgate.load.sessions.SessionPlan` per unit (``units``: indices into ``items``,
    a session's turns in order): turn 0's prompt built now (``content.first``: ``/tokenize`` calls,
    so off the event loop), each later turn's by its ``follow`` at run time from the previous
    prompt and the reply (``content.follow``: the history grows). ``spec(prompt, item)`` makes the
    request; ``offsets_s`` (open loop): each item's planned send time, seconds; record indices are
    the item indices; ``built`` collects each item's :class:`_Built` (prompt and its token count).
    Shared by :func:`run_replay` and the soak (:mod:`kvgate.soak.runner`)."""
    built = {} if built is None else built
    out: list[SessionPlan] = []
    for unit in units:
        first = unit[0]
        built[first] = content.first(items[first])

        def follow(n: int, earlier: list[RequestRecord], unit: Sequence[int] = unit) -> Any:
            i, prev = unit[n], built[unit[n - 1]]
            b = built[i] = content.follow(items[i], prev, earlier[-1])
            return spec(b.prompt, items[i])

        offs = tuple(offsets_s[i] for i in unit) if offsets_s is not None else None
        out.append(SessionPlan(spec(built[first].prompt, items[first]), len(unit), offs,
                               follow if len(unit) > 1 else None, indices=tuple(unit)))
    return out


def _text(message: dict[str, Any]) -> str:
    """A message's text: a string content, or its text parts joined."""
    c = message.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return " ".join(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _said(messages: list[dict[str, Any]], first_user: str) -> str:
    """The sample's own messages as transcript lines (the first user message labelled
    ``first_user``, later ones ``User:``, replies ``Assistant:``), ending with a space for the
    filler that sizes it; empty when there are none."""
    out, user = [], first_user
    for m in messages:
        role = m.get("role")
        if role == "user":
            out.append(f"{user}{_text(m)}")
            user = NEXT_USER
        else:
            out.append(f"\n{str(role).capitalize()}: {_text(m)}" if out else f"{user}\n{str(role).capitalize()}: {_text(m)}")
    return "".join(out) + " " if out else ""


# ----------------------------------------------------------------------------- results


def _p50_ms(xs: list[float]) -> float | None:
    return round(float(np.percentile(xs, 50)) * 1e3, 3) if xs else None


def cached_tokens(rec: RequestRecord) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a record (tokens), None when the server
    did not report it (vLLM reports it only with ``--enable-prompt-tokens-details``)."""
    details = (rec.usage or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class ReplayResult:
    """A finished replay.

    ``plan``; ``result`` (the :class:`~kvgate.load.LoadResult`; record ``index`` = the item's
    index in ``plan.items``); ``requests``: one row per planned item (:meth:`rows`: key, session,
    turn, planned offset, ``prompt_tokens_planned`` (the sample's) / ``prompt_tokens_built`` (as
    counted when built) / ``prompt_tokens_actual`` (the server's ``usage.prompt_tokens``),
    ``cached_tokens``, TTFT, lag, ``wait_ms`` (dependent turn: its prompt ready minus its planned
    offset; > 0 when the previous reply came later than the trace's next arrival), error or why
    it was not sent); ``turns``: per turn position (empty for a plan without sessions)
    ``{"turn", "requests", "sent", "ok", "cached_tokens_mean", "cached_share", "ttft_p50_ms",
    "prompt_tokens_planned_mean", "prompt_tokens_actual_mean", "deviating"}`` (``cached_*`` None
    when the server does not report cached tokens; ``cached_share``: share of the ok requests
    with cached tokens > 0); ``cache``: the summary (:meth:`describe_cache`): ``content``
    (``text`` or ``token-ids``), ``cached_tokens_reported``, ``later_turns_cached_mean`` /
    ``later_turns_cached_share``, ``ttft_p50_ms_first`` / ``ttft_p50_ms_later`` (turn 0 vs turns
    >= 1) and ``ttft_later_vs_first`` (ratio), ``prefix_cache_hits_delta`` /
    ``prefix_cache_queries_delta`` (tokens; ``vllm:prefix_cache_hits``/``_queries`` over the
    replay, None without ``/metrics``) and ``prefix_cache_hit_rate``, ``deviating`` (requests
    whose actual prompt length differs from the planned), ``not_sent``, ``build_p99_ms`` (time
    to build a later turn's prompt after its previous reply)."""

    plan: ReplayPlan
    result: LoadResult
    turns: list[dict[str, Any]] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """Per-request rows (one per planned item, in plan order)."""
        return list(self.requests)

    def turns_csv(self) -> str:
        """The per-turn table as CSV text (a report attachment)."""
        return _csv(self.turns, ["turn", "requests", "sent", "ok", "cached_tokens_mean", "cached_share",
                                 "ttft_p50_ms", "prompt_tokens_planned_mean", "prompt_tokens_actual_mean", "deviating"])

    def rows_csv(self) -> str:
        """The per-request rows as CSV text (a report attachment)."""
        return _csv(self.requests, list(self.requests[0]) if self.requests else ["key"])

    def describe_cache(self) -> str:
        """One line for a verdict: the cache effect of later turns, and the counter's delta."""
        c = self.cache
        parts = []
        if self.turns:
            later = sum(t["ok"] for t in self.turns if t["turn"] > 0)
            if c.get("cached_tokens_reported"):
                parts.append(f"later turns ({later} ok): cached tokens mean {c['later_turns_cached_mean']:,.0f}, "
                             f"{c['later_turns_cached_share']:.0%} with cached tokens > 0")
            else:
                parts.append(f"later turns ({later} ok): cached tokens not reported by the server "
                             "(vLLM: --enable-prompt-tokens-details)")
            if c.get("ttft_p50_ms_first") is not None and c.get("ttft_p50_ms_later") is not None:
                parts.append(f"TTFT p50 {c['ttft_p50_ms_later']:,.1f} ms vs {c['ttft_p50_ms_first']:,.1f} ms at turn 0")
        hits = c.get("prefix_cache_hits_delta")
        if hits is not None:
            rate = c.get("prefix_cache_hit_rate")
            parts.append(f"vllm:prefix_cache_hits +{hits:,.0f} tokens" + (f" ({rate:.0%} of queried)" if rate is not None else ""))
        else:
            parts.append("vllm:prefix_cache_hits not scraped (no /metrics)")
        return "; ".join(parts)


def _csv(rows: list[dict[str, Any]], cols: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return buf.getvalue()


def _summarise(plan: ReplayPlan, run: SessionRun, built: dict[int, _Built], content: str,
               hits: tuple[float | None, float | None], queries: tuple[float | None, float | None]
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    recs = {r.index: r for r in run.result.records}
    rows: list[dict[str, Any]] = []
    for i, it in enumerate(plan.items):
        r, t = recs.get(i), run.timing.get(i)
        usage = (r.usage or {}) if r is not None else {}
        actual = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
        ttft = (r.first_token_s - r.sent_s) if r is not None and r.ok and r.first_token_s is not None \
            and r.sent_s is not None else None
        wait = (max(0.0, (t.built_s or 0.0) - t.due_s) if t is not None and t.due_s is not None and t.built_s is not None
                else None)
        rows.append({
            "key": it.key, "session": it.session, "turn": it.turn, "offset_s": it.offset_s,
            "prompt_tokens_planned": it.trace.prompt_tokens,
            "prompt_tokens_built": built[i].tokens if i in built else None, "prompt_tokens_actual": actual,
            "output_tokens_planned": it.trace.output_tokens, "output_tokens": r.tokens if r is not None else None,
            "cached_tokens": cached_tokens(r) if r is not None else None,
            "ttft_ms": None if ttft is None else round(ttft * 1e3, 3),
            "lag_ms": None if r is None or r.lag_s is None else round(r.lag_s * 1e3, 3),
            "wait_ms": None if wait is None else round(wait * 1e3, 3),
            "build_ms": None if t is None or t.build_s is None else round(t.build_s * 1e3, 3),
            "sent": r is not None, "ok": bool(r is not None and r.ok),
            "error": (r.error if r is not None else run.not_sent.get(i, "not sent")),
        })
    reported = any(row["cached_tokens"] is not None for row in rows)
    turns: list[dict[str, Any]] = []
    if plan.sessions:
        for n in sorted({row["turn"] for row in rows}):
            at = [row for row in rows if row["turn"] == n]
            ok = [row for row in at if row["ok"]]
            cached = [row["cached_tokens"] for row in ok if row["cached_tokens"] is not None]
            actual = [row["prompt_tokens_actual"] for row in ok if row["prompt_tokens_actual"] is not None]
            turns.append({
                "turn": n, "requests": len(at), "sent": sum(1 for row in at if row["sent"]), "ok": len(ok),
                "cached_tokens_mean": round(float(np.mean(cached)), 1) if cached else None,
                "cached_share": round(sum(c > 0 for c in cached) / len(cached), 4) if cached else None,
                "ttft_p50_ms": _p50_ms([row["ttft_ms"] / 1e3 for row in ok if row["ttft_ms"] is not None]),
                "prompt_tokens_planned_mean": round(float(np.mean([row["prompt_tokens_planned"] for row in at])), 1),
                "prompt_tokens_actual_mean": round(float(np.mean(actual)), 1) if actual else None,
                "deviating": sum(1 for row in ok if row["prompt_tokens_actual"] is not None
                                 and row["prompt_tokens_actual"] != row["prompt_tokens_planned"]),
            })
    ok_rows = [row for row in rows if row["ok"]]
    later = [row for row in ok_rows if row["turn"] > 0]
    later_cached = [row["cached_tokens"] for row in later if row["cached_tokens"] is not None]
    first_ttft = [row["ttft_ms"] / 1e3 for row in ok_rows if row["turn"] == 0 and row["ttft_ms"] is not None]
    later_ttft = [row["ttft_ms"] / 1e3 for row in later if row["ttft_ms"] is not None]
    f50, l50 = _p50_ms(first_ttft), _p50_ms(later_ttft)

    def delta(pair: tuple[float | None, float | None]) -> float | None:
        return None if pair[0] is None or pair[1] is None else pair[1] - pair[0]

    dh, dq = delta(hits), delta(queries)
    builds = [t.build_s for t in run.timing.values() if t.build_s is not None]
    cache = {
        "content": content, "cached_tokens_reported": reported,
        "later_turns": len(later),
        "later_turns_cached_mean": round(float(np.mean(later_cached)), 1) if later_cached else None,
        "later_turns_cached_share": round(sum(c > 0 for c in later_cached) / len(later_cached), 4) if later_cached else None,
        "ttft_p50_ms_first": f50, "ttft_p50_ms_later": l50,
        "ttft_later_vs_first": round(l50 / f50, 3) if f50 and l50 is not None else None,
        "prefix_cache_hits_delta": dh, "prefix_cache_queries_delta": dq,
        "prefix_cache_hit_rate": round(dh / dq, 4) if dh is not None and dq else None,
        "deviating": sum(1 for row in ok_rows if row["prompt_tokens_actual"] is not None
                         and row["prompt_tokens_actual"] != row["prompt_tokens_planned"]),
        "not_sent": len(run.not_sent),
        "build_p99_ms": round(float(np.percentile(builds, 99)) * 1e3, 3) if builds else None,
    }
    return rows, turns, cache


def _scrape(client: KvClient) -> tuple[float | None, float | None]:
    """``(prefix_cache_hits, prefix_cache_queries)`` now (tokens; None when not exposed)."""
    try:
        text = client.metrics_text()
    except EndpointUnreachable:
        return None, None
    return scrape_value(text, "prefix_hits"), scrape_value(text, "prefix_queries")


def run_replay(client: KvClient, endpoint: Endpoint, profile: Any, plan: ReplayPlan, *, tag: str = "replay",
               deadline_s: float = 300.0, salt: str = "", max_in_flight: int = 512,
               run: Callable[..., SessionRun] = sessions_loop, **run_kw: Any) -> ReplayResult:
    """Send ``plan`` to ``endpoint`` and measure the cache effect (module docstring).

    Every request is a streamed completions request of its recorded ``prompt_tokens`` (the
    transcript layout of the module docstring, ``/tokenize``-counted or token ids) with
    ``max_tokens`` = its ``output_tokens`` and ``ignore_eos`` (so it generates exactly that),
    ``temperature`` 0. ``salt`` separates this replay's prompts (system prompts included) from
    another replay's on the same server. ``deadline_s``: the whole run, seconds (prompts built
    before the clock are not in it); each request also bounded by ``limits.request_timeout_s``
    and cut after ``limits.stream_idle_timeout_s`` of silence. ``max_in_flight``: open loop, the
    most requests outstanding. ``run`` / ``run_kw``: the session runner and extra arguments for
    it (``transport=``, ``clock=``, ``sleep=``: tests). ``/metrics`` is scraped right before and
    after the run for the ``vllm:prefix_cache_hits`` delta."""
    model = profile.model.served_name
    count = text_counter(client, model)
    content = ReplayContent(count, tag, salt)
    built: dict[int, _Built] = {}

    def spec(prompt: str | list[int], it: PlannedRequest) -> Any:
        return completion_request(endpoint, model=model, prompt=prompt, max_tokens=max(1, it.trace.output_tokens),
                                  tag=tag, temperature=0, ignore_eos=True)

    offsets = [it.offset_s or 0.0 for it in plan.items] if plan.mode == "open" else None
    sessions = session_plans(plan.items, plan.units(), content, spec, offsets, built)
    hits0, queries0 = _scrape(client)
    done = run(endpoint, sessions, mode=plan.mode, concurrency=max(1, plan.concurrency), max_in_flight=max_in_flight,
               deadline_s=deadline_s, request_timeout_s=profile.limits.request_timeout_s,
               idle_timeout_s=profile.limits.stream_idle_timeout_s, **run_kw)
    hits1, queries1 = _scrape(client)
    rows, turns, cache = _summarise(plan, done, built, "text" if count is not None else "token-ids",
                                    (hits0, hits1), (queries0, queries1))
    return ReplayResult(plan, done.result, turns, cache, rows)

