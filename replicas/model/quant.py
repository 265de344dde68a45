"""Quantized projections of the decoder layers (the ``quantization`` setting,
docs/quantization.md): a thin own linear, its weights quantized at load, and beside it the
plain dequantize-then-matmul reference it is tested against.

A projection contracts the last ``n_in`` axes of its input ``x [..., *in]`` with the first
``n_in`` axes of its weight ``w [*in, *out]`` (q, k, v, gate, up, down: one axis; o: two).
Quantized, ``w`` is stored as ``values [*in, *out]`` (int8 or float8_e4m3fn) and float32
scales, symmetric: ``scale [*out]`` one per output channel (``int8``, ``fp8``), or
``int8_weight``'s per block (``scale_shape``).

- ``int8`` (W8A8): each token's input row gets its own scale (``max |x| / 127`` over the
  contracted axes), the int8 values are multiplied as s8 x s8 -> s32 (``dot_general``) and the
  int32 sums rescaled by both scales. A token's output depends on its own row and the weights
  only, never on what shares its step (docs/semantics.md, the float32 floor): no scale is per
  step or per tensor.
- ``int8_smooth``: ``int8`` on weights rescaled at load by SmoothQuant (``model.smooth``):
  the same op, the same per-token scales.
- ``int8_weight``: int8 weights with a scale per block of ``BLOCK`` (32) along the last
  contracted axis (as llama.cpp's Q8_0), dequantized into the compute dtype, the matmul in it.
- ``fp8``: as ``int8`` with e4m3 values (max 448) and a float32 accumulation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.settings.common import SettingsError

Array = Any  # jax.Array or np.ndarray: ``quantize`` also runs on the host (loading)

# Decoder-layer leaves that are quantized, under params["layers"], and their n_in.
QUANTIZED: dict[tuple[str, str], int] = {
    ("attn", "q"): 1,
    ("attn", "k"): 1,
    ("attn", "v"): 1,
    ("attn", "o"): 2,
    ("mlp", "gate"): 1,
    ("mlp", "up"): 1,
    ("mlp", "down"): 1,
}
SCALE_SUFFIX = "_scale"
FP8 = jnp.float8_e4m3fn
# int8_weight: a scale per 32 weights along the contracted axis (llama.cpp's Q8_0 block):
# per output channel alone misses the KL target on SmolLM2 (docs/quantization.md).
BLOCK = 32
# largest stored magnitude; int8_smooth runs as int8 on SmoothQuant-rescaled weights (model.smooth)
_LIMITS = {"int8": 127.0, "int8_smooth": 127.0, "int8_weight": 127.0, "fp8": 448.0}
W8A8_INT = ("int8", "int8_smooth")  # s8 x s8 -> s32 dots
ACTIVATIONS = (*W8A8_INT, "fp8")  # the forms that quantize activations too (a byte a value)


def stored_dtype(quantization: str) -> Any:
    """The dtype quantized weights are stored in."""
    return FP8 if quantization == "fp8" else jnp.int8


def _to_stored(scaled: Array, quantization: str, xp: Any) -> Array:
    limit = _LIMITS[quantization]
    if quantization == "fp8":
        return xp.clip(scaled, -limit, limit).astype(FP8)
    return xp.clip(xp.round(scaled), -limit, limit).astype(np.int8)


def block_of(size: int) -> int:
    """The block of ``int8_weight`` scales along a contracted axis of ``size``: ``BLOCK``
    where it divides the axis, else the whole axis."""
    return BLOCK if size % BLOCK == 0 else size


def quantize(w: Array, n_in: int, quantization: str, lead: int = 0, xp: Any = jnp) -> tuple:
    """A float weight ``[*lead, *in, *out]`` -> (values, float32 scale), symmetric: one scale
    per output channel (``[*lead, *out]``), or for ``int8_weight`` one per block of ``BLOCK``
    along the last contracted axis (the weight's shape with that axis ``/ BLOCK``).
    ``lead``: stacked axes in front (the layers); ``xp``: numpy on the host, jax.numpy in a
    traced init."""
    w32 = w.astype(np.float32)
    if quantization == "int8_weight":
        return _quantize_blocks(w32, lead + n_in - 1, quantization, xp)
    axes = tuple(range(lead, lead + n_in))
    amax = xp.max(xp.abs(w32), axis=axes)  # [*lead, *out]
    scale = xp.where(amax > 0, amax / _LIMITS[quantization], 1.0).astype(np.float32)
    return _to_stored(w32 / xp.expand_dims(scale, axes), quantization, xp), scale


def _quantize_blocks(w32: Array, axis: int, quantization: str, xp: Any) -> tuple:
    """Per block of ``axis``: ``[..., n, ...]`` -> values, scale ``[..., n / block, ...]``."""
    size = w32.shape[axis]
    block = block_of(size)
    blocked = w32.reshape(*w32.shape[:axis], size // block, block, *w32.shape[axis + 1 :])
    amax = xp.max(xp.abs(blocked), axis=axis + 1, keepdims=True)
    scale = xp.where(amax > 0, amax / _LIMITS[quantization], 1.0).astype(np.float32)
    values = _to_stored(blocked / scale, quantization, xp).reshape(w32.shape)
    return values, xp.squeeze(scale, axis=axis + 1)


def scale_shape(shape: tuple[int, ...], n_in: int, quantization: str, lead: int = 0) -> tuple:
    """The scale's shape of a weight of ``shape`` (``quantize``)."""
    if quantization == "int8_weight":
        axis = lead + n_in - 1
        return (*shape[:axis], shape[axis] // block_of(shape[axis]), *shape[axis + 1 :])
    return (*shape[:lead], *shape[lead + n_in :])


def dequantize(values: Array, scale: Array, n_in: int, xp: Any = jnp) -> Array:
    """``int8_weight``'s values ``[*in, *out]`` and block scales -> float32 ``[*in, *out]``."""
    axis = n_in - 1
    block = values.shape[axis] // scale.shape[axis]
    return values.astype(np.float32) * xp.repeat(scale.astype(np.float32), block, axis=axis)


def _contract(x: Array, w: Array, n_in: int, out_type: Any) -> Array:
    """``x [..., *in]`` . ``w [*in, *out]`` -> ``[..., *out]`` in ``out_type``."""
    x_axes = tuple(range(x.ndim - n_in, x.ndim))
    dims = ((x_axes, tuple(range(n_in))), ((), ()))
    return jax.lax.dot_general(x, w, dims, preferred_element_type=out_type)


def _rows(x_scale: Array, n_in: int, out_axes: int) -> Array:
    """A token scale ``[..., 1 * n_in]`` -> ``[..., 1 * out_axes]``, to multiply outputs by."""
    return x_scale.reshape(*x_scale.shape[: x_scale.ndim - n_in], *([1] * out_axes))


def quantized_project(
    x: Array, values: Array, scale: Array, n_in: int, quantization: str, dtype: Any
) -> Array:
    """``x [..., *in]`` through a quantized weight (``values [*in, *out]``, ``scale [*out]``)
    -> ``[..., *out]`` in ``dtype``."""
    if quantization == "int8_weight":
        weight = dequantize(values, scale, n_in).astype(x.dtype)  # [*in, *out]
        return _contract(x, weight, n_in, x.dtype).astype(dtype)
    x_q, x_scale = quantize_tokens(x, n_in, quantization)
    return project_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)


def quantize_tokens(x: Array, n_in: int, quantization: str) -> tuple[Array, Array]:
    """W8A8 / fp8: ``x [..., *in]`` -> (its stored values ``[..., *in]``, one float32 scale
    per token ``[..., 1 * n_in]``)."""
    axes = tuple(range(x.ndim - n_in, x.ndim))
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axes, keepdims=True)
    x_scale = jnp.where(amax > 0, amax / _LIMITS[quantization], 1.0)  # [..., 1 * n_in]
    return _to_stored(x.astype(jnp.float32) / x_scale, quantization, jnp), x_scale


def project_tokens(
    x_q: Array, x_scale: Array, values: Array, scale: Array, n_in: int, quantization: str,
    dtype: Any,
) -> Array:  # fmt: skip
    """``quantize_tokens``' output through a quantized weight: the s8 x s8 -> s32 (fp8: f32)
    sums times both scales -> ``[..., *out]`` in ``dtype`` (``quantized_project``'s second
    half; model.token_split runs it on each chip's part of a row-parallel contraction)."""
    acc_type = jnp.int32 if quantization in W8A8_INT else jnp.float32
    acc = _contract(x_q, values, n_in, acc_type)  # [..., *out]
    rows = _rows(x_scale, n_in, scale.ndim)  # [..., 1 * out axes]
    return (acc.astype(jnp.float32) * rows * scale).astype(dtype)


def reference_project(
    x: np.ndarray, values: np.ndarray, scale: np.ndarray, n_in: int, quantization: str
) -> np.ndarray:
    """The oracle, in numpy float64: dequantize the weight (and for W8A8 the per-token
    quantized input, each row with its own scale), then a plain matmul."""
    x64 = np.asarray(x, np.float64)
    if quantization == "int8_weight":
        w64 = dequantize(np.asarray(values), np.asarray(scale), n_in, np).astype(np.float64)
    else:
        w64 = np.asarray(values).astype(np.float64) * np.asarray(scale, np.float64)
        axes = tuple(range(x64.ndim - n_in, x64.ndim))
        amax = np.max(np.abs(x64.astype(np.float32)), axis=axes, keepdims=True)
        s = np.where(amax > 0, amax.astype(np.float32) / np.float32(_LIMITS[quantization]), 1.0)
        s = s.astype(np.float32).astype(np.float64)
        stored = _to_stored((x64 / s).astype(np.float32), quantization, np)
        x64 = stored.astype(np.float64) * s
    return np.tensordot(x64, w64, axes=n_in)


def quantize_layers(layers: dict[str, Any], quantization: str, xp: Any = jnp) -> dict[str, Any]:
    """A stacked layer tree (leaves ``[layers, ...]``) with every ``QUANTIZED`` weight
    replaced by its values and a ``<name>_scale`` leaf beside it; ``none``: unchanged."""
    if quantization == "none":
        return layers
    out = {block: dict(leaves) if isinstance(leaves, dict) else leaves
           for block, leaves in layers.items()}  # fmt: skip
    for (block, name), n_in in QUANTIZED.items():
        if name not in out.get(block, {}):  # an encoder's MLP has no gate
            continue
        values, scale = quantize(out[block][name], n_in, quantization, lead=1, xp=xp)
        out[block][name], out[block][name + SCALE_SUFFIX] = values, scale
    return out


def with_scales(tree: dict[str, Any], scale_of: Any) -> dict[str, Any]:
    """The layers' tree of axes or shapes with each ``QUANTIZED`` weight's scale beside it:
    ``scale_of(weight's node, n_in)``."""
    out = {block: dict(leaves) if isinstance(leaves, dict) else leaves
           for block, leaves in tree.items()}  # fmt: skip
    for (block, name), n_in in QUANTIZED.items():
        if name in tree.get(block, {}):
            out[block][name + SCALE_SUFFIX] = scale_of(tree[block][name], n_in)
    return out


def scale_axes(axes: dict[str, Any], quantization: str) -> dict[str, Any]:
    """Logical axes of the layers' tree with the scales': a block scale keeps its weight's
    axes (the blocked one shorter), a per-channel scale the layers and output axes."""
    if quantization == "int8_weight":
        return with_scales(axes, lambda weight, n_in: weight)
    return with_scales(axes, lambda weight, n_in: (weight[0], *weight[1 + n_in :]))


def scale_shapes(shapes: dict[str, Any], quantization: str) -> dict[str, Any]:
    """Shapes of the layers' tree (leaves ``[layers, ...]``) with the scales'."""
    return with_scales(shapes, lambda shape, n_in: scale_shape(shape, n_in, quantization, 1))


def check_backend(quantization: str, platform: str, device_kind: str = "") -> None:
    """Start-up check: ``fp8`` needs a backend with fp8 matmuls (a GPU of compute capability
    8.9 or more: ``device_kind`` names it, e.g. H100; or a TPU)."""
    if quantization != "fp8" or platform == "tpu":
        return
    if platform == "gpu" and any(name in device_kind for name in ("H100", "H200", "L4", "L40")):
        return
    raise SettingsError(
        f"quantization: fp8 needs fp8 matmuls (an H100/H200/L4/L40 GPU or a TPU); this backend "
        f"is {platform} {device_kind!r}. Use int8 or int8_weight"
    )
