"""What every layout shares: bucket look-up, the LM head over scoring rows, unpacking.

A step's hidden states are flattened to ``[X, D]``; ``rows[r]`` names the hidden state whose
next-token distribution is score row r. The LM head runs in a loop over chunks of
``SCORE_CHUNK`` rows (``score_chunk``: fewer in a step that holds fewer) whose trip count is a
traced scalar, so the number of items is not part of any compiled shape and the LM head costs
what the real rows need, never the padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.contract import ScoreWork
from replicas.model.protocol import DecoderModel, Params
from replicas.settings import EngineSettings

Array = jax.Array
SCORE_CHUNK = 32
# An abstract step argument: (shape, dtype, logical axes or None for a whole copy per device).
Spec = Callable[[tuple[int, ...], Any, tuple[str | None, ...] | None], Any]


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


def step_capacity(engine: EngineSettings) -> int:
    """Stream tokens one step takes: the largest bucket within ``item_tokens_per_step``
    (chunks then fill a bucket exactly instead of padding to the next)."""
    fitting = [b for b in engine.item_token_buckets if b <= engine.item_tokens_per_step]
    return fitting[-1] if fitting else engine.item_tokens_per_step


def score_chunk(rows: int) -> int:
    """Rows the LM head takes at once in a step that holds ``rows`` score rows (per data
    shard): ``SCORE_CHUNK``, or the power of two >= ``rows`` below it. A chunk of a step's
    whole capacity is computed once, whatever its trip count, so a small step's head computes
    the rows it can hold, not 32 (a 16-token fused row: 16; the head's matmul is
    compute-bound at these widths on a CPU, docs/engine.md)."""
    return min(SCORE_CHUNK, 1 << (max(rows, 1) - 1).bit_length())


def score_capacity(rows: int) -> int:
    """Score rows a step can hold: ``rows`` rounded up to whole chunks (``score_chunk``)."""
    chunk = score_chunk(rows)
    return -(-max(rows, 1) // chunk) * chunk


def data_multiple(size: int, groups: int) -> int:
    """``size`` rounded up to a multiple of the data axis (a batch or row bucket), so the
    axis divides it and every data shard gets its own rows."""
    return -(-max(size, 1) // groups) * groups


def spread_row(i: int, rows: int, groups: int) -> int:
    """Where the i-th real row of a step goes: round-robin over the ``groups`` blocks of
    ``rows // groups`` rows, so a step with fewer real rows than ``rows`` still keeps every
    data shard busy."""
    return i % groups * (rows // groups) + i // groups


def data_buckets(buckets: Sequence[int], groups: int) -> tuple[int, ...]:
    """Batch (or row) buckets as multiples of the data axis."""
    return tuple(sorted({data_multiple(b, groups) for b in buckets}))


def score_rows(
    model: DecoderModel,
    params: Params,
    hidden: Array,  # [G, X, D]: G = data shards, each group's own hidden states
    rows: Array,  # [G, Rg] int32 indices into each group's X, Rg a score_capacity
    labels: Array,  # [G, Rg, C] int32
    count: Array,  # [] int32: real rows in the fullest group, the rest is padding
) -> Array:
    """Label log-probabilities ``[G, Rg, C]`` float32 of the first ``count`` rows of every
    group (rest zeros). Each group reads only its own hidden states, so with G sharded over
    ``data`` the LM head runs on every shard at once with no gather across shards."""
    groups, size = hidden.shape[0], score_chunk(rows.shape[1])

    def chunk(i: Array, out: Array) -> Array:
        start = i * size
        index = jax.lax.dynamic_slice_in_dim(rows, start, size, axis=1)  # [G, CH]
        chunk_labels = jax.lax.dynamic_slice_in_dim(labels, start, size, axis=1)
        picked = jnp.take_along_axis(hidden, index[..., None], axis=1)  # [G, CH, D]
        flat = picked.reshape(groups * size, -1)  # [G * CH, D]
        scores = model.label_logprobs(params, flat, chunk_labels.reshape(flat.shape[0], -1))
        scores = scores.reshape(groups, size, -1)  # [G, CH, C]
        return jax.lax.dynamic_update_slice_in_dim(out, scores, start, axis=1)

    trips = (count + size - 1) // size
    return jax.lax.fori_loop(0, trips, chunk, jnp.zeros(labels.shape, jnp.float32))


def grouped(hidden: Array, groups: int) -> Array:
    """``[N, L, D]`` -> ``[G, N / G * L, D]``: consecutive rows per data shard."""
    n, length, d = hidden.shape
    return hidden.reshape(groups, n // groups * length, d)


class ScoreIndex:
    """Host-side score rows of a step whose ``units`` rows (each ``width`` hidden states)
    are split into ``groups`` consecutive blocks, one per data shard: ``rows [G, Rg]``
    holds indices into each block's own hidden states, and the step's output ``[G, Rg, C]``
    flattens to row ``g * Rg + r``."""

    def __init__(self, groups: int, units: int, width: int, rows_per_state: int = 1) -> None:
        self.groups, self.per_group, self.width = groups, units // groups, width
        capacity = score_capacity(rows_per_state * self.per_group * width)
        self.rows = np.zeros((groups, capacity), np.int32)
        self._next = [0] * groups

    def add(self, unit: int, offset: int) -> int:
        """Score hidden state ``offset`` of ``unit``; returns its flat output row."""
        group, local = divmod(unit, self.per_group)
        return self._put(group, local * self.width + offset)

    def add_extra(self, unit: int) -> int:
        """Score ``unit``'s extra state, appended after its block's ``per_group * width``
        (the stream's prefix last states, one per unit); returns its flat output row."""
        group, local = divmod(unit, self.per_group)
        return self._put(group, self.per_group * self.width + local)

    def first_row(self, unit: int) -> int:
        """The flat output row the next score of ``unit`` gets."""
        group = unit // self.per_group
        return group * self.rows.shape[1] + self._next[group]

    def _put(self, group: int, index: int) -> int:
        row = self._next[group]
        self.rows[group, row] = index
        self._next[group] += 1
        return group * self.rows.shape[1] + row

    @property
    def count(self) -> np.ndarray:
        return np.asarray(max(self._next), np.int32)

    def labels(
        self, works: Sequence[ScoreWork], slots: Sequence[RowSlot], width: int
    ) -> np.ndarray:
        """``[G, Rg, width]`` int32: each score row gets its work's label ids."""
        labels = np.zeros((self.rows.size, width), np.int32)
        for slot in slots:
            ids = works[slot.work].label_ids
            labels[slot.first_row : slot.first_row + slot.num_items, : len(ids)] = ids
        return labels.reshape(*self.rows.shape, width)


class BucketDims:
    """Base of a step's frozen dims dataclass (its compiled signature): every field is a
    padded size, and a signature covers another when every field is at least as large.
    Subclasses define a ``cost`` property."""

    def astuple(self) -> tuple[int, ...]:
        return dataclasses.astuple(self)  # type: ignore[call-overload]

    def covers(self, other: BucketDims) -> bool:
        return all(a >= b for a, b in zip(self.astuple(), other.astuple(), strict=True))

    def cost_for(self, exact: BucketDims) -> int:
        """Rough work of running ``exact``'s step on this signature (each subclass defines
        ``cost``, the work of one step of its own shape)."""
        return self.cost  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RowSlot:
    """Score rows [first_row, first_row + num_items) hold items
    [first_item, first_item + num_items) of works[work]."""

    work: int
    first_item: int
    num_items: int
    first_row: int


def unpack(
    outputs: np.ndarray, slots: Sequence[RowSlot], works: Sequence[ScoreWork], into: list
) -> None:
    """Scatter ``outputs [G, Rg, C]`` (flat row ``g * Rg + r``) into ``into[w]`` arrays of
    shape [items, labels]."""
    outputs = outputs.reshape(-1, outputs.shape[-1])
    for slot in slots:
        num_labels = len(works[slot.work].label_ids)
        rows = outputs[slot.first_row : slot.first_row + slot.num_items, :num_labels]
        into[slot.work][slot.first_item : slot.first_item + slot.num_items] = rows


def lay_row(
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
    row: int,
    pieces: Sequence[Sequence[int]],
    offsets: int | Sequence[int] = 0,
    ids: Sequence[int] | None = None,
    start: int = 0,
) -> list[tuple[int, int]]:
    """The one row packer: ``pieces`` end to end in row ``row`` of a step's ``(tokens,
    positions, segment ids)`` arrays ``[B, S]``, from ``start``: each piece's tokens, its
    positions counted from its offset (``offsets[n]``, or one for every piece) and its
    segment id (``ids[n]``, default ``n``). Returns each piece's ``(start, end)``."""
    tokens, positions, segments = arrays
    spans = []
    for n, piece in enumerate(pieces):
        end = start + len(piece)
        tokens[row, start:end] = piece
        offset = offsets[n] if isinstance(offsets, Sequence) else offsets
        positions[row, start:end] = offset + np.arange(len(piece))
        segments[row, start:end] = n if ids is None else ids[n]
        spans.append((start, end))
        start = end
    return spans
