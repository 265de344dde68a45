"""The item-stream step: items end to end in one flat token stream behind shared prefixes.

Used by the shared-prefix layout (the prefix is the query, computed once by ``prefix_step``
or taken from the query cache) and by the single-item layout (an empty prefix; each
``query + item`` row is one "item"). A step's compiled shape is ``StreamDims``: requests B,
prefix tokens T, stream tokens S, the item window W (longest item allowed) and labels C.
Per-token metadata (item id, position ``len(query) + k``) comes from lengths, never from
searching token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.contract import ScoreWork
from replicas.engine.layouts.common import (
    BucketDims,
    RowSlot,
    ScoreIndex,
    Spec,
    bucket_for,
    grouped,
    label_bucket,
    labels_by_row,
    score_capacity,
    score_rows,
    spread_row,
)
from replicas.model.causal_lm import CausalLM, CausalSpec, ItemStreamSpec, Params

Array = jax.Array
MIN_WINDOW = 4


@dataclass(frozen=True)
class PrefixEntry:
    """A prefix's per-layer keys/values ``[layers, 1, T, K, Dh]`` and its last hidden state
    ``[1, D]`` (the score of an empty item), on device. ``length`` real tokens of ``T``."""

    keys: Array
    values: Array
    last: Array
    length: int

    @property
    def bucket(self) -> int:
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes + self.last.nbytes)


@dataclass(frozen=True)
class StreamUnit:
    """Items behind one prefix, scored in order; ``runs`` says whose they are:
    ``(work, first_item, num_items)`` per run of consecutive items of one work. Item token k
    sits at position ``offset + k``."""

    runs: tuple[tuple[int, int, int], ...]
    items: tuple[tuple[int, ...], ...]
    offset: int
    prefix: PrefixEntry | None = None

    @property
    def works(self) -> tuple[int, ...]:
        return tuple(run[0] for run in self.runs)

    @property
    def tokens(self) -> int:
        return sum(len(item) for item in self.items)

    @property
    def size(self) -> int:
        """Stream slots needed: every token, and at least one score row per item."""
        return max(self.tokens, len(self.items))

    @property
    def longest(self) -> int:
        return max((len(item) for item in self.items), default=0)


@dataclass(frozen=True, order=True)
class StreamDims(BucketDims):
    """The compiled shape of one item-stream step."""

    batch: int
    prefix: int
    tokens: int
    window: int
    labels: int

    @property
    def cost(self) -> int:
        """Rough work of a step: every stream token plus each request's prefix."""
        return self.batch * (self.tokens + self.prefix) * 64 + self.window + self.labels


def window_for(longest_item: int, tokens: int) -> int:
    """Smallest power of two >= the longest item (>= MIN_WINDOW), at most the stream."""
    window = max(MIN_WINDOW, 1 << max(longest_item - 1, 0).bit_length())
    return min(window, tokens)


def exact_dims(
    units: Sequence[StreamUnit],
    works: Sequence[ScoreWork],
    prefix: int,
    batch_buckets: Sequence[int],
    token_buckets: Sequence[int],
) -> StreamDims:
    tokens = bucket_for(max(u.size for u in units), token_buckets, "item_token_buckets")
    return StreamDims(
        batch=bucket_for(len(units), batch_buckets, "batch_buckets"),
        prefix=prefix,
        tokens=tokens,
        window=window_for(max(u.longest for u in units), tokens),
        labels=label_bucket(max(len(works[w].label_ids) for u in units for w in u.works)),
    )


@dataclass(frozen=True)
class StreamBatch:
    """Host arrays of one step; ``prefixes`` holds B entries (padding slots repeat one)."""

    prefixes: tuple[PrefixEntry, ...]
    prefix_valid: np.ndarray  # [B, T] bool
    tokens: np.ndarray  # [B, S] int32
    positions: np.ndarray  # [B, S] int32
    item_ids: np.ndarray  # [B, S] int32, -1 padding
    rows: np.ndarray  # [G, Rg] int32 into each group's [B / G * S + B / G] hidden states
    labels: np.ndarray  # [G, Rg, C] int32
    count: np.ndarray  # [] int32
    slots: tuple[RowSlot, ...]
    useful_tokens: int


def pack_stream(
    units: Sequence[StreamUnit], works: Sequence[ScoreWork], dims: StreamDims, groups: int
) -> StreamBatch:
    """Units in rows ``0..len(units)``; rows split into ``groups`` blocks (data shards),
    each scoring its own items: an item's last token, or an empty item's prefix last
    state (appended after its block's tokens)."""
    b, s = dims.batch, dims.tokens
    tokens = np.zeros((b, s), np.int32)
    positions = np.zeros((b, s), np.int32)
    item_ids = np.full((b, s), -1, np.int32)
    prefix_valid = np.zeros((b, dims.prefix), bool)
    index = ScoreIndex(groups, b, s)
    slots = []
    prefixes = [units[0].prefix] * b  # padding rows repeat one
    for i, unit in enumerate(units):
        u = spread_row(i, b, groups)
        prefixes[u] = unit.prefix
        prefix_valid[u, : unit.prefix.length if unit.prefix else 0] = True
        first = index.first_row(u)
        for work, first_item, num_items in unit.runs:
            slots.append(RowSlot(work, first_item, num_items, first))
            first += num_items
        cursor = 0
        for n, item in enumerate(unit.items):
            end = cursor + len(item)
            tokens[u, cursor:end] = item
            positions[u, cursor:end] = unit.offset + np.arange(len(item))
            item_ids[u, cursor:end] = n
            if item:
                index.add(u, end - 1)
            else:
                index.add_extra(u)
            cursor = end
    labels = labels_by_row(works, slots, (index.flat_rows, dims.labels))
    useful = sum(unit.tokens for unit in units)
    return StreamBatch(
        tuple(prefixes), prefix_valid, tokens, positions, item_ids, index.rows,
        labels.reshape(*index.rows.shape, dims.labels), index.count, tuple(slots), useful,
    )  # fmt: skip


def stream_step(
    model: CausalLM,
    window: int,
    params: Params,
    prefix_keys: tuple[Array, ...],  # B x [layers, 1, T, K, Dh]
    prefix_values: tuple[Array, ...],  # B x [layers, 1, T, K, Dh]
    prefix_lasts: tuple[Array, ...],  # B x [1, D]
    prefix_valid: Array,  # [B, T]
    tokens: Array,  # [B, S]
    positions: Array,  # [B, S]
    item_ids: Array,  # [B, S]
    rows: Array,  # [G, Rg]
    labels: Array,  # [G, Rg, C]
    count: Array,  # []
) -> Array:
    """Label log-probs ``[G, Rg, C]`` of every item of the stream (rows past ``count``:
    zeros). Rows are independent, so with B sharded over ``data`` each shard runs its own."""
    keys = jnp.concatenate(prefix_keys, axis=1)  # [layers, B, T, K, Dh]
    values = jnp.concatenate(prefix_values, axis=1)
    spec = ItemStreamSpec(prefix_valid=prefix_valid, item_ids=item_ids, window=window)
    hidden = model.stream_hidden(params, tokens, positions, spec, keys, values)  # [B, S, D]
    groups = rows.shape[0]
    lasts = jnp.concatenate(prefix_lasts, axis=0)[:, None]  # [B, 1, D]
    states = jnp.concatenate([grouped(hidden, groups), grouped(lasts, groups)], axis=1)
    return score_rows(model, params, states, rows, labels, count)


def prefix_step(
    model: CausalLM, params: Params, tokens: Array, lengths: Array
) -> tuple[tuple[Array, ...], tuple[Array, ...], tuple[Array, ...]]:
    """Queries ``tokens [B, T]`` (``lengths [B]`` real tokens each, >= 1) -> per query: keys,
    values [layers, 1, T, K, Dh] and the last real token's hidden state [1, D]; B queries in
    one forward pass, returned apart so each can be cached and reused on its own."""
    batch, width = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32)[None], (batch, width))
    hidden, keys, values = model.hidden_and_kv(params, tokens, positions, CausalSpec(lengths))
    last = hidden[jnp.arange(batch), lengths - 1]  # [B, D]
    return (
        tuple(keys[:, b : b + 1] for b in range(batch)),
        tuple(values[:, b : b + 1] for b in range(batch)),
        tuple(last[b : b + 1] for b in range(batch)),
    )


def batch_arguments(batch: StreamBatch) -> tuple[Any, ...]:
    """The step's arguments after params, in order."""
    return (
        tuple(p.keys for p in batch.prefixes),
        tuple(p.values for p in batch.prefixes),
        tuple(p.last for p in batch.prefixes),
        batch.prefix_valid,
        batch.tokens,
        batch.positions,
        batch.item_ids,
        batch.rows,
        batch.labels,
        batch.count,
    )


def stream_specs(model: CausalLM, spec: Spec, dims: StreamDims, groups: int) -> tuple[Any, ...]:
    """Abstract arguments (after params) of an item-stream step of ``dims``: per-row inputs
    split over ``data`` by the logical-axis table, prefix entries whole."""
    c = model.config
    b, t, s = dims.batch, dims.prefix, dims.tokens
    kv = spec((c.num_layers, 1, t, c.num_kv_heads, c.head_dim), model.dtype, None)
    last = spec((1, c.hidden_size), model.dtype, None)
    rows = score_capacity(b // groups * s)
    return (
        (kv,) * b,
        (kv,) * b,
        (last,) * b,
        spec((b, t), np.bool_, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((groups, rows), np.int32, ("batch", None)),
        spec((groups, rows, dims.labels), np.int32, ("batch", None, None)),
        spec((), np.int32, None),
    )
