"""A bidirectional encoder (BERT) over the packed stream of the embedding layout.

The embedding layout (``replicas.engine.layouts.embed``) puts independent sequences end to
end in a row, each at positions 0..len-1, with its sequence id per token (``item_ids``, -1
padding). A decoder reads them as an item stream behind an empty prefix (causal within each
sequence); an encoder reads the same row with attention bidirectional within each sequence
and never across sequences (``masks.segment_block_mask``), so a sequence's output never
depends on what shares its row. ``Encoder`` keeps ``model.protocol.ScoringModel``, what the
engine takes (its ``stream_hidden``'s prefix is empty and not read).

BERT: ``LayerNorm(word + position + token type embeddings)``, then per layer
``h = LN(x + Attn(x))``, ``x = LN(h + W2 gelu(W1 h + b1) + b2)`` with biases on every
projection. Parameters (``replicas.model.encoder_params``) are a plain pytree, layer leaves
stacked on a leading ``layers`` axis and scanned. LayerNorm, softmax and the MLP's GELU run
in float32.

ModernBERT (``config.rotary``): ``LN(word embeddings)``, then per layer
``x += Wo Attn(LN(x))`` (layer 0: of x) with RoPE on q and k (local layers: their own base,
keys within +-``sliding_window`` positions), ``x += Wo(gelu(in) * gate)`` of ``Wi LN(x)``,
then a final LayerNorm; no biases, LayerNorm biases only with ``norm_bias``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from replicas.model.causal_lm import ItemStreamSpec
from replicas.model.config import NO_WINDOW, ModelConfig
from replicas.model.layers import (
    NEG_INF,
    QUERY_BLOCK,
    apply_rope,
    rope_inv_freq,
)
from replicas.model.lora import layer_inputs, split_tagged, with_delta
from replicas.model.masks import (
    bidirectional_mask,
    lookback,
    neighbor_blocks,
    segment_block_mask,
    window_block_mask,
)
from replicas.model.quant import SCALE_SUFFIX, quantize_layers, quantized_project

Array = jax.Array
Params = dict[str, Any]


def layer_norm(p: Params, x: Array, eps: float) -> Array:
    """LayerNorm with scale (and bias, where the tree has one) over the last axis, in
    float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    normed = (x32 - mean) * jax.lax.rsqrt(var + eps)
    out = normed * p["scale"].astype(jnp.float32)
    return (out + p["bias"].astype(jnp.float32) if "bias" in p else out).astype(x.dtype)


def _masked_softmax(logits: Array, mask: Array, axis: int, dtype: Any) -> Array:
    """softmax of ``logits`` over the keys ``mask`` allows (broadcast over heads at
    ``axis``); a query no key is readable to (padding, or a query-only fill token whose
    local window holds none of its query's tokens) reads nothing: zeros, as torch's SDPA
    answers a fully masked row, so it depends on nothing else in the row."""
    mask = jnp.expand_dims(mask, axis)
    probs = jax.nn.softmax(jnp.where(mask, logits, NEG_INF), axis=-1)
    return jnp.where(jnp.any(mask, axis=-1, keepdims=True), probs, 0.0).astype(dtype)


def attend_segments(
    q: Array, k: Array, v: Array, item_ids: Array, window: int,
    local: tuple[Array, Array, int] | None = None, scale: float | None = None,
) -> Array:  # fmt: skip
    """Bidirectional attention within each packed sequence.

    q, k, v: [B, S, H, Dh]; item_ids: [B, S] (-1 padding) -> [B, S, H, Dh]. Queries run in
    blocks of ``min(window, QUERY_BLOCK)``, each reading the blocks before and after it that
    a sequence of ``window`` tokens can reach (exact when none is longer than ``window``).
    ``local``: (positions [B, S], is_local [] bool, half): where is_local, a key also has to
    be within ``half`` positions of its query (ModernBERT's local layers). ``scale``: the
    logits' scale (None: ``Dh ** -0.5``).
    """
    batch, length, heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    block = min(window, QUERY_BLOCK)
    padded = -(-length // block) * block
    nb = padded // block
    reach = lookback(window, block, nb)
    if (2 * reach + 1) * block >= length:  # each block would read the whole row: read it once
        return attend_row(q, k, v, item_ids, local, scale)
    pad = [(0, 0), (0, padded - length)]
    qb = jnp.pad(q, pad + [(0, 0)] * 2).reshape(batch, nb, block, heads, head_dim)
    kb = neighbor_blocks(jnp.pad(k, pad + [(0, 0)] * 2), block, reach)  # [B, nb, C, H, Dh]
    vb = neighbor_blocks(jnp.pad(v, pad + [(0, 0)] * 2), block, reach)
    mask = segment_block_mask(jnp.pad(item_ids, pad, constant_values=-1), block, reach)
    if local is not None:
        positions, is_local, half = local
        near = window_block_mask(jnp.pad(positions, pad), block, reach, half)
        mask = mask & (near | ~is_local)  # [B, nb, W, C]
    logits = jnp.einsum("bnwhd,bnchd->bnhwc", qb, kb).astype(jnp.float32) * scale
    probs = _masked_softmax(logits, mask, 2, v.dtype)  # [B, nb, H, W, C]
    out = jnp.einsum("bnhwc,bnchd->bnwhd", probs, vb)  # [B, nb, W, H, Dh]
    return out.reshape(batch, padded, heads, head_dim)[:, :length]


def attend_row(
    q: Array, k: Array, v: Array, item_ids: Array,
    local: tuple[Array, Array, int] | None = None, scale: float | None = None,
) -> Array:  # fmt: skip
    """``attend_segments`` with every query over the whole row ([B, H, S, S] logits, no key
    blocks gathered): fewer keys than the blocks would read once they reach across the row,
    and dense matmuls (on a CPU 2-3x the blocks' speed per key)."""
    mask = bidirectional_mask(item_ids)  # [B, S, S]
    if local is not None:
        positions, is_local, half = local
        near = jnp.abs(positions[:, :, None] - positions[:, None, :]) <= half
        mask = mask & (near | ~is_local)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = jnp.einsum("bshd,bthd->bhst", q, k).astype(jnp.float32) * scale
    probs = _masked_softmax(logits, mask, 1, v.dtype)  # [B, H, S, S]
    return jnp.einsum("bhst,bthd->bshd", probs, v)


# (q, k, v [B, S, H, Dh], item_ids [B, S], window) -> [B, S, H, Dh]: attend_segments, or
# the Pallas kernel the engine picks on TPU (replicas.model.attention.with_attention)
SegmentAttention = Callable[[Array, Array, Array, Array, int], Array]


def _projected(x: Array, p: Params, name: str, pattern: str, lora: Any) -> Array:
    """``x``'s projection by ``p[name]`` (einsum ``pattern``; ``int8_weight``: its block
    scales beside it, dequantized), its LoRA update (model.lora) where ``lora`` allocates the
    target, then its bias."""
    scale = p.get(name + SCALE_SUFFIX)
    if scale is None:
        y = jnp.einsum(pattern, x, p[name])
    else:  # the contracted axes: those of x the pattern sums over
        n_in = len(set(pattern.split("->")[0].split(",")[0]) - set(pattern.split("->")[1]))
        y = quantized_project(x, p[name], scale, n_in, "int8_weight", x.dtype)
    return with_delta(y, x, name, lora) + p[f"{name}_bias"]


def _attention(
    p: Params, x: Array, item_ids: Array, window: int, attend: SegmentAttention, lora: Any = None
) -> Array:
    """x: [B, S, D] -> the attention block's output [B, S, D] (before its residual)."""
    q, k, v = (_projected(x, p, name, "bsd,dhk->bshk", lora) for name in "qkv")  # [B, S, H, Dh]
    attended = attend(q, k, v, item_ids, window)
    return _projected(attended, p, "o", "bshk,hkd->bsd", lora)


def _mlp(p: Params, x: Array, lora: Any = None) -> Array:
    """[B, S, D] -> [B, S, D]: W2 gelu(W1 x + b1) + b2 (exact GELU, in float32)."""
    inner = _projected(x, p, "up", "bsd,df->bsf", lora).astype(jnp.float32)  # [B, S, F]
    inner = jax.nn.gelu(inner, approximate=False).astype(x.dtype)
    return _projected(inner, p, "down", "bsf,fd->bsd", lora)


def encoder_layer(
    c: ModelConfig, p: Params, x: Array, item_ids: Array, window: int,
    attend: SegmentAttention = attend_segments, lora: Any = None,
) -> Array:  # fmt: skip
    """One post-norm encoder layer: x [B, S, D] -> [B, S, D]; ``lora``: (this layer's
    adapter stacks, how the tokens reach their slots) or None (model.lora)."""
    eps = c.rms_norm_eps
    attended = _attention(p["attn"], x, item_ids, window, attend, lora)
    h = layer_norm(p["attn_norm"], x + attended, eps)
    return layer_norm(p["mlp_norm"], h + _mlp(p["mlp"], h, lora), eps)


def _rotary_attention(
    c: ModelConfig, p: Params, x: Array, positions: Array, item_ids: Array, window: int,
    is_local: Array, lora: Any = None,
) -> Array:  # fmt: skip
    """ModernBERT's attention: fused q/k/v (a LoRA update per part: peft's ``Wqkv`` adapter
    split, checkpoints.adapters), RoPE (the local or global base), no biases."""
    heads, dh = c.num_heads, c.head_dim
    qkv = (x @ p["qkv"]).reshape(*x.shape[:2], 3, heads, dh)  # [B, S, 3, H, Dh]
    q, k, v = (with_delta(qkv[:, :, i], x, name, lora) for i, name in enumerate("qkv"))
    inv = jnp.where(is_local, rope_inv_freq(c, local=True), rope_inv_freq(c))  # [Dh/2]
    q, k = (apply_rope(part, positions, inv) for part in (q, k))
    local = (positions, is_local, c.sliding_window or NO_WINDOW)
    attended = attend_segments(q, k, v, item_ids, window, local)  # [B, S, H, Dh]
    out = attended.reshape(*x.shape[:2], heads * dh) @ p["o"]
    return with_delta(out, attended, "o", lora)


def _geglu(p: Params, x: Array, lora: Any = None) -> Array:
    """ModernBERT's MLP: [B, S, D] -> [B, S, D], ``Wo(gelu(input) * gate)`` of ``Wi x``
    (input then gate; peft's ``Wi`` adapter split into up and gate)."""
    up, gate = jnp.split(x @ p["wi"], 2, axis=-1)  # [B, S, F] each
    up, gate = (with_delta(part, x, name, lora) for part, name in ((up, "up"), (gate, "gate")))
    inner = jax.nn.gelu(up.astype(jnp.float32), approximate=False) * gate.astype(jnp.float32)
    inner = inner.astype(x.dtype)
    return with_delta(inner @ p["down"], inner, "down", lora)


def rotary_layer(
    c: ModelConfig, p: Params, x: Array, positions: Array, item_ids: Array, window: int,
    index: Array, lora: Any = None,
) -> Array:  # fmt: skip
    """One pre-norm ModernBERT layer (layer ``index``; layer 0 reads x unnormed):
    x [B, S, D] -> [B, S, D]; ``lora`` as ``encoder_layer``'s."""
    eps = c.rms_norm_eps
    is_local = jnp.asarray(c.sliding_layers or (False,) * c.num_layers)[index]
    normed = jnp.where(index == 0, x, layer_norm(p["attn_norm"], x, eps))
    x = x + _rotary_attention(c, p["attn"], normed, positions, item_ids, window, is_local, lora)
    return x + _geglu(p["mlp"], layer_norm(p["mlp_norm"], x, eps), lora)


def _random(rng: Array, shape: tuple[int, ...], path: str, dtype: Any) -> Array:
    if path.endswith("'scale']"):
        return jnp.ones(shape, dtype)
    if path.endswith("bias']"):
        return jnp.zeros(shape, dtype)
    return 0.02 * jax.random.normal(rng, shape, dtype)


def roberta_positions(tokens: Array, positions: Array, pad: int) -> Array:
    """RoBERTa's position ids (transformers' ``create_position_ids_from_input_ids``) for
    packed sequences: tokens, positions from 0 in each sequence [B, S] -> [B, S]. A token
    equal to ``pad`` takes position ``pad`` and is not counted; every other token ``pad`` +
    the count of non-``pad`` tokens of its sequence up to it, itself included."""
    is_pad = (tokens == pad).astype(jnp.int32)
    pads = jnp.cumsum(is_pad, axis=1)  # [B, S] pad tokens in the row up to each token
    start = jnp.arange(tokens.shape[1])[None, :] - positions  # [B, S] its sequence's first
    before = jnp.take_along_axis(pads, jnp.maximum(start - 1, 0), axis=1) * (start > 0)
    counted = pad + 1 + positions - (pads - before)
    return jnp.where(is_pad == 1, pad, counted)


@dataclass(frozen=True)
class Encoder:
    """Functional wrapper: all state is in ``params``; methods are jit-friendly. A
    ``model.protocol.ScoringModel`` (no decoder layouts' forwards): its sequences attend
    through ``segment_attention`` (None: ``attend_segments``, the XLA reference; ModernBERT's
    rotary layers always run it, their local windows being two-sided)."""

    decoder: ClassVar[bool] = False
    config: ModelConfig
    dtype: Any = jnp.float32
    segment_attention: SegmentAttention | None = None
    lora_groups: int = 1
    lora_update: str = "auto"

    def init_params(self, rng: Array) -> Params:
        """Random parameters with the loaders' tree structure (tests, eval_shape)."""
        from replicas.model.params import param_shapes

        shapes = param_shapes(self.config)
        leaves, tree = jax.tree_util.tree_flatten_with_path(
            shapes, is_leaf=lambda node: isinstance(node, tuple)
        )
        keys = jax.random.split(rng, len(leaves))
        values = [
            _random(key, shape, jax.tree_util.keystr(path), self.dtype)
            for key, (path, shape) in zip(keys, leaves, strict=True)
        ]
        params = jax.tree_util.tree_unflatten(tree, values)
        params["layers"] = quantize_layers(params["layers"], self.config.quantization)
        return params

    def embed(self, params: Params, tokens: Array, positions: Array, types: Array) -> Array:
        """tokens, positions, token types [B, S] -> normed embeddings [B, S, D]."""
        c = self.config
        x = jnp.take(params["embed"], tokens, axis=0, mode="clip")
        if c.position_offset:
            positions = roberta_positions(tokens, positions, c.position_offset - 1)
        x = x + jnp.take(params["position_embed"], positions, 0, mode="clip")
        x = x + jnp.take(params["type_embed"], types, axis=0, mode="clip")
        return layer_norm(params["embed_norm"], x.astype(self.dtype), c.rms_norm_eps)

    def encode(
        self, params: Params, tokens: Array, positions: Array, item_ids: Array, window: int,
        token_types: Array | None = None,
    ) -> Array:  # fmt: skip
        """Packed sequences [B, S] (``item_ids`` -1 padding, each sequence's positions from
        0, none longer than ``window``) -> last hidden states [B, S, D]. With adapter slots
        (``params["lora"]``) tokens are tagged ids (model.lora)."""
        c = self.config
        tokens, slots = split_tagged(params, tokens, c.vocab_size)
        stacks, slot_map = layer_inputs(params, slots, self.lora_groups, self.lora_update)
        attend = self.segment_attention or attend_segments

        def step(h: Array, xs: tuple[Params, Array | None, Params | None]) -> tuple[Array, None]:
            layer_params, index, lora = xs
            lora_in = None if lora is None else (lora, slot_map)
            if c.rotary:
                h = rotary_layer(c, layer_params, h, positions, item_ids, window, index, lora_in)
                return h, None
            return encoder_layer(c, layer_params, h, item_ids, window, attend, lora_in), None

        if c.rotary:  # ModernBERT: normed token embeddings, the layers, the final norm
            x = jnp.take(params["embed"], tokens, axis=0, mode="clip").astype(self.dtype)
            x = layer_norm(params["embed_norm"], x, c.rms_norm_eps)
        else:
            types = jnp.zeros_like(tokens) if token_types is None else token_types
            x = self.embed(params, tokens, positions, types)
        index = jnp.arange(c.num_layers) if c.rotary else None
        x, _ = jax.lax.scan(step, x, (params["layers"], index, stacks))
        return layer_norm(params["final_norm"], x, c.rms_norm_eps) if c.rotary else x

    def stream_hidden(
        self, params: Params, tokens: Array, positions: Array, spec: ItemStreamSpec,
        prefix_k: Array, prefix_v: Array, token_types: Array | None = None,
    ) -> Array:  # fmt: skip
        """``ScoringModel.stream_hidden``: the stream's sequences attend to themselves,
        bidirectionally; the (empty) prefix is not read."""
        del prefix_k, prefix_v
        return self.encode(params, tokens, positions, spec.item_ids, spec.window, token_types)


__all__ = [
    "Encoder", "attend_row", "attend_segments", "encoder_layer", "layer_norm", "rotary_layer",
]  # fmt: skip
