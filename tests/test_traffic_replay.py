"""The replay engine: plans (caps, speed-up, seeds, whole sessions), the session runner's
scheduling with a virtual clock (no sleeping), and replays against the in-process fake vLLM
(history growth, the shared system prompt, the per-turn cache effect, bounded runs).

Real-time checks against the fake assert lower bounds only ("not sent before its offset"), which
a loaded machine cannot break; everything tighter runs on the virtual clock.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kvgate.http.client import Endpoint, KvClient
from kvgate.load import RequestRecord, RequestSpec, SessionPlan, run_sessions
from kvgate.profile.models import TrafficSpec
from kvgate.traffic.replay import MIN_USER_WORDS, ReplayPlan, fit_text, plan_replay, run_replay
from kvgate.traffic.sample import TraceRequest, TrafficError, TrafficSample
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

PROFILE = SimpleNamespace(model=SimpleNamespace(served_name="fake-model"),
                          limits=SimpleNamespace(request_timeout_s=30.0, stream_idle_timeout_s=None))


def sample_of(rows: list[TraceRequest]) -> TrafficSample:
    return TrafficSample(tuple(rows), "test.jsonl", "0" * 64, "jsonl")


def chats(n_sessions: int = 3, turns: int = 3, gap_s: float = 1.0, stagger_s: float = 0.5, base: int = 40,
          step: int = 30, out: int = 8, prefix_tokens: int = 32, singles: int = 0) -> TrafficSample:
    """``n_sessions`` conversations (turn t: base + step*t prompt tokens, a shared 32-token system
    prompt) starting ``stagger_s`` apart, turns ``gap_s`` apart; plus ``singles`` lone requests."""
    rows = [TraceRequest(base + step * t, out, arrival_s=10.0 + s * stagger_s + t * gap_s, session=f"c{s}", turn=t,
                         prefix_id="sys", prefix_tokens=prefix_tokens)
            for s in range(n_sessions) for t in range(turns)]
    rows += [TraceRequest(base, out, arrival_s=10.0 + 0.25 + k * stagger_s, prefix_id="sys", prefix_tokens=prefix_tokens)
             for k in range(singles)]
    return sample_of(rows)


def spec(**kw: Any) -> TrafficSpec:
    return TrafficSpec(path="test.jsonl", **kw)


# ----------------------------------------------------------------------------- plans


def test_open_plan_offsets_are_recorded_arrivals_sped_up_in_send_order():
    plan = plan_replay(chats(gap_s=1.0, stagger_s=0.5), spec(replay="open", speedup=2.0), concurrency=4)
    assert plan.mode == "open" and len(plan.items) == 9 and plan.sessions == 3
    offs = [it.offset_s for it in plan.items]
    assert offs == sorted(offs) and offs[0] == 0.0
    by_key = {it.key: it.offset_s for it in plan.items}
    assert by_key["c0/1"] == pytest.approx(0.5) and by_key["c1/0"] == pytest.approx(0.25)
    assert by_key["c2/2"] == pytest.approx((1.0 + 2.0) / 2)
    assert plan.provenance()["sessions_drawn"] == 3 and plan.provenance()["speedup"] == 2.0


def test_caps_keep_or_drop_sessions_whole():
    sample = chats(n_sessions=4, turns=3, gap_s=1.0, stagger_s=0.5, singles=2)
    # max_duration_s 2.2 s: c0 (0..2 s) and c1 (0.5..2.5 s)? c1 ends at 2.5 > 2.2: dropped whole
    plan = plan_replay(sample, spec(replay="open", max_duration_s=2.2), concurrency=1)
    sessions = {it.session for it in plan.items if it.session}
    assert sessions == {"c0"}
    for sid in ("c1", "c2", "c3"):
        assert not [it for it in plan.items if it.session == sid]
    assert plan.left_out["sessions_over_duration"] == 3
    assert sum(1 for it in plan.items if it.session is None) == 2  # the singles at 0.25 s and 0.75 s
    # the request cap 6, by first arrival: c0 (3), r12 (1), c1 (3 more: 7 > 6, left out), r13 (1), c2, c3 out
    plan = plan_replay(sample, spec(replay="open"), concurrency=1, max_requests=6)
    assert len(plan.items) == 5
    assert [it.key for it in plan.items if it.session is None] == ["r12", "r13"]
    assert {it.session for it in plan.items if it.session} == {"c0"}
    assert plan.left_out["sessions_over_cap"] == 3
    for it in plan.items:  # never a later turn without its first
        if it.session:
            assert {i.turn for i in plan.items if i.session == it.session} == {0, 1, 2}


def test_closed_plan_is_seeded_and_draws_sessions_as_units():
    sample = chats(n_sessions=6, turns=3, singles=6)
    a = plan_replay(sample, spec(replay="closed", seed=7), concurrency=2, max_requests=15)
    b = plan_replay(sample, spec(replay="closed", seed=7), concurrency=2, max_requests=15)
    c = plan_replay(sample, spec(replay="closed", seed=8), concurrency=2, max_requests=15)
    assert [it.key for it in a.items] == [it.key for it in b.items]
    assert [it.key for it in a.items] != [it.key for it in c.items]
    assert a.mode == "closed" and all(it.offset_s is None for it in a.items) and len(a.items) <= 15
    for unit in a.units():  # a session's turns together, in order
        keys = [a.items[i] for i in unit]
        assert [k.turn for k in keys] == list(range(len(keys)))
        assert unit == list(range(unit[0], unit[0] + len(unit)))
    full = plan_replay(sample, spec(replay="closed", seed=1), concurrency=2)
    assert sorted(it.key for it in full.items) == sorted({it.key for it in full.items}) and len(full.items) == 24


def test_open_replay_of_a_sample_without_arrivals_is_a_clear_error():
    with pytest.raises(TrafficError, match="replay open needs arrival_s"):
        plan_replay(sample_of([TraceRequest(10, 2)]), spec(replay="open"), 1)


# ----------------------------------------------------------------------------- content


@pytest.mark.parametrize("count", [lambda t: len(t.split()) + 1, lambda t: len(t) // 3],
                         ids=["word-per-token", "three-chars-per-token"])
def test_fit_text_hits_the_target_exactly_or_returns_the_minimum(count):
    text, n = fit_text(count, "System[x]: ", 57, "\nAssistant:")
    assert n == count(text) == 57 and text.startswith("System[x]: ") and text.endswith("\nAssistant:")
    text, n = fit_text(count, "a long history " * 20, 10, "\nAssistant:")  # the history alone is longer
    assert n == count(text) > 10 and len(text.split("\nAssistant:")[0].split()) == 60 + MIN_USER_WORDS


# ----------------------------------------------------------------------------- the runner, virtual clock


class Clock:
    """Virtual time for several sleepers: a sleeper whose wake-up is the earliest pending one
    moves the clock there once the other tasks had their turns (a few loop passes)."""

    def __init__(self) -> None:
        self.t = 50.0
        self.wakes: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, d: float) -> None:
        target = self.t + max(0.0, d)
        self.wakes.append(target)
        try:
            spins = 0
            while target > self.t:
                await asyncio.sleep(0)
                spins = spins + 1 if target <= min(self.wakes) else 0
                if spins >= 5:
                    self.t = max(self.t, target)
        finally:
            self.wakes.remove(target)


class Transport:
    """Each request takes ``service_s`` of virtual time; its reply text is ``reply <index>``.
    ``block_s``: the clock jumps that far inside send, as if the client's loop were blocked."""

    name = "virtual"

    def __init__(self, clock: Clock, service_s: float = 0.0, fail: set[int] = frozenset(), block_s: float = 0.0):
        self.c, self.service_s, self.fail, self.block_s = clock, service_s, set(fail), block_s
        self.sent: list[tuple[int, float, str]] = []  # (index, sent at, prompt)

    def bind(self, clock: Any, t0: float, max_connections: int) -> None:
        self.t0 = t0

    def prepare(self, spec: RequestSpec) -> RequestSpec:
        return spec

    async def send(self, spec: RequestSpec, rec: RequestRecord, timeout_s: float) -> None:
        rec.sent_s = self.c() - self.t0
        self.sent.append((rec.index, rec.sent_s, spec.body["prompt"]))
        self.c.t += self.block_s  # blocked: no other task runs meanwhile
        await self.c.sleep(self.service_s)
        t = self.c() - self.t0
        rec.status = 500 if rec.index in self.fail else 200
        rec.content_type = "text/event-stream"
        rec.piece_s = [t, t]
        rec.pieces = [f'data: {{"choices":[{{"index":0,"text":" reply{rec.index}","finish_reason":"length"}}]}}\n\n'.encode(),
                      b"data: [DONE]\n\n"]
        rec.end_s = t

    async def aclose(self) -> None:
        pass


def req(prompt: str) -> RequestSpec:
    return RequestSpec("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 1, "stream": True})


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def conversation(offsets: tuple[float, ...], index0: int) -> SessionPlan:
    def follow(n: int, earlier: list[RequestRecord]) -> RequestSpec:
        return req(earlier[-1].body or "|".join(r.text for r in earlier))
    return SessionPlan(req(f"s{index0}"), len(offsets), offsets, follow, index0)


def run_virtual(sessions: list[SessionPlan], transport: Transport, clock: Clock, **kw: Any):
    return asyncio.run(run_sessions(None, sessions, transport=transport, clock=clock, sleep=clock.sleep,
                                    loop_monitor_s=None, freeze_gc=False, build=inline, **kw))


def test_open_loop_turns_wait_for_their_offset_and_the_previous_reply():
    clock = Clock()
    tr = Transport(clock, service_s=0.3)
    # session A: turns at 0, 1.0, 1.1 s (turn 2 due before turn 1's reply at 1.3 s); B at 0.5 s
    run = run_virtual([conversation((0.0, 1.0, 1.1), 0), conversation((0.5,), 10)], tr, clock, mode="open")
    sent = {i: t for i, t, _ in tr.sent}
    assert sent[0] == pytest.approx(0.0) and sent[10] == pytest.approx(0.5)
    assert sent[1] == pytest.approx(1.0)  # its offset: the reply of turn 0 came at 0.3 s
    assert sent[2] == pytest.approx(1.3)  # the reply of turn 1 came at 1.3 s, after its offset 1.1 s
    assert run.timing[2].due_s == pytest.approx(1.1) and run.timing[2].ready_s == pytest.approx(1.3)
    # that 0.2 s is the server's time, not the client's lag
    assert max(run.result.lags_s) == pytest.approx(0.0, abs=1e-9)
    assert run.result.invalid_verdict("replay") is None
    prompts = {i: p for i, _, p in tr.sent}
    assert prompts[1] == " reply0" and prompts[2] == " reply0| reply1"  # history grows turn by turn


def test_a_client_that_falls_behind_is_still_invalid():
    clock = Clock()
    tr = Transport(clock, block_s=0.05)  # every send blocks the loop 50 ms; arrivals 10 ms apart
    sessions = [conversation((0.01 * k,), k) for k in range(20)]
    run = run_virtual(sessions, tr, clock, mode="open")
    v = run.result.invalid_verdict("replay")
    assert v is not None and "fell behind" in v.message


def test_closed_loop_workers_run_whole_sessions_in_turn_order():
    clock = Clock()
    tr = Transport(clock, service_s=0.1)
    sessions = [conversation((0.0, 0.0, 0.0), 10 * k) for k in range(4)]
    run = run_virtual(sessions, tr, clock, mode="closed", concurrency=2)
    order = [i for i, _, _ in tr.sent]
    for k in range(4):
        mine = [i for i in order if i // 10 == k]
        assert mine == [10 * k, 10 * k + 1, 10 * k + 2]
    assert len(run.result.records) == 12 and run.result.concurrency == 2
    assert order[:2] == [0, 10]  # two workers, two sessions at once


def test_a_failed_turn_ends_its_session_and_the_deadline_bounds_the_run():
    clock = Clock()
    tr = Transport(clock, service_s=0.1, fail={1})
    run = run_virtual([conversation((0.0, 0.2, 0.4), 0), conversation((0.1, 0.3), 10)], tr, clock, mode="open")
    assert [i for i, _, _ in tr.sent].count(2) == 0 and "turn 1 failed" in run.not_sent[2]
    assert 11 in {i for i, _, _ in tr.sent}
    clock = Clock()
    tr = Transport(clock, service_s=0.5)
    run = run_virtual([conversation((0.0, 0.0, 0.0, 0.0), 0)], tr, clock, mode="closed", deadline_s=1.2)
    assert len(tr.sent) == 3 and run.not_sent == {3: "not sent: the run's deadline passed"}
    assert run.result.deadline_hit and run.result.n_requested == 4


# ----------------------------------------------------------------------------- against the fake vLLM


def replay(fake: FakeVLLM, sample: TrafficSample, traffic: TrafficSpec, concurrency: int = 2, **kw: Any):
    ep = Endpoint(fake.base_url)
    with KvClient(ep) as client:
        plan = plan_replay(sample, traffic, concurrency)
        return plan, run_replay(client, ep, PROFILE, plan, **kw)


def prompts_of(fake: FakeVLLM) -> list[str]:
    return [r.prompt for r in fake.state.requests if r.prompt is not None]


@pytest.fixture
def fake():
    with FakeVLLM(FakeConfig(max_model_len=1024, num_gpu_blocks=1024, prompt_tokens_details=True)) as f:
        yield f


def test_sessions_replay_with_growing_history_and_a_shared_system_prompt(fake):
    plan, res = replay(fake, chats(n_sessions=3, turns=3, gap_s=0.05, stagger_s=0.02, singles=2),
                       spec(replay="open", speedup=1.0), deadline_s=20.0)
    assert res.result.records and all(r.ok for r in res.result.records)
    got = {r.prompt: r for r in fake.state.requests}
    prompts = prompts_of(fake)
    assert len(prompts) == 11
    system = prompts[0].split("\n", 1)[0]
    assert system.startswith("System[sys]: ")
    assert all(p.split("\n", 1)[0] == system for p in prompts)  # one system prompt, every request
    assert len(system.split()) + 1 == 32  # the fake counts words + BOS: exactly prefix_tokens
    by_key = {row["key"]: row for row in res.rows()}
    sent = {rec.index: rec for rec in res.result.records}
    for s in range(3):
        p = [next(q for q in prompts if f"User[replay c{s}/0]" in q.split("\nAssistant:", 1)[0])]
        for t in (1, 2):
            i = next(k for k, it in enumerate(plan.items) if it.key == f"c{s}/{t}")
            prev = next(k for k, it in enumerate(plan.items) if it.key == f"c{s}/{t - 1}")
            cur = [q for q in prompts if q.startswith(p[-1] + sent[prev].text + "\nUser: ")
                   and got[q].prompt_tokens == plan.items[i].trace.prompt_tokens]
            assert len(cur) == 1, f"c{s}/{t}: the prompt does not continue turn {t - 1}'s prompt and reply"
            assert sent[prev].text.strip() and sent[prev].text in cur[0]
            assert got[cur[0]].prompt_tokens == plan.items[i].trace.prompt_tokens
            p.append(cur[0])
    # different sessions share nothing after the system prompt
    heads = {q.split("\n", 2)[1][:20] for q in prompts}
    assert len(heads) == 3 + 2
    assert all(by_key[k]["prompt_tokens_actual"] == by_key[k]["prompt_tokens_planned"] for k in by_key)
    # every later turn not before its own recorded arrival (sped up), counted from the run's start
    for rec in res.result.records:
        it = plan.items[rec.index]
        assert rec.sent_s >= it.offset_s - 1e-6, f"{it.key} sent at {rec.sent_s:.4f} s, due {it.offset_s:.4f} s"
        if it.turn:
            assert res.rows()[rec.index]["wait_ms"] is not None
            prev = next(r for r in res.result.records if plan.items[r.index].key == f"{it.session}/{it.turn - 1}")
            assert rec.sent_s >= prev.end_s, f"{it.key} sent before turn {it.turn - 1}'s reply was complete"


def test_later_turns_hit_the_prefix_cache_and_the_result_says_so(fake):
    _, res = replay(fake, chats(), spec(replay="closed", seed=3), deadline_s=20.0)
    turns = {t["turn"]: t for t in res.turns}
    assert set(turns) == {0, 1, 2}
    assert turns[1]["cached_tokens_mean"] > 0 and turns[2]["cached_share"] == 1.0
    assert turns[2]["cached_tokens_mean"] > turns[1]["cached_tokens_mean"]  # history grows, so does the hit
    c = res.cache
    assert c["cached_tokens_reported"] and c["later_turns_cached_share"] == 1.0
    assert c["prefix_cache_hits_delta"] > 0 and 0 < c["prefix_cache_hit_rate"] < 1
    assert c["ttft_p50_ms_first"] is not None and c["ttft_p50_ms_later"] is not None and c["deviating"] == 0
    assert "cached tokens mean" in res.describe_cache() and "prefix_cache_hits +" in res.describe_cache()
    lines = res.turns_csv().splitlines()
    assert lines[0].startswith("turn,requests,sent,ok,cached_tokens_mean") and len(lines) == 4
    assert res.rows_csv().splitlines()[0].startswith("key,session,turn")


def test_a_cache_that_never_hits_shows_zero_and_an_unreported_one_none():
    with FakeVLLM(FakeConfig(max_model_len=1024, num_gpu_blocks=1024, prompt_tokens_details=True,
                             faults={"prefix_cache_never_hits"})) as f:
        _, res = replay(f, chats(), spec(replay="closed"), deadline_s=20.0)
    assert all(t["cached_tokens_mean"] == 0 and t["cached_share"] == 0 for t in res.turns)
    assert res.cache["prefix_cache_hits_delta"] == 0 and res.cache["later_turns_cached_share"] == 0
    with FakeVLLM(FakeConfig(max_model_len=1024, num_gpu_blocks=1024)) as f:  # vLLM's default: no details
        _, res = replay(f, chats(), spec(replay="closed"), deadline_s=20.0)
    assert all(t["cached_tokens_mean"] is None for t in res.turns) and not res.cache["cached_tokens_reported"]
    assert res.cache["prefix_cache_hits_delta"] > 0
    assert "not reported by the server" in res.describe_cache()


def test_a_history_longer_than_the_recorded_prompt_is_a_recorded_deviation(fake):
    # turn 1 recorded at 45 tokens, but turn 0 (40) + its 8-token reply + labels already exceed it
    _, res = replay(fake, chats(n_sessions=1, turns=2, base=40, step=5), spec(replay="closed"), deadline_s=20.0)
    row = next(r for r in res.rows() if r["turn"] == 1)
    assert row["prompt_tokens_planned"] == 45 and row["prompt_tokens_actual"] > 45
    assert row["prompt_tokens_built"] == row["prompt_tokens_actual"]
    assert res.cache["deviating"] == 1 and res.turns[1]["deviating"] == 1


def test_without_a_tokenizer_prompts_are_token_ids_sharing_the_system_prefix():
    with FakeVLLM(FakeConfig(max_model_len=1024, num_gpu_blocks=1024, prompt_tokens_details=True,
                             faults={"no_tokenize"})) as f:
        _, res = replay(f, chats(), spec(replay="closed"), deadline_s=20.0)
        assert not prompts_of(f)  # token ids only
    assert res.cache["content"] == "token-ids"
    assert all(r["prompt_tokens_actual"] == r["prompt_tokens_planned"] for r in res.rows())
    assert res.turns[0]["cached_share"] > 0 and res.turns[2]["cached_tokens_mean"] >= 64


def test_a_replay_is_bounded_by_its_deadline():
    with FakeVLLM(FakeConfig(max_model_len=1024, num_gpu_blocks=1024, itl_s=0.05)) as f:
        _, res = replay(f, chats(n_sessions=2, turns=3, out=8), spec(replay="closed"), concurrency=1,
                        deadline_s=0.5)
    assert res.result.wall_s < 1.5 and res.result.deadline_hit
    assert res.cache["not_sent"] >= 1
    assert any(r["error"] and "deadline" in r["error"] for r in res.rows() if not r["sent"])


def test_single_turn_samples_have_no_turn_table():
    rows = [TraceRequest(30 + k, 4, arrival_s=k * 0.01) for k in range(5)]
    with FakeVLLM(FakeConfig(max_model_len=1024)) as f:
        plan, res = replay(f, sample_of(rows), spec(replay="open"), deadline_s=10.0)
    assert isinstance(plan, ReplayPlan) and res.turns == [] and len(res.result.records) == 5
    assert all(r.ok for r in res.result.records)
    assert [r["prompt_tokens_actual"] for r in res.rows()] == [30, 31, 32, 33, 34]


def test_a_sample_that_carries_text_sends_its_own_words_padded_to_the_recorded_length(fake):
    rows = [
        TraceRequest(30, 4, messages=({"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "hello there friend"})),
        TraceRequest(20, 6, session="t", turn=0, messages=({"role": "user", "content": "what is a kv block"},)),
        TraceRequest(60, 6, session="t", turn=1, messages=(
            {"role": "user", "content": "what is a kv block"}, {"role": "assistant", "content": "recorded words"},
            {"role": "user", "content": [{"type": "text", "text": "and prefix caching?"}]})),
    ]
    plan, res = replay(fake, sample_of(rows), spec(replay="closed"), concurrency=1, deadline_s=20.0)
    prompts = prompts_of(fake)
    single = next(p for p in prompts if "hello there friend" in p)
    assert single.startswith("System: You are terse.\nUser[replay r0]: hello there friend ")
    later = next(p for p in prompts if "and prefix caching?" in p)
    first = next(p for p in prompts if p != later and "what is a kv block" in p)
    assert first.startswith("User[replay t/0]: what is a kv block ")
    reply = next(r.text for r in res.result.records if plan.items[r.index].key == "t/0")
    assert later.startswith(first + reply + "\nUser: and prefix caching? ")
    assert "recorded words" not in later  # the history holds the server's own reply
    assert [r["prompt_tokens_actual"] for r in res.rows()] == [r["prompt_tokens_planned"] for r in res.rows()]


def test_a_tokenize_refusal_names_the_prompt_being_built():
    from kvgate.http.prompts import PreparationRefused

    def refuse(text: str) -> int:
        raise PreparationRefused("/tokenize", 413, 6144, "HTML: 413 Request Entity Too Large")

    with pytest.raises(PreparationRefused, match="while building the 300-token completions prompt"):
        fit_text(refuse, "User: ", 300)
