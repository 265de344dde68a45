"""Which item-stream attention a mesh runs: Pallas kernels on TPU, XLA elsewhere.

``layers.attend_item_stream`` (XLA) is the reference everywhere. On TPU the two parts run as
Pallas kernels (``pallas_attention.item_stream_attention``) inside ``shard_map``: each device
attends its own heads (and batch rows), laid out by the one sharding table. Pallas on another
platform runs in interpret mode, which is how the tests check it on CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import jax
from jax.sharding import Mesh, PartitionSpec

from cluster.sharding import partition_spec
from replicas.layers import attend_item_stream
from replicas.model import CausalLM
from replicas.pallas_attention import item_stream_attention

Array = jax.Array


def mesh_platform(mesh: Mesh) -> str:
    return str(mesh.devices.flat[0].platform)


def uses_pallas(choice: str, mesh: Mesh) -> bool:
    """``attention`` setting: auto (Pallas on TPU), xla, or pallas."""
    return choice == "pallas" or (choice == "auto" and mesh_platform(mesh) == "tpu")


def with_stream_attention(model: CausalLM, choice: str, mesh: Mesh) -> CausalLM:
    """``model`` running the item-stream attention the setting and the mesh call for."""
    if not uses_pallas(choice, mesh):
        return dataclasses.replace(model, stream_attention=attend_item_stream)
    interpret = mesh_platform(mesh) != "tpu"
    kernel = partial(sharded_stream_attention, mesh=mesh, interpret=interpret)
    return dataclasses.replace(model, stream_attention=kernel)


def _specs(q: Array, k: Array, mesh: Mesh) -> tuple[PartitionSpec, PartitionSpec, PartitionSpec]:
    """(heads-axis spec of q, of k/v, of [B, tokens] metadata): heads split over ``model``
    only when both head counts divide, so every device keeps whole GQA groups."""
    q_spec = partition_spec(("batch", "seq", "heads", "head_dim"), q.shape, mesh)
    kv_spec = partition_spec(("batch", "seq", "kv_heads", "head_dim"), k.shape, mesh)
    if q_spec[2] != kv_spec[2]:
        q_spec = PartitionSpec(q_spec[0], None, None, None)
        kv_spec = PartitionSpec(kv_spec[0], None, None, None)
    return q_spec, kv_spec, PartitionSpec(q_spec[0], None)


def sharded_stream_attention(
    q: Array,  # [B, S, H, Dh]
    prefix_k: Array,  # [B, T, K, Dh]
    prefix_v: Array,
    prefix_valid: Array,  # [B, T]
    k: Array,  # [B, S, K, Dh]
    v: Array,
    item_ids: Array,  # [B, S]
    window: int,
    *,
    mesh: Mesh,
    interpret: bool,
) -> Array:
    """``attend_item_stream``'s contract through the Pallas kernels, per device."""
    q_spec, kv_spec, rows = _specs(q, k, mesh)
    kernel: Callable[..., Array] = partial(
        item_stream_attention, window=window, interpret=interpret
    )
    sharded = jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(q_spec, kv_spec, kv_spec, rows, kv_spec, kv_spec, rows),
        out_specs=q_spec,
        check_vma=False,
    )
    return sharded(q, prefix_k, prefix_v, prefix_valid, k, v, item_ids)
