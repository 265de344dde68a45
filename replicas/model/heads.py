"""Score heads on the decoder's final hidden state (semantics 18), chosen by the config.

A head attaches to any family: it reads the final-normed hidden state at scoring positions
only (the last token of each item or row, where transformers reads the last non-pad token)
and computes in float32 whatever the model's dtype. Parameters live under ``params["head"]``
with logical axes like the LM head's (``cluster.sharding`` maps them).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from replicas.contract import ScoreHead

Array = jax.Array
Params = dict[str, Any]


def head_logical_axes(head: ScoreHead) -> dict[str, Any]:
    """Logical axes of the head's parameters (D hidden, L labels)."""
    if head.kind == "linear":
        return {"score": ("embed", "labels")}  # [D, L]
    if head.kind == "cross_encoder":
        return {
            "pooler": ("embed", "head_hidden"),  # [D, D]
            "pooler_bias": ("head_hidden",),
            "score": ("head_hidden", "labels"),  # [D, L]
            "score_bias": ("labels",),
        }
    return {
        "dense": ("embed", "head_hidden"),  # [D, D]
        "dense_bias": ("head_hidden",),  # [D]
        "out": ("head_hidden", "labels"),  # [D, 1]
        "out_bias": ("labels",),  # [1]
    }


def init_head_params(head: ScoreHead, hidden_size: int, rng: Array, dtype: Any) -> Params:
    """Random head parameters (tests and deviceless compiles)."""
    first, second = jax.random.split(rng)
    d, labels = hidden_size, head.num_labels
    if head.kind == "linear":
        return {"score": 0.02 * jax.random.normal(first, (d, labels), dtype)}
    return {
        "dense": 0.02 * jax.random.normal(first, (d, d), dtype),
        "dense_bias": jnp.zeros((d,), dtype),
        "out": 0.02 * jax.random.normal(second, (d, labels), dtype),
        "out_bias": jnp.zeros((labels,), dtype),
    }


def head_outputs(head: ScoreHead, params: Params, hidden: Array) -> Array:
    """hidden [..., D] (scoring positions only) -> the head's outputs [..., L] float32."""
    x = hidden.astype(jnp.float32)
    p = jax.tree_util.tree_map(lambda leaf: leaf.astype(jnp.float32), params)
    if head.kind == "linear":
        return x @ p["score"]
    if head.kind == "cross_encoder" and head.norm_eps is not None:  # ModernBERT's head
        inner = x @ p["dense"] + p.get("dense_bias", 0.0)
        inner = jax.nn.gelu(inner, approximate=False)  # [..., D]
        mean = jnp.mean(inner, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(inner - mean), axis=-1, keepdims=True)
        normed = (inner - mean) * jax.lax.rsqrt(var + head.norm_eps) * p["norm"]
        normed = normed + p.get("norm_bias", 0.0)
        return normed @ p["score"] + p["score_bias"]
    if head.kind == "cross_encoder":  # BERT's pooler (on [CLS]) then its classifier
        return jnp.tanh(x @ p["pooler"] + p["pooler_bias"]) @ p["score"] + p["score_bias"]
    inner = jax.nn.relu(x @ p["dense"] + p["dense_bias"])  # [..., D]
    return inner @ p["out"] + p["out_bias"]
