"""compressed-tensors checkpoints written by hand in llm-compressor's format (no
llm-compressor in the venv): config.json's ``quantization_config`` for a W8A8 recipe and the
tensors it stores, quantized here in numpy (tests/engine/test_quantized_checkpoints.py,
tests/unit/test_compressed_tensors.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

# (our leaf, Hugging Face module, GGUF tensor, layout of name_map)
PROJECTIONS = {
    ("attn", "q"): ("self_attn.q_proj", "attn_q", "heads_in"),
    ("attn", "k"): ("self_attn.k_proj", "attn_k", "heads_in"),
    ("attn", "v"): ("self_attn.v_proj", "attn_v", "heads_in"),
    ("attn", "o"): ("self_attn.o_proj", "attn_output", "heads_out"),
    ("mlp", "gate"): ("mlp.gate_proj", "ffn_gate", "transpose"),
    ("mlp", "up"): ("mlp.up_proj", "ffn_up", "transpose"),
    ("mlp", "down"): ("mlp.down_proj", "ffn_down", "transpose"),
}


def compressed_config(kind: str) -> dict:
    """config.json's quantization_config as llm-compressor writes a W8A8 recipe."""
    args = {"num_bits": 8, "type": kind, "symmetric": True, "group_size": None,
            "block_structure": None, "actorder": None, "observer_kwargs": {}}  # fmt: skip
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized" if kind == "int" else "float-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "version": "0.9.0",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**args, "strategy": "channel", "dynamic": False,
                            "observer": "minmax"},
                "input_activations": {**args, "strategy": "token", "dynamic": True,
                                      "observer": None},
                "output_activations": None,
            }
        },
    }  # fmt: skip


def write_compressed(model_dir: Path, target: Path, kind: str) -> tuple[Path, Path, dict]:
    """(the compressed-tensors directory, a float directory of the same weights dequantized,
    the stored {name: (values, scale)}), quantized here in numpy: one scale per output
    channel, symmetric (int: round to int8, max 127; float: e4m3, max 448; scale in bf16 for
    float as llm-compressor keeps the model's dtype)."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    dense, stored = dict(tensors), {}
    for name, weight in tensors.items():
        if not any(f".{module}.weight" in name for module, _, _ in PROJECTIONS.values()):
            continue
        amax = np.abs(weight).max(axis=1, keepdims=True)  # [out, 1]
        if kind == "int":
            scale = (amax / 127).astype(np.float32)
            values = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
        else:
            scale = (amax / 448).astype(ml_dtypes.bfloat16)
            values = (weight / scale.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
        stored[name] = (values, scale)
        dense[name] = values.astype(np.float32) * scale.astype(np.float32)
    quantized = {**tensors}
    for name, (values, scale) in stored.items():
        quantized[name], quantized[name + "_scale"] = values, scale
    config = json.loads((model_dir / "config.json").read_text())
    shutil.copytree(model_dir, target / "dense")
    save_file(dense, str(target / "dense" / "model.safetensors"))
    (target / "q").mkdir()
    save_file(quantized, str(target / "q" / "model.safetensors"))
    config["quantization_config"] = compressed_config(kind)
    (target / "q" / "config.json").write_text(json.dumps(config))
    return target / "q", target / "dense", stored
