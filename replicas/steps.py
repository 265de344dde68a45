"""The jitted prefill-only steps: forward pass, LM head at scoring positions only,
full-vocabulary log-softmax, then the label ids. Each returns ``[rows, K, C]`` float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from replicas.masks import PAD, QUERY, item_positions, item_self_mask, prefix_visible
from replicas.masks import segment_mask as build_segment_mask
from replicas.model import AttentionSpec, CausalLM, ItemStream, Params

Array = jax.Array


def dense_step(
    model: CausalLM,
    params: Params,
    tokens: Array,  # [R, T]
    positions: Array,  # [R, T]
    segments: Array,  # [R, T]
    score_index: Array,  # [R, K]
    labels: Array,  # [R, C]
) -> Array:
    """Single-item rows and packed reference rows -> [R, K, C] label log-probs."""
    spec = AttentionSpec(mask=build_segment_mask(segments))
    hidden, _ = model.hidden_states(params, tokens, positions, spec)  # [R, T, D]
    picked = jnp.take_along_axis(hidden, score_index[..., None], axis=1)  # [R, K, D]
    return model.label_logprobs(params, picked, labels)


def shared_prefix_step(
    model: CausalLM,
    params: Params,
    query_tokens: Array,  # [B, T]
    query_lengths: Array,  # [B]
    item_tokens: Array,  # [B, N, L]
    item_lengths: Array,  # [B, N]
    labels: Array,  # [B, C]
) -> Array:
    """Query once as a prefix, items as a batch behind it -> [B, N, C] label log-probs."""
    batch, length = query_tokens.shape
    _, num_items, item_len = item_tokens.shape
    items = ItemStream(
        tokens=item_tokens,
        positions=item_positions(query_lengths, num_items, item_len),
        prefix_visible=prefix_visible(query_lengths, length),
        self_mask=item_self_mask(item_lengths, item_len),
    )
    valid = jnp.arange(length)[None, :] < query_lengths[:, None]  # [B, T]
    spec = AttentionSpec(mask=build_segment_mask(jnp.where(valid, QUERY, PAD)), items=items)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    hidden, item_hidden = model.hidden_states(params, query_tokens, positions, spec)
    last = jnp.maximum(item_lengths - 1, 0)[..., None, None]  # [B, N, 1, 1]
    last_item = jnp.take_along_axis(item_hidden, last, axis=2)[:, :, 0]  # [B, N, D]
    last_query = jnp.take_along_axis(hidden, (query_lengths - 1)[:, None, None], axis=1)
    picked = jnp.where((item_lengths > 0)[..., None], last_item, last_query)  # [B, N, D]
    return model.label_logprobs(params, picked, labels)
