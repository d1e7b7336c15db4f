"""Read a Hugging Face ``config.json`` into a profile's ``model:`` section.

:func:`model_from_hf_config` parses the file with ``transformers``' own config class for its
``model_type`` (``AutoConfig.for_model``), so derived values are the ones vLLM sees: Gemma 2/3's
and gpt-oss's ``layer_types`` (computed from ``sliding_window_pattern`` when the file has none),
Qwen's ``sliding_window = None`` unless ``use_sliding_window``, a default ``head_dim``. A
multimodal config (Gemma 3 ``Gemma3ForConditionalGeneration``) contributes its text config.
Unknown model types are read as plain attributes (``PretrainedConfig``).

Which layers slide follows vLLM 0.32 ``engine/arg_utils.py::create_engine_config``: with no
``layer_types`` (or all ``sliding_attention``) every layer uses ``sliding_window`` (Mistral);
otherwise each layer follows its ``layer_types`` entry (``model_executor/models/gemma3.py``,
``gpt_oss.py``, ``llama.py``). MLA (DeepSeek-V2/V3, ``kv_lora_rank`` set) caches one latent of
``kv_lora_rank + qk_rope_head_dim`` per token and layer (``MLAAttentionSpec``).

The result carries ``architecture.sources``: for each number, the ``config.json`` key it came
from (``"config.json num_key_value_heads"``) or how it was derived; the fit table prints them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["HfConfigError", "model_from_hf_config", "read_hf_config"]


class HfConfigError(ValueError):
    """A ``config.json`` could not be read or lacks a number kvgate needs. ``str()`` names the
    file and the missing key."""


def read_hf_config(path: str | Path) -> Any:
    """Parse ``path`` (a ``config.json``, or a directory holding one) with ``transformers``.

    Returns the *text* config object (``get_text_config()`` for multimodal models). Raises
    :class:`HfConfigError` naming the file when it is missing or not JSON.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise HfConfigError(f"{p}: hf_config file not found") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise HfConfigError(f"{p}: not a readable JSON config.json ({exc})") from None
    if not isinstance(data, dict):
        raise HfConfigError(f"{p}: config.json must be a JSON object, got {type(data).__name__}")
    from transformers import AutoConfig, PretrainedConfig  # heavy import: only when a profile names a file

    model_type = data.get("model_type")
    kwargs = {k: v for k, v in data.items() if k != "model_type"}
    if "torch_dtype" in kwargs and "dtype" not in kwargs:  # transformers 5 name; the old one warns
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs) if model_type else PretrainedConfig(**kwargs)
    except ValueError:
        cfg = PretrainedConfig(**kwargs)  # a model_type this transformers does not know: raw attributes
    except Exception as exc:  # noqa: BLE001 - a config class rejecting its own values
        raise HfConfigError(f"{p}: transformers rejected config.json ({type(exc).__name__}: {exc})") from None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    object.__setattr__(text, "_kvgate_file", str(p))
    object.__setattr__(text, "_kvgate_raw", data.get("text_config", data) if isinstance(data.get("text_config"), dict) else data)
    return text


def _get(cfg: Any, *names: str) -> tuple[Any, str | None]:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value, name
    return None, None


def _origin(cfg: Any, name: str | None) -> str:
    """``config.json NAME`` when the file has the key, else the config class's default."""
    if name in cfg._kvgate_raw or (name == "dtype" and "torch_dtype" in cfg._kvgate_raw):
        return f"config.json {'torch_dtype' if name == 'dtype' and 'torch_dtype' in cfg._kvgate_raw else name}"
    return f"{type(cfg).__name__} default {name}"


def _require(cfg: Any, file: str, *names: str) -> tuple[Any, str]:
    value, name = _get(cfg, *names)
    if value is None:
        raise HfConfigError(f"{file}: config.json has no {' / '.join(names)} (needed for the KV arithmetic)")
    return value, name  # type: ignore[return-value]


def model_from_hf_config(path: str | Path) -> dict[str, Any]:
    """The profile ``model:`` fields a HF ``config.json`` determines.

    Returns ``{"dtype": str, "architecture": {...}}`` where ``architecture`` has the keys of
    :class:`kvgate.profile.models.Architecture`: ``model_type``, ``layers``, ``attention_heads``, ``kv_heads``,
    ``head_dim``, ``hidden_size``, ``vocab_size``, ``intermediate_size``,
    ``max_position_embeddings``, ``attention`` (``mha``/``gqa``/``mqa``/``mla``), ``layer_types``
    (one of ``full_attention``/``sliding_attention``/``chunked_attention`` per layer),
    ``sliding_window`` and ``attention_chunk_size`` (tokens), MLA ``kv_lora_rank``,
    ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``, MoE
    ``num_experts``, ``experts_per_token``, ``moe_intermediate_size``, ``shared_experts``,
    ``first_dense_layers``, and ``sources`` (key -> where the number came from). Keys whose value
    the file does not give are left out. ``dtype`` is ``torch_dtype``/``dtype`` (``bfloat16`` if
    absent; its source is ``architecture.sources["dtype"]``).

    Raises :class:`HfConfigError` naming the file and the missing key (layers, heads).
    """
    cfg = read_hf_config(path)
    file = cfg._kvgate_file
    src: dict[str, str] = {}
    arch: dict[str, Any] = {}

    def put(key: str, value: Any, how: str) -> None:
        if value is not None:
            arch[key] = value
            src[key] = how

    def take(key: str, *names: str, required: bool = False) -> Any:
        value, name = _require(cfg, file, *names) if required else _get(cfg, *names)
        put(key, value, _origin(cfg, name))
        return value

    layers = take("layers", "num_hidden_layers", "n_layer", "num_layers", required=True)
    take("model_type", "model_type")
    heads = take("attention_heads", "num_attention_heads", "n_head", required=True)
    kv, kv_name = _get(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    if kv is None and getattr(cfg, "multi_query", False):
        kv, kv_name = 1, "multi_query"
    if kv is None:
        put("kv_heads", heads, "= attention_heads (config.json has no num_key_value_heads)")
        kv = heads
    else:
        put("kv_heads", kv, _origin(cfg, kv_name))
    hidden = take("hidden_size", "hidden_size", "n_embd", "d_model")
    hd, hd_name = _get(cfg, "head_dim")
    if hd is not None:
        put("head_dim", hd, _origin(cfg, hd_name))
    elif hidden is not None:
        put("head_dim", hidden // heads, "hidden_size / num_attention_heads")
    else:
        raise HfConfigError(f"{file}: config.json has no head_dim and no hidden_size to derive it from")
    take("vocab_size", "vocab_size")
    take("intermediate_size", "intermediate_size", "ffn_dim", "n_inner")
    take("max_position_embeddings", "max_position_embeddings", "n_positions")

    kv_lora = getattr(cfg, "kv_lora_rank", None)
    if kv_lora:
        arch["attention"], src["attention"] = "mla", "config.json kv_lora_rank is set"
        take("kv_lora_rank", "kv_lora_rank")
        take("qk_rope_head_dim", "qk_rope_head_dim", required=True)
        take("qk_nope_head_dim", "qk_nope_head_dim")
        take("v_head_dim", "v_head_dim")
        take("q_lora_rank", "q_lora_rank")
    elif kv == 1 and heads > 1:
        arch["attention"], src["attention"] = "mqa", "1 KV head"
    elif kv == heads:
        arch["attention"], src["attention"] = "mha", "KV heads = attention heads"
    else:
        arch["attention"], src["attention"] = "gqa", f"{kv} KV heads < {heads} attention heads"

    window = getattr(cfg, "sliding_window", None)
    chunk = getattr(cfg, "attention_chunk_size", None)
    layer_types = getattr(cfg, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and layer_types:
        kinds = [str(t) for t in layer_types][:layers]
        if len(kinds) != layers:
            raise HfConfigError(f"{file}: layer_types has {len(layer_types)} entries for {layers} layers")
        kinds = [k if k in ("sliding_attention", "chunked_attention") else "full_attention" for k in kinds]
        if window is None:
            kinds = ["full_attention" if k == "sliding_attention" else k for k in kinds]
        if chunk is None:
            kinds = ["full_attention" if k == "chunked_attention" else k for k in kinds]
        if any(k != "full_attention" for k in kinds):
            how = ("config.json layer_types" if "layer_types" in cfg._kvgate_raw
                   else f"{type(cfg).__name__} layer_types (derived)")
            put("layer_types", kinds, how)
            if "sliding_attention" in kinds:
                take("sliding_window", "sliding_window")
            if "chunked_attention" in kinds:
                take("attention_chunk_size", "attention_chunk_size")
    elif window:
        put("layer_types", ["sliding_attention"] * layers, "config.json sliding_window, no layer_types: every layer")
        take("sliding_window", "sliding_window")

    experts = take("num_experts", "n_routed_experts", "num_local_experts", "num_experts")
    if experts:
        take("experts_per_token", "num_experts_per_tok", "num_experts_per_token", "moe_top_k")
        take("moe_intermediate_size", "moe_intermediate_size")
        take("shared_experts", "n_shared_experts")
        take("first_dense_layers", "first_k_dense_replace")

    dtype, dtype_name = _get(cfg, "dtype", "torch_dtype")
    dtype_s = str(dtype).replace("torch.", "") if dtype is not None else "bfloat16"
    src["dtype"] = _origin(cfg, dtype_name) if dtype_name else "not in config.json: bfloat16"
    arch["sources"] = src
    return {"dtype": dtype_s, "architecture": arch}
