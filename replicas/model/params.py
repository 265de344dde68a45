"""The parameter tree of ``CausalLM``: each leaf's shape and logical axis names.

Loaders check every tensor against ``param_shapes``; ``param_shardings`` places it on the
mesh through the single rule table in ``cluster.sharding``.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import Mesh

from cluster.sharding import tree_shardings
from replicas.model.config import ModelConfig
from replicas.model.encoder_params import encoder_logical_axes
from replicas.model.heads import head_logical_axes
from replicas.model.quant import ACTIVATIONS, scale_axes, scale_shapes

Axes = tuple[str | None, ...]


def param_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """Logical axes of every parameter; layer leaves lead with ``layers``."""
    if config.encoder:
        return encoder_logical_axes(config)
    attn: dict[str, Any] = {
        "q": ("layers", "embed", "heads", "head_dim"),
        "k": ("layers", "embed", "kv_heads", "head_dim"),
        "v": ("layers", "embed", "kv_heads", "head_dim"),
        "o": ("layers", "heads", "head_dim", "embed"),
    }
    if config.qkv_bias:
        attn["q_bias"] = ("layers", "heads", "head_dim")
        attn["k_bias"] = ("layers", "kv_heads", "head_dim")
        attn["v_bias"] = ("layers", "kv_heads", "head_dim")
    if config.qk_norm:
        attn["q_norm"] = {"scale": ("layers", "head_dim")}
        attn["k_norm"] = {"scale": ("layers", "head_dim")}
    layers: dict[str, Any] = {}
    if config.post_norms:
        layers["post_attn_norm"] = {"scale": ("layers", "norm")}
        layers["post_mlp_norm"] = {"scale": ("layers", "norm")}
    tree: dict[str, Any] = {
        "embed": ("vocab", "embed"),
        "layers": {
            "attn_norm": {"scale": ("layers", "norm")},
            "attn": attn,
            "mlp_norm": {"scale": ("layers", "norm")},
            "mlp": {
                "gate": ("layers", "embed", "mlp"),
                "up": ("layers", "embed", "mlp"),
                "down": ("layers", "mlp", "embed"),
            },
            **layers,
        },
        "final_norm": {"scale": ("norm",)},
    }
    if config.head is not None:
        tree["head"] = head_logical_axes(config.head)
    elif not config.tie_word_embeddings and config.pooling is None:
        tree["lm_head"] = ("embed", "vocab")
    return tree


_SIZES = {
    "layers": lambda c: c.num_layers,
    "vocab": lambda c: c.vocab_size,
    "embed": lambda c: c.hidden_size,
    "norm": lambda c: c.hidden_size,
    "heads": lambda c: c.num_heads,
    "whole_heads": lambda c: c.num_heads,
    "kv_heads": lambda c: c.num_kv_heads,
    "head_dim": lambda c: c.head_dim,
    "mlp": lambda c: c.intermediate_size,
    "head_hidden": lambda c: c.hidden_size,
    "labels": lambda c: c.head.num_labels,
    "positions": lambda c: c.max_position_embeddings,
    "token_types": lambda c: c.type_vocab_size,
    "qkv": lambda c: 3 * c.num_heads * c.head_dim,  # ModernBERT's fused projections
    "heads_flat": lambda c: c.num_heads * c.head_dim,
    "mlp2": lambda c: 2 * c.intermediate_size,
}


def served_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """``param_logical_axes`` (the checkpoint's tensors) and, quantized, each quantized
    weight's scale (model.quant): the tree the model runs on."""
    tree = param_logical_axes(config)
    if config.quantization in ACTIVATIONS:  # o reads whole rows of its tokens (model.token_split)
        tree["layers"]["attn"]["o"] = ("layers", "whole_heads", "head_dim", "embed")
    if config.quantization != "none":
        tree["layers"] = scale_axes(tree["layers"], config.quantization)
    return tree


def param_shapes(config: ModelConfig) -> dict[str, Any]:
    """The expected shape of every checkpoint tensor, derived from its logical axes."""
    import jax

    return jax.tree_util.tree_map(
        lambda names: tuple(_SIZES[name](config) for name in names),
        param_logical_axes(config),
        is_leaf=lambda node: isinstance(node, tuple),
    )


def param_shardings(config: ModelConfig, mesh: Mesh) -> dict[str, Any]:
    """NamedSharding of every parameter the model runs on (scales included) on ``mesh``."""
    shapes = param_shapes(config)
    if config.quantization != "none":
        shapes["layers"] = scale_shapes(shapes["layers"], config.quantization)
    return tree_shardings(served_logical_axes(config), shapes, mesh)
