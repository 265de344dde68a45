"""The two steps every token layout shares: the prefix step and the item-stream step.

``prefix_step`` computes prefixes from position 0 (a /v1/score query, a prompt group's
shared blocks); ``stream_step`` runs items end to end in one flat token stream behind shared
prefixes (a query's items, prompts' remaining tokens). Both pick what they score by a
scored-position selector (``rows`` into each data shard's hidden states, ``count`` real rows)
and one of two heads, chosen by the signature: label log-probs (``labels`` > 0, /v1/score) or
every scored token's own log-prob and its ``top_k`` best (``top_k`` > 0, prompt
log-likelihood; ``token_steps.score_tokens``). A prefix step with ``top_k`` 0 scores nothing.
A head is a static field of the signature, so a score step never pays a vocabulary top-k and
a prompt step never label gathers. Single-item rows do not run here (they are causal rows,
``dense.causal_step``); the embedding and prefix-extension steps run the same stream attention
(``CausalLM.stream_hidden``) in steps of their own and take ``window_for`` from here. Per-token
metadata (item id, position ``len(query) + k``) comes from lengths, never from searching token
ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
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
    lay_row,
    score_capacity,
    score_rows,
    spread_row,
)
from replicas.engine.layouts.prefix_blocks import KV_AXES, LAST_AXES, PrefixEntry
from replicas.engine.layouts.token_steps import (
    BLOCK_AXES,
    PREFIX_BLOCK,
    prefix_specs,
    score_tokens,
)
from replicas.model.causal_lm import CausalSpec, ItemStreamSpec, Params
from replicas.model.protocol import DecoderModel

Array = jax.Array
MIN_WINDOW = 4


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
    def tokens(self) -> int:
        return sum(len(item) for item in self.items)

    @property
    def size(self) -> int:
        """Stream slots needed: every token, and at least one score row per item."""
        return max(self.tokens, len(self.items))


@dataclass(frozen=True, order=True)
class StreamDims(BucketDims):
    """The compiled shape of one item-stream step: requests B, prefix tokens T, stream
    tokens S, the item window W (longest item allowed) and its head: ``labels`` C (label
    log-probs of each item's last token) or ``top_k`` (every token scored, prompts)."""

    batch: int
    prefix: int
    tokens: int
    window: int
    labels: int
    top_k: int = 0

    @property
    def cost(self) -> int:
        """Rough work of a step: every stream token plus each request's prefix."""
        return (
            self.batch * (self.tokens + self.prefix) * 64 + self.window + self.labels + self.top_k
        )

    def covers(self, other: BucketDims) -> bool:
        """Field by field, and only within one head."""
        return (self.top_k > 0) == (other.top_k > 0) and super().covers(other)  # type: ignore[attr-defined]


@dataclass(frozen=True, order=True)
class PrefixDims(BucketDims):
    """The compiled shape of a prefix step: ``batch`` prefixes of ``tokens`` (padded)
    tokens; ``top_k`` > 0: its own tokens scored with that many alternatives (prompts). A
    query prefix (``top_k`` 0) is covered only at its own width (the item stream reads the
    prefix at its own width); a prompt prefix by any wider one."""

    batch: int
    tokens: int
    top_k: int = 0

    @property
    def cost(self) -> int:
        return self.batch * self.tokens

    def covers(self, other: BucketDims) -> bool:
        if (self.top_k > 0) != (other.top_k > 0):  # type: ignore[attr-defined]
            return False
        same_width = self.top_k > 0 or self.tokens == other.tokens  # type: ignore[attr-defined]
        return super().covers(other) and same_width


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
        window=window_for(max((len(i) for u in units for i in u.items), default=0), tokens),
        labels=label_bucket(max(len(works[w].label_ids) for u in units for w, _, _ in u.runs)),
    )


@dataclass(frozen=True)
class StreamBatch:
    """Host arrays of one step; ``prefixes`` holds the entry each of the B rows reads (None:
    a padding row)."""

    prefixes: tuple[PrefixEntry | None, ...]
    prefix_valid: np.ndarray  # [B, T] bool
    tokens: np.ndarray  # [B, S] int32
    positions: np.ndarray  # [B, S] int32
    item_ids: np.ndarray  # [B, S] int32, -1 padding
    rows: np.ndarray  # [G, Rg] int32 into each group's [B / G * S + B / G] hidden states
    labels: np.ndarray  # [G, Rg, C] int32
    count: np.ndarray  # [] int32
    slots: tuple[RowSlot, ...]
    useful_tokens: int

    def arguments(self, prefixes: tuple[Array, Array, Array]) -> tuple[Any, ...]:
        """The step's arguments after params, in order; ``prefixes``: the assembled keys,
        values and lasts of the batch's rows (``prefix_blocks.assemble``)."""
        return (*prefixes, self.prefix_valid, self.tokens, self.positions, self.item_ids,
                self.rows, self.labels, self.count)  # fmt: skip


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
    prefixes: list[PrefixEntry | None] = [None] * b
    for i, unit in enumerate(units):
        u = spread_row(i, b, groups)
        prefixes[u] = unit.prefix
        prefix_valid[u, : unit.prefix.length if unit.prefix else 0] = True
        first = index.first_row(u)
        for work, first_item, num_items in unit.runs:
            slots.append(RowSlot(work, first_item, num_items, first))
            first += num_items
        spans = lay_row((tokens, positions, item_ids), u, unit.items, unit.offset)
        for item, (_, end) in zip(unit.items, spans, strict=True):
            if item:
                index.add(u, end - 1)
            else:
                index.add_extra(u)
    labels = index.labels(works, slots, dims.labels)
    useful = sum(unit.tokens for unit in units)
    return StreamBatch(
        tuple(prefixes), prefix_valid, tokens, positions, item_ids, index.rows,
        labels, index.count, tuple(slots), useful,
    )  # fmt: skip


def stream_step(
    model: DecoderModel,
    window: int,
    top_k: int,
    params: Params,
    prefix_keys: Array,  # [layers, B, T, K, Dh]
    prefix_values: Array,  # [layers, B, T, K, Dh]
    prefix_lasts: Array,  # [B, D]: the state after each row's (read) prefix
    prefix_valid: Array,  # [B, T]
    tokens: Array,  # [B, S]
    positions: Array,  # [B, S]
    item_ids: Array,  # [B, S]
    rows: Array,  # [G, Rg]: the scored positions, into each group's B / G * S + B / G
    scored: Array,  # [G, Rg, C] label ids (top_k 0), or [G, Rg] each row's target token
    count: Array,  # []
) -> Array | tuple[Array, Array, Array]:
    """The stream's scored rows (past ``count``: zeros): label log-probs ``[G, Rg, C]``, or
    with ``top_k`` each row's target log-prob ``[G, Rg]`` and its top-k log-probs and ids
    ``[G, Rg, k]``. Rows are independent, so with B sharded over ``data`` each shard runs
    its own."""
    spec = ItemStreamSpec(prefix_valid=prefix_valid, item_ids=item_ids, window=window)
    hidden = model.stream_hidden(params, tokens, positions, spec, prefix_keys, prefix_values)
    groups = rows.shape[0]
    lasts = prefix_lasts[:, None]  # [B, 1, D]
    states = jnp.concatenate([grouped(hidden, groups), grouped(lasts, groups)], axis=1)
    if top_k:
        return score_tokens(model, params, states, rows, scored, count, top_k)
    return score_rows(model, params, states, rows, scored, count)


def prefix_step(
    model: DecoderModel,
    top_k: int,
    params: Params,
    tokens: Array,  # [B, T]
    lengths: Array,  # [B], >= 1
    *scored: Array,  # top_k > 0: rows [G, Rg] into each group's B / G * T, targets, count
) -> tuple[Array, ...]:
    """Prefixes ``tokens [B, T]`` (``lengths [B]`` real tokens each) -> keys, values
    ``[layers, B, T, K, Dh]`` and each prefix's last real hidden state ``[B, D]``, left on
    the data shard that computed them (``prefix_blocks.split_entries`` cuts them apart);
    with ``top_k`` also the hidden states at block ends ``[B, T / PREFIX_BLOCK, D]``
    (position ``PREFIX_BLOCK * (j + 1) - 1``) and the scored rows' log-probs and top-k."""
    batch, width = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32)[None], (batch, width))
    hidden, keys, values = model.hidden_and_kv(params, tokens, positions, CausalSpec(lengths))
    lasts = hidden[jnp.arange(batch), lengths - 1]
    if not top_k:
        return keys, values, lasts
    blocks = hidden[:, PREFIX_BLOCK - 1 : width // PREFIX_BLOCK * PREFIX_BLOCK : PREFIX_BLOCK]
    rows, targets, count = scored
    states = grouped(hidden, rows.shape[0])
    scores = score_tokens(model, params, states, rows, targets, count, top_k)
    return keys, values, lasts, blocks, *scores


def stream_specs(model: DecoderModel, spec: Spec, dims: StreamDims, groups: int) -> tuple[Any, ...]:
    """Abstract arguments (after params) of an item-stream step of ``dims``: every per-row
    input, prefix keys/values included, split over ``data`` by the logical-axis table."""
    c = model.config
    b, t, s = dims.batch, dims.prefix, dims.tokens
    kv = spec((c.num_layers, b, t, c.num_kv_heads, c.head_dim), model.dtype, KV_AXES)
    # A prompt stream scores every item token and each item's first one from the prefix.
    rows = score_capacity((2 if dims.top_k else 1) * (b // groups) * s)
    scored = (groups, rows) if dims.top_k else (groups, rows, dims.labels)
    return (
        kv,
        kv,
        spec((b, c.hidden_size), model.dtype, LAST_AXES),
        spec((b, t), np.bool_, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((b, s), np.int32, ("batch", "seq")),
        spec((groups, rows), np.int32, ("batch", None)),
        spec(scored, np.int32, ("batch", None, None)[: len(scored)]),
        spec((), np.int32, None),
    )


def compile_prefix(model: DecoderModel, runner: Any, dims: PrefixDims) -> Any:
    """The prefix step of ``dims``, compiled through the runner: prefixes split over
    ``data`` (kv heads over ``model``), each left on the block computing it with a prompt
    prefix's block states; a prompt prefix's log-probs come back whole."""
    placement, c, b, t = runner.placement, model.config, dims.batch, dims.tokens
    kv = placement.sharding(KV_AXES, (c.num_layers, b, t, c.num_kv_heads, c.head_dim))
    out: tuple[Any, ...] = (kv, kv, placement.sharding(LAST_AXES, (b, c.hidden_size)))
    specs = prefix_specs(placement.spec, b, t, placement.groups)
    if dims.top_k:
        blocks = placement.sharding(BLOCK_AXES, (b, t // PREFIX_BLOCK, c.hidden_size))
        out += (blocks, *[placement.replicated] * 3)
    else:  # tokens and lengths only
        specs = specs[:2]
    step = jax.jit(partial(prefix_step, model, dims.top_k), out_shardings=out)
    return runner.lower(step, specs)


def compile_stream(model: DecoderModel, runner: Any, dims: StreamDims) -> Any:
    """The item-stream step of ``dims``, compiled through the runner (a query stream's prefix
    step of the same batch and width first: every query stream reads one)."""
    placement = runner.placement
    if not dims.top_k:
        runner.ensure("prefix", PrefixDims(dims.batch, dims.prefix))
    step = jax.jit(  # scores gathered once, readable by every host of a group
        partial(stream_step, model, dims.window, dims.top_k), out_shardings=placement.replicated
    )
    return runner.lower(step, stream_specs(model, placement.spec, dims, placement.groups))
