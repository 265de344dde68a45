"""Production model architectures by name, as their Hugging Face ``config.json`` values.

Written by hand (no download): shapes for deviceless compiles (``planning.tpu_check``),
benchmarks on random weights and shape tests. ``model_config`` also reads any local
``config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replicas.model.config import ModelConfig, config_from_hf
from replicas.model.pooling_config import pooling_head_for

_QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
}
_LLAMA3 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
_MISTRAL = {
    "model_type": "mistral",
    "architectures": ["MistralForCausalLM"],
    "vocab_size": 32000,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}

_GEMMA2 = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "vocab_size": 256000,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
_GEMMA3 = {  # text towers; 4B and up: 262208 tokens, window 1024, global RoPE scaled 8x
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "vocab_size": 262208,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }


def _sized(base: Mapping[str, Any], *shape: int, **changes: Any) -> dict[str, Any]:
    """``base`` with (hidden, MLP width, layers, heads, kv heads) and other ``changes``."""
    names = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    names += ("num_key_value_heads",)
    return {**base, **dict(zip(names, shape, strict=True)), **changes}


HF_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    "Qwen3-0.6B": _sized(_QWEN3, 1024, 3072, 28, 16, 8, tie_word_embeddings=True),
    "Qwen3-8B": _sized(_QWEN3, 4096, 12288, 36, 32, 8, tie_word_embeddings=False),
    "Llama-3.2-1B": _sized(
        _LLAMA3, 2048, 8192, 16, 32, 8, head_dim=64, tie_word_embeddings=True,
        rope_scaling=_llama3_rope(32.0),
    ),
    "Llama-3.1-8B": _sized(_LLAMA3, 4096, 14336, 32, 32, 8, rope_scaling=_llama3_rope(8.0)),
    "Llama-3.1-70B": _sized(_LLAMA3, 8192, 28672, 80, 64, 8, rope_scaling=_llama3_rope(8.0)),
    "Mistral-7B-v0.1": _sized(_MISTRAL, 4096, 14336, 32, 32, 8),
    "Gemma-2-2B": _sized(_GEMMA2, 2304, 9216, 26, 8, 4),
    "Gemma-2-9B": _sized(_GEMMA2, 3584, 14336, 42, 16, 8),
    "Gemma-2-27B": _sized(
        _GEMMA2, 4608, 36864, 46, 32, 16, head_dim=128, query_pre_attn_scalar=144
    ),
    "Gemma-3-1B": _sized(
        _GEMMA3, 1152, 6912, 26, 4, 1, vocab_size=262144, sliding_window=512, rope_scaling=None,
        max_position_embeddings=32768,
    ),
    "Gemma-3-4B": _sized(_GEMMA3, 2560, 10240, 34, 8, 4),
    "Gemma-3-12B": _sized(_GEMMA3, 3840, 15360, 48, 16, 8),
    "Gemma-3-27B": _sized(
        _GEMMA3, 5376, 21504, 62, 32, 16, head_dim=128, query_pre_attn_scalar=168
    ),
}  # fmt: skip
# Embedding models (semantics 20): their base models (no LM head), last-token pooled.
HF_CONFIGS["Qwen3-Embedding-0.6B"] = {**HF_CONFIGS["Qwen3-0.6B"], "architectures": ["Qwen3Model"]}
HF_CONFIGS["Qwen3-Embedding-8B"] = {**HF_CONFIGS["Qwen3-8B"], "architectures": ["Qwen3Model"]}


def hf_config(values: Mapping[str, Any]) -> Any:
    """A transformers config object from ``config.json`` values."""
    from transformers import AutoConfig

    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def model_config(name_or_path: str) -> ModelConfig:
    """A catalog name (``HF_CONFIGS``) or the path of a ``config.json`` (or its folder)."""
    if name_or_path in HF_CONFIGS:
        return _with_pooling(hf_config(HF_CONFIGS[name_or_path]), None)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"model: {name_or_path!r} is neither a known config ({', '.join(HF_CONFIGS)}) "
            "nor a config.json"
        )
    return _with_pooling(hf_config(json.loads(path.read_text())), path.parent)


def _with_pooling(hf: Any, directory: Path | None) -> ModelConfig:
    """The ModelConfig, with its PoolingHead for an embedding model (a base model, or a
    sentence-transformers directory)."""
    return config_from_hf(hf).replace(pooling=pooling_head_for(directory, hf))
