"""The masked-LM head of an encoder's ``*ForMaskedLM`` (BERT, XLM-RoBERTa, ModernBERT): what a
sparse (SPLADE) model's weights are read from. Per token, in float32:
``LN(gelu(h W + b)) E^T + c``, with ``E`` the word embeddings (``params["embed"]``: the
decoder is tied to them) and ``c`` the decoder's bias. Its leaves are ``params["mlm"]``
(``replicas.model.encoder_params.mlm_logical_axes``); the activation is exact GELU (the
families refuse any other for a ``*ForMaskedLM`` when its config is read), the LayerNorm's
eps the encoder's (``rms_norm_eps``: BERT's ``layer_norm_eps``, ModernBERT's ``norm_eps``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from replicas.model.config import ModelConfig
from replicas.model.encoder import layer_norm
from replicas.model.errors import UnsupportedModelError

Array = jax.Array


def mlm_logits(config: ModelConfig, params: dict[str, Any], hidden: Array) -> Array:
    """An encoder's final hidden states ``[..., D]`` (``Encoder.stream_hidden``'s; ModernBERT's
    after its final norm) -> the masked-LM head's float32 logits ``[..., V]``."""
    if config.hidden_act != "gelu":
        raise UnsupportedModelError(f"hidden_act: {config.hidden_act!r} (the head's: gelu)")
    head = params["mlm"]
    x = hidden.astype(jnp.float32) @ head["dense"].astype(jnp.float32)  # [..., D]
    if "dense_bias" in head:
        x = x + head["dense_bias"].astype(jnp.float32)
    x = jax.nn.gelu(x, approximate=False)
    x = layer_norm(head["norm"], x, config.rms_norm_eps)  # [..., D] float32
    embed = params["embed"].astype(jnp.float32)  # [V, D]
    return jnp.einsum("...d,vd->...v", x, embed) + head["bias"].astype(jnp.float32)  # [..., V]


__all__ = ["mlm_logits"]
