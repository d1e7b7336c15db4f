"""The disconnect gate's cancellation storm (``disconnect/cancellation-storm``; vllm#46283, #50425:
requests cancelled while their KV was being built or moved leaked blocks until nothing was admitted,
with ``/metrics`` otherwise healthy). Observations only; :func:`kvgate.gates.disconnect.storm_verdict`
decides.

What is sent, all ``/completions``, streamed, greedy, each prompt with a prefix of its own (prefix
caching shares no block between them):

1. a **step probe**: one uncut stream of a *long* prompt (``long_tokens``, :func:`long_prompt_tokens`)
   and :data:`PROBE_TOKENS` tokens -- its time to first token is that prompt's prefill on this
   server, its event spacing the decode step (:func:`kvgate.http.probes.estimate_rate`). The release
   bound is ``max(floor_s, prefill + steps x step)`` seconds (:func:`release_bound`): a cancelled
   request's blocks are freed at the end of the engine step it was cut in, the longest being a
   prefill of that prompt.
2. the **storm**: ``k`` cancellations, dealt round-robin over :data:`STAGES` and sent stage by stage
   (a stage's requests at once, :func:`kvgate.load.open_loop`): ``before-first-byte`` (a short
   prompt, hung up :data:`EARLY_HANGUP_S` after sending), ``mid-prefill`` (a long prompt, hung up at
   half the probe's prefill), ``after-first-token`` (hung up after the first SSE event),
   ``mid-decode`` (hung up after :data:`DECODE_HANGUP_CHUNKS` events of ``decode_tokens``). After
   each stage ``vllm:kv_cache_usage_perc`` is polled back to the level the stage started from
   (within the bound, and still there two decode steps later -- a prefill later for mid-prefill --
   :func:`settled`; a stage that leaks leaves the next starting higher, so each stage's leak is its
   own).
3. a **max-context canary**: a prompt of ``max_model_len - CANARY_MAX_TOKENS`` tokens, sent with
   :func:`kvgate.http.probes.send_watched` (``waiting``/``running`` sampled while it is outstanding:
   a prompt the leaked pool cannot hold waits, never admitted).

A :class:`~kvgate.http.metrics.MetricsSampler` scrapes the KV usage across all of it, so the verdict
can tell a gauge that never moved (a return to baseline that proves nothing) from one that did.
Bounded: ``k`` <= 64 requests in 4 stages, each stage's requests and its poll within their deadlines,
the canary within its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import Endpoint, KvClient, StreamReply
from kvgate.http.metrics import GaugePoll, MetricsSampler, cache_config, parse, poll_gauge, scrape_value, MetricsError
from kvgate.http.probes import Exchange, QueueSample, build_prompt, estimate_rate, send, send_watched
from kvgate.http.prompts import ExactPrompt, PromptUnavailable
from kvgate.load import completion_request, open_loop

#: The staged moments of a cancellation, in the order they are sent.
STAGES = ("before-first-byte", "mid-prefill", "after-first-token", "mid-decode")
#: [s] a before-first-byte request is hung up this long after it was sent.
EARLY_HANGUP_S = 0.005
#: [events] a mid-decode request is hung up after this many SSE events.
DECODE_HANGUP_CHUNKS = 4
#: [tokens] the step probe's generation after its long prompt.
PROBE_TOKENS = 8
#: [tokens] the max-context canary's generation: its prompt is max_model_len minus this.
CANARY_MAX_TOKENS = 2
#: [s] one stage's requests (hung up early by design) must all end within this.
STAGE_DEADLINE_S = 30.0
#: [s] the least wait before a reached release is read again (:func:`settled`).
MIN_CONFIRM_S = 0.05
#: [fraction of the pool] the tolerance of "back to baseline" when the pool's block count is unknown.
DEFAULT_TOLERANCE = 1e-3


def long_prompt_tokens(max_model_len: int) -> int:
    """[tokens] the mid-prefill prompt: an eighth of ``max_model_len``, within 32..512 (and below
    ``max_model_len - 16``) -- long enough for its prefill to be hung up in, short enough to cost a
    CPU server well under a second (SmolLM2-135M on one core: ~3.5 ms a token)."""
    return max(1, min(max(32, max_model_len // 8), 512, max_model_len - 16))


def release_bound(prefill_s: float | None, step_s: float | None, steps: int, floor_s: float) -> float:
    """[s] how long a storm's cancelled KV may take to show as freed: ``max(floor_s, prefill_s +
    steps x step_s)`` (the engine step a request was cut in ends, then a few more for the
    scheduler and the gauge); ``floor_s`` alone when no step was measured."""
    if step_s is None:
        return floor_s
    return max(floor_s, (prefill_s or 0.0) + steps * step_s)


@dataclass(frozen=True)
class StepProbe:
    """The server's own step time: ``prefill_s`` the long prompt's time to first token, ``step_s``
    seconds per decode step (None with ``why`` when the events could not be timed), ``prompt_tokens``
    the long prompt's length, ``status`` the probe's HTTP status, ``kv_during`` the KV usage
    [fraction] read at its first token event (None: not read)."""

    prompt_tokens: int
    status: int
    prefill_s: float | None
    step_s: float | None
    why: str | None = None
    kv_during: float | None = None

    def evidence(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "status": self.status, "kv_during": self.kv_during,
                "prefill_s": None if self.prefill_s is None else round(self.prefill_s, 4),
                "step_s": None if self.step_s is None else round(self.step_s, 5), "why": self.why}


@dataclass
class StageResult:
    """One stage of the storm: ``stage`` (in :data:`STAGES`); ``moments`` where each of its requests
    really was when the client let go (:func:`moment`); ``before`` the KV usage [fraction] when it
    began; ``poll`` the KV usage polled back to ``before`` + tolerance (None without the gauge)."""

    stage: str
    moments: list[str]
    before: float | None
    poll: GaugePoll | None

    @property
    def cut(self) -> int:
        """Requests really cancelled (the client hung up before they completed)."""
        return sum(1 for m in self.moments if m.startswith(("before", "after")))

    @property
    def after(self) -> float | None:
        return self.poll.last if self.poll is not None else None

    @property
    def leaked(self) -> bool:
        return self.poll is not None and not self.poll.reached

    def evidence(self) -> dict[str, Any]:
        return {"stage": self.stage, "moments": self.moments, "kv_before": self.before, "kv_after": self.after,
                "released": None if self.poll is None else self.poll.reached,
                "elapsed_s": None if self.poll is None else round(self.poll.elapsed_s, 3),
                "samples": None if self.poll is None else self.poll.samples[-20:]}


@dataclass
class StormObservation:
    """A cancellation storm: ``baseline`` KV usage [fraction of the pool] before it (None: the
    server's ``/metrics`` has no ``vllm:kv_cache_usage_perc``/``gpu_cache_usage_perc``; ``metrics``
    whether ``/metrics`` answered at all); ``tolerance`` [fraction] of "back to baseline" (half a
    block where ``vllm:cache_config_info`` gives ``num_gpu_blocks``); ``probe`` the step probe;
    ``bound_s`` the release bound (``steps``, ``floor_s`` what it was sized from); ``stages``;
    ``probe_release`` the KV usage polled back to baseline after the (uncut) step probe; ``final`` the
    KV usage after the last stage; ``peak`` the highest KV usage sampled across the
    storm and the canary (the step probe's read at its first token included); ``canary`` the max-context canary and ``canary_queue`` the scheduler gauges
    while it was outstanding; ``canary_deadline_s`` its deadline."""

    k: int
    baseline: float | None
    metrics: bool
    tolerance: float
    probe: StepProbe | None
    bound_s: float
    steps: int
    floor_s: float
    stages: list[StageResult] = field(default_factory=list)
    final: float | None = None
    peak: float | None = None
    canary: Exchange | None = None
    canary_queue: list[QueueSample] = field(default_factory=list)
    canary_deadline_s: float = 0.0
    canary_error: str | None = None
    num_gpu_blocks: int | None = None
    probe_release: GaugePoll | None = None

    @property
    def cut(self) -> int:
        return sum(s.cut for s in self.stages)


def moment(rec: Any) -> str:
    """Where a storm request was when the client let go, from its record
    (:class:`kvgate.load.record.RequestRecord`, finalized): ``before the first byte``, ``before the
    first token`` (headers, no token), ``after N token events``; ``completed`` when it ended before
    the hang-up; ``error: ...``."""
    if rec.hung_up:
        if rec.first_byte_s is None:
            return "before the first byte"
        n = len(rec.content_s)
        return "before the first token" if n == 0 else f"after {n} token event{'s' if n != 1 else ''}"
    if rec.error:
        return f"error: {rec.error}"[:160]
    return "completed" if 200 <= rec.status < 300 else f"error: HTTP {rec.status}"


def settled(fetch: Callable[[], str | None], target: float, bound_s: float, confirm_s: float, *,
            clock: Callable[[], float], sleep: Callable[[float], None]) -> GaugePoll:
    """The KV usage polled down to ``target`` [fraction] within ``bound_s`` seconds
    (:func:`kvgate.http.metrics.poll_gauge`), and still there ``confirm_s`` seconds later: the gauge
    is published once per engine step, so a read taken while a cut request's step is still running
    (a prefill) shows the pool as it was before that request. Reached: ``elapsed_s`` is the first
    of the two reads. Bounded: at most ``bound_s + confirm_s`` seconds of polls."""
    t0 = clock()
    samples: list[tuple[float, float | None]] = []
    for _ in range(int(bound_s / max(confirm_s, MIN_CONFIRM_S)) + 2):
        left = bound_s - (clock() - t0)
        poll = poll_gauge(fetch, "kv_usage", target, max(0.0, left), clock=clock, sleep=sleep)
        at = clock() - t0 - poll.elapsed_s
        samples += [(round(at + t, 4), v) for t, v in poll.samples]
        if not poll.reached:
            return GaugePoll("kv_usage", target, False, samples, clock() - t0)
        reached_s = at + poll.elapsed_s
        sleep(confirm_s)
        value = _kv(fetch())
        samples.append((round(clock() - t0, 4), value))
        if value is not None and value <= target:
            return GaugePoll("kv_usage", target, True, samples, reached_s)
        if clock() - t0 >= bound_s:
            break
    return GaugePoll("kv_usage", target, False, samples, clock() - t0)


def _probe(client: KvClient, scraper: KvClient, model: str, prompt: ExactPrompt, timeout_s: float) -> StepProbe:
    """The step probe; at its first token event ``scraper`` reads the KV usage while the probe still
    decodes (``kv_during``: the gauge moving, whatever the background sampler's timing caught)."""
    seen: dict[str, float | None] = {}

    def first_token(t: float, data: str) -> None:
        if "kv" not in seen and data.strip() != "[DONE]":
            seen["kv"] = _kv(scraper.metrics_text())

    ex = send(client, "completions", prompt.body(model, max_tokens=PROBE_TOKENS, temperature=0, ignore_eos=True),
              stream=True, timeout_s=timeout_s, prompt_tokens=prompt.tokens, on_event=first_token)
    r = ex.reply
    during = seen.get("kv")
    if not isinstance(r, StreamReply) or r.status != 200:
        return StepProbe(prompt.tokens, r.status, None, None, f"the step probe answered {r.status}", during)
    times = [t for t, d in r.events if d.strip() != "[DONE]"]
    if not times:
        return StepProbe(prompt.tokens, r.status, None, None, "the step probe streamed no token event", during)
    rate = estimate_rate(times)
    return StepProbe(prompt.tokens, r.status, times[0], 1.0 / rate.tps if rate.tps else None, rate.why, during)


def _kv(text: str | None) -> float | None:
    return scrape_value(text, "kv_usage")


def _blocks(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        cc = cache_config(parse(text))
    except MetricsError:
        return None
    try:
        return int(cc["num_gpu_blocks"]) if cc and cc.get("num_gpu_blocks") not in (None, "None") else None
    except ValueError:
        return None


def run_storm(client: KvClient, endpoint: Endpoint, model: str, *, max_model_len: int, k: int, steps: int,
              floor_s: float, canary_deadline_s: float, decode_tokens: int = 32,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              sampler_interval_s: float = 0.1) -> StormObservation:
    """Run the storm (module docstring) and return what was seen. ``k``: cancellations (4..64);
    ``steps``/``floor_s``: the release bound's size (:func:`release_bound`); ``decode_tokens``: the
    short requests' ``max_tokens`` (the deployment's cap or less: a mid-decode request must still be
    decoding when it is hung up); ``canary_deadline_s`` [s]: the max-context canary's deadline.
    ``clock``/``sleep``: the gauge polls' (tests inject them). Without ``vllm:kv_cache_usage_perc``
    nothing is sent but the canary (the verdict SKIPs saying so, or FAILs on the canary)."""
    if not 4 <= k <= 64:
        raise ValueError(f"cancellations must be 4..64, got {k}")
    text = client.metrics_text()
    baseline = _kv(text)
    blocks = _blocks(text)
    tol = 0.5 / blocks if blocks else DEFAULT_TOLERANCE
    obs = StormObservation(k, baseline, text is not None, tol, None, floor_s, steps, floor_s, num_gpu_blocks=blocks,
                           canary_deadline_s=canary_deadline_s)
    own, scraper = KvClient(endpoint, timeout_s=10.0), KvClient(endpoint, timeout_s=10.0)  # a pool per thread
    sampler = MetricsSampler(own.metrics_text, interval_s=sampler_interval_s,
                             max_samples=2000) if baseline is not None else None
    if sampler is not None:
        sampler.start()
    try:
        if baseline is not None:
            _storm(client, scraper, endpoint, model, obs, max_model_len, decode_tokens, clock, sleep)
        _canary(client, model, obs, max_model_len)
    finally:
        if sampler is not None:
            obs.peak = sampler.stop().peak("kv_usage")
        own.close()
        scraper.close()
    during = obs.probe.kv_during if obs.probe is not None else None
    if during is not None:
        obs.peak = during if obs.peak is None else max(obs.peak, during)
    return obs


def _storm(client: KvClient, scraper: KvClient, endpoint: Endpoint, model: str, obs: StormObservation,
           max_model_len: int, decode_tokens: int, clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    long_n = long_prompt_tokens(max_model_len)
    probe = _probe(client, scraper, model,
                   build_prompt(client, model, "completions", long_n, prefix="storm probe: "), STAGE_DEADLINE_S)
    obs.probe = probe
    obs.bound_s = release_bound(probe.prefill_s, probe.step_s, obs.steps, obs.floor_s)
    # the probe's own KV back first: the storm's baseline is an idle pool
    first = poll_gauge(client.metrics_text, "kv_usage", obs.baseline + obs.tolerance, obs.bound_s,
                       clock=clock, sleep=sleep)
    obs.probe_release = first
    prefill_cut = max(EARLY_HANGUP_S, (probe.prefill_s or 0.0) / 2)
    per_stage = {s: obs.k // len(STAGES) + (1 if i < obs.k % len(STAGES) else 0) for i, s in enumerate(STAGES)}
    short = max(DECODE_HANGUP_CHUNKS + 2, decode_tokens)
    for stage in STAGES:
        specs = []
        for i in range(per_stage[stage]):
            prefix = f"storm {stage} {i}: "
            if stage == "mid-prefill":
                p = build_prompt(client, model, "completions", long_n, prefix=prefix)
                specs.append(completion_request(endpoint, model=model, prompt=p.body(model)["prompt"], max_tokens=short,
                                                include_usage=False, hangup_after_s=prefill_cut, temperature=0,
                                                ignore_eos=True, tag=stage))
            else:
                kw: dict[str, Any] = ({"hangup_after_s": EARLY_HANGUP_S} if stage == "before-first-byte" else
                                      {"hangup_after_chunks": 1} if stage == "after-first-token" else
                                      {"hangup_after_chunks": DECODE_HANGUP_CHUNKS})
                specs.append(completion_request(endpoint, model=model, prompt=f"{prefix}kv cache canary",
                                                max_tokens=short, include_usage=False, temperature=0,
                                                ignore_eos=True, tag=stage, **kw))
        before = _kv(client.metrics_text())
        result = open_loop(endpoint, specs, offsets_s=[0.0] * len(specs), deadline_s=STAGE_DEADLINE_S,
                           loop_monitor_s=None, freeze_gc=False)
        moments = [moment(r.finalize()) for r in sorted(result.records, key=lambda r: r.index)]
        poll = None
        if before is not None:
            step = probe.step_s or 0.0
            confirm = max(MIN_CONFIRM_S, 2 * step, (probe.prefill_s or 0.0) if stage == "mid-prefill" else 0.0)
            poll = settled(client.metrics_text, before + obs.tolerance, obs.bound_s, confirm, clock=clock, sleep=sleep)
        obs.stages.append(StageResult(stage, moments, before, poll))
    obs.final = _kv(client.metrics_text())


def _canary(client: KvClient, model: str, obs: StormObservation, max_model_len: int) -> None:
    n = max(1, max_model_len - CANARY_MAX_TOKENS)
    try:
        p = build_prompt(client, model, "completions", n, prefix="storm canary: ")
    except PromptUnavailable as exc:  # the canary's absence is evidence
        obs.canary_error = f"the max-context canary could not be built: {exc}"[:200]
        return
    obs.canary, obs.canary_queue = send_watched(
        client, "completions", p.body(model, max_tokens=CANARY_MAX_TOKENS, temperature=0, ignore_eos=True),
        deadline_s=obs.canary_deadline_s, poll_s=min(0.5, obs.canary_deadline_s / 4), prompt_tokens=p.tokens)
