"""What every layout shares: bucket look-up, the LM head over scoring rows, unpacking.

A step's hidden states are flattened to ``[X, D]``; ``rows[r]`` names the hidden state whose
next-token distribution is score row r. The LM head runs in a loop over chunks of
``SCORE_CHUNK`` rows whose trip count is a traced scalar, so the number of items is not part
of any compiled shape and the LM head costs what the real rows need, never the padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from replicas.contract import ScoreWork
from replicas.model.causal_lm import CausalLM, Params
from replicas.settings import ReplicaSettings

Array = jax.Array
SCORE_CHUNK = 32


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


def step_capacity(settings: ReplicaSettings) -> int:
    """Stream tokens one step takes: the largest bucket within ``item_tokens_per_step``
    (chunks then fill a bucket exactly instead of padding to the next)."""
    fitting = [b for b in settings.item_token_buckets if b <= settings.item_tokens_per_step]
    return fitting[-1] if fitting else settings.item_tokens_per_step


def score_capacity(rows: int) -> int:
    """Score rows a step can hold: ``rows`` rounded up to whole chunks."""
    return -(-max(rows, 1) // SCORE_CHUNK) * SCORE_CHUNK


def score_rows(
    model: CausalLM,
    params: Params,
    hidden: Array,  # [X, D]
    rows: Array,  # [R] int32 indices into hidden, R a multiple of SCORE_CHUNK
    labels: Array,  # [R, C] int32
    count: Array,  # [] int32: real rows, the rest is padding
) -> Array:
    """Label log-probabilities ``[R, C]`` float32 of the first ``count`` rows (rest zeros)."""

    def chunk(i: Array, out: Array) -> Array:
        start = i * SCORE_CHUNK
        index = jax.lax.dynamic_slice_in_dim(rows, start, SCORE_CHUNK)  # [CH]
        chunk_labels = jax.lax.dynamic_slice_in_dim(labels, start, SCORE_CHUNK)  # [CH, C]
        picked = jnp.take(hidden, index, axis=0)  # [CH, D]
        scores = model.label_logprobs(params, picked, chunk_labels)  # [CH, C]
        return jax.lax.dynamic_update_slice_in_dim(out, scores, start, axis=0)

    trips = (count + SCORE_CHUNK - 1) // SCORE_CHUNK
    return jax.lax.fori_loop(0, trips, chunk, jnp.zeros(labels.shape, jnp.float32))


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


def labels_by_row(works: Sequence[ScoreWork], slots: Sequence[RowSlot], shape: tuple) -> np.ndarray:
    """[R, C] int32: each score row gets its work's label ids."""
    labels = np.zeros(shape, np.int32)
    for slot in slots:
        ids = works[slot.work].label_ids
        labels[slot.first_row : slot.first_row + slot.num_items, : len(ids)] = ids
    return labels


def unpack(
    outputs: np.ndarray, slots: Sequence[RowSlot], works: Sequence[ScoreWork], into: list
) -> None:
    """Scatter ``outputs [R, C]`` into ``into[w]`` arrays of shape [items, labels]."""
    for slot in slots:
        num_labels = len(works[slot.work].label_ids)
        rows = outputs[slot.first_row : slot.first_row + slot.num_items, :num_labels]
        into[slot.work][slot.first_item : slot.first_item + slot.num_items] = rows
