"""The parameter tree of an encoder (``replicas.model.encoder``): each leaf's logical axes.

Shapes: V vocabulary, P positions, T token types, D hidden, H heads, Dh head dim, F MLP
width; layer leaves lead with ``layers``. ``replicas.model.params`` derives shapes and
shardings from these as it does for the decoder's tree. A sparse model's tree holds the
masked-LM head (``mlm``, ``replicas.model.mlm_head``), its decoder weight the tree's
``embed`` (tied).
"""

from __future__ import annotations

from typing import Any

from replicas.model.config import ModelConfig
from replicas.model.family.bert import reads_mlm_head
from replicas.model.heads import head_logical_axes


def _norm(config: ModelConfig, layer: bool) -> dict[str, Any]:
    """A LayerNorm's axes: its bias with ``norm_bias`` (BERT's always)."""
    axes = ("layers", "norm") if layer else ("norm",)
    return {"scale": axes, "bias": axes} if config.norm_bias else {"scale": axes}


def _modernbert_head_axes(config: ModelConfig) -> dict[str, Any]:
    """ModernBertForSequenceClassification's head: dense (its bias with classifier_bias),
    LayerNorm (its bias with norm_bias), classifier [D -> L] with its bias."""
    axes: dict[str, Any] = {
        "dense": ("embed", "head_hidden"),  # [D, D]
        "norm": ("head_hidden",),
        "score": ("head_hidden", "labels"),  # [D, L]
        "score_bias": ("labels",),
    }
    if config.classifier_bias:
        axes["dense_bias"] = ("head_hidden",)
    if config.norm_bias:
        axes["norm_bias"] = ("head_hidden",)
    return axes


def mlm_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """A ``*ForMaskedLM``'s head: dense [D, D] and its bias (ModernBERT's with
    classifier_bias), LayerNorm, the decoder's bias [V] (its weight: ``embed``)."""
    axes: dict[str, Any] = {
        "dense": ("embed", "norm"),  # [D, D]
        "norm": _norm(config, layer=False),
        "bias": ("vocab",),  # [V]
    }
    if config.classifier_bias or not config.rotary:
        axes["dense_bias"] = ("norm",)  # [D]
    return axes


def _extras(config: ModelConfig, head: dict[str, Any]) -> dict[str, Any]:
    """The score head's axes (``head``) and the masked-LM head's, where the tree has them."""
    extras = {} if config.head is None else {"head": head}
    return extras | ({"mlm": mlm_logical_axes(config)} if reads_mlm_head(config) else {})


def modernbert_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """ModernBERT: fused q/k/v and GeGLU input projections, no biases, no positions; layer
    0's ``attn_norm`` is held but not read (its attention reads its input unnormed)."""
    head = _extras(config, {} if config.head is None else _modernbert_head_axes(config))
    return head | {
        "embed": ("vocab", "embed"),  # [V, D]
        "embed_norm": _norm(config, layer=False),
        "final_norm": _norm(config, layer=False),
        "layers": {
            "attn_norm": _norm(config, layer=True),
            "attn": {
                "qkv": ("layers", "embed", "qkv"),  # [L, D, 3 * H * Dh]
                "o": ("layers", "heads_flat", "embed"),  # [L, H * Dh, D]
            },
            "mlp_norm": _norm(config, layer=True),
            "mlp": {
                "wi": ("layers", "embed", "mlp2"),  # [L, D, 2F]: input, then gate
                "down": ("layers", "mlp", "embed"),  # [L, F, D]
            },
        },
    }


def encoder_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """Logical axes of every parameter of an encoder (a cross-encoder's head, a sparse
    model's masked-LM head too)."""
    if config.rotary:
        return modernbert_logical_axes(config)
    head = _extras(config, {} if config.head is None else head_logical_axes(config.head))
    return head | {
        "embed": ("vocab", "embed"),  # [V, D]
        "position_embed": ("positions", "embed"),  # [P, D]
        "type_embed": ("token_types", "embed"),  # [T, D]
        "embed_norm": _norm(config, layer=False),
        "layers": {
            "attn": {
                "q": ("layers", "embed", "heads", "head_dim"),  # [L, D, H, Dh]
                "k": ("layers", "embed", "heads", "head_dim"),
                "v": ("layers", "embed", "heads", "head_dim"),
                "o": ("layers", "heads", "head_dim", "embed"),  # [L, H, Dh, D]
                "q_bias": ("layers", "heads", "head_dim"),
                "k_bias": ("layers", "heads", "head_dim"),
                "v_bias": ("layers", "heads", "head_dim"),
                "o_bias": ("layers", "norm"),  # [L, D]
            },
            "attn_norm": _norm(config, layer=True),
            "mlp": {
                "up": ("layers", "embed", "mlp"),  # [L, D, F]
                "up_bias": ("layers", "mlp"),
                "down": ("layers", "mlp", "embed"),  # [L, F, D]
                "down_bias": ("layers", "norm"),
            },
            "mlp_norm": _norm(config, layer=True),
        },
    }
