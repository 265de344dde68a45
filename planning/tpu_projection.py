"""Paper projections of a step's time on a TPU chip: a roofline from analytic FLOPs and bytes.

XLA's ``cost_analysis`` counts the body of the layer scan once, so the FLOPs here are
analytic (``replicas.model.flops``), for the padded shapes a step really computes. A step's time is
``max(FLOPs / peak, bytes / bandwidth)`` per chip: the model axis splits the work, the data
axis repeats it (step inputs are replicated). It leaves out collectives over ICI, kernel
efficiency and host overhead, so it is a lower bound on step time, not a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster.tpu_topology import ChipSpec
from replicas.model.config import ModelConfig
from replicas.model.flops import lm_head_flops, matmul_params_per_token


@dataclass(frozen=True)
class StepCost:
    """One chip's share of a step: FLOPs, HBM bytes moved, and the roofline time."""

    flops: float
    bytes: float
    seconds: float


def attention_flops(c: ModelConfig, tokens: int, keys: int) -> int:
    """QK^T and PV of ``tokens`` queries over ``keys`` keys, every layer."""
    return 4 * tokens * keys * c.num_heads * c.head_dim * c.num_layers


def kv_bytes(c: ModelConfig, tokens: int, itemsize: int) -> int:
    return 2 * c.num_layers * tokens * c.num_kv_heads * c.head_dim * itemsize


def step_flops(c: ModelConfig, kind: str, dims: Any, rows: int) -> int:
    """Padded FLOPs of one step as compiled: prefix (B, T) dense, items (B, T, S, W) with
    the prefix part over T and the own-item part over 2W keys, rows (R, L) dense; plus the
    LM head over ``rows`` scored rows."""
    dense = 2 * matmul_params_per_token(c)
    if kind == "prefix":
        tokens = dims.batch * dims.tokens
        return tokens * dense + attention_flops(c, tokens, dims.tokens)
    if kind == "items":
        tokens = dims.batch * dims.tokens
        keys = dims.prefix + 2 * dims.window
        return tokens * dense + attention_flops(c, tokens, keys) + rows * lm_head_flops(c)
    tokens = dims.rows * dims.tokens
    return tokens * dense + attention_flops(c, tokens, dims.tokens) + rows * lm_head_flops(c)


def step_bytes(c: ModelConfig, kind: str, dims: Any, param_bytes: int, itemsize: int) -> int:
    """Weights read once per step, plus the prefix keys/values written (prefix) or read
    (items), per chip before the model-axis split of the KV part."""
    if kind == "prefix":
        return param_bytes + kv_bytes(c, dims.batch * dims.tokens, itemsize)
    if kind == "items":
        return param_bytes + kv_bytes(c, dims.batch * dims.prefix, itemsize)
    return param_bytes


def project_step(
    c: ModelConfig,
    kind: str,
    dims: Any,
    rows: int,
    chip: ChipSpec,
    model_axis: int,
    param_bytes_per_chip: int,
    itemsize: int,
) -> StepCost:
    flops = step_flops(c, kind, dims, rows) / model_axis
    kv = step_bytes(c, kind, dims, 0, itemsize) / model_axis
    moved = param_bytes_per_chip + kv
    return StepCost(flops, moved, max(flops / chip.peak_flops, moved / chip.hbm_bandwidth))


def items_per_second(items: int, costs: Sequence[StepCost]) -> float:
    return items / sum(cost.seconds for cost in costs)
