"""Host-side packing of scoring work into bucketed, static-shape NumPy arrays.

Three layouts (DESIGN.md "Architecture"):
- single-item: one row per item, ``query + item`` (``item + query`` for ``item_first``);
- shared-prefix (default multi-item): the query once as a prefix ``[T]``, items as ``[N, L]``;
- packed reference: RFC-008's ``query<d>item1<d>...itemN<d>`` as one row, with segment ids
  from which ``masks.segment_mask`` builds the shared-prefix + block-diagonal mask.
Per-token metadata comes from lengths only; delimiter ids are written, never searched for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from replicas.contract import ScoreWork
from replicas.masks import DELIMITER, PAD, QUERY


class BucketOverflowError(ValueError):
    """A size is larger than the largest configured bucket."""


def bucket_for(size: int, buckets: Sequence[int], name: str) -> int:
    """Smallest bucket >= size (>= 1)."""
    for candidate in buckets:
        if candidate >= max(size, 1):
            return candidate
    raise BucketOverflowError(f"{name}: size {size} exceeds the largest bucket {buckets[-1]}")


def label_bucket(num_labels: int) -> int:
    """Label counts pad to powers of two."""
    return 1 << max(num_labels - 1, 0).bit_length()


@dataclass(frozen=True)
class Buckets:
    tokens: tuple[int, ...]  # row / prefix lengths
    item_lengths: tuple[int, ...]  # L of the shared-prefix layout
    items: tuple[int, ...]  # N
    batch: tuple[int, ...]  # requests per shared-prefix or packed step
    rows: tuple[int, ...]  # rows per single-item step


@dataclass(frozen=True)
class RowSlot:
    """Output row r holds items [first_item, first_item + num_items) of works[work]."""

    work: int
    first_item: int
    num_items: int


@dataclass(frozen=True)
class DenseBatch:
    """Single-item rows or packed reference rows."""

    tokens: np.ndarray  # [R, T] int32
    positions: np.ndarray  # [R, T] int32
    segments: np.ndarray  # [R, T] int32
    score_index: np.ndarray  # [R, K] int32
    labels: np.ndarray  # [R, C] int32
    slots: tuple[RowSlot, ...]


@dataclass(frozen=True)
class PrefixBatch:
    """Shared-prefix layout: queries once, items as a batch behind them."""

    query_tokens: np.ndarray  # [B, T] int32
    query_lengths: np.ndarray  # [B] int32
    item_tokens: np.ndarray  # [B, N, L] int32
    item_lengths: np.ndarray  # [B, N] int32
    labels: np.ndarray  # [B, C] int32
    slots: tuple[RowSlot, ...]


def _labels(works: Sequence[ScoreWork], rows: int, slots: Sequence[RowSlot]) -> np.ndarray:
    width = label_bucket(max(len(works[s.work].label_ids) for s in slots))
    labels = np.zeros((rows, width), np.int32)
    for r, slot in enumerate(slots):
        ids = works[slot.work].label_ids
        labels[r, : len(ids)] = ids
    return labels


def single_item_row(work: ScoreWork, item: int) -> tuple[int, ...]:
    ids = work.item_ids[item]
    return ids + work.query_ids if work.item_first else work.query_ids + ids


def pack_single_item(
    works: Sequence[ScoreWork], pairs: Sequence[tuple[int, int]], buckets: Buckets
) -> DenseBatch:
    """One row per (work, item) pair; scored at the row's last token."""
    rows = [single_item_row(works[w], i) for w, i in pairs]
    num_rows = bucket_for(len(rows), buckets.rows, "rows")
    length = bucket_for(max(len(r) for r in rows), buckets.tokens, "tokens")
    tokens = np.zeros((num_rows, length), np.int32)
    segments = np.full((num_rows, length), PAD, np.int32)
    score_index = np.zeros((num_rows, 1), np.int32)
    for r, row in enumerate(rows):
        tokens[r, : len(row)] = row
        segments[r, : len(row)] = QUERY
        score_index[r, 0] = len(row) - 1
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (num_rows, length)).copy()
    slots = tuple(RowSlot(w, i, 1) for w, i in pairs)
    return DenseBatch(
        tokens, positions, segments, score_index, _labels(works, num_rows, slots), slots
    )


def _packed_row(work: ScoreWork, delimiter: int) -> tuple[list[int], list[int], list[int]]:
    """tokens, positions, segments of ``query<d>item1<d>...itemN<d>``."""
    q = len(work.query_ids)
    tokens, positions, segments = list(work.query_ids), list(range(q)), [QUERY] * q
    for i, item in enumerate(work.item_ids):
        tokens += [delimiter, *item]
        positions += [q, *range(q, q + len(item))]
        segments += [DELIMITER] + [i + 1] * len(item)
    tokens.append(delimiter)
    positions.append(q)
    segments.append(DELIMITER)
    return tokens, positions, segments


def _packed_score_index(work: ScoreWork) -> list[int]:
    """Last token of each item; the last query token for an empty item."""
    q, cursor, index = len(work.query_ids), len(work.query_ids), []
    for item in work.item_ids:
        cursor += 1 + len(item)  # the delimiter before the item, then the item
        index.append(cursor - 1 if item else q - 1)
    return index


def pack_reference(
    works: Sequence[ScoreWork], indices: Sequence[int], delimiter: int, buckets: Buckets
) -> DenseBatch:
    """One packed row per work."""
    packed = [_packed_row(works[w], delimiter) for w in indices]
    num_rows = bucket_for(len(indices), buckets.batch, "batch")
    length = bucket_for(max(len(p[0]) for p in packed), buckets.tokens, "tokens")
    width = bucket_for(max(works[w].num_items for w in indices), buckets.items, "items")
    tokens = np.zeros((num_rows, length), np.int32)
    positions = np.zeros((num_rows, length), np.int32)
    segments = np.full((num_rows, length), PAD, np.int32)
    score_index = np.zeros((num_rows, width), np.int32)
    for r, (w, (tok, pos, seg)) in enumerate(zip(indices, packed, strict=True)):
        tokens[r, : len(tok)], positions[r, : len(pos)], segments[r, : len(seg)] = tok, pos, seg
        index = _packed_score_index(works[w])
        score_index[r, : len(index)] = index
    slots = tuple(RowSlot(w, 0, works[w].num_items) for w in indices)
    return DenseBatch(
        tokens, positions, segments, score_index, _labels(works, num_rows, slots), slots
    )


def pack_shared_prefix(
    works: Sequence[ScoreWork], indices: Sequence[int], buckets: Buckets
) -> PrefixBatch:
    """Queries as ``[B, T]`` prefixes, items as ``[B, N, L]``."""
    chosen = [works[w] for w in indices]
    batch = bucket_for(len(chosen), buckets.batch, "batch")
    length = bucket_for(max(len(w.query_ids) for w in chosen), buckets.tokens, "tokens")
    num_items = bucket_for(max(w.num_items for w in chosen), buckets.items, "items")
    item_len = bucket_for(
        max((len(i) for w in chosen for i in w.item_ids), default=0),
        buckets.item_lengths,
        "item_lengths",
    )
    query_tokens = np.zeros((batch, length), np.int32)
    query_lengths = np.zeros((batch,), np.int32)
    item_tokens = np.zeros((batch, num_items, item_len), np.int32)
    item_lengths = np.zeros((batch, num_items), np.int32)
    for b, work in enumerate(chosen):
        query_tokens[b, : len(work.query_ids)] = work.query_ids
        query_lengths[b] = len(work.query_ids)
        for n, item in enumerate(work.item_ids):
            item_tokens[b, n, : len(item)] = item
            item_lengths[b, n] = len(item)
    slots = tuple(RowSlot(w, 0, works[w].num_items) for w in indices)
    labels = _labels(works, batch, slots)
    return PrefixBatch(query_tokens, query_lengths, item_tokens, item_lengths, labels, slots)


def unpack(
    outputs: np.ndarray, slots: Sequence[RowSlot], works: Sequence[ScoreWork], into: list
) -> None:
    """Scatter ``outputs [R, K, C]`` into ``into[w]`` arrays of shape [items, labels]."""
    for r, slot in enumerate(slots):
        num_labels = len(works[slot.work].label_ids)
        end = slot.first_item + slot.num_items
        into[slot.work][slot.first_item : end] = outputs[r, : slot.num_items, :num_labels]
