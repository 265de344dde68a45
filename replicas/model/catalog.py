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

_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rope_theta": 1000000.0}
_LLAMA3 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "num_key_value_heads": 8,
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


HF_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    "Qwen3-0.6B": {
        **_QWEN3,
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **_QWEN3,
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
    "Llama-3.2-1B": {
        **_LLAMA3,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_scaling": _llama3_rope(32.0),
    },
    "Llama-3.1-8B": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "rope_scaling": _llama3_rope(8.0),
    },
    "Llama-3.1-70B": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "rope_scaling": _llama3_rope(8.0),
    },
}


def hf_config(values: Mapping[str, Any]) -> Any:
    """A transformers config object from ``config.json`` values."""
    from transformers import AutoConfig

    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def model_config(name_or_path: str) -> ModelConfig:
    """A catalog name (``HF_CONFIGS``) or the path of a ``config.json`` (or its folder)."""
    if name_or_path in HF_CONFIGS:
        return config_from_hf(hf_config(HF_CONFIGS[name_or_path]))
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"model: {name_or_path!r} is neither a known config ({', '.join(HF_CONFIGS)}) "
            "nor a config.json"
        )
    return config_from_hf(hf_config(json.loads(path.read_text())))
