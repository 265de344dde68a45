"""Tiny random-weight checkpoints of each family, a GGUF writer, and both forward passes.

Weights are drawn large enough (not transformers' 0.02 init) that the logits are far from
uniform, norm scales and biases are random too, so a wrong layout or permutation cannot hide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 500000.0,
}
GEMMA2 = {
    "head_dim": 16,
    "query_pre_attn_scalar": 24,
    "sliding_window": 4,
    "attn_logit_softcapping": 5.0,
    "final_logit_softcapping": 8.0,
    "layer_types": ["sliding_attention", "full_attention"],
}
GEMMA3 = {
    "head_dim": 16,
    "num_hidden_layers": 3,
    "query_pre_attn_scalar": 24,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}
# name -> (transformers config class, overrides of TINY)
TINY_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True}),
    # head_dim 32: a GGUF's Q8_0 blocks of 32 along H * Dh are int8_weight's blocks along Dh
    "llama-hd32": ("LlamaConfig", {"tie_word_embeddings": True, "head_dim": 32}),
    "llama3-untied": ("LlamaConfig", {"tie_word_embeddings": False, "rope_scaling": LLAMA3_ROPE}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False, "rope_theta": 1e6}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
    # 6 query heads over 3 kv heads: kv_heads cannot be split over a model axis of 2
    "llama-kv3": (
        "LlamaConfig",
        {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3},
    ),
    # Windows of 4-5 tokens (sequences of 12 cross them); soft-caps small enough to bite.
    "mistral": ("MistralConfig", {"tie_word_embeddings": False, "sliding_window": 5}),
    "gemma2": ("Gemma2Config", GEMMA2),
    # What a GGUF can say: llama.cpp's query scale (head_dim ** -0.5), alternating layers.
    "gemma2-gguf": ("Gemma2Config", {**GEMMA2, "query_pre_attn_scalar": 16}),
    "gemma3": ("Gemma3TextConfig", GEMMA3),
    # What a GGUF can say: llama.cpp's query scale, layer kinds by Gemma 3's pattern (five
    # windowed, then a global one), the global layers' linear RoPE factor in the metadata.
    "gemma3-gguf": (
        "Gemma3TextConfig",
        {**GEMMA3, "num_hidden_layers": 6, "layer_types": None, "query_pre_attn_scalar": 16},
    ),
}


def tiny_hf_config(variant: str) -> Any:
    import transformers

    class_name, overrides = TINY_VARIANTS[variant]
    return getattr(transformers, class_name)(**{**TINY, **overrides})


def randomize_(model: Any, seed: int) -> None:
    """Every parameter random: matrices N(0, 1/fan_in), norms 1 + N(0, 0.04), biases N(0, 0.04);
    embeddings and LM head scaled so log-probs spread over several nats."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.2 * noise)
            elif "embed_tokens" in name:  # tied: logits ~ 3 * N(0, 1), like a trained model
                param.copy_(0.4 * noise)
            elif "lm_head" in name:
                param.copy_(3.0 * noise / param.shape[-1] ** 0.5)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5)


def save_tiny(variant: str, directory: Path, seed: int = 0, **save_kwargs: Any) -> Path:
    """A tiny model of ``variant`` saved with save_pretrained(safe_serialization=True)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(variant), dtype=torch.float32)
    randomize_(model, seed)
    model.save_pretrained(directory, safe_serialization=True, **save_kwargs)
    return directory


def batch(vocab: int, lengths: list[int], width: int, seed: int = 0) -> np.ndarray:
    """[B, width] int32 right-padded token ids (pad id 0), one row per length."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), width), np.int32)
    for row, length in enumerate(lengths):
        tokens[row, :length] = rng.integers(1, vocab, length)
    return tokens


def hf_logprobs(model_dir: Path, tokens: np.ndarray, lengths: list[int], **kw: Any) -> np.ndarray:
    """transformers fp32 log-softmax [B, T, V] of a right-padded batch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **kw).eval()
    attention_mask = (np.arange(tokens.shape[1])[None] < np.array(lengths)[:, None]).astype(int)
    with torch.no_grad():
        logits = model(
            input_ids=torch.from_numpy(tokens.astype(np.int64)),
            attention_mask=torch.from_numpy(attention_mask),
        ).logits
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def our_logprobs(
    loaded: Any, tokens: np.ndarray, lengths: list[int], log_softmax: bool = True
) -> np.ndarray:
    """Our log-softmax (or raw logits) [B, T, V]: causal + right-padding mask built with jnp."""
    import jax
    import jax.numpy as jnp

    from replicas.model.causal_lm import AttentionSpec

    model, width = loaded.model, tokens.shape[1]

    @jax.jit
    def forward(params: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        idx = jnp.arange(width)
        valid = idx[None, :] < lengths[:, None]  # [B, T]
        mask = (idx[None, :, None] >= idx[None, None, :]) & valid[:, None, :]  # [B, T, T]
        positions = jnp.broadcast_to(idx, tokens.shape)
        hidden = model.hidden_states(params, tokens, positions, AttentionSpec(mask=mask))
        logits = model.logits(params, hidden)
        return jax.nn.log_softmax(logits, axis=-1) if log_softmax else logits

    out = forward(loaded.params, jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32))
    return np.asarray(out)


def max_valid_diff(a: np.ndarray, b: np.ndarray, lengths: list[int]) -> float:
    """Max abs difference over the non-padding positions of [B, T, V] arrays."""
    return max(float(np.abs(a[i, :n] - b[i, :n]).max()) for i, n in enumerate(lengths))


def write_gguf(model_dir: Path, path: Path, qtype_name: str = "F32") -> Path:
    """Write a Hugging Face checkpoint as GGUF the way llama.cpp's converter does.

    Names come from gguf's own tensor map (not ours), llama q/k rows are permuted for
    llama.cpp's RoPE, 2-D weights are stored as ``qtype_name`` and 1-D tensors as F32.
    """
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    from replicas.checkpoints.gguf_loading import permute_qk

    config = AutoConfig.from_pretrained(str(model_dir))
    arch_name = config.model_type.removesuffix("_text")  # gemma3_text: llama.cpp's gemma3
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch_name)
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch_name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' RoPE
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if arch_name.startswith("gemma"):
        writer.add_sliding_window(config.sliding_window)
        if getattr(config, "attn_logit_softcapping", None) is not None:
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    for name, tensor in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        tensor = tensor.astype(np.float32)
        if arch_name.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1.0  # llama.cpp's Gemma converter stores 1 + w
        if arch_name == "llama" and "q_proj" in name:
            tensor = permute_qk(tensor, heads, heads)
        elif arch_name == "llama" and "k_proj" in name:
            tensor = permute_qk(tensor, heads, kv_heads)
        if tensor.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(tensor, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def copy_gguf(
    source: Path, target: Path, drop: tuple[str, ...] = (), add: dict[str, np.ndarray] | None = None
) -> Path:
    """Rewrite a GGUF written by ``write_gguf`` without the ``drop`` tensors, plus ``add``."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(target), arch)
    for field in reader.fields.values():
        if field.name.startswith(f"{arch}."):
            value = field.contents()
            if isinstance(value, int):
                writer.add_uint32(field.name, value)
            else:
                writer.add_float32(field.name, float(value))
    for tensor in reader.tensors:
        if tensor.name not in drop:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    for name, array in (add or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def json_lines_on_host_devices(module: str, *args: str, timeout: int = 1200) -> list[dict]:
    """Run ``python -m module args`` on 4 CPU devices (XLA_FLAGS must be set before jax
    initializes, hence a subprocess) and return the JSON lines it prints."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def tiny_random_lm(family: str = "llama", layers: int = 2, vocab: int = 300, seed: int = 0) -> Any:
    """(CausalLM, random params, a 1x1 mesh): a model small enough to compile in a second."""
    import jax

    from cluster.mesh import build_mesh
    from replicas.model.causal_lm import CausalLM
    from replicas.model.config import ModelConfig

    config = ModelConfig(
        family=family, vocab_size=vocab, hidden_size=64, intermediate_size=128,
        num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    model = CausalLM(config)
    return model, model.init_params(jax.random.PRNGKey(seed)), build_mesh((1, 1))
