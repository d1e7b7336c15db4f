"""The fake vLLM behaves like vLLM 0.32 when healthy, and each fault does what FAULTS says."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gates.features import BATTERY, DEFAULT_FUNCTIONS

from .fake_vllm import (CONTENT_TEXT, FAULTS, REASONING_TEXT, FakeConfig, FakeVLLM, _buffered, minimal_instance,
                        running_fake)

L = 256
MODEL = "fake-model"
ROOT = Path(__file__).resolve().parents[2]


# ---- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with FakeVLLM() as fake:
        yield fake


@pytest.fixture
def fake(server):
    """The module's fake with a fresh config and state for each test."""
    server.config = FakeConfig()
    server.reset()
    yield server
    server.config = FakeConfig()


@pytest.fixture
def client(fake):
    with new_client(base_url=fake.base_url, timeout=5) as c:
        yield c


def new_client(base_url: str = "", timeout: float = 5.0) -> httpx.Client:
    # plain http: verify=False skips loading the CA bundle (~40 ms per client)
    return httpx.Client(base_url=base_url, timeout=timeout, verify=False)


def get(url: str, **kw) -> httpx.Response:
    with new_client() as c:
        return c.get(url, **kw)


def post(url: str, **kw) -> httpx.Response:
    with new_client() as c:
        return c.post(url, **kw)


def words(n: int) -> str:
    return " ".join(f"w{i % 7}" for i in range(n))


def cmpl(prompt_tokens: int, **kw) -> dict:
    """A completions body whose prompt is exactly ``prompt_tokens`` tokens (BOS included)."""
    return {"model": MODEL, "prompt": words(prompt_tokens - 1), "temperature": 0, **kw}


def chat(prompt_tokens: int, **kw) -> dict:
    """A chat body whose rendered prompt is exactly ``prompt_tokens`` tokens (BOS, role, gen prompt)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": words(prompt_tokens - 3)}], "temperature": 0, **kw}


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
BODIES = {"completions": cmpl, "chat": chat}


def stream(client: httpx.Client, path: str, body: dict) -> tuple[list[dict], bool, list[float]]:
    """POST a streaming request; returns (JSON chunks, whether [DONE] came last, arrival times)."""
    chunks, times, done = [], [], False
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            times.append(time.monotonic())
            assert not done, "data after [DONE]"
            if line == "data: [DONE]":
                done = True
            else:
                chunks.append(json.loads(line[6:]))
    return chunks, done, times


def text_of(chunks: list[dict]) -> str:
    out = []
    for c in chunks:
        for ch in c["choices"]:
            out.append(ch["delta"].get("content") or "" if "delta" in ch else ch["text"])
    return "".join(out)


def finishes(chunks: list[dict]) -> list[str]:
    return [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]


def usage_of(chunks: list[dict]) -> dict | None:
    us = [c["usage"] for c in chunks if c.get("usage") and not c["choices"]]
    assert len(us) <= 1
    return us[0] if us else None


def non_stream_text(body: dict) -> str:
    ch = body["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"]


def metrics(client: httpx.Client) -> dict[str, list]:
    r = client.get("/metrics")
    assert r.status_code == 200
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def gauge(client: httpx.Client, name: str) -> float:
    return metrics(client)[name][0].value


def wait_for(pred, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


# ---- the healthy fake behaves like vLLM ----------------------------------------------------------


def test_health_ping_version_models(client):
    r = client.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert client.get("/ping").status_code == 200
    assert client.get("/version").json() == {"version": "0.32.0+fake"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == L and card["root"] and isinstance(card["created"], int)
    assert client.post("/tokenize", json={"prompt": "a"}).json()["max_model_len"] == L


@pytest.mark.parametrize("prompt", ["", "hello", "hello world  again\nand\tmore", words(100)])
def test_tokenize_count_equals_completion_usage(client, prompt):
    tok = client.post("/tokenize", json={"model": MODEL, "prompt": prompt, "return_token_strs": True}).json()
    assert tok["count"] == len(prompt.split()) + 1 == len(tok["tokens"])
    assert tok["token_strs"][0] == "<s>"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == tok["count"]


def test_tokenize_count_equals_chat_usage(client):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}, {"type": "text", "text": "friend"}]},
    ]
    tok = client.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert tok["count"] == 1 + (1 + 2) + (1 + 3) + 1  # BOS, role+words per message, <|assistant|>
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens"] == tok["count"]
    no_gen = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert no_gen["count"] == tok["count"] - 1


def test_detokenize_round_trip(client):
    tok = client.post("/tokenize", json={"prompt": "alpha tok7 beta", "add_special_tokens": False}).json()
    assert client.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": "alpha tok7 beta"}


@pytest.mark.parametrize("kind", ["completions", "chat"])
@pytest.mark.parametrize("stream_", [False, True])
def test_over_length_is_400(client, fake, kind, stream_):
    t0 = time.monotonic()
    for n in (L + 1, L + 40, L):
        r = client.post(PATHS[kind], json=BODIES[kind](n, max_tokens=4, stream=stream_))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and "maximum" in err["message"]
        if n > L:
            assert err["param"] == "input_tokens"
            assert f"(parameter=input_tokens, value={L + 1})" in err["message"]  # vLLM truncates at L+1
    assert time.monotonic() - t0 < 1
    assert fake.state.running == 0 and fake.state.prompt_tokens_total == 0
    assert client.post(PATHS[kind], json=BODIES[kind](10, max_tokens=2)).status_code == 200


def test_over_length_token_ids_reports_exact_count(client):
    r = client.post("/v1/completions", json={"prompt": list(range(L + 10)), "max_tokens": 1})
    assert r.status_code == 400
    assert f"value={L + 10})" in r.json()["error"]["message"]


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_prompt_plus_max_tokens_over_length_is_clamped(client, kind):
    r = client.post(PATHS[kind], json=BODIES[kind](L - 5, max_tokens=50, ignore_eos=True))
    assert r.status_code == 200
    body = r.json()
    assert body["usage"] == {"prompt_tokens": L - 5, "completion_tokens": 5, "total_tokens": L,
                             "prompt_tokens_details": None}
    assert body["choices"][0]["finish_reason"] == "length"


def test_max_tokens_above_max_model_len_is_400(client):
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=L + 1))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=0)).status_code == 400


def test_default_max_tokens_and_natural_eos(client, fake):
    r = client.post("/v1/completions", json=cmpl(5)).json()  # completions default: 16
    assert r["usage"]["completion_tokens"] == 16 and r["choices"][0]["finish_reason"] == "length"
    r = client.post("/v1/chat/completions", json=chat(6, ignore_eos=True)).json()  # chat default: L - N
    assert r["usage"]["completion_tokens"] == L - 6 and r["choices"][0]["finish_reason"] == "length"
    # without ignore_eos the model stops after eos_after words; the EOS counts as a token, adds no text
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=100)).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == fake.config.eos_after + 1
    assert len(r["choices"][0]["text"].split()) == fake.config.eos_after
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=100, min_tokens=60)).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 61


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_stream_matches_non_stream(client, kind):
    body = BODIES[kind](20, max_tokens=12, ignore_eos=True, seed=7)
    full = client.post(PATHS[kind], json=body).json()
    chunks, done, _ = stream(client, PATHS[kind], {**body, "stream_options": {"include_usage": True}})
    assert done
    assert text_of(chunks) == non_stream_text(full)
    assert len(text_of(chunks).split()) == 12
    assert finishes(chunks) == ["length"] == [full["choices"][0]["finish_reason"]]
    assert usage_of(chunks) == full["usage"]
    assert full["usage"]["completion_tokens"] == 12
    if kind == "chat":
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[0]["object"] == "chat.completion.chunk"
    # without include_usage there is no usage chunk (vLLM >= 0.33 / 0.32 default)
    chunks, done, _ = stream(client, PATHS[kind], body)
    assert done and usage_of(chunks) is None


def test_stream_with_eos_counts_eos_token(client):
    body = cmpl(5, max_tokens=100, stream_options={"include_usage": True})
    chunks, done, _ = stream(client, "/v1/completions", body)
    assert done and finishes(chunks) == ["stop"]
    token_chunks = [c for c in chunks if c["choices"]]
    assert len(token_chunks) == usage_of(chunks)["completion_tokens"] == 49
    assert token_chunks[-1]["choices"][0]["text"] == ""


def test_near_tie_flip_and_changed_model(client, fake):
    """Temperature 0: token near_tie_at (2) is a near tie (its runner-up 0.01 nats below);
    "flip_near_ties" takes the runner-up there and goes on otherwise; "changed_model" answers other
    tokens from the first, none of them among the healthy answer's alternatives."""
    body = cmpl(5, max_tokens=6, logprobs=5, ignore_eos=True, temperature=0)

    def ask():
        lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
        return lp["tokens"], lp["top_logprobs"]

    healthy, top = ask()
    runner = [t for t in top[2] if t != healthy[2]]
    gaps = sorted(top[2][healthy[2]] - top[2][t] for t in runner)
    assert round(gaps[0], 4) == 0.01 and gaps[1] >= 1  # one near tie, the rest a nat or more below
    fake.config.faults.add("flip_near_ties")
    flipped, ftop = ask()
    assert flipped[:2] == healthy[:2] and flipped[2] in top[2] and flipped[2] != healthy[2]
    assert flipped[3:] != healthy[3:] and round(ftop[2][flipped[2]] - ftop[2][healthy[2]], 4) == 0.01
    fake.config.faults = {"changed_model"}
    changed, ctop = ask()
    assert all(t not in alts for t, alts in zip(changed, top)) and all(h not in alts for h, alts in zip(healthy, ctop))


def test_logprobs(client):
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=6, logprobs=2, ignore_eos=True)).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 6
    assert all(len(t) == 2 for t in lp["top_logprobs"])
    chunks, _, _ = stream(client, "/v1/completions", cmpl(5, max_tokens=6, logprobs=0, ignore_eos=True))
    assert [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]] == lp["tokens"]
    r = client.post("/v1/chat/completions", json=chat(5, max_tokens=4, logprobs=True, ignore_eos=True)).json()
    assert len(r["choices"][0]["logprobs"]["content"]) == 4
    chunks, _, _ = stream(client, "/v1/chat/completions", chat(5, max_tokens=4, logprobs=True, ignore_eos=True))
    assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in chunks[1:]) == 4
    assert client.post("/v1/completions", json=cmpl(5, logprobs=21)).status_code == 400


def test_sampling_is_seeded_and_greedy_is_reproducible(client):
    def gen(**kw):
        return client.post("/v1/completions", json=cmpl(8, max_tokens=10, ignore_eos=True, **kw)).json()["choices"][0]["text"]

    assert gen(temperature=0) == gen(temperature=0)
    assert gen(temperature=1.0, seed=3) == gen(temperature=1.0, seed=3)
    assert len({gen(temperature=1.0) for _ in range(4)}) > 1


def test_unknown_model_404_and_bad_requests(client):
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                 "param": "model", "code": 404}
    assert client.post("/v1/chat/completions", json={"messages": "x"}).status_code == 400
    assert client.post("/v1/completions", content=b"{not json").status_code == 400
    assert client.post("/v1/completions", json=cmpl(5, stream_options={"include_usage": True})).status_code == 400
    assert client.post("/v1/completions", json=cmpl(5, n=2)).status_code == 400


def test_server_side_cap_clamps(client, fake):
    fake.config.max_tokens_cap = 8
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=20, ignore_eos=True)).json()
    assert r["usage"]["completion_tokens"] == 8 and r["choices"][0]["finish_reason"] == "length"


def test_api_key_protects_v1_only(client, fake):
    fake.config.api_key = "sekret"
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models").json() == {"error": "Unauthorized"}
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200


def test_metrics_shape_and_counters(client, fake):
    client.post("/v1/completions", json=cmpl(10, max_tokens=4, ignore_eos=True))
    client.post("/v1/completions", json=cmpl(10, max_tokens=100))
    m = metrics(client)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        (s,) = m[name]
        assert s.labels == {"model_name": MODEL, "engine": "0"} and s.value == 0
    (info,) = m["vllm:cache_config_info"]
    assert info.value == 1
    assert {k: info.labels[k] for k in ("block_size", "gpu_memory_utilization", "cache_dtype", "num_gpu_blocks",
                                        "enable_prefix_caching", "kv_cache_size_tokens")} == {
        "block_size": "16", "gpu_memory_utilization": "0.9", "cache_dtype": "auto", "num_gpu_blocks": "64",
        "enable_prefix_caching": "True", "kv_cache_size_tokens": "1024"}
    assert m["vllm:prompt_tokens_total"][0].value == 20
    assert m["vllm:generation_tokens_total"][0].value == 4 + 49
    success = {s.labels["finished_reason"]: s.value for s in m["vllm:request_success_total"]}
    assert success["length"] == 1 and success["stop"] == 1 and success["abort"] == 0
    count = [s for s in m["vllm:time_to_first_token_seconds_count"]]
    assert count[0].value == 2
    assert m["vllm:num_preemptions_total"][0].value == 0
    assert "process_resident_memory_bytes" in m


def test_running_gauge_and_kv_usage_while_streaming(client, fake):
    fake.config.itl_s = 0.01
    with client.stream("POST", "/v1/completions", json=cmpl(100, max_tokens=20, ignore_eos=True, stream=True)) as r:
        it = r.iter_lines()
        next(it)
        assert gauge(client, "vllm:num_requests_running") == 1
        assert gauge(client, "vllm:kv_cache_usage_perc") == pytest.approx(7 / 64)  # ceil(101/16) blocks
        for _ in it:
            pass
    assert wait_for(lambda: fake.state.running == 0)


def test_kv_pressure_counts_preemptions(client, fake):
    fake.config.num_gpu_blocks = 8  # 128 tokens
    client.post("/v1/completions", json=cmpl(120, max_tokens=20, ignore_eos=True))
    assert gauge(client, "vllm:num_preemptions_total") == 1


def test_max_num_seqs_queues_requests(client, fake):
    fake.config.max_num_seqs = 1
    fake.config.itl_s = 0.02
    second = {}
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=200, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()  # keep a reference: a discarded iterator closes the stream
        next(lines)
        t = threading.Thread(target=lambda: second.update(
            r=post(fake.base_url + "/v1/completions", json=cmpl(5, max_tokens=2), timeout=5)))
        t.start()
        assert wait_for(lambda: fake.state.waiting == 1)
        assert gauge(client, "vllm:num_requests_waiting") == 1 and fake.state.running == 1
    # the first client hangs up: its slot goes to the queued request
    t.join(5)
    assert second["r"].status_code == 200
    assert fake.state.waiting == 0 and fake.state.running == 0


def _order_served(fake, policy):
    """One slot held by a stream; then a low-priority (10) and a high-priority (0) request queue,
    the low one first. Returns the order the two were admitted in."""
    fake.config.max_num_seqs, fake.config.itl_s, fake.config.scheduling_policy = 1, 0.02, policy
    done: list[int] = []

    def send(prio):
        post(fake.base_url + "/v1/completions", json=cmpl(5, max_tokens=2, priority=prio), timeout=5)
        done.append(prio)

    client = new_client(base_url=fake.base_url)
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=200, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()
        next(lines)
        low = threading.Thread(target=send, args=(10,))
        low.start()
        assert wait_for(lambda: fake.state.waiting == 1)
        high = threading.Thread(target=send, args=(0,))
        high.start()
        assert wait_for(lambda: fake.state.waiting == 2)
    low.join(5), high.join(5)
    client.close()
    return done


def test_priority_policy_admits_by_priority_and_fcfs_by_arrival(fake):
    assert _order_served(fake, "priority") == [0, 10]  # the high-priority request jumped the queue
    fake.reset()
    assert _order_served(fake, "fcfs") == [10, 0]  # FCFS: the "priority" field is accepted and ignored
    r = post(fake.base_url + "/v1/completions", json=cmpl(5, max_tokens=2, priority="high"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


@pytest.mark.parametrize("fault, after", [("frozen_queue_gauge", 0), ("stuck_queue_gauge", 1)])
def test_fault_queue_gauges(client, fake, fault, after):
    fake.config.max_num_seqs, fake.config.itl_s = 1, 0.02
    fake.config.faults.add(fault)
    second = {}
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=200, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()
        next(lines)
        t = threading.Thread(target=lambda: second.update(
            r=post(fake.base_url + "/v1/completions", json=cmpl(5, max_tokens=2), timeout=5)))
        t.start()
        assert wait_for(lambda: fake.state.waiting == 1)
        assert gauge(client, "vllm:num_requests_waiting") == (0 if fault == "frozen_queue_gauge" else 1)
    t.join(5)
    assert fake.state.waiting == 0 and gauge(client, "vllm:num_requests_waiting") == after


def test_stream_disconnect_frees_the_slot(client, fake):
    fake.config.itl_s = 0.02
    with client.stream("POST", "/v1/chat/completions", json=chat(20, max_tokens=200, ignore_eos=True, stream=True)) as r:
        it = r.iter_lines()
        next(it), next(it)
        assert fake.state.running == 1
    assert wait_for(lambda: fake.state.running == 0, 1.0)
    assert gauge(client, "vllm:num_requests_running") == 0
    rec = fake.state.requests[-1]
    assert rec.disconnected and rec.finish_reason == "abort" and rec.completion_tokens < 200


def test_non_stream_disconnect_frees_the_slot(fake):
    fake.config.itl_s = 0.02
    with pytest.raises(httpx.ReadTimeout):
        post(fake.base_url + "/v1/completions", json=cmpl(20, max_tokens=200, ignore_eos=True), timeout=0.15)
    assert wait_for(lambda: fake.state.running == 0, 1.0)
    assert fake.state.requests[-1].disconnected


def test_injected_sleep_and_ttft_itl(fake):
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)
        await asyncio.sleep(0)

    fake.sleep, real = fake_sleep, fake.sleep
    try:
        fake.config.ttft_s, fake.config.itl_s, fake.config.prefill_s_per_token = 30.0, 5.0, 0.5
        t0 = time.monotonic()
        r = post(fake.base_url + "/v1/completions", json=cmpl(10, max_tokens=3, ignore_eos=True))
        assert r.status_code == 200 and time.monotonic() - t0 < 1
        assert slept == [5.0, 30.0, 5.0, 5.0]  # prefill 10 x 0.5, ttft, 2 x itl
    finally:
        fake.sleep = real


def test_real_delays_show_in_ttft(client, fake):
    fake.config.ttft_s = 0.1
    t0 = time.monotonic()
    chunks, _, times = stream(client, "/v1/completions", cmpl(5, max_tokens=2))
    assert times[0] - t0 >= 0.095  # uvloop timers may wake ~1 ms early
    rec = fake.state.requests[-1]
    assert rec.t_first_token - rec.t_received >= 0.095 and rec.t_first_byte >= rec.t_first_token


def test_fault_names_are_validated():
    cfg = FakeConfig(faults={"missing_done"})
    with pytest.raises(ValueError, match="unknown fault"):
        cfg.faults.add("mising_done")
    with pytest.raises(ValueError, match="unknown fault"):
        FakeConfig(faults={"nope"})
    cfg.faults = ["over_length_500"]
    assert cfg.faults == {"over_length_500"}
    assert all(isinstance(v, str) and v for v in FAULTS.values())


def test_control_endpoints(client, fake):
    r = client.post("/_fake/config", json={"faults": ["missing_done"], "itl_s": 0})
    assert r.status_code == 200 and r.json()["faults"] == ["missing_done"]
    assert fake.config.faults == {"missing_done"}
    assert client.post("/_fake/config", json={"faults": ["bogus"]}).status_code == 400
    client.post("/v1/completions", json=cmpl(5, max_tokens=2))
    state = client.get("/_fake/state").json()
    assert state["running"] == 0 and state["requests"][-1]["completion_tokens"] == 2
    assert client.post("/_fake/reset").status_code == 200 and fake.state.requests == []


def test_running_fake_context_manager():
    cfg = FakeConfig(max_model_len=64)
    with running_fake(cfg) as base_url:
        assert base_url.startswith("http://127.0.0.1:") and not base_url.endswith("/v1")
        assert get(base_url + "/v1/models").json()["data"][0]["max_model_len"] == 64
        cfg.faults.add("wrong_max_model_len")  # switchable while running
        assert get(base_url + "/v1/models").json()["data"][0]["max_model_len"] == 128
    with pytest.raises(httpx.ConnectError):
        get(base_url + "/health")


def test_cli_prints_url_and_serves():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.fake_vllm", "--port", "0", "--fault", "missing_done",
                             "--set", "max_model_len=128"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert wait_for(lambda: _get_ok(url + "/health"), 10)
        cfg = get(url + "/_fake/config").json()
        assert cfg["faults"] == ["missing_done"] and cfg["max_model_len"] == 128
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def _get_ok(url: str) -> bool:
    try:
        return get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---- issue 2 faults ------------------------------------------------------------------------------


def test_fault_wrong_max_model_len(client, fake):
    fake.config.faults.add("wrong_max_model_len")
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 2 * L
    assert client.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"] == 2 * L
    assert client.post("/v1/completions", json=cmpl(L + 1, max_tokens=1)).status_code == 400  # still enforces L
    fake.config.advertised_max_model_len = 1000
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 1000


@pytest.mark.parametrize("stream_", [False, True])
def test_fault_over_length_500(client, fake, stream_):
    fake.config.faults.add("over_length_500")
    r = client.post("/v1/completions", json=cmpl(L + 1, max_tokens=4, stream=stream_))
    assert r.status_code == 500
    assert client.post("/v1/completions", json=cmpl(10, max_tokens=2)).status_code == 200


def test_fault_over_length_truncate(client, fake):
    fake.config.faults.add("over_length_truncate")
    r = client.post("/v1/completions", json=cmpl(L + 50, max_tokens=10, ignore_eos=True))
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == L - 10 and r.json()["usage"]["completion_tokens"] == 10
    r = client.post("/v1/chat/completions", json=chat(L + 1, stream=True))
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


def test_fault_ignore_max_tokens(client, fake):
    fake.config.faults.add("ignore_max_tokens")
    r = client.post("/v1/completions", json=cmpl(10, max_tokens=5, ignore_eos=True)).json()
    assert r["usage"]["completion_tokens"] == 13 and len(r["choices"][0]["text"].split()) == 13
    chunks, _, _ = stream(client, "/v1/chat/completions", chat(10, max_tokens=5, ignore_eos=True))
    assert len(text_of(chunks).split()) == 13


def test_fault_finish_stop_at_cap(client, fake):
    fake.config.faults.add("finish_stop_at_cap")
    r = client.post("/v1/completions", json=cmpl(10, max_tokens=5, ignore_eos=True)).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "stop"
    chunks, _, _ = stream(client, "/v1/chat/completions", chat(10, max_tokens=5, ignore_eos=True))
    assert finishes(chunks) == ["stop"]


def test_fault_stream_usage_mismatch(client, fake):
    fake.config.faults.add("stream_usage_mismatch")
    body = cmpl(10, max_tokens=5, ignore_eos=True)
    full = client.post("/v1/completions", json=body).json()
    assert full["usage"]["completion_tokens"] == 5
    chunks, _, _ = stream(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert len(text_of(chunks).split()) == 5
    assert usage_of(chunks)["completion_tokens"] == 6


def test_fault_dead_after_over_length_500(client, fake):
    fake.config.faults.add("dead_after_over_length")
    assert client.post("/v1/completions", json=cmpl(10, max_tokens=2)).status_code == 200
    assert client.post("/v1/completions", json=cmpl(L + 1)).status_code == 400
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json=cmpl(10, max_tokens=2)).status_code == 500
    assert client.post("/v1/chat/completions", json=chat(10, max_tokens=2, stream=True)).status_code == 500
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_fault_dead_after_over_length_hang(client, fake):
    fake.config.faults.add("dead_after_over_length")
    fake.config.dead_mode = "hang"
    client.post("/v1/completions", json=cmpl(L + 1))
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/completions", json=cmpl(10, max_tokens=2), timeout=0.2)
    assert client.get("/health", timeout=1).status_code == 200


def test_fault_ignore_cap(client, fake):
    fake.config.max_tokens_cap = 8
    fake.config.faults.add("ignore_cap")
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=20, ignore_eos=True)).json()
    assert r["usage"]["completion_tokens"] == 20


# ---- issue 4 faults ------------------------------------------------------------------------------


def test_fault_stall_mid_stream(client, fake):
    fake.config.faults.add("stall_mid_stream")
    fake.config.stall_s = 0.3
    health_times = []
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=10, ignore_eos=True, stream=True)) as r:
        times = []
        for line in r.iter_lines():
            if line:
                times.append(time.monotonic())
                if len(times) == 3:  # during the stall /health answers at once
                    t = time.monotonic()
                    assert get(fake.base_url + "/health").status_code == 200
                    health_times.append(time.monotonic() - t)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) >= 0.25 and sorted(gaps)[-2] < 0.1
    assert health_times[0] < 0.1


def test_fault_slow_health_while_busy(client, fake):
    fake.config.faults.add("slow_health_while_busy")
    fake.config.slow_health_s = 0.6  # margins for a loaded machine: an idle /health took 0.1+ s there
    fake.config.itl_s = 0.05  # the generation (40 x 50 ms) is still in flight when /health is asked
    t = time.monotonic()
    assert get(fake.base_url + "/health").status_code == 200
    idle = time.monotonic() - t
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=40, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()
        next(line for line in lines if line)  # a generation is in flight
        t = time.monotonic()
        assert get(fake.base_url + "/health").status_code == 200
        busy = time.monotonic() - t
        list(lines)
    assert idle < 0.4 and busy >= 0.59, (idle, busy)


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_fault_missing_done(client, fake, kind):
    fake.config.faults.add("missing_done")
    chunks, done, _ = stream(client, PATHS[kind], BODIES[kind](5, max_tokens=3))
    assert not done and finishes(chunks) == ["length"]


def test_fault_duplicate_deltas(client, fake):
    body = chat(5, max_tokens=6, ignore_eos=True)
    expected = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    fake.config.faults.add("duplicate_deltas")
    chunks, done, _ = stream(client, "/v1/chat/completions", body)
    got = text_of(chunks)
    assert done and got != expected and len(got.split()) == 7
    assert len(set(got.split())) == 6


def test_fault_two_finish_chunks(client, fake):
    fake.config.faults.add("two_finish_chunks")
    for kind in ("completions", "chat"):
        chunks, done, _ = stream(client, PATHS[kind], BODIES[kind](5, max_tokens=3))
        assert done and finishes(chunks) == ["length", "length"]


def _ttft_short_while_long(fake) -> float:
    """TTFT of a short request sent while a long prefill is in progress."""
    results = {}

    def long_req():
        post(fake.base_url + "/v1/completions", json=cmpl(200, max_tokens=1), timeout=5)

    t = threading.Thread(target=long_req)
    t.start()
    assert wait_for(lambda: fake.state.running == 1, 1)
    with new_client(base_url=fake.base_url, timeout=5) as c:
        t0 = time.monotonic()
        with c.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=1, stream=True)) as r:
            lines = r.iter_lines()
            next(lines)
            results["ttft"] = time.monotonic() - t0
            for _ in lines:
                pass
    t.join(5)
    return results["ttft"]


def test_fault_hol_blocking(fake):
    fake.config.prefill_s_per_token = 0.001  # 200-token prefill: 0.2 s
    fake.config.enable_prefix_caching = False  # the same long prompt twice: a prefix hit would skip its prefill
    assert _ttft_short_while_long(fake) < 0.1
    fake.config.faults.add("hol_blocking")
    assert _ttft_short_while_long(fake) >= 0.12


def test_fault_stuck_gauges(client, fake):
    fake.config.faults.add("stuck_gauges")
    fake.config.itl_s = 0.02
    with client.stream("POST", "/v1/completions", json=cmpl(20, max_tokens=100, ignore_eos=True, stream=True)) as r:
        next(r.iter_lines())  # then hang up
    assert wait_for(lambda: fake.state.requests[-1].disconnected, 1)
    time.sleep(0.05)
    assert fake.state.running == 1 and gauge(client, "vllm:num_requests_running") == 1
    assert gauge(client, "vllm:kv_cache_usage_perc") > 0
    # a request that completes still releases its own slot
    client.post("/v1/completions", json=cmpl(5, max_tokens=2))
    assert fake.state.running == 1


def test_fault_5xx_under_concurrency(client, fake):
    fake.config.faults.add("5xx_under_concurrency")
    fake.config.itl_s = 0.02
    long_body = cmpl(150, max_tokens=50, ignore_eos=True, stream=True)
    with client.stream("POST", "/v1/completions", json=long_body) as r:
        lines = r.iter_lines()  # keep a reference: a discarded iterator closes the stream
        next(lines)
        with new_client(base_url=fake.base_url, timeout=5) as c2:
            assert c2.post("/v1/completions", json={**long_body, "stream": False}).status_code == 500
            assert c2.post("/v1/completions", json=cmpl(10, max_tokens=2)).status_code == 200  # short is fine
    assert wait_for(lambda: not fake.state.inflight, 1)
    assert client.post("/v1/completions", json=cmpl(150, max_tokens=2)).status_code == 200  # alone is fine


def test_fault_leaky_rss(client, fake):
    fake.config.faults.add("leaky_rss")
    fake.config.leak_bytes_per_request = 1 << 16
    fake.config.rss_wiggle_bytes = 0  # the leak alone
    base = gauge(client, "process_resident_memory_bytes")
    for _ in range(3):
        client.post("/v1/completions", json=cmpl(5, max_tokens=1))
    assert gauge(client, "process_resident_memory_bytes") - base == 3 << 16
    assert fake.state.leaked_bytes == 3 << 16
    fake.config.faults.discard("leaky_rss")
    client.post("/v1/completions", json=cmpl(5, max_tokens=1))
    assert fake.state.leaked_bytes == 3 << 16


def test_fault_leaky_rss_long(client, fake):
    fake.config.faults.add("leaky_rss_long")
    fake.config.leak_bytes_per_request = 1 << 16
    fake.config.rss_wiggle_bytes = 0  # the leak alone
    base = gauge(client, "process_resident_memory_bytes")
    for n in (5, 128, 20):  # max_model_len 256: only prompts over 128 tokens leak
        client.post("/v1/completions", json=cmpl(n, max_tokens=1))
    assert fake.state.leaked_bytes == 0 and gauge(client, "process_resident_memory_bytes") == base
    for n in (129, 200):
        client.post("/v1/completions", json=cmpl(n, max_tokens=1))
    assert fake.state.leaked_bytes == 2 << 16
    assert gauge(client, "process_resident_memory_bytes") - base == 2 << 16
    fake.config.leak_min_prompt_tokens = 8  # the threshold is the config's
    client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(100, 109)), "max_tokens": 1})
    assert fake.state.leaked_bytes == 3 << 16


def test_healthy_rss_moves_by_a_page_and_fault_frozen_rss_never_moves(client, fake):
    seen = [gauge(client, "process_resident_memory_bytes") for _ in range(4)]
    assert abs(seen[1] - seen[0]) == 4096 and seen[2] == seen[0] and len(set(seen)) == 2  # a live process's pages
    fake.config.faults.add("frozen_rss")
    fake.config.faults.add("leaky_rss")
    client.post("/v1/completions", json=cmpl(5, max_tokens=1))
    assert fake.state.leaked_bytes > 0
    first = fake.state.rss_first
    assert first in seen and {gauge(client, "process_resident_memory_bytes") for _ in range(4)} == {first}  # forever


def test_fault_drifting_ttft(client, fake):
    fake.config.faults.add("drifting_ttft")
    fake.config.drift_s_per_request = 0.025
    for _ in range(5):
        client.post("/v1/completions", json=cmpl(5, max_tokens=1))
    ttfts = [r.t_first_token - r.t_received for r in fake.state.requests]
    assert ttfts[0] < 0.02 and ttfts[-1] >= 0.09  # 4 x 0.025; uvloop timers may wake ~1 ms early
    assert all(b > a for a, b in zip(ttfts, ttfts[1:]))


def test_fault_ttft_rises_with_load(client, fake):
    """ttft_rises_with_load: a request admitted while another runs waits load_ttft_s_per_request
    more for its first token; alone it does not."""
    fake.config.faults.add("ttft_rises_with_load")
    fake.config.load_ttft_s_per_request = 0.06
    fake.config.itl_s = 0.03
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=12, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()  # held open: this request keeps running while the next one is admitted
        next(lines)
        assert client.post("/v1/completions", json=cmpl(5, max_tokens=1)).status_code == 200
        for _ in lines:
            pass
    alone, loaded = [r.t_first_token - r.t_received for r in fake.state.requests]
    assert alone < 0.03 and loaded >= 0.055, (alone, loaded)  # 1 other running x 0.06 s; timers may wake ~1 ms early


def test_fault_no_metrics_no_tokenize(client, fake):
    fake.config.faults |= {"no_metrics", "no_tokenize"}
    assert client.get("/metrics").status_code == 404
    assert client.post("/tokenize", json={"prompt": "x"}).status_code == 404
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=1)).status_code == 200


def test_fault_metrics_consumers_read(client, fake):
    """duplicate_pid_series: 8 pid series, one real; renamed_kv_usage: the old name only;
    ttft_histogram_lies: every TTFT in the lowest bucket; metrics_500_under_load: 500 only while busy."""
    fake.config.itl_s = 0.02
    fake.config.faults |= {"duplicate_pid_series", "renamed_kv_usage", "ttft_histogram_lies", "metrics_500_under_load"}
    fake.config.ttft_s = 0.03
    assert client.get("/metrics").status_code == 200  # idle
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=100, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()  # held: a dropped generator closes the stream
        next(lines)
        busy = client.get("/metrics")
        assert busy.status_code == 500 and busy.text == "Internal Server Error"
        fake.config.faults.discard("metrics_500_under_load")
        m = metrics(client)
    running = m["vllm:num_requests_running"]
    assert len(running) == 8 and {s.labels["pid"] for s in running} == {str(1000 + i) for i in range(8)}
    assert sorted(s.value for s in running) == [0.0] * 7 + [1.0]
    assert len(m["vllm:num_requests_waiting"]) == 8 and len(m["vllm:gpu_cache_usage_perc"]) == 8
    assert "vllm:kv_cache_usage_perc" not in m
    assert wait_for(lambda: metrics(client)["vllm:time_to_first_token_seconds_count"][0].value == 1)
    buckets = {s.labels["le"]: s.value for s in metrics(client)["vllm:time_to_first_token_seconds_bucket"]}
    assert buckets["0.001"] == 1  # the request took >= 30 ms


def test_healthy_ttft_histogram_counts_what_the_request_took(client, fake):
    fake.config.ttft_s = 0.03
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=2)).status_code == 200
    m = metrics(client)
    buckets = {s.labels["le"]: s.value for s in m["vllm:time_to_first_token_seconds_bucket"]}
    assert buckets["0.02"] == 0 and buckets["0.1"] == 1 and m["vllm:e2e_request_latency_seconds_count"][0].value == 1
    assert len(m["vllm:num_requests_running"]) == 1 and "vllm:kv_cache_usage_perc" in m


def test_every_fault_has_a_test():
    # here, or in the suite test that proves its case against the fake (tests/test_api_vs_fake.py, ...)
    tests = Path(__file__).parents[1]
    src = "".join(p.read_text() for p in [Path(__file__), *tests.glob("test_*vs_fake.py"),
                                          tests / "test_gates_storm.py"])  # leak_cancelled_kv's proof
    missing = [f for f in FAULTS if f'"{f}"' not in src]
    assert not missing, missing


def test_fault_error_mid_stream(client, fake):
    fake.config.faults.add("error_mid_stream")
    with client.stream("POST", "/v1/chat/completions", json=chat(5, max_tokens=8, ignore_eos=True, stream=True)) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][6:])
    assert err["error"]["code"] == 500 and "error_mid_stream" in err["error"]["message"]
    assert len(text_of([json.loads(x[6:]) for x in lines[:-2]]).split()) == 4
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=8, ignore_eos=True))
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    assert fake.state.running == 0 and fake.state.requests[-1].finish_reason == "error"
    success = {s.labels["finished_reason"]: s.value for s in metrics(client)["vllm:request_success_total"]}
    assert success["error"] == 2


def test_openai_sdk_parses_the_fake(fake):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=fake.url, api_key="x", http_client=new_client()) as sdk:
        full = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}],
                                           max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert full.usage.completion_tokens == 5 and full.choices[0].finish_reason == "length"
        parts, usage = [], None
        for chunk in sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}],
                                                 max_tokens=5, temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}):
            parts += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
        assert "".join(parts) == full.choices[0].message.content and usage == full.usage
        text = "".join(c.choices[0].text for c in sdk.completions.create(
            model=MODEL, prompt="a b", max_tokens=3, temperature=0, stream=True) if c.choices)
        assert text == sdk.completions.create(model=MODEL, prompt="a b", max_tokens=3, temperature=0).choices[0].text
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            sdk.completions.create(model=MODEL, prompt=words(L + 5), max_tokens=3)


# ---- issue 12: edge requests, chunk schema, route timeout, garbage framing --------------------------


def _events(client, path, body):
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        return r.status_code, r.read().decode()


def test_fault_validation_500_and_plain_error_body(client, fake):
    fake.config.faults.add("validation_500")
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=0))
    assert r.status_code == 500 and "max_tokens must be at least 1" in r.json()["error"]["message"]
    fake.config.faults = {"plain_error_body"}
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=0))
    assert r.status_code == 400 and r.text == "Bad Request"
    assert client.post("/v1/completions", content=b"{not json").text == "Bad Request"


def test_fault_empty_prompt_kills(client, fake):
    fake.config.faults.add("empty_prompt_kills")
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": [""], "max_tokens": 4}).status_code == 500
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=4)).status_code == 500  # engine dead
    assert client.get("/health").status_code == 200


def test_fault_ignore_min_tokens(client, fake):
    body = cmpl(5, max_tokens=64, min_tokens=32)
    assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] >= 32
    fake.config.faults.add("ignore_min_tokens")
    r = client.post("/v1/completions", json=body).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "stop"  # 2 words + EOS


def test_non_ascii_prompt_gets_non_ascii_words_and_split_utf8_breaks_them(client, fake):
    body = {"model": MODEL, "prompt": "한국어 🙂", "max_tokens": 4, "temperature": 0}
    text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert not text.isascii() and "\ufffd" not in text
    _, clean = _events(client, "/v1/completions", body)
    fake.config.faults.add("split_utf8")
    _, broken = _events(client, "/v1/completions", body)
    assert "\\ufffd" not in clean and "\\ufffd" in broken


def test_fault_finish_reason_empty_and_usage_unasked(client, fake):
    fake.config.faults |= {"finish_reason_empty", "usage_unasked"}
    _, raw = _events(client, "/v1/chat/completions", chat(5, max_tokens=3, ignore_eos=True))
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == ["", "", "", "length"]
    assert all(c["usage"] for c in chunks)


def test_fault_route_timeout(client, fake):
    fake.config.faults.add("route_timeout")
    fake.config.route_timeout_s, fake.config.itl_s = 0.1, 0.02
    r = client.post("/v1/completions", json=cmpl(5, max_tokens=30, ignore_eos=True))
    assert r.status_code == 504 and "Gateway Time-out" in r.text
    with pytest.raises(httpx.RemoteProtocolError):
        _events(client, "/v1/completions", cmpl(5, max_tokens=30, ignore_eos=True))
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=2)).status_code == 200  # short ones pass


def test_fault_truncated_stream(client, fake):
    fake.config.faults.add("truncated_stream")
    with pytest.raises(httpx.RemoteProtocolError):
        _events(client, "/v1/completions", cmpl(5, max_tokens=8, ignore_eos=True))


def test_fault_html_error_page_and_empty_502(client, fake):
    fake.config.faults.add("html_error_page")
    r = client.post("/v1/completions", json=cmpl(5))
    assert r.status_code == 502 and r.headers["content-type"].startswith("text/html") and "502 Bad Gateway" in r.text
    fake.config.faults = {"empty_502"}
    r = client.post("/v1/chat/completions", json=chat(5))
    assert r.status_code == 502 and r.content == b""


def test_sse_framing_faults(client, fake):
    fake.config.faults |= {"sse_crlf", "sse_comments", "sse_event_fields"}
    _, raw = _events(client, "/v1/completions", cmpl(5, max_tokens=2, ignore_eos=True))
    assert raw.startswith(": ping\r\n\r\nevent: message\r\ndata: {") and raw.endswith("data: [DONE]\r\n\r\n")
    assert "\n" not in raw.replace("\r\n", "")


def test_fault_never_schedule(client, fake):
    fake.config.faults.add("never_schedule")
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=4)).status_code == 200  # fits: scheduled
    with pytest.raises(httpx.ReadTimeout):  # 250 + 4 tokens > 256 - 16 schedulable: waits forever
        client.post("/v1/completions", json=cmpl(250, max_tokens=4), timeout=0.5)
    assert wait_for(lambda: fake.state.waiting == 0)  # the hang-up released it


def test_chat_template_kwargs_add_tokens_in_tokenize_and_chat(client, fake):
    msgs = [{"role": "user", "content": "a b c"}]
    plain = client.post("/tokenize", json={"model": MODEL, "messages": msgs}).json()["count"]
    kw = {"chat_template_kwargs": {"enable_thinking": False}}
    assert client.post("/tokenize", json={"model": MODEL, "messages": msgs, **kw}).json()["count"] == plain + 2
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1, **kw}).json()
    assert r["usage"]["prompt_tokens"] == plain + 2


# ---- serve features (the features gate) ----------------------------------------------------------

TOOLS = [{"type": "function", "function": f} for f in DEFAULT_FUNCTIONS]
WEATHER = {"city": "Oslo", "unit": "c"}  # get_weather's minimal instance: each enum's first value
CHAT = "/v1/chat/completions"


def tool_chat(choice, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "weather in Oslo"}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": 64, "temperature": 0, **kw}


def named(fn: str) -> dict:
    return {"type": "function", "function": {"name": fn}}


def plain_chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "the capital of France"}], "max_tokens": 64,
            "temperature": 0, **kw}


def streamed_calls(chunks: list[dict]) -> tuple[list[tuple[str, str]], int]:
    """``([(name, arguments)] reassembled by index, how many deltas carried arguments)``."""
    calls: dict[int, list[str]] = {}
    arg_deltas = 0
    for c in chunks:
        for ch in c["choices"]:
            for tc in ch["delta"].get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], ["", ""])
                slot[0] += tc.get("function", {}).get("name") or ""
                if "arguments" in tc.get("function", {}):
                    slot[1] += tc["function"]["arguments"]
                    arg_deltas += 1
    return [(n, a) for _, (n, a) in sorted(calls.items())], arg_deltas


def streamed_reasoning(chunks: list[dict]) -> str:
    return "".join(ch["delta"].get("reasoning") or "" for c in chunks for ch in c["choices"])


@pytest.mark.parametrize("choice, fn, args, finish", [
    ("auto", "get_weather", WEATHER, "tool_calls"),  # the first function with parameters
    ("required", "get_weather", WEATHER, "tool_calls"),  # the first function
    (named("get_weather"), "get_weather", WEATHER, "stop"),  # a named choice finishes stop, as vLLM's does
    (named("get_time"), "get_time", {}, "stop"),
], ids=["auto", "required", "named-get_weather", "named-get_time"])
def test_tool_calls_non_streamed_and_streamed(client, choice, fn, args, finish):
    body = client.post(CHAT, json=tool_chat(choice)).json()
    ch = body["choices"][0]
    (call,) = ch["message"]["tool_calls"]
    assert ch["message"]["content"] is None and ch["finish_reason"] == finish
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == fn and json.loads(call["function"]["arguments"]) == args
    chunks, done, _ = stream(client, CHAT, tool_chat(choice))
    first = next(tc for c in chunks for x in c["choices"] for tc in x["delta"].get("tool_calls") or [])
    assert first["function"] == {"name": fn} and first["type"] == "function" and first["index"] == 0
    calls, arg_deltas = streamed_calls(chunks)
    assert done and calls == [(fn, call["function"]["arguments"])] and arg_deltas >= 2  # {} too: "{", "}"
    assert finishes(chunks) == [finish] and text_of(chunks) == ""


def test_tool_choice_auto_with_a_regex_still_calls_and_bad_choices_are_400(client):
    body = client.post(CHAT, json=tool_chat("auto", structured_outputs={"regex": "<tool_call>.*"})).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    r = client.post(CHAT, json=tool_chat(named("nope")))
    assert r.status_code == 400 and "'nope' has not been passed in `tools`" in r.json()["error"]["message"]
    no_tools = tool_chat("required")
    del no_tools["tools"]
    assert client.post(CHAT, json=no_tools).status_code == 400
    msg = client.post(CHAT, json=tool_chat("none")).json()["choices"][0]["message"]
    assert msg["tool_calls"] == [] and msg["content"]  # tool_choice none: a plain answer


def test_minimal_instance_is_valid_against_its_schema():
    import jsonschema

    extra = {"type": "object", "required": ["n", "s", "t", "a"],
             "properties": {"n": {"type": "integer", "minimum": 3}, "s": {"type": "string", "pattern": "^[0-9]{3}$"},
                            "t": {"type": "string", "minLength": 5},
                            "a": {"type": "array", "items": {"type": "boolean"}, "minItems": 2}}}
    schemas = [g.spec for g in BATTERY if g.kind == "json_schema"] + [f["parameters"] for f in DEFAULT_FUNCTIONS]
    for schema in schemas + [extra]:
        jsonschema.validate(minimal_instance(schema), schema)
    assert minimal_instance(extra) == {"n": 3, "s": "000", "t": "kvaaa", "a": [True, True]}
    assert minimal_instance(DEFAULT_FUNCTIONS[0]["parameters"]) == WEATHER
    assert minimal_instance(DEFAULT_FUNCTIONS[1]["parameters"]) == {}


@pytest.mark.parametrize("g", BATTERY, ids=[g.name for g in BATTERY])
def test_structured_outputs_answer_the_battery_example(client, g):
    body = client.post(CHAT, json=plain_chat(**g.request())).json()
    ch = body["choices"][0]
    assert ch["message"]["content"] == g.example and ch["finish_reason"] == "stop"
    assert 2 <= body["usage"]["completion_tokens"] <= 16  # the pieces + EOS
    chunks, done, _ = stream(client, CHAT, plain_chat(**g.request()))
    assert done and text_of(chunks) == g.example and finishes(chunks) == ["stop"]


def test_structured_outputs_outside_the_battery(client, fake):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2}}, "required": ["n"]}
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
    assert client.post(CHAT, json=plain_chat(**rf)).json()["choices"][0]["message"]["content"] == '{"n":2}'
    choice = client.post(CHAT, json=plain_chat(structured_outputs={"choice": ["x", "y"]})).json()
    assert choice["choices"][0]["message"]["content"] == "x"
    r = client.post(CHAT, json=plain_chat(structured_outputs={"regex": "[a-z]+!"}))
    assert r.status_code == 400 and "fake cannot satisfy regex" in r.json()["error"]["message"]
    fake.config.reasoning_parser = "qwen3"  # then an unknown regex is a reasoning request's guide: ignored
    guided = plain_chat(structured_outputs={"regex": "[a-z]+!"}, chat_template_kwargs={"enable_thinking": False})
    assert client.post(CHAT, json=guided).json()["choices"][0]["message"]["content"] == CONTENT_TEXT


@pytest.mark.parametrize("kwargs, reasoning", [({}, REASONING_TEXT), ({"enable_thinking": True}, REASONING_TEXT),
                                               ({"enable_thinking": False}, None)], ids=["default", "on", "off"])
def test_reasoning_parser_splits_reasoning_from_content(client, fake, kwargs, reasoning):
    fake.config.reasoning_parser = "qwen3"
    body = plain_chat(chat_template_kwargs=kwargs)
    msg = client.post(CHAT, json=body).json()["choices"][0]["message"]
    assert msg["reasoning"] == reasoning and msg["content"] == CONTENT_TEXT
    chunks, done, _ = stream(client, CHAT, body)
    assert done and streamed_reasoning(chunks) == (reasoning or "") and text_of(chunks) == CONTENT_TEXT
    order = ["r" if ch["delta"].get("reasoning") else "c" for c in chunks for ch in c["choices"]
             if ch["delta"].get("reasoning") or ch["delta"].get("content")]
    assert order == sorted(order, reverse=True)  # every reasoning delta before the first content delta


def test_without_a_reasoning_parser_chat_is_plain(client):
    msg = client.post(CHAT, json=plain_chat()).json()["choices"][0]["message"]
    assert "reasoning" not in msg and msg["content"].startswith(" tok")


def test_lora_adapters_are_listed_and_answer_text_of_their_own(client, fake):
    fake.config.lora_adapters = ("a1", "a2")
    cards = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in cards] == [
        (MODEL, None, "/models/fake-model"), ("a1", MODEL, "/adapters/a1"), ("a2", MODEL, "/adapters/a2")]

    def text(model: str) -> str:
        body = client.post("/v1/completions", json={**cmpl(5, max_tokens=8, ignore_eos=True), "model": model}).json()
        assert body["model"] == model
        return body["choices"][0]["text"]

    texts = {m: text(m) for m in (MODEL, "a1", "a2")}
    assert len(set(texts.values())) == 3 and text("a1") == texts["a1"]  # distinct and deterministic
    assert client.post("/v1/completions", json={**cmpl(5), "model": "a3"}).status_code == 404
    fake.config.faults.add("lora_as_base")
    assert text("a1") == text("a2") == texts[MODEL]  # echoed as themselves, the base model's text
    labels = {s.labels["model_name"] for s in metrics(client)["vllm:prompt_tokens_total"]}
    assert labels == {MODEL}  # metrics carry the served model, adapters included


def _prefilled(fake) -> list[float]:
    """Install a sleep that records the prefill (and any other) delays, returning the record."""
    slept: list[float] = []

    async def record(s: float) -> None:
        slept.append(s)
        await asyncio.sleep(0)

    fake.sleep = record
    return slept


def _cached(client, prompt, model=MODEL):
    body = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1}).json()
    details = body["usage"]["prompt_tokens_details"]
    return None if details is None else details["cached_tokens"]


def _prefix_counters(client) -> tuple[float, float]:
    m = metrics(client)
    return m["vllm:prefix_cache_queries_total"][0].value, m["vllm:prefix_cache_hits_total"][0].value


def test_prefix_cache_hits_whole_blocks_and_prefills_the_rest(client, fake):
    real = fake.sleep
    try:
        slept = _prefilled(fake)
        fake.config.prefill_s_per_token, fake.config.prompt_tokens_details = 1.0, True
        prefix = list(range(100, 140))  # 40 tokens: 2 whole blocks of 16 and 8 more
        assert _cached(client, prefix + [1, 2]) == 0
        assert _cached(client, prefix + [3, 4]) == 32  # the whole blocks shared
        assert _cached(client, prefix[:32]) == 16  # never the whole prompt: its last block is computed again
        assert slept == [42.0, 10.0, 16.0]  # prefill: the uncached tokens only
        assert _prefix_counters(client) == (42 + 42 + 32, 32 + 16)
        assert _cached(client, words(40)) == 0 and _cached(client, words(40)) == 32  # text prompts alike
        fake.config.lora_adapters = ("a1",)
        assert _cached(client, prefix + [5, 6], model="a1") == 0  # an adapter's blocks are its own
        fake.config.enable_prefix_caching = False
        assert _cached(client, prefix + [7, 8]) == 0
        fake.config.prompt_tokens_details = False
        assert _cached(client, prefix + [7, 8]) is None  # vLLM's default: no prompt_tokens_details
    finally:
        fake.sleep = real


def test_the_fake_keeps_a_completions_text_prompt_as_received(client, fake):
    client.post("/v1/completions", json={"model": MODEL, "prompt": "System: a\nUser: b", "max_tokens": 1})
    client.post("/v1/completions", json={"model": MODEL, "prompt": [101, 102], "max_tokens": 1})
    assert [r.prompt for r in fake.state.requests] == ["System: a\nUser: b", None]


@pytest.mark.parametrize("fault, cached, hits", [("prefix_cache_never_hits", 0, 0), ("prefix_counter_frozen", 32, 0)])
def test_fault_prefix_cache(client, fake, fault, cached, hits):
    real = fake.sleep
    try:
        slept = _prefilled(fake)
        fake.config.faults.add(fault)
        fake.config.prefill_s_per_token, fake.config.prompt_tokens_details = 1.0, True
        prefix = list(range(100, 140))
        assert _cached(client, prefix + [1, 2]) == 0 and _cached(client, prefix + [3, 4]) == cached
        assert slept == [42.0, 42.0 - cached]
        assert _prefix_counters(client) == (84, hits)
    finally:
        fake.sleep = real


def test_fault_tools_stream_as_text(client, fake):
    fake.config.faults.add("tools_stream_as_text")
    chunks, done, _ = stream(client, CHAT, tool_chat("auto"))
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    assert done and text_of(chunks) == raw and finishes(chunks) == ["stop"] and streamed_calls(chunks) == ([], 0)
    ch = client.post(CHAT, json=tool_chat("auto")).json()["choices"][0]  # non-streamed stays right
    assert ch["finish_reason"] == "tool_calls" and len(ch["message"]["tool_calls"]) == 1


def test_fault_tools_empty_calls(client, fake):
    fake.config.faults.add("tools_empty_calls")
    for choice in ("auto", named("get_time")):
        ch = client.post(CHAT, json=tool_chat(choice)).json()["choices"][0]
        assert ch["finish_reason"] == "tool_calls" and ch["message"]["tool_calls"] == []
        assert ch["message"]["content"] is None
    chunks, _, _ = stream(client, CHAT, tool_chat("auto"))  # streamed stays right
    assert streamed_calls(chunks)[0] == [("get_weather", json.dumps(WEATHER))]


def test_fault_tools_args_not_object(client, fake):
    fake.config.faults.add("tools_args_not_object")
    for choice, fn in (("auto", "get_weather"), (named("get_time"), "get_time")):  # parameterless too
        call = client.post(CHAT, json=tool_chat(choice)).json()["choices"][0]["message"]["tool_calls"][0]
        assert call["function"] == {"name": fn, "arguments": "false"}
        chunks, _, _ = stream(client, CHAT, tool_chat(choice))
        assert streamed_calls(chunks)[0] == [(fn, "false")]


def _schema_case(name: str):
    return next(g for g in BATTERY if g.name == name)


def test_fault_structured_whitespace_loop(client, fake):
    fake.config.faults.add("structured_whitespace_loop")
    body = client.post(CHAT, json=plain_chat(**_schema_case("nested").request())).json()
    ch = body["choices"][0]
    assert ch["message"]["content"] == "{" + " " * 63 and ch["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 64
    for other in ("json-object", "regex"):  # json_schema only
        g = _schema_case(other)
        assert client.post(CHAT, json=plain_chat(**g.request())).json()["choices"][0]["message"]["content"] == g.example


def test_fault_structured_cut(client, fake):
    fake.config.faults.add("structured_cut")
    g = _schema_case("enum-const")
    ch = client.post(CHAT, json=plain_chat(**g.request())).json()["choices"][0]
    assert ch["message"]["content"] == g.example[: len(g.example) // 2] and ch["finish_reason"] == "stop"
    chunks, _, _ = stream(client, CHAT, plain_chat(**g.request()))
    assert text_of(chunks) == g.example[: len(g.example) // 2]
    assert client.post(CHAT, json=plain_chat(**_schema_case("choice").request())).json()["choices"][0][
        "message"]["content"] == "block"


def test_fault_reasoning_markers_in_content(client, fake):
    fake.config.reasoning_parser = "qwen3"
    fake.config.faults.add("reasoning_markers_in_content")
    on = plain_chat(chat_template_kwargs={"enable_thinking": True})
    msg = client.post(CHAT, json=on).json()["choices"][0]["message"]
    marked = f"<think>\n{REASONING_TEXT}\n</think>\n\n{CONTENT_TEXT}"
    assert msg["reasoning"] is None and msg["content"] == marked
    chunks, _, _ = stream(client, CHAT, on)
    assert streamed_reasoning(chunks) == "" and text_of(chunks) == marked
    off = client.post(CHAT, json=plain_chat(chat_template_kwargs={"enable_thinking": False})).json()
    assert off["choices"][0]["message"]["content"] == CONTENT_TEXT  # thinking off: unaffected


# ---- issue 21: the drain of a rolling update (FakeVLLM.sigterm) ------------------------------------


def _drain_run(faults=(), max_tokens=30):
    """Start a fresh fake (the drain ends it), one stream in flight, SIGTERM after its first token, one
    new request during the drain; returns (stream events, stream error, new request's status, /health
    status during the drain, exited)."""
    fake = FakeVLLM(FakeConfig(itl_s=0.01, eos_after=None, faults=set(faults)))
    fake.start()
    try:
        first = threading.Event()
        events: list[str] = []
        error: list[str] = []

        def stream():
            body = {"model": MODEL, "prompt": "drain me", "max_tokens": max_tokens, "stream": True}
            try:
                with new_client(fake.base_url, 5) as c, c.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            first.set()
            except httpx.HTTPError as exc:
                error.append(type(exc).__name__)
            first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(5)
        fake.sigterm()
        with new_client(fake.base_url, 5) as c:
            new = c.post("/v1/completions", json={"model": MODEL, "prompt": "new", "max_tokens": 2}).status_code
            health = c.get("/health").status_code
        t.join(5)
        return events, error, new, health, fake.wait_exit(3)
    finally:
        fake.stop()


def test_healthy_drain_finishes_in_flight_refuses_new_work_with_503_and_exits():
    events, error, new, health, exited = _drain_run()
    assert not error and events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert new == 503 and health == 200 and exited


def test_fault_abort_on_sigterm():
    events, error, new, _, exited = _drain_run(["abort_on_sigterm"], max_tokens=200)
    assert "[DONE]" not in events and len(events) < 200 and error, (events[-2:], error)
    assert exited


def test_fault_drain_500():
    events, _, new, health, exited = _drain_run(["drain_500"])
    assert new == 500 and health == 200 and events[-1] == "[DONE]" and exited


def test_fault_no_exit_after_drain():
    fake = FakeVLLM(FakeConfig(faults={"no_exit_after_drain"}))
    fake.start()
    try:
        fake.sigterm()
        assert fake.wait_exit(0.2) is False and get(fake.base_url + "/health").status_code == 200
    finally:
        fake.stop()


# ---- issue 21 faults: a hung engine behind a healthy /health, streams that pause --------------------


def test_fault_hang_after_generations(client, fake):
    fake.config.faults.add("hang_after_generations")
    fake.config.hang_after = 2
    for _ in range(2):  # the first two generations are served
        assert client.post("/v1/completions", json=cmpl(5, max_tokens=2)).status_code == 200
    with pytest.raises(httpx.ReadTimeout):  # the third is held, non-streamed...
        client.post("/v1/completions", json=cmpl(5, max_tokens=2), timeout=0.3)
    with pytest.raises(httpx.ReadTimeout):  # ...and streamed (headers, then nothing)
        with client.stream("POST", "/v1/chat/completions", json=chat(5, max_tokens=2, stream=True), timeout=0.3) as r:
            list(r.iter_lines())
    assert client.get("/health").status_code == 200  # while /health stays healthy
    assert client.post("/tokenize", json={"model": MODEL, "prompt": "a b"}).status_code == 200  # not a generation
    assert wait_for(lambda: fake.state.waiting == 0)  # the hang-ups released them


def test_fault_exit_after_generations():
    with FakeVLLM(FakeConfig(faults={"exit_after_generations"}, exit_after=1)) as f, new_client(f.base_url) as c:
        assert c.post("/v1/completions", json=cmpl(5, max_tokens=2)).status_code == 200
        r = c.post("/v1/completions", json=cmpl(5, max_tokens=2))  # the generation that finds the process gone
        assert r.status_code >= 500
        assert wait_for(lambda: f._thread is None or not f._thread.is_alive())
        with pytest.raises(httpx.ConnectError):  # nothing listens any more, /health included
            httpx.get(f.base_url + "/health", timeout=2)


def test_fault_pause_streams(client, fake):
    fake.config.faults.add("pause_streams")
    fake.config.pause_s, fake.config.pause_after_chunks = 0.3, 4
    times = []
    with client.stream("POST", "/v1/completions", json=cmpl(5, max_tokens=8, ignore_eos=True, stream=True)) as r:
        times = [time.monotonic() for line in r.iter_lines() if line]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps.index(max(gaps)) == 3 and max(gaps) >= 0.25 and sorted(gaps)[-2] < 0.1  # after 4 token chunks
    t = time.monotonic()
    assert client.post("/v1/completions", json=cmpl(5, max_tokens=8, ignore_eos=True)).status_code == 200
    assert time.monotonic() - t < 0.2  # non-streamed: no pause


def test_buffered_body_is_released_in_whole_pieces_and_the_rest_at_the_end():
    async def events():
        for i in range(5):
            yield f"data: {i:03d}\n\n"  # 11 bytes each

    async def pieces(size):
        return [p async for p in _buffered(events(), size)]

    body = b"".join(f"data: {i:03d}\n\n".encode() for i in range(5))  # 55 bytes
    assert asyncio.run(pieces(25)) == [body[:25], body[25:50], body[50:]]  # events split where the buffer fills
    assert asyncio.run(pieces(0)) == [body]


@pytest.mark.parametrize("buffer_bytes", [0, 16384])
def test_fault_buffer_stream_holds_the_events_until_the_end(client, fake, buffer_bytes):
    # 20 tokens, 10 ms apart: the stream (~3 KB, below 16 KB) reaches the client in one burst at the end
    fake.config.faults.add("buffer_stream")
    fake.config.itl_s, fake.config.buffer_bytes = 0.01, buffer_bytes
    t0 = time.monotonic()
    chunks, done, times = stream(client, "/v1/completions", cmpl(5, max_tokens=20, ignore_eos=True))
    assert done and len(chunks) == 20 and text_of(chunks).count(" tok") == 20
    assert times[0] - t0 >= 0.19 and times[-1] - times[0] < 0.05
    assert fake.state.requests[-1].t_first_token - t0 < 0.1  # the engine generated at its own pace meanwhile


def test_fault_buffer_stream_flushes_each_full_buffer(client, fake):
    fake.config.faults.add("buffer_stream")
    fake.config.itl_s, fake.config.buffer_bytes = 0.01, 1024  # ~6 completions chunks per flush
    chunks, done, times = stream(client, "/v1/completions", cmpl(5, max_tokens=20, ignore_eos=True))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert done and len(chunks) == 20
    assert 2 <= sum(g > 0.03 for g in gaps) <= 5  # a few long silences (one per flush), the rest bunched


# ---- server shapes other than vLLM (FakeConfig.server, SERVERS) ------------------------------------


@pytest.mark.parametrize("shape,owned,header", [("vllm", "vllm", "uvicorn"), ("llama-cpp-python", "me", "uvicorn"),
                                                ("llama.cpp", "llamacpp", "llama.cpp")])
def test_server_shapes_models_and_server_header(shape, owned, header):
    from .fake_vllm import SERVERS

    assert shape in SERVERS
    with FakeVLLM(FakeConfig(server=shape)) as f, new_client(f.base_url) as c:
        r = c.get("/v1/models")
        card = r.json()["data"][0]
        assert r.headers["server"] == header and card["owned_by"] == owned and card["id"] == MODEL
        assert ("max_model_len" in card) == (shape == "vllm")


def test_llama_cpp_python_shape_endpoints_and_defects():
    with FakeVLLM(FakeConfig(server="llama-cpp-python", max_tokens_cap=4)) as f, new_client(f.base_url) as c:
        for path in ("/tokenize", "/detokenize"):
            assert c.post(path, json={"model": MODEL, "prompt": "a b"}).status_code == 404
        for path in ("/metrics", "/version", "/health"):
            assert c.get(path).status_code == 404
        assert c.post("/extras/tokenize", json={"input": "a b", "model": MODEL}).json()["tokens"][0] == 1  # BOS
        assert c.post("/extras/tokenize/count", json={"input": "a b"}).json() == {"count": 3}
        assert c.post("/extras/tokenize", json={"model": MODEL}).status_code == 422
        # no server-side cap; no usage chunk with include_usage; token-id prompts 500
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 8, "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 8
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True,
                                            "stream_options": {"include_usage": True}})
        assert r.status_code == 200 and '"usage"' not in r.text and r.text.rstrip().endswith("[DONE]")
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [101, 102], "max_tokens": 1})
        assert r.status_code == 500 and "validation errors" in r.text


def test_llama_cpp_shape_tokenize_apply_template_props_metrics():
    with FakeVLLM(FakeConfig(server="llama.cpp")) as f, new_client(f.base_url) as c:
        assert c.post("/tokenize", json={"content": "a b"}).json() == c.post("/tokenize", json={"content": "a b",
                                                                                                 "add_special": False}).json()
        assert len(c.post("/tokenize", json={"content": "a b", "add_special": True}).json()["tokens"]) == 3
        assert c.post("/tokenize", json={"model": MODEL, "prompt": "a b"}).json() == {"tokens": []}  # vLLM's shape
        msgs = [{"role": "user", "content": "a b"}]
        prompt = c.post("/apply-template", json={"messages": msgs}).json()["prompt"]
        n = len(c.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
        chat = c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1}).json()
        assert chat["usage"]["prompt_tokens"] == n
        assert c.get("/props").json()["default_generation_settings"]["n_ctx"] == L
        m = c.get("/metrics")
        assert m.status_code == 501 and m.json()["error"]["type"] == "not_supported_error"
        assert c.get("/health").status_code == 200 and c.get("/version").status_code == 404
        assert c.post("/extras/tokenize", json={"input": "a"}).status_code == 404


def test_static_files_shape_lists_models_and_nothing_else_works():
    with FakeVLLM(FakeConfig(server="static-files")) as f, new_client(f.base_url) as c:
        r = c.get("/v1/models")
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL and r.headers["server"].startswith("SimpleHTTP")
        r = c.post("/tokenize", json={"model": MODEL, "prompt": "a"})
        assert r.status_code == 501 and "Unsupported method ('POST')" in r.text and r.headers["content-type"].startswith("text/html")
        assert c.post("/v1/chat/completions", json={"model": MODEL, "messages": []}).status_code == 501
        assert c.get("/health").status_code == 404 and c.get("/metrics").status_code == 404


def test_vllm_shape_has_no_other_servers_routes_and_no_tokenize_covers_them():
    with FakeVLLM(FakeConfig()) as f, new_client(f.base_url) as c:
        assert c.post("/extras/tokenize", json={"input": "a"}).status_code == 404
        assert c.post("/apply-template", json={"messages": []}).status_code == 404
    with FakeVLLM(FakeConfig(server="llama-cpp-python", faults={"no_tokenize"})) as f, new_client(f.base_url) as c:
        assert c.post("/extras/tokenize", json={"input": "a"}).status_code == 404
    with pytest.raises(ValueError, match="unknown server 'tgi'"):
        FakeConfig(server="tgi")


def test_fault_body_limit_413_on_every_post_route(client, fake):
    fake.config.faults.add("body_limit_413")
    fake.config.max_body_bytes = 4096
    small = {"model": MODEL, "prompt": "the kv cache " * 10, "max_tokens": 1}
    assert client.post("/v1/completions", json=small).status_code == 200
    assert client.post("/tokenize", json={"model": MODEL, "prompt": "kv"}).json()["count"] == 2
    big_prompt = "kv " * 2100  # 6,300 bytes of prompt: over the limit
    for path, body in (("/tokenize", {"model": MODEL, "prompt": big_prompt}),
                       ("/v1/completions", {"model": MODEL, "prompt": big_prompt, "max_tokens": 1}),
                       ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": big_prompt}]})):
        r = client.post(path, json=body)
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html"), path
        assert "<title>413 Request Entity Too Large</title>" in r.text
    # the limit is on bytes: exactly max_body_bytes passes, one more does not; GETs are untouched
    pad = lambda n: b'{"model": "fake-model", "prompt": "' + b"x" * (n - 37) + b'"}'  # noqa: E731
    assert len(pad(4096)) == 4096
    assert client.post("/tokenize", content=pad(4096)).status_code == 200
    assert client.post("/tokenize", content=pad(4097)).status_code == 413
    assert client.get("/v1/models").status_code == 200
    fake.config.faults.discard("body_limit_413")
    assert client.post("/tokenize", json={"model": MODEL, "prompt": big_prompt}).status_code == 200


#: The answering faults (FakeConfig.answers): each is proven against the answers gate, case by case, in
#: tests/test_answers_vs_fake.py (it fails exactly its case there; the healthy answering fake passes all).
ANSWER_FAULTS = ("garbage_answers", "inject_fffd", "repetition_loop", "shift_one_token", "double_bos_ids",
                 "echo_prompt_first_delta", "nondeterministic_concurrency", "forget_first_turn", "template_drops_roles",
                 "gateway_drops_system", "sampling_dropped", "contaminating", "stale_allowlist", "bad_words_500",
                 "split_fleet", "gateway_keeps_last_turn")

SYS_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


def test_fault_template_drops_roles_renders_contents_alone_everywhere(client, fake):
    fake.config.faults.add("template_drops_roles")
    tok = client.post("/tokenize", json={"model": MODEL, "messages": SYS_CHAT, "return_token_strs": True}).json()
    assert tok["token_strs"] == ["<s>", "Be", "brief.", "Capital", "of", "France?"]
    as_user = [{**m, "role": "user"} for m in SYS_CHAT]
    assert client.post("/tokenize", json={"model": MODEL, "messages": as_user}).json()["tokens"] == tok["tokens"]
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": SYS_CHAT, "max_tokens": 2}).json()
    assert r["usage"]["prompt_tokens"] == 6
    fake.config.faults.discard("template_drops_roles")
    assert client.post("/tokenize", json={"model": MODEL, "messages": SYS_CHAT}).json()["count"] == 9


def test_fault_gateway_drops_system_on_the_chat_route_only(client, fake):
    fake.config.faults.add("gateway_drops_system")
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": SYS_CHAT, "max_tokens": 2}).json()
    assert r["usage"]["prompt_tokens"] == 6  # <s> <|user|> Capital of France? <|assistant|>
    assert client.post("/tokenize", json={"model": MODEL, "messages": SYS_CHAT}).json()["count"] == 9


def _sys_chat(user: str, system: str | None = "Be brief.") -> dict:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"model": MODEL, "messages": msgs, "max_tokens": 2, "temperature": 0}


def test_fault_answer_cache_first_words_serves_another_requests_body(client, fake):
    first = client.post("/v1/chat/completions", json=_sys_chat("Capital of France?", None)).json()
    other = client.post("/v1/chat/completions", json=_sys_chat("Capital of Japan, please?")).json()
    assert other["id"] != first["id"] and other["usage"]["prompt_tokens"] == 10  # healthy: its own answer and count
    fake.config.faults.add("answer_cache_first_words")
    fake.config.cache_words = 2  # 'Capital of'
    warm = client.post("/v1/chat/completions", json=_sys_chat("Capital of France?", None)).json()
    hit = client.post("/v1/chat/completions", json=_sys_chat("Capital of Japan, please?")).json()
    assert hit == warm and hit["usage"]["prompt_tokens"] == 6  # another request's body: its id, created, usage
    streamed = client.post("/v1/chat/completions", json={**_sys_chat("Capital of Japan, please?"), "stream": True})
    assert warm["id"] not in streamed.text  # streams are not cached
    miss = client.post("/v1/chat/completions", json=_sys_chat("Largest ocean?")).json()
    assert miss["id"] != warm["id"] and miss["usage"]["prompt_tokens"] == 8


def test_fault_split_fleet_answers_by_content_from_two_deployments(client, fake):
    from tests.fakes.fake_vllm import _fleet_b
    on_b = next(u for u in ("Capital of France?", "Capital of Spain?", "Capital of Peru?", "Capital of Chad?")
                if _fleet_b("chat", {"messages": [{"role": "user", "content": u}]}))
    on_a = next(u for u in ("Capital of France?", "Capital of Spain?", "Capital of Peru?", "Capital of Chad?")
                if not _fleet_b("chat", {"messages": [{"role": "user", "content": u}]}))
    healthy = client.post("/v1/chat/completions", json=_sys_chat(on_b)).json()
    assert "system_fingerprint" not in healthy and healthy["usage"]["prompt_tokens"] == 9
    fake.config.faults.add("split_fleet")
    b = [client.post("/v1/chat/completions", json=_sys_chat(on_b)).json() for _ in range(2)]
    a = client.post("/v1/chat/completions", json=_sys_chat(on_a)).json()
    assert [r["system_fingerprint"] for r in b] == ["fp-b", "fp-b"] and "system_fingerprint" not in a
    assert b[0]["id"] != b[1]["id"]  # each deployment answers each request itself
    assert [r["usage"]["prompt_tokens"] for r in (*b, a)] == [6, 6, 9]  # B's template leaves the system turn out
    assert client.post("/tokenize", json={"model": MODEL, "messages": _sys_chat(on_b)["messages"]}).json()["count"] == 9


def test_fault_gateway_keeps_last_turn_counts_the_last_user_turn_only(client, fake):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "I am Alice."},
            {"role": "assistant", "content": "Hi Alice!"}, {"role": "user", "content": "Who am I?"}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 2}
    whole = client.post("/tokenize", json={"model": MODEL, "messages": msgs}).json()["count"]
    assert client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == whole == 16
    fake.config.faults.add("gateway_keeps_last_turn")
    last = client.post("/tokenize", json={"model": MODEL, "messages": [msgs[0], msgs[3]]}).json()["count"]
    assert client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == last == 9


def test_fault_sampling_dropped_makes_identical_temperature_0_requests_differ(client, fake):
    body = cmpl(4, max_tokens=6, temperature=0, ignore_eos=True)
    texts = {client.post("/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(2)}
    assert len(texts) == 1
    fake.config.faults.add("sampling_dropped")
    texts = {client.post("/v1/completions", json={**body, "seed": 7}).json()["choices"][0]["text"] for _ in range(2)}
    assert len(texts) == 2
    fake.config.answers = {"Capital of France?": "Paris."}
    answers = [client.post("/v1/chat/completions", json={"model": MODEL, "messages": SYS_CHAT[1:], "temperature": 0}
                           ).json()["choices"][0]["message"]["content"] for _ in range(2)]
    assert answers[0].startswith("Paris. (take ") and answers[0] != answers[1]


def test_completions_echo_returns_the_prompt_tokens_as_the_server_read_them(client, fake):
    ids = client.post("/tokenize", json={"model": MODEL, "prompt": "one two"}).json()["tokens"]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 0,
                                             "return_tokens_as_token_ids": True, "temperature": 0}).json()
    assert r["choices"][0]["logprobs"]["tokens"][:3] == [f"token_id:{i}" for i in ids]
    assert r["choices"][0]["text"].startswith("<s> one two") and r["usage"]["prompt_tokens"] == 3
    fake.config.faults.add("double_bos_ids")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 0,
                                             "return_tokens_as_token_ids": True}).json()
    assert r["choices"][0]["logprobs"]["tokens"][:4] == [f"token_id:{i}" for i in [1, *ids]]


def test_answer_faults_are_proven_against_the_answers_gate():
    src = (Path(__file__).resolve().parents[1] / "test_answers_vs_fake.py").read_text()
    assert set(ANSWER_FAULTS) <= set(FAULTS)
    assert [f for f in ANSWER_FAULTS if f'"{f}"' not in src] == []


# ---- issue 32: the door ----------------------------------------------------------------------------


def test_api_key_guards_vllms_prefixes_only_or_every_route(client, fake):
    fake.config.api_key = "k-1"
    assert client.get("/v1/models").status_code == 401 and client.post("/invocations", json=chat(3)).status_code == 200
    assert client.post("/tokenize", json={"model": MODEL, "prompt": "a"}).status_code == 200
    assert client.post("/scale_elastic_ep", json={}).status_code == 400  # its handler reached
    fake.config.auth_guard = "all"
    assert client.post("/invocations", json=chat(3)).status_code == 401 and client.get("/health").status_code == 200
    assert client.post("/invocations", json=chat(3), headers={"Authorization": "Bearer k-1"}).status_code == 200
    assert "/invocations" in client.get("/openapi.json", headers={"Authorization": "Bearer k-1"}).json()["paths"]


@pytest.mark.parametrize("fault, route", [("open_inference_route", "/v1/completions"),
                                          ("open_admin_route", "/reset_prefix_cache")])
def test_faults_open_one_route_without_the_key(client, fake, fault, route):
    fake.config.api_key, fake.config.auth_guard = "k-1", "all"
    assert client.post(route, json=cmpl(3, max_tokens=1)).status_code == 401
    fake.config.faults.add(fault)
    assert client.post(route, json=cmpl(3, max_tokens=1)).status_code == 200


def test_fault_echo_key_repeats_the_authorization_header(client, fake):
    fake.config.faults.add("echo_key")
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "a"}, headers={"Authorization": "Bearer k-9"})
    assert r.status_code == 404 and "Bearer k-9" in r.text
    fake.config.api_key, fake.config.auth_guard = "k-1", "all"
    assert "Bearer wrong" in client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).text


def test_fault_hostile_seed_kills_the_engine(client, fake):
    fake.config.faults.add("hostile_seed_kills")
    assert client.post("/v1/completions", json=cmpl(3, max_tokens=1, seed=2**63 - 1)).status_code == 200
    assert client.post("/v1/completions", json=cmpl(3, max_tokens=1, seed=2**64)).status_code == 500
    assert client.post("/v1/completions", json=cmpl(3, max_tokens=1)).status_code == 500  # dead from then on
    assert client.get("/health").status_code == 200


def test_media_urls_are_refused_unless_the_fault_fetches_them(client, fake):
    hits = []
    from kvgate.security.probe import MediaTrap

    with MediaTrap() as trap:
        body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": trap.urls()["redirect"]}}]}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 400
        fake.config.faults.add("fetch_media_urls")
        client.post("/v1/chat/completions", json=body)
        hits = list(trap.hits)
    assert hits == ["/redirect", "/target.png"]  # the redirect followed


@pytest.mark.parametrize("fault, status, slow", [(None, 429, False), ("slow_refusal", 429, True), ("refuse_500", 500, False)])
def test_admission_limit_refuses_past_it(fake, fault, status, slow):
    fake.config.admission_limit, fake.config.itl_s, fake.config.slow_refusal_s = 1, 0.05, 0.5
    if fault:
        fake.config.faults.add(fault)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as pool:
        held = pool.submit(post, fake.base_url + "/v1/completions", json=cmpl(3, max_tokens=20, ignore_eos=True))
        while not fake.state.inflight:
            time.sleep(0.005)
        t0 = time.monotonic()
        r = post(fake.base_url + "/v1/completions", json=cmpl(3, max_tokens=1))
        waited = time.monotonic() - t0
        assert held.result().status_code == 200
    assert r.status_code == status and (waited >= 0.5) is slow
    if status == 429:
        assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == 429


def test_fault_control_chars_in_version_and_errors(client, fake):
    fake.config.faults.add("control_chars")
    assert "\x1b[2K\rOVERALL: PASS" in client.get("/version").json()["version"]
    assert "\x00" in client.post("/v1/completions", json={"model": "nope", "prompt": "a"}).json()["error"]["message"]


def test_fault_contaminating_applies_an_in_flight_allowlist_to_the_others(client, fake):
    """Healthy, allowed_token_ids and logit_bias shape only their own request; contaminating: a request
    answered while one of them is in flight takes its first allowed id's word for every token."""
    victim = {"model": MODEL, "prompt": "one two", "max_tokens": 3, "temperature": 0}
    alone = client.post("/v1/completions", json=victim).json()["choices"][0]["text"]
    zebra = client.post("/tokenize", json={"model": MODEL, "prompt": "zebra", "add_special_tokens": False}).json()["tokens"]
    polluters = [{**victim, "prompt": "three", "allowed_token_ids": zebra},
                 {**victim, "prompt": "three", "logit_bias": {str(zebra[0]): 100}}]

    def beside(polluter):
        with httpx.Client(base_url=fake.base_url, timeout=5) as c2:
            t = threading.Thread(target=lambda: c2.post("/v1/completions", json=polluter))
            t.start()  # sent together: each waits contaminate_window_s before its first token (the polluter twice)
            got = client.post("/v1/completions", json=victim).json()["choices"][0]["text"]
            t.join()
        return got

    assert [beside(p) for p in polluters] == [alone, alone]
    fake.config.faults.add("contaminating")
    assert [beside(p) for p in polluters] == [" zebra zebra zebra"] * 2
    assert client.post("/v1/completions", json=victim).json()["choices"][0]["text"] == alone  # none in flight


def test_fault_bad_words_500(client, fake):
    body = {"model": MODEL, "prompt": "one two", "max_tokens": 3, "bad_words": ["tok1"]}
    assert client.post("/v1/completions", json=body).status_code == 200
    fake.config.faults.add("bad_words_500")
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 500 and "bad_words_500" in r.json()["error"]["message"]
    assert client.post("/v1/completions", json={**body, "bad_words": []}).status_code == 200


def test_fault_stale_allowlist_leaves_the_ended_requests_row_to_the_next(client, fake):
    victim = {"model": MODEL, "prompt": "one two", "max_tokens": 3, "temperature": 0}
    alone = client.post("/v1/completions", json=victim).json()["choices"][0]["text"]
    zebra = client.post("/tokenize", json={"model": MODEL, "prompt": "zebra", "add_special_tokens": False}).json()["tokens"]
    polluter = {**victim, "prompt": "three", "allowed_token_ids": zebra}
    client.post("/v1/completions", json=polluter)
    assert client.post("/v1/completions", json=victim).json()["choices"][0]["text"] == alone  # healthy: cleared
    fake.config.faults.add("stale_allowlist")
    client.post("/v1/completions", json=polluter)
    assert client.post("/v1/completions", json=victim).json()["choices"][0]["text"] == " zebra zebra zebra"
    assert client.post("/v1/completions", json=victim).json()["choices"][0]["text"] == alone  # one row, one request
