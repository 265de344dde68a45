"""The dense steps: token rows ``[R, T]``, causal rows or a mask built from segment ids.

``causal_step`` runs the single-item layout (each ``query + item`` row causal on its own,
``lengths`` real tokens then padding: what a fused causal kernel computes); ``dense_step``
the packed reference layout (RFC-008's packed row, a mask from segment ids). Score rows index
the flattened ``[R * T]`` hidden states, so the number of scored positions is no compiled
dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import numpy as np

from replicas.engine.layouts.common import BucketDims, score_capacity, score_rows
from replicas.model.causal_lm import AttentionSpec, CausalLM, CausalSpec, DenseSpec, Params
from replicas.model.masks import segment_mask

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
    model: CausalLM,
    params: Params,
    tokens: Array,  # [R, T]
    positions: Array,  # [R, T]
    spec: DenseSpec,
    rows: Array,  # [Rs] indices into the flattened [R * T] hidden states
    labels: Array,  # [Rs, C]
    count: Array,  # []
) -> Array:
    hidden = model.hidden_states(params, tokens, positions, spec)
    flat = hidden.reshape(-1, hidden.shape[-1])  # [R * T, D]
    return score_rows(model, params, flat, rows, labels, count)


def dense_step(
    model: CausalLM, params: Params, tokens: Array, positions: Array, segments: Array, *score: Array
) -> Array:
    """Rows whose mask comes from segment ids ``[R, T]`` (the packed reference)."""
    return _scored(model, params, tokens, positions, AttentionSpec(segment_mask(segments)), *score)


def causal_step(
    model: CausalLM, params: Params, tokens: Array, positions: Array, lengths: Array, *score: Array
) -> Array:
    """Causal rows of ``lengths [R]`` real tokens each (the single-item layout)."""
    return _scored(model, params, tokens, positions, CausalSpec(lengths), *score)


def dense_specs(
    spec: Callable[[tuple[int, ...], Any], Any], dims: DenseDims, causal: bool = False
) -> tuple[Any, ...]:
    """Abstract arguments (after params) of a dense (or causal) step of ``dims``."""
    r, t = dims.rows, dims.tokens
    rows = score_capacity(r * t)
    return (
        spec((r, t), np.int32),
        spec((r, t), np.int32),
        spec((r,) if causal else (r, t), np.int32),
        spec((rows,), np.int32),
        spec((rows, dims.labels), np.int32),
        spec((), np.int32),
    )


def compile_dense(model: CausalLM, runner: Any, dims: DenseDims, causal: bool = False) -> Any:
    """The dense (or causal) step of ``dims``, compiled ahead of time through the runner."""
    step = jax.jit(partial(causal_step if causal else dense_step, model))
    return runner.lower(step, dense_specs(runner.spec, dims, causal))
