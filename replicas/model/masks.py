"""Attention masks built from explicit lengths and per-token metadata, never from token ids.

Every function works on jnp arrays inside a jitted step; tests compare them with literal
matrices. ``True`` means "may attend". Two families: dense rows (``segment_mask``: single-item
rows and RFC-008's packed reference row; ``work_segment_mask``: several small works back to
back in one row, the fused layout) and the item stream's own-item part
(``own_item_mask``: blocks of stream tokens reading their block and the blocks before it
that an item of at most the window's length can reach), and the encoders' bidirectional
segments (``bidirectional_mask``; ``segment_block_mask`` in blocks reading the blocks on both
sides that a sequence of at most the window's length can reach; ``bidirectional_window_mask``
and ``window_block_mask`` add a local layer's +-half window of positions).

Segment ids of a token row (``segments``): ``0`` query, ``i + 1`` item i, ``DELIMITER`` a
delimiter, ``PAD`` padding. From them one rule gives every dense layout:
key s is visible to token t iff s <= t and (s is query, or s and t are in the same item),
or s == t (keeps delimiter and padding rows finite; nobody reads them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
QUERY = 0
DELIMITER = -1
PAD = -2


def segment_mask(segments: Array) -> Array:
    """[B, T] segment ids -> [B, T, T] mask of the dense layouts (single-item, packed)."""
    seg_t = segments[:, :, None]  # [B, T, 1]
    seg_s = segments[:, None, :]  # [B, 1, T]
    length = segments.shape[1]
    causal = jnp.arange(length)[None, :, None] >= jnp.arange(length)[None, None, :]
    readable = (seg_s == QUERY) | ((seg_s > QUERY) & (seg_s == seg_t))
    self_only = jnp.eye(length, dtype=bool)[None]
    return (causal & readable & (seg_t != PAD)) | self_only


def work_segment_mask(works: Array, segments: Array) -> Array:
    """[B, T] work index (-1 padding) and segment ids of each token -> [B, T, T] mask of the
    fused layout: several works back to back in one row, each read only by its own tokens
    (``segment_mask`` within a work: its query, then each item on its own)."""
    same_work = works[:, :, None] == works[:, None, :]  # [B, T, T]
    return segment_mask(segments) & same_work


def within_window(q_positions: Array, k_positions: Array, window: Array) -> Array:
    """[B, ..., T] query and [B or 1, ..., S] key positions, window [] -> [B, ..., T, S]: key
    at position s is inside the sliding window of the token at p iff p - s < window (keys
    after p are left to the causal or item mask)."""
    return (q_positions[..., :, None] - k_positions[..., None, :]) < window


def lookback(window: int, block: int, blocks: int) -> int:
    """Key blocks before a block of ``block`` queries that an item of at most ``window``
    tokens can reach: ceil((window - 1) / block), no more than the ``blocks`` - 1 there are."""
    return max(0, min(-(-(window - 1) // block), blocks - 1))


def key_blocks(x: Array, block: int, back: int, fill: int = 0) -> Array:
    """[B, S', ...] in blocks of ``block`` -> [B, S'/block, (back + 1) * block, ...]: each
    block with the ``back`` blocks before it, oldest first (``fill`` before the stream)."""
    batch, length = x.shape[:2]
    count = length // block
    blocks = x.reshape(batch, count, block, *x.shape[2:])
    if back == 0:
        return blocks
    lead = jnp.full((batch, back, *blocks.shape[2:]), fill, x.dtype)
    padded = jnp.concatenate([lead, blocks], axis=1)  # [B, back + count, block, ...]
    return jnp.concatenate([padded[:, i : i + count] for i in range(back + 1)], axis=2)


def own_item_mask(item_ids: Array, block: int, back: int) -> Array:
    """[B, S'] item ids (-1 padding), S' a multiple of ``block`` -> [B, S'/block, block, C]
    with C = (back + 1) * block (``key_blocks``' keys): query i of block j may read key c
    iff both are in the same item and c is not later."""
    batch, length = item_ids.shape
    queries = item_ids.reshape(batch, length // block, block)  # [B, nb, block]
    keys = key_blocks(jnp.where(item_ids < 0, -2, item_ids), block, back, fill=-2)  # [B, nb, C]
    causal = jnp.arange(keys.shape[-1])[None, :] <= jnp.arange(block)[:, None] + back * block
    same = (queries[..., :, None] == keys[..., None, :]) & (queries[..., :, None] >= 0)
    return same & causal


def reader_ids(item_ids: Array) -> Array:
    """[B, S] sequence ids -> the sequence each token reads as a query: its own, and for a
    query-only token (id ``-3 - n``: it reads sequence n, no token reads it; a
    late-interaction query's fill tokens) n. As a key every negative id is read by none."""
    return jnp.where(item_ids <= -3, -3 - item_ids, item_ids)


def bidirectional_mask(item_ids: Array) -> Array:
    """[B, S] sequence ids (-1 padding, ``reader_ids``' query-only ids) -> [B, S, S]: token t
    reads s iff both are in the same sequence, whatever their order (an encoder's packed
    row); padding reads nothing, a query-only token is read by nothing."""
    readers = reader_ids(item_ids)
    same = readers[:, :, None] == item_ids[:, None, :]
    return same & (readers[:, :, None] >= 0)


def bidirectional_window_mask(item_ids: Array, positions: Array, half: int) -> Array:
    """[B, S] sequence ids (-1 padding) and positions (from 0 in each sequence) -> [B, S, S]:
    ``bidirectional_mask`` where the two positions are at most ``half`` apart (ModernBERT's
    local layers: +-``local_attention // 2`` inside its own sequence)."""
    near = jnp.abs(positions[:, :, None] - positions[:, None, :]) <= half
    return bidirectional_mask(item_ids) & near


def neighbor_blocks(x: Array, block: int, reach: int, fill: int = 0) -> Array:
    """[B, S', ...] in blocks of ``block`` -> [B, S'/block, (2 * reach + 1) * block, ...]:
    each block with the ``reach`` blocks before and after it, in stream order (``fill``
    beyond either end)."""
    if reach == 0:
        return key_blocks(x, block, 0)
    tail = jnp.full((x.shape[0], reach * block, *x.shape[2:]), fill, x.dtype)
    extended = jnp.concatenate([x, tail], axis=1)  # [B, S' + reach * block, ...]
    return key_blocks(extended, block, 2 * reach, fill)[:, reach:]


def segment_block_mask(item_ids: Array, block: int, reach: int) -> Array:
    """[B, S'] sequence ids (-1 padding), S' a multiple of ``block`` -> [B, S'/block, block,
    C] with C = (2 * reach + 1) * block (``neighbor_blocks``' keys): ``bidirectional_mask``
    restricted to the keys each block reads."""
    batch, length = item_ids.shape
    queries = reader_ids(item_ids).reshape(batch, length // block, block)  # [B, nb, block]
    keys = neighbor_blocks(jnp.where(item_ids < 0, -2, item_ids), block, reach, fill=-2)
    return (queries[..., :, None] == keys[..., None, :]) & (queries[..., :, None] >= 0)


def window_block_mask(positions: Array, block: int, reach: int, half: int) -> Array:
    """[B, S'] positions, S' a multiple of ``block`` -> [B, S'/block, block, C]: key c is at
    most ``half`` positions from query i (``segment_block_mask``'s layout; AND them)."""
    batch, length = positions.shape
    queries = positions.reshape(batch, length // block, block)  # [B, nb, block]
    keys = neighbor_blocks(positions, block, reach)  # [B, nb, C]
    return jnp.abs(queries[..., :, None] - keys[..., None, :]) <= half
