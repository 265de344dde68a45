"""The token head of prompt log-likelihood (semantics 14): every prompt token scored.

A scored position is one hidden state and the token that follows it (its target). The LM
head runs at scored positions only, in chunks of ``SCORE_CHUNK`` rows up to a traced count
(as ``common.score_rows``): full-vocabulary log-softmax on device, and only each row's
target log-prob and its ``k`` best tokens leave the device.

``stream.prefix_step`` and ``stream.stream_step`` run this head when their signature's
``top_k`` is set: a prompt prefix step scores the prefix's own tokens and returns its hidden
states at block boundaries (a later prompt that shares only the first blocks of it reads
those); a prompt stream step scores every item token instead of the last. Here too: the
prompt prefix step's abstract arguments.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.engine.layouts.common import Spec, score_capacity, score_chunk
from replicas.engine.prefix_index import PREFIX_BLOCK as PREFIX_BLOCK  # re-exported
from replicas.model.lora import untag
from replicas.model.protocol import DecoderModel, Params

Array = jax.Array
BLOCK_AXES = ("batch", None, None)  # [B, T / PREFIX_BLOCK, D]


def score_tokens(
    model: DecoderModel,
    params: Params,
    states: Array,  # [G, X, D]: each data shard's own hidden states
    rows: Array,  # [G, Rg] int32 indices into X, Rg a score_capacity
    targets: Array,  # [G, Rg] int32: the token each row's log-prob is taken for
    count: Array,  # [] int32: real rows in the fullest group
    top_k: int,
) -> tuple[Array, Array, Array]:
    """Each row's target log-prob ``[G, Rg]`` and its ``top_k`` best log-probs and token
    ids ``[G, Rg, k]`` (rows past ``count``: zeros)."""
    groups, size = states.shape[0], score_chunk(rows.shape[1])

    def chunk(i: Array, out: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        start = i * size
        index = jax.lax.dynamic_slice_in_dim(rows, start, size, axis=1)  # [G, CH]
        target = jax.lax.dynamic_slice_in_dim(targets, start, size, axis=1)
        picked = jnp.take_along_axis(states, index[..., None], axis=1)  # [G, CH, D]
        flat = picked.reshape(groups * size, -1)  # [G * CH, D]
        logprobs = jax.nn.log_softmax(model.logits(params, flat), axis=-1)  # [G * CH, V]
        target = untag(params, target, model.config.vocab_size)  # adapter-tagged ids
        own = jnp.take_along_axis(logprobs, target.reshape(-1, 1), axis=-1)  # [G * CH, 1]
        best, ids = jax.lax.top_k(logprobs, top_k)  # [G * CH, k]
        parts = (own.reshape(groups, size), best, ids.astype(jnp.int32))
        parts = (parts[0], *(p.reshape(groups, size, top_k) for p in parts[1:]))
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
    trips = (count + size - 1) // size
    return jax.lax.fori_loop(0, trips, chunk, zeros)


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
