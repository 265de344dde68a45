"""Device steps of prompt log-likelihood (semantics 14): every prompt token scored.

A scored position is one hidden state and the token that follows it (its target). The LM
head runs at scored positions only, in chunks of ``SCORE_CHUNK`` rows up to a traced count
(as ``common.score_rows``): full-vocabulary log-softmax on device, and only each row's
target log-prob and its ``k`` best tokens leave the device.

``prompt_prefix_step`` is the shared-prefix layout's prefix step plus the log-probs of the
prefix's own tokens and its hidden states at block boundaries (a later prompt that shares
only the first blocks of it reads those); ``prompt_stream_step`` is the item-stream step
scoring every item token instead of the last.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.engine.layouts.common import SCORE_CHUNK, Spec, grouped, score_capacity
from replicas.engine.layouts.prefix_blocks import KV_AXES, LAST_AXES
from replicas.engine.prefix_index import PREFIX_BLOCK
from replicas.model.causal_lm import CausalLM, CausalSpec, ItemStreamSpec, Params
from replicas.model.lora import untag

Array = jax.Array
__all__ = ["PREFIX_BLOCK"]  # re-exported: the prefix reuse granularity (prefix_index)
BLOCK_AXES = ("batch", None, None)  # [B, T / PREFIX_BLOCK, D]


def score_tokens(
    model: CausalLM,
    params: Params,
    states: Array,  # [G, X, D]: each data shard's own hidden states
    rows: Array,  # [G, Rg] int32 indices into X, Rg a multiple of SCORE_CHUNK
    targets: Array,  # [G, Rg] int32: the token each row's log-prob is taken for
    count: Array,  # [] int32: real rows in the fullest group
    top_k: int,
) -> tuple[Array, Array, Array]:
    """Each row's target log-prob ``[G, Rg]`` and its ``top_k`` best log-probs and token
    ids ``[G, Rg, k]`` (rows past ``count``: zeros)."""
    groups = states.shape[0]

    def chunk(i: Array, out: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        start = i * SCORE_CHUNK
        index = jax.lax.dynamic_slice_in_dim(rows, start, SCORE_CHUNK, axis=1)  # [G, CH]
        target = jax.lax.dynamic_slice_in_dim(targets, start, SCORE_CHUNK, axis=1)
        picked = jnp.take_along_axis(states, index[..., None], axis=1)  # [G, CH, D]
        flat = picked.reshape(groups * SCORE_CHUNK, -1)  # [G * CH, D]
        logprobs = jax.nn.log_softmax(model.logits(params, flat), axis=-1)  # [G * CH, V]
        target = untag(params, target, model.config.vocab_size)  # adapter-tagged ids
        own = jnp.take_along_axis(logprobs, target.reshape(-1, 1), axis=-1)  # [G * CH, 1]
        best, ids = jax.lax.top_k(logprobs, top_k)  # [G * CH, k]
        parts = (own.reshape(groups, SCORE_CHUNK), best, ids.astype(jnp.int32))
        parts = (parts[0], *(p.reshape(groups, SCORE_CHUNK, top_k) for p in parts[1:]))
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(o, p, start, axis=1)
            for o, p in zip(out, parts, strict=True)
        )  # type: ignore[return-value]

    g, r = rows.shape
    zeros = (
        jnp.zeros((g, r), jnp.float32),
        jnp.zeros((g, r, top_k), jnp.float32),
        jnp.zeros((g, r, top_k), jnp.int32),
    )
    trips = (count + SCORE_CHUNK - 1) // SCORE_CHUNK
    return jax.lax.fori_loop(0, trips, chunk, zeros)


def prompt_prefix_step(
    model: CausalLM,
    top_k: int,
    params: Params,
    tokens: Array,  # [B, T]
    lengths: Array,  # [B], >= 1
    rows: Array,  # [G, Rg] into each group's B / G * T hidden states
    targets: Array,  # [G, Rg]
    count: Array,  # []
) -> tuple[Array, ...]:
    """Prefixes ``tokens`` -> keys, values ``[layers, B, T, K, Dh]``, last hidden states
    ``[B, D]``, hidden states at block ends ``[B, T / PREFIX_BLOCK, D]`` (position
    ``PREFIX_BLOCK * (j + 1) - 1``), and the scored rows' log-probs and top-k."""
    batch, width = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32)[None], (batch, width))
    hidden, keys, values = model.hidden_and_kv(params, tokens, positions, CausalSpec(lengths))
    lasts = hidden[jnp.arange(batch), lengths - 1]
    blocks = hidden[:, PREFIX_BLOCK - 1 : width // PREFIX_BLOCK * PREFIX_BLOCK : PREFIX_BLOCK]
    scored = score_tokens(
        model, params, grouped(hidden, rows.shape[0]), rows, targets, count, top_k
    )
    return keys, values, lasts, blocks, *scored


def prompt_stream_step(
    model: CausalLM,
    window: int,
    top_k: int,
    params: Params,
    prefix_keys: Array,  # [layers, B, T, K, Dh]
    prefix_values: Array,  # [layers, B, T, K, Dh]
    prefix_lasts: Array,  # [B, D]: the state after each row's reused prefix
    prefix_valid: Array,  # [B, T]
    tokens: Array,  # [B, S]
    positions: Array,  # [B, S]
    item_ids: Array,  # [B, S]
    rows: Array,  # [G, Rg]
    targets: Array,  # [G, Rg]
    count: Array,  # []
) -> tuple[Array, Array, Array]:
    """Every scored position of an item stream: log-probs ``[G, Rg]``, top-k ``[G, Rg, k]``."""
    spec = ItemStreamSpec(prefix_valid=prefix_valid, item_ids=item_ids, window=window)
    hidden = model.stream_hidden(params, tokens, positions, spec, prefix_keys, prefix_values)
    groups = rows.shape[0]
    lasts = prefix_lasts[:, None]  # [B, 1, D]
    states = jnp.concatenate([grouped(hidden, groups), grouped(lasts, groups)], axis=1)
    return score_tokens(model, params, states, rows, targets, count, top_k)


def prefix_specs(spec: Spec, batch: int, width: int, groups: int) -> tuple[Any, ...]:
    """Abstract arguments (after params) of a prompt prefix step."""
    rows = score_capacity(batch // groups * width)
    return (
        spec((batch, width), np.int32, ("batch", "seq")),
        spec((batch,), np.int32, ("batch",)),
        spec((groups, rows), np.int32, ("batch", None)),
        spec((groups, rows), np.int32, ("batch", None)),
        spec((), np.int32, None),
    )


def prefix_out_shardings(model: CausalLM, sharding: Any, batch: int, width: int) -> tuple:
    """Keys, values, lasts and block states stay on the data shard that computed them (as
    the shared-prefix layout's); the log-probs come back whole."""
    c = model.config
    kv = sharding(KV_AXES, (c.num_layers, batch, width, c.num_kv_heads, c.head_dim))
    last = sharding(LAST_AXES, (batch, c.hidden_size))
    blocks = sharding(BLOCK_AXES, (batch, width // PREFIX_BLOCK, c.hidden_size))
    return kv, kv, last, blocks


def stream_token_specs(
    model: CausalLM, spec: Spec, batch: int, prefix: int, tokens: int, groups: int
) -> tuple[Any, ...]:
    """Abstract arguments (after params) of a prompt stream step: as the item stream's, with
    room for every token of every item and one more row per item (its first token, scored
    from the prefix's state)."""
    c = model.config
    kv = spec((c.num_layers, batch, prefix, c.num_kv_heads, c.head_dim), model.dtype, KV_AXES)
    rows = score_capacity(2 * (batch // groups) * tokens)
    return (
        kv,
        kv,
        spec((batch, c.hidden_size), model.dtype, LAST_AXES),
        spec((batch, prefix), np.bool_, ("batch", "seq")),
        spec((batch, tokens), np.int32, ("batch", "seq")),
        spec((batch, tokens), np.int32, ("batch", "seq")),
        spec((batch, tokens), np.int32, ("batch", "seq")),
        spec((groups, rows), np.int32, ("batch", None)),
        spec((groups, rows), np.int32, ("batch", None)),
        spec((), np.int32, None),
    )
