"""The dense steps: token rows ``[R, T]``, causal rows or a mask built from segment ids.

``causal_step`` runs the single-item layout (each ``query + item`` row causal on its own,
``lengths`` real tokens then padding: what a fused causal kernel computes); ``dense_step``
the packed reference layout (RFC-008's packed row, a mask from segment ids); ``fused_step``
the fused layout (small works back to back in a row, a mask from work and segment ids).
Rows are split into one block per data shard; score rows index each block's flattened hidden
states, so the number of scored positions is no compiled dimension and no shard reads
another's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import numpy as np

from replicas.engine.layouts.common import BucketDims, Spec, grouped, score_capacity, score_rows
from replicas.model.causal_lm import AttentionSpec, CausalSpec, DenseSpec, Params
from replicas.model.masks import segment_mask, work_segment_mask
from replicas.model.protocol import DecoderModel

Array = jax.Array


@dataclass(frozen=True, order=True)
class DenseDims(BucketDims):
    """The compiled shape of a dense step: rows R of T tokens, C labels."""

    rows: int
    tokens: int
    labels: int

    def covers(self, other: BucketDims) -> bool:
        """Rows are independent: fewer rows cover a step run in several pieces."""
        return self.tokens >= other.tokens and self.labels >= other.labels

    @property
    def cost(self) -> int:
        return self.rows * self.tokens * 64 + self.labels

    def cost_for(self, exact: BucketDims) -> int:
        pieces = -(-exact.rows // self.rows)  # type: ignore[attr-defined]
        return pieces * self.cost


def _scored(
    model: DecoderModel,
    params: Params,
    tokens: Array,  # [R, T]
    positions: Array,  # [R, T]
    spec: DenseSpec,
    rows: Array,  # [G, Rg] indices into each group's [R / G * T] hidden states
    labels: Array,  # [G, Rg, C]
    count: Array,  # []
) -> Array:
    hidden = model.hidden_states(params, tokens, positions, spec)  # [R, T, D]
    return score_rows(model, params, grouped(hidden, rows.shape[0]), rows, labels, count)


def dense_step(
    model: DecoderModel, params: Params, tokens: Array, positions: Array, segments: Array,
    *score: Array,
) -> Array:  # fmt: skip
    """Rows whose mask comes from segment ids ``[R, T]`` (the packed reference)."""
    return _scored(model, params, tokens, positions, AttentionSpec(segment_mask(segments)), *score)


def fused_step(
    model: DecoderModel,
    params: Params,
    tokens: Array,  # [R, T]
    positions: Array,  # [R, T]
    segments: Array,  # [R, T]
    works: Array,  # [R, T] work of each token, -1 padding
    *score: Array,
) -> Array:
    """Rows of several small works back to back (the fused layout), each work's tokens
    reading only its own query and their own item."""
    spec = AttentionSpec(work_segment_mask(works, segments))
    return _scored(model, params, tokens, positions, spec, *score)


def causal_step(
    model: DecoderModel, params: Params, tokens: Array, positions: Array, lengths: Array,
    *score: Array,
) -> Array:  # fmt: skip
    """Causal rows of ``lengths [R]`` real tokens each (the single-item layout)."""
    return _scored(model, params, tokens, positions, CausalSpec(lengths), *score)


STEPS = {"dense": dense_step, "causal": causal_step, "fused": fused_step}


def dense_specs(spec: Spec, dims: DenseDims, groups: int, step: str = "dense") -> tuple[Any, ...]:
    """Abstract arguments (after params) of a ``step`` (``STEPS``) of ``dims``: rows split
    over ``data`` by the logical-axis table."""
    r, t = dims.rows, dims.tokens
    rows = score_capacity(r // groups * t)
    token_row = spec((r, t), np.int32, ("batch", "seq"))
    per_token = {"dense": (token_row,), "causal": (), "fused": (token_row, token_row)}[step]
    lengths = (spec((r,), np.int32, ("batch",)),) if step == "causal" else ()
    return (
        token_row,
        token_row,
        *lengths,
        *per_token,
        spec((groups, rows), np.int32, ("batch", None)),
        spec((groups, rows, dims.labels), np.int32, ("batch", None, None)),
        spec((), np.int32, None),
    )


def compile_dense(model: DecoderModel, runner: Any, dims: DenseDims, step: str = "dense") -> Any:
    """The ``step`` (``STEPS``) of ``dims``, compiled ahead of time through the runner."""
    placement = runner.placement  # scores gathered once, readable by every host of a group
    jitted = jax.jit(partial(STEPS[step], model), out_shardings=placement.replicated)
    return runner.lower(jitted, dense_specs(placement.spec, dims, placement.groups, step))
