"""The one table that maps logical axis names to mesh axes, and what follows from it.

Every parameter and activation names its axes logically (``replicas.model.params``); this table
alone decides where each lands on the (data, model) mesh. A dimension that a mesh axis does
not divide is replicated instead (documented fallback, see docs/models.md), so odd head
counts such as SmolLM2's 9 heads never crash deep inside XLA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_AXIS_RULES: Mapping[str, str | None] = {
    "batch": "data",
    "layers": None,
    "vocab": "model",
    "embed": None,
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "mlp": "model",
    "norm": None,
    "seq": None,
    # A quantized model's residual stream between its blocks (replicas.model.token_split),
    # and its o projection's heads: that weight whole on every chip, which reads its own tokens.
    "split_tokens": "model",
    "whole_heads": None,
    "labels": None,  # a score head's outputs (few)
    "head_hidden": "model",  # a reward head's inner width, split like the MLP's
    "positions": None,  # an encoder's learned position and token-type embeddings (small)
    "token_types": None,
    # ModernBERT's fused q/k/v [D, 3 * H * Dh] and GeGLU input [D, 2F] are whole on every
    # device (their halves are not contiguous per shard), its Wo input [H * Dh, D] too.
    "qkv": None,
    "heads_flat": None,
    "mlp2": None,
    # LoRA adapter stacks (replicas.model.lora): A [layers, slots, *in, rank] and
    # B [layers, slots, rank, *out] split on the model axis where their base matrix is
    # (heads, kv_heads, mlp); slots and rank are small and whole on every device.
    "lora_slots": None,
    "lora_rank": None,
}


def partition_spec(
    logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh
) -> PartitionSpec:
    """PartitionSpec for one array; replicate any dimension its mesh axis does not divide."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {logical_axes} do not match shape {shape}")
    used: set[str] = set()
    spec: list[str | None] = []
    for name, size in zip(logical_axes, shape, strict=True):
        if name is not None and name not in LOGICAL_AXIS_RULES:
            raise KeyError(f"logical axis {name!r} has no rule in LOGICAL_AXIS_RULES")
        axis = None if name is None else LOGICAL_AXIS_RULES[name]
        if axis is None or axis in used or size % mesh.shape[axis]:
            spec.append(None)
            continue
        used.add(axis)
        spec.append(axis)
    return PartitionSpec(*spec)


def named_sharding(
    logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh
) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(logical_axes, shape, mesh))


def tree_shardings(logical_tree: Any, shape_tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a pytree, given matching trees of logical axes and shapes."""
    return jax.tree_util.tree_map(
        lambda axes, shape: named_sharding(axes, shape, mesh),
        logical_tree,
        shape_tree,
        is_leaf=lambda node: isinstance(node, tuple),
    )


def replicated(mesh: Mesh) -> NamedSharding:
    """Masks and per-token metadata: the same full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())
