"""Sequence parallelism of a quantized model on the model axis (``TokenSplit``).

With the layers' weights split over ``model`` (cluster.sharding), the row-parallel projections
(o, down) leave each chip a partial sum of every token, and the column-parallel ones (q, k, v;
gate, up) need every token's whole input on every chip: unquantized, XLA all-reduces each
partial sum in the compute dtype. Quantized with activations (``int8``, ``int8_smooth``,
``fp8``), a column-parallel projection reads one byte a value and one float32 scale a token,
and a token's scale is its own row's (model.quant). So between the layers' blocks the residual
stream is split over ``model`` by tokens; each chip normalizes and quantizes its own tokens
(a token's row whole on its chip: one device's values and scales) and the quantized tokens
are all-gathered; o keeps its weight whole on every chip and takes every head of its own
tokens by an int8 all-to-all (``own_tokens``); down rescales each chip's int32 part into the
compute dtype and reduce-scatters it onto the split tokens (``row_parallel``). Per layer a
chip sends 0.56x the two all-reduces' bytes on a model axis of 4 (Qwen3-0.6B's shapes;
docs/quantization.md, "Planning", "On the model axis").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cluster.sharding import partition_spec
from replicas.model.quant import ACTIVATIONS, project_tokens

Array = jax.Array


@dataclass(frozen=True)
class TokenSplit:
    """Where a quantized model's activations lie between its projections, on ``mesh``."""

    mesh: Mesh

    def tokens(self, x: Array) -> Array:
        """``x [B, T, ...]`` with its tokens split over ``model`` (where that divides T)."""
        return self._place(x, ("batch", "split_tokens"))

    def whole(self, x: Array) -> Array:
        """``x [B, T, ...]`` whole on every chip of the model axis (rows split over data)."""
        return self._place(x, ("batch", None))

    def row_parallel(
        self, x_q: Array, x_scale: Array, values: Array, scale: Array, n_in: int,
        quantization: str, dtype: Any,
    ) -> Array:  # fmt: skip
        """down: quantized tokens ``x_q [B, T, *in]`` (``in[0]`` split over ``model``, as
        the weight's) and their scales ``[B, T, 1 * n_in]`` (each token's own, whole) through
        ``values [*in, *out]`` -> ``[B, T, *out]`` split by tokens. Each chip rescales its
        part's int32 sums into ``dtype`` and the parts are reduce-scattered in ``dtype``
        (all-reduced where the model axis does not divide T); one chip's own int32 sum is
        ``project_tokens``' exactly."""
        model = int(self.mesh.shape["model"])
        if values.shape[0] % model or x_q.ndim - n_in != 2:  # the weight whole on each chip
            return self.tokens(
                project_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)
            )
        data = partition_spec(("batch",), x_q.shape[:1], self.mesh)[0]
        scatter = x_q.shape[1] % model == 0

        def part(x_q: Array, x_scale: Array, values: Array, scale: Array) -> Array:
            mine = project_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)
            if scatter:
                return jax.lax.psum_scatter(mine, "model", scatter_dimension=1, tiled=True)
            return jax.lax.psum(mine, "model")

        specs = (PartitionSpec(data, None, "model"), PartitionSpec(data), PartitionSpec("model"))
        out = PartitionSpec(data, "model" if scatter else None)
        summed = jax.shard_map(
            part, mesh=self.mesh, in_specs=(*specs, PartitionSpec()), out_specs=out,
            check_vma=False,
        )  # fmt: skip
        return summed(x_q, x_scale, values, scale)

    def own_tokens(
        self, x_q: Array, x_scale: Array, values: Array, scale: Array, n_in: int,
        quantization: str, dtype: Any,
    ) -> Array:  # fmt: skip
        """o: quantized tokens ``x_q [B, T, H, Dh]`` (heads split over ``model``, as the
        attention leaves them) and their scales ``[B, T, 1, 1]`` through the whole weight
        ``values [H, Dh, D]`` (on every chip, ``whole_heads``) -> ``[B, T, D]`` split by
        tokens: an all-to-all gives each chip every head of its own tokens (int8: a byte a
        value, a quarter of a reduce-scatter's bf16 on 4 chips for H x Dh = 2 D) and its
        int32 sums are one device's exactly. The model axis not dividing T or the heads: each
        chip gathers every head (all-gather) and projects its tokens."""
        model = int(self.mesh.shape["model"])
        data = partition_spec(("batch",), x_q.shape[:1], self.mesh)[0]
        tokens = x_q.shape[1] % model == 0
        heads = x_q.shape[2] % model == 0

        def mine(x_q: Array, x_scale: Array, values: Array, scale: Array) -> Array:
            if tokens and heads:
                x_q = jax.lax.all_to_all(x_q, "model", 1, 2, tiled=True)  # [B, T / m, H, Dh]
            elif heads:
                x_q = jax.lax.all_gather(x_q, "model", axis=2, tiled=True)  # [B, T, H, Dh]
            if tokens:
                size = x_scale.shape[1] // model
                start = jax.lax.axis_index("model") * size
                x_scale = jax.lax.dynamic_slice_in_dim(x_scale, start, size, axis=1)
                if not heads:
                    x_q = jax.lax.dynamic_slice_in_dim(x_q, start, size, axis=1)
            return project_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)

        x_spec = PartitionSpec(data, None, "model" if heads else None)
        summed = jax.shard_map(
            mine, mesh=self.mesh,
            in_specs=(x_spec, PartitionSpec(data), PartitionSpec(), PartitionSpec()),
            out_specs=PartitionSpec(data, "model" if tokens else None), check_vma=False,
        )  # fmt: skip
        return summed(x_q, x_scale, values, scale)

    def _place(self, x: Array, lead: tuple[str | None, ...]) -> Array:
        axes = (*lead, *([None] * (x.ndim - len(lead))))
        spec = partition_spec(axes, x.shape, self.mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))


def token_split(quantization: str, mesh: Mesh) -> TokenSplit | None:
    """The engine's ``TokenSplit`` for a model of ``quantization`` on ``mesh``: one where a
    quantized model's weights are split over a model axis, else None (nothing changes)."""
    if quantization not in ACTIVATIONS or int(mesh.shape["model"]) == 1:
        return None
    return TokenSplit(mesh)
