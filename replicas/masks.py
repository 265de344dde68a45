"""Attention masks built from explicit lengths and per-token metadata, never from token ids.

Every function works on jnp arrays inside a jitted step; tests compare them with literal
matrices. ``True`` means "may attend".

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


def prefix_visible(query_lengths: Array, length: int) -> Array:
    """[B] query lengths -> [B, T]: the prefix keys every item token reads."""
    return jnp.arange(length)[None, :] < query_lengths[:, None]


def item_self_mask(item_lengths: Array, length: int) -> Array:
    """[B, N] item lengths -> [B, N, L, L]: causal within the item, padding never read.

    A padding row keeps only itself so its softmax stays finite.
    """
    rows = jnp.arange(length)[:, None]  # [L, 1]
    cols = jnp.arange(length)[None, :]  # [1, L]
    valid_key = cols[None, None] < item_lengths[:, :, None, None]  # [B, N, 1, L]
    return ((cols <= rows)[None, None] & valid_key) | (rows == cols)[None, None]


def causal_positions(length: int) -> Array:
    """[T] positions 0..T-1 of a prefix stream."""
    return jnp.arange(length, dtype=jnp.int32)


def item_positions(query_lengths: Array, num_items: int, length: int) -> Array:
    """[B] query lengths -> [B, N, L]: item token k sits at position len(query) + k."""
    offsets = jnp.arange(length, dtype=jnp.int32)[None, None, :]
    return jnp.broadcast_to(
        query_lengths[:, None, None] + offsets, (len(query_lengths), num_items, length)
    )
