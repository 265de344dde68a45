"""Flax building blocks of the decoder: RMSNorm, RoPE, grouped-query attention, gated MLP.

Options that other families turn on (``ModelConfig``): (1 + w) norms, attention-logit scale
and soft-cap, sliding windows (a mask from explicit positions), per-layer RoPE base, gelu-tanh.

Shapes use B batch, T/S query/key tokens, N items, L item tokens, D hidden, H query heads,
K key/value heads, G = H // K, Dh head dim, F MLP width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replicas.model.config import ModelConfig
from replicas.model.lora import with_delta
from replicas.model.masks import key_blocks, lookback, own_item_mask, within_window
from replicas.model.quant import (
    SCALE_SUFFIX,
    project_tokens,
    quantize_tokens,
    quantized_project,
    scale_shape,
    stored_dtype,
)
from replicas.model.token_split import TokenSplit

Array = jax.Array
NEG_INF = float(np.finfo(np.float32).min)
_INIT = nn.initializers.normal(0.02)
# Stream tokens per query block of the item stream's own-item part: a block reads the keys an
# item of at most ``window`` tokens can reach, ``window`` + this many, not ``2 * window``.
QUERY_BLOCK = 128


def declare_weight(module: nn.Module, name: str, shape: tuple[int, ...], n_in: int) -> Any:
    """A projection's weight ``[*in, *out]`` in ``module.dtype``; quantized (the config's
    ``quantization``): (values ``[*in, *out]``, float32 scale ``[*out]``), model.quant."""
    quantization = module.config.quantization
    if quantization == "none":
        return module.param(name, _INIT, shape, module.dtype)
    values = module.param(name, nn.initializers.zeros, shape, stored_dtype(quantization))
    scale_of = scale_shape(shape, n_in, quantization)
    scale = module.param(name + SCALE_SUFFIX, nn.initializers.ones, scale_of, jnp.float32)
    return values, scale


def project(
    x: Array,
    weight: Any,
    n_in: int,
    config: ModelConfig,
    dtype: Any,
    spec: str,
    parallel: str = "column",
    split: TokenSplit | None = None,
) -> Array:
    """``x [..., *in]`` through a ``declare_weight`` weight -> ``[..., *out]``; unquantized
    exactly as before (the einsum ``spec``, or ``x @ w`` for ``"@"``). ``split``
    (model.token_split): a ``column``-parallel projection (q, k, v, gate, up) gathers its
    quantized tokens, a ``row``-parallel one (down: the contraction split over the model
    axis) sums each chip's part in ``dtype`` onto tokens split over the chips, and o
    (``tokens``: its weight whole on every chip) projects each chip's own tokens."""
    quantization = config.quantization
    if quantization == "none":
        return x @ weight if spec == "@" else jnp.einsum(spec, x, weight)
    values, scale = weight
    if split is None:
        return quantized_project(x, values, scale, n_in, quantization, dtype)
    x_q, x_scale = quantize_tokens(x, n_in, quantization)  # [..., *in], [..., 1 * n_in]
    if parallel == "row":
        return split.row_parallel(x_q, x_scale, values, scale, n_in, quantization, dtype)
    if parallel == "tokens":
        return split.own_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)
    # quantized on the token's own chip, then gathered: one byte a value crosses the chips
    x_q, x_scale = (split.whole(split.tokens(a)) for a in (x_q, x_scale))
    return project_tokens(x_q, x_scale, values, scale, n_in, quantization, dtype)


def observe(module: nn.Module, name: str, x: Array, n_in: int) -> None:
    """Sow the largest |x| of each input channel of a projection (``[*in]``, over every token)
    into ``intermediates``: calibration only (model.smooth); a no-op unless that collection is
    mutable, so served steps are unchanged."""
    if module.is_mutable_collection("intermediates"):
        module.sow("intermediates", name, jnp.max(jnp.abs(x), axis=tuple(range(x.ndim - n_in))))


class RMSNorm(nn.Module):
    eps: float
    dtype: Any = jnp.float32
    offset: bool = False  # Gemma: scale by (1 + w), computed in float32

    @nn.compact
    def __call__(self, x: Array) -> Array:  # [..., D] -> [..., D]
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],), self.dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.offset:
            return ((1.0 + scale.astype(jnp.float32)) * normed).astype(self.dtype)
        return scale * normed.astype(self.dtype)


def soft_cap(logits: Array, cap: float | None) -> Array:
    """``cap * tanh(logits / cap)`` (Gemma 2's attention and final logits); None: unchanged."""
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> np.ndarray:
    """[Dh/2] float32 inverse frequencies, with Llama 3 or linear scaling when configured;
    ``local``: those of the windowed layers (``local_rope_theta``, unscaled)."""
    exponents = np.arange(0, config.head_dim, 2, dtype=np.int64).astype(np.float32)
    theta = config.local_rope_theta if local else config.rope_theta
    inv_freq = (1.0 / (theta ** (exponents / config.head_dim))).astype(np.float32)
    if local:
        return inv_freq
    inv_freq = (inv_freq / np.float32(config.rope_linear_factor)).astype(np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray) -> Array:
    """Rotate-half RoPE. x: [..., T, heads, Dh], positions: [..., T] -> x's shape."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)  # [..., T, Dh/2]
    cos = jnp.cos(angles)[..., None, :].astype(x.dtype)  # [..., T, 1, Dh/2]
    sin = jnp.sin(angles)[..., None, :].astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _group(q: Array, num_kv_heads: int) -> Array:
    """[..., T, H, Dh] -> [..., T, K, G, Dh]."""
    *lead, heads, head_dim = q.shape
    return q.reshape(*lead, num_kv_heads, heads // num_kv_heads, head_dim)


def _ungroup(x: Array) -> Array:
    """[..., T, K, G, Dh] -> [..., T, H, Dh]."""
    *lead, kv, groups, head_dim = x.shape
    return x.reshape(*lead, kv * groups, head_dim)


def _masked_softmax(logits: Array, mask: Array, dtype: Any) -> Array:
    logits = jnp.where(mask, logits.astype(jnp.float32), NEG_INF)
    return jax.nn.softmax(logits, axis=-1).astype(dtype)


def attend_dense(
    q: Array,
    k: Array,
    v: Array,
    mask: Array,
    scale: float | None = None,
    softcap: float | None = None,
) -> Array:
    """Attention within one stream.

    q: [B, T, H, Dh]; k, v: [B, S, K, Dh]; mask: [B, T, S] bool -> [B, T, H, Dh].
    ``scale``: logit scale (None: Dh ** -0.5); ``softcap``: see ``soft_cap``.
    """
    qg = _group(q, k.shape[-2])  # [B, T, K, G, Dh]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = soft_cap(jnp.einsum("btkgd,bskd->bkgts", qg, k) * scale, softcap)
    probs = _masked_softmax(logits, mask[:, None, None], q.dtype)  # [B, K, G, T, S]
    return _ungroup(jnp.einsum("bkgts,bskd->btkgd", probs, v))


def attend_item_stream(
    q: Array,
    prefix_k: Array,
    prefix_v: Array,
    prefix_valid: Array,
    k: Array,
    v: Array,
    item_ids: Array,
    window: int,
    scale: float | None = None,
    softcap: float | None = None,
    positions: Array | None = None,
    sliding_window: Array | None = None,
) -> Array:
    """Item tokens of a flat stream read the shared prefix and their own item, nothing else.

    q: [B, S, H, Dh]; prefix_k/v: [B, T, K, Dh]; prefix_valid: [B, T] bool; k, v:
    [B, S, K, Dh] of the stream; item_ids: [B, S] int (-1 padding) -> [B, S, H, Dh].
    Two partial attentions share one running max and are summed: the prefix part (no mask
    beyond the query length) and the own-item part over blocks of ``min(window,
    QUERY_BLOCK)`` queries, each reading its block and the blocks before it that an item of
    ``window`` tokens can reach (exact when no item is longer than ``window``).
    ``scale``/``softcap``: as ``attend_dense``. ``sliding_window`` ([] int) with the stream's
    ``positions`` [B, S]: a token at p reads only keys at positions > p - sliding_window (a
    prefix key's position is its index).
    """
    batch, length, _, head_dim = q.shape
    kv_heads = k.shape[-2]
    scale = head_dim**-0.5 if scale is None else scale
    qg = _group(q, kv_heads)  # [B, S, K, G, Dh]
    groups = qg.shape[3]
    prefix_logits = jnp.einsum("bskgd,btkd->bkgst", qg, prefix_k).astype(jnp.float32) * scale
    prefix_logits = soft_cap(prefix_logits, softcap)
    readable = prefix_valid[:, None, :]  # [B, 1, T]
    if sliding_window is not None:
        prefix_pos = jnp.arange(prefix_valid.shape[1], dtype=jnp.int32)[None]  # [1, T]
        readable = readable & within_window(positions, prefix_pos, sliding_window)  # [B, S, T]
    prefix_logits = jnp.where(readable[:, None, None], prefix_logits, NEG_INF)
    block = min(window, QUERY_BLOCK)
    padded = -(-length // block) * block
    nb = padded // block
    back = lookback(window, block, nb)
    pad = [(0, 0), (0, padded - length)]
    qb = jnp.pad(qg, pad + [(0, 0)] * 3).reshape(batch, nb, block, kv_heads, groups, head_dim)
    qb = qb.transpose(0, 1, 3, 4, 2, 5)  # [B, nb, K, G, W, Dh]: both einsums plain batched matmuls
    kw = key_blocks(jnp.pad(k, pad + [(0, 0)] * 2), block, back).transpose(0, 1, 3, 2, 4)
    vw = key_blocks(jnp.pad(v, pad + [(0, 0)] * 2), block, back).transpose(0, 1, 3, 2, 4)
    mask = own_item_mask(jnp.pad(item_ids, pad, constant_values=-1), block, back)  # [B, nb, W, C]
    if sliding_window is not None:
        pos = jnp.pad(positions, pad)
        q_pos = pos.reshape(batch, nb, block)  # [B, nb, W]
        k_pos = key_blocks(pos, block, back)  # [B, nb, C]
        mask = mask & within_window(q_pos, k_pos, sliding_window)
    # kw, vw: [B, nb, K, C, Dh]; own_logits: [B, nb, K, G, W, C]
    own_logits = jnp.einsum("bnkgwd,bnkcd->bnkgwc", qb, kw).astype(jnp.float32) * scale
    own_logits = soft_cap(own_logits, softcap)
    own_logits = jnp.where(mask[:, :, None, None], own_logits, NEG_INF)
    # Running max of both parts, laid out like the prefix part: [B, K, G, S].
    own_max = jnp.moveaxis(own_logits.max(-1), 1, 3).reshape(batch, kv_heads, groups, padded)
    top = jnp.maximum(prefix_logits.max(-1), own_max[..., :length])
    prefix_p = jnp.exp(prefix_logits - top[..., None])  # [B, K, G, S, T]
    top_padded = jnp.pad(top, [(0, 0)] * 3 + [(0, padded - length)])  # [B, K, G, S']
    top_b = jnp.moveaxis(top_padded.reshape(batch, kv_heads, groups, nb, block), 3, 1)
    own_p = jnp.exp(own_logits - top_b[..., None])  # top_b [B, nb, K, G, W]; [B, nb, K, G, W, C]
    own_sum = jnp.moveaxis(own_p.sum(-1), 1, 3).reshape(batch, kv_heads, groups, padded)
    total = prefix_p.sum(-1) + own_sum[..., :length]  # [B, K, G, S]
    out = jnp.einsum("bkgst,btkd->bskgd", prefix_p.astype(v.dtype), prefix_v)
    own_out = jnp.einsum("bnkgwc,bnkcd->bnwkgd", own_p.astype(v.dtype), vw)
    out = out + own_out.reshape(batch, padded, kv_heads, groups, head_dim)[:, :length]
    out = out / jnp.moveaxis(total, 3, 1)[..., None].astype(out.dtype)  # [B, S, K, G, Dh]
    return _ungroup(out)


class Attention(nn.Module):
    """Projections of grouped-query attention; the attention pattern is the caller's."""

    config: ModelConfig
    dtype: Any = jnp.float32
    split: TokenSplit | None = None  # see ``project``

    def setup(self) -> None:
        c = self.config
        d, h, k, dh = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.q = declare_weight(self, "q", (d, h, dh), 1)
        self.k = declare_weight(self, "k", (d, k, dh), 1)
        self.v = declare_weight(self, "v", (d, k, dh), 1)
        self.o = declare_weight(self, "o", (h, dh, d), 2)
        if c.qkv_bias:
            self.q_bias = self.param("q_bias", nn.initializers.zeros, (h, dh), self.dtype)
            self.k_bias = self.param("k_bias", nn.initializers.zeros, (k, dh), self.dtype)
            self.v_bias = self.param("v_bias", nn.initializers.zeros, (k, dh), self.dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.rms_norm_eps, self.dtype, c.norm_offset)
            self.k_norm = RMSNorm(c.rms_norm_eps, self.dtype, c.norm_offset)
        self.inv_freq = rope_inv_freq(c)
        if c.local_rope_theta is not None:
            self.local_inv_freq = rope_inv_freq(c, local=True)

    def qkv(
        self, x: Array, positions: Array, local: Array | None = None, lora: Any = None
    ) -> tuple[Array, Array, Array]:
        """x: [..., T, D], positions: [..., T] -> q [..., T, H, Dh], k and v [..., T, K, Dh].
        ``local`` ([] bool, traced): this layer is windowed (Gemma 3: other RoPE base).
        ``lora``: (this layer's adapter stacks, how the step's tokens reach their slots), see
        model.lora."""
        inv_freq: Any = self.inv_freq
        if self.config.local_rope_theta is not None and local is not None:
            inv_freq = jnp.where(local, self.local_inv_freq, self.inv_freq)
        observe(self, "qkv_in", x, 1)
        q = with_delta(self._in(x, self.q), x, "q", lora)
        k = with_delta(self._in(x, self.k), x, "k", lora)
        v = with_delta(self._in(x, self.v), x, "v", lora)
        if self.config.qkv_bias:
            q, k, v = q + self.q_bias, k + self.k_bias, v + self.v_bias
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def _in(self, x: Array, weight: Any) -> Array:
        """[..., T, D] -> [..., T, heads, Dh]."""
        return project(x, weight, 1, self.config, self.dtype, "...td,dhk->...thk", split=self.split)

    def out(self, attended: Array, lora: Any = None) -> Array:
        """[..., T, H, Dh] -> [..., T, D]."""
        spec = "...thk,hkd->...td"
        observe(self, "o_in", attended, 2)
        out = project(attended, self.o, 2, self.config, self.dtype, spec, "tokens", self.split)
        return with_delta(out, attended, "o", lora)


class MLP(nn.Module):
    config: ModelConfig
    dtype: Any = jnp.float32
    split: TokenSplit | None = None  # see ``project``

    @nn.compact
    def __call__(self, x: Array, lora: Any = None) -> Array:  # [..., D] -> [..., D]
        d, f = self.config.hidden_size, self.config.intermediate_size
        c, dt, split = self.config, self.dtype, self.split
        gate = declare_weight(self, "gate", (d, f), 1)
        up = declare_weight(self, "up", (d, f), 1)
        down = declare_weight(self, "down", (f, d), 1)
        observe(self, "gate_up_in", x, 1)
        gated = with_delta(project(x, gate, 1, c, dt, "@", split=split), x, "gate", lora)
        if self.config.hidden_act == "gelu_tanh":
            gated = jax.nn.gelu(gated, approximate=True)
        else:
            gated = jax.nn.silu(gated)
        up_out = project(x, up, 1, c, dt, "@", split=split)
        hidden = gated * with_delta(up_out, x, "up", lora)  # [..., F]
        observe(self, "down_in", hidden, 1)
        down_out = project(hidden, down, 1, c, dt, "@", "row", split)
        return with_delta(down_out, hidden, "down", lora)
