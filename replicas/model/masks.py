"""Attention masks built from explicit lengths and per-token metadata, never from token ids.

Every function works on jnp arrays inside a jitted step; tests compare them with literal
matrices. ``True`` means "may attend". Two families: dense rows (``segment_mask``: single-item
rows and RFC-008's packed reference row; ``work_segment_mask``: several small works back to
back in one row, the fused layout) and the item stream's own-item part
(``own_item_mask``: blocks of W stream tokens reading their block and the one before).

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


def window_blocks(x: Array, window: int, fill: int = 0) -> Array:
    """[B, S', ...] in blocks of ``window`` -> [B, S'/W, 2W (W when one block), ...]: each
    block with the block before it (``fill`` before the first)."""
    batch, length = x.shape[:2]
    blocks = x.reshape(batch, length // window, window, *x.shape[2:])
    if blocks.shape[1] == 1:
        return blocks
    previous = jnp.concatenate([jnp.full_like(blocks[:, :1], fill), blocks[:, :-1]], axis=1)
    return jnp.concatenate([previous, blocks], axis=2)


def own_item_mask(item_ids: Array, window: int) -> Array:
    """[B, S'] item ids (-1 padding), S' a multiple of W -> [B, S'/W, W, 2W] (or [.., W, W]):
    query i of block j may read window key c iff both are in the same item and c is not later.
    """
    batch, length = item_ids.shape
    queries = item_ids.reshape(batch, length // window, window)  # [B, nb, W]
    keys = window_blocks(jnp.where(item_ids < 0, -2, item_ids), window, fill=-2)  # [B, nb, W or 2W]
    offset = keys.shape[-1] - window  # keys before the block
    causal = jnp.arange(keys.shape[-1])[None, :] <= jnp.arange(window)[:, None] + offset
    same = (queries[..., :, None] == keys[..., None, :]) & (queries[..., :, None] >= 0)
    return same & causal
