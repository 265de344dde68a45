"""Which attention kernels a mesh runs: the ``attention`` setting and the platform decide.

The XLA functions (``model.masked_attention`` for dense rows, ``layers.attend_item_stream``
for the item stream) are the reference everywhere and what CPUs run.

- TPU (``auto`` or ``pallas``): the item stream's two parts run as Pallas kernels
  (``pallas_attention.item_stream_attention``) inside ``shard_map``: each device attends its
  own heads (and batch rows), laid out by the one sharding table. An encoder's packed
  sequences (BERT, XLM-RoBERTa) attend bidirectionally within each sequence through the same
  kernel (``pallas_attention.segment_attention``; ModernBERT keeps the XLA reference).
  Pallas on another platform runs in interpret mode, which is how the tests check it on CPU.
- GPU (``auto`` in bfloat16/float16, or ``cudnn``): causal dense rows (the query's prefix
  step, single-item rows) run cuDNN's fused flash attention, which skips the masked half;
  masked rows (the packed reference) stay on XLA.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from cluster.sharding import partition_spec
from replicas.model.causal_lm import CausalSpec, DenseSpec, masked_attention
from replicas.model.config import ModelConfig
from replicas.model.encoder import Encoder
from replicas.model.layers import attend_item_stream
from replicas.model.pallas_attention import item_stream_attention, segment_attention
from replicas.model.protocol import ScoringModel
from replicas.settings import SettingsError

Array = jax.Array
logger = logging.getLogger(__name__)


def mesh_platform(mesh: Mesh) -> str:
    return str(mesh.devices.flat[0].platform)


def uses_pallas(choice: str, mesh: Mesh) -> bool:
    """``attention`` setting: auto (Pallas on TPU), xla, pallas or cudnn."""
    return choice == "pallas" or (choice == "auto" and mesh_platform(mesh) == "tpu")


def uses_cudnn(choice: str, mesh: Mesh, dtype: Any) -> bool:
    """cuDNN's flash attention takes half precision only, so ``auto`` picks it for those."""
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return choice == "cudnn" or (choice == "auto" and mesh_platform(mesh) == "gpu" and half)


def cudnn_lacks(config: ModelConfig) -> list[str]:
    """The family's attention options that cuDNN's fused kernel does not take."""
    named = {
        "sliding_window": config.windowed,
        "attn_logit_softcapping": config.attn_softcap is not None,
        "query_pre_attn_scalar": config.query_scale is not None,
    }
    return [name for name, used in named.items() if used]


def with_attention(model: ScoringModel, choice: str, mesh: Mesh) -> ScoringModel:
    """``model`` running the attention kernels the setting and the mesh call for. The Pallas
    kernels take windows and soft-caps; where cuDNN lacks one (``cudnn_lacks``) dense rows
    run the XLA reference (logged once, here). An encoder has only its sequences' attention."""
    if choice == "cudnn" and mesh_platform(mesh) != "gpu":
        raise SettingsError(f"attention: cudnn needs a GPU, this mesh is {mesh_platform(mesh)}")
    interpret = mesh_platform(mesh) != "tpu"
    if isinstance(model, Encoder):
        if not uses_pallas(choice, mesh):
            return model
        if model.config.rotary:  # ModernBERT: its local layers' windows are two-sided
            logger.warning("attention: ModernBERT's layers run the XLA reference, not Pallas")
            return model
        segments = partial(sharded_segment_attention, mesh=mesh, interpret=interpret)
        return dataclasses.replace(model, segment_attention=segments)
    cudnn = uses_cudnn(choice, mesh, model.dtype)
    if cudnn and (missing := cudnn_lacks(model.config)):
        logger.warning(
            "attention: %s dense rows run the XLA reference: cuDNN lacks %s",
            model.config.family, ", ".join(missing),
        )  # fmt: skip
        cudnn = False
    dense = cudnn_dense_attention if cudnn else masked_attention
    if not uses_pallas(choice, mesh):
        stream: Callable[..., Array] = attend_item_stream
    else:
        stream = partial(sharded_stream_attention, mesh=mesh, interpret=interpret)
    return dataclasses.replace(model, stream_attention=stream, dense_attention=dense)


def cudnn_dense_attention(q: Array, k: Array, v: Array, spec: DenseSpec) -> Array:
    """``masked_attention``'s contract: causal rows through cuDNN (q [B, T, H, Dh], k/v
    [B, T, K, Dh]; padding follows each row's real tokens, so causality alone is exact for
    them), masked rows through XLA."""
    if not isinstance(spec, CausalSpec):
        return masked_attention(q, k, v, spec)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def _specs(q: Array, k: Array, mesh: Mesh) -> tuple[PartitionSpec, PartitionSpec, PartitionSpec]:
    """(heads-axis spec of q, of k/v, of [B, tokens] metadata): heads split over ``model``
    only when both head counts divide, so every device keeps whole GQA groups."""
    q_spec = partition_spec(("batch", "seq", "heads", "head_dim"), q.shape, mesh)
    kv_spec = partition_spec(("batch", "seq", "kv_heads", "head_dim"), k.shape, mesh)
    if q_spec[2] != kv_spec[2]:
        q_spec = PartitionSpec(q_spec[0], None, None, None)
        kv_spec = PartitionSpec(kv_spec[0], None, None, None)
    return q_spec, kv_spec, PartitionSpec(q_spec[0], None)


def sharded_segment_attention(
    q: Array,  # [B, S, H, Dh]
    k: Array,  # [B, S, H, Dh]
    v: Array,
    item_ids: Array,  # [B, S]
    window: int,
    *,
    mesh: Mesh,
    interpret: bool,
) -> Array:
    """``encoder.attend_segments``' contract through the Pallas kernel, per device (each
    device its own heads and batch rows); ``window`` is the XLA reference's block reach, which
    the kernel does not need."""
    del window
    q_spec, kv_spec, rows = _specs(q, k, mesh)

    def kernel(q: Array, k: Array, v: Array, item_ids: Array) -> Array:
        return segment_attention(q, k, v, item_ids, interpret=interpret)

    sharded = jax.shard_map(
        kernel, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, rows), out_specs=q_spec,
        check_vma=False,
    )  # fmt: skip
    return sharded(q, k, v, item_ids)


def sharded_stream_attention(
    q: Array,  # [B, S, H, Dh]
    prefix_k: Array,  # [B, T, K, Dh]
    prefix_v: Array,
    prefix_valid: Array,  # [B, T]
    k: Array,  # [B, S, K, Dh]
    v: Array,
    item_ids: Array,  # [B, S]
    window: int,
    scale: float | None = None,
    softcap: float | None = None,
    positions: Array | None = None,  # [B, S], with a sliding window
    sliding_window: Array | None = None,  # []
    *,
    mesh: Mesh,
    interpret: bool,
) -> Array:
    """``attend_item_stream``'s contract through the Pallas kernels, per device."""
    q_spec, kv_spec, rows = _specs(q, k, mesh)
    arrays = [q, prefix_k, prefix_v, prefix_valid, k, v, item_ids]
    specs = [q_spec, kv_spec, kv_spec, rows, kv_spec, kv_spec, rows]
    if sliding_window is not None:
        arrays += [positions, sliding_window]
        specs += [rows, PartitionSpec()]

    def kernel(*shard: Array) -> Array:
        sliding = dict(zip(("positions", "sliding_window"), shard[7:], strict=False))
        return item_stream_attention(
            *shard[:7], window, scale, softcap, **sliding, interpret=interpret
        )

    sharded = jax.shard_map(
        kernel, mesh=mesh, in_specs=tuple(specs), out_specs=q_spec, check_vma=False
    )
    return sharded(*arrays)
