"""The causal LM: embeddings, a scanned stack of decoder layers, final norm, LM head.

Two forward passes: a dense one over token rows with an explicit mask (it also returns every
layer's keys and values), and an item-stream one whose tokens read those keys and values as a
shared prefix plus their own item (``ItemStreamSpec``). Positions are always explicit.
Parameters are a plain pytree whose layer leaves are stacked on a leading ``layers`` axis, so
the stack compiles once; what differs between layers (a sliding window, Gemma 3's local RoPE
base) is scanned beside them as ``LayerKind``. With ``layer_loop: unrolled`` an engine holds
the layers as one tree per layer instead and the loop runs unrolled over them (with ``auto``,
on a CPU, small steps over a per-layer copy beside the stack; ``replicas.model.layer_loop``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from replicas.model.config import ModelConfig
from replicas.model.heads import head_outputs, init_head_params
from replicas.model.layer_loop import loop_layers, small_steps
from replicas.model.layers import (
    MLP,
    Attention,
    RMSNorm,
    attend_dense,
    attend_item_stream,
    soft_cap,
)
from replicas.model.lora import has_head_slots, head_slot_outputs, layer_inputs, split_tagged
from replicas.model.masks import within_window
from replicas.model.quant import quantize_layers
from replicas.model.token_split import TokenSplit

Array = jax.Array
Params = dict[str, Any]


@flax.struct.dataclass
class AttentionSpec:
    """Who attends to whom in a dense row. ``mask[b, t, s]``: token t of row b may read s."""

    mask: Array  # [B, T, T] bool
    scale: float | None = flax.struct.field(pytree_node=False, default=None)  # None: Dh**-0.5
    softcap: float | None = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class CausalSpec:
    """Causal rows: row b's first ``lengths[b]`` tokens are real, padding follows. Real
    tokens read the real tokens up to themselves; padding reads what causality allows
    (nobody reads it), so a fused causal kernel computes the same real tokens."""

    lengths: Array  # [B] int32, >= 1

    def dense_mask(self, width: int) -> Array:
        """[B, T, T] mask of ``masked_attention`` (padding rows read the real keys and
        themselves, like the single-item rows always did)."""
        idx = jnp.arange(width)
        valid = idx[None, :] < self.lengths[:, None]  # [B, T]
        causal = idx[:, None] >= idx[None, :]  # [T, T]
        return (causal[None] & valid[:, None, :]) | jnp.eye(width, dtype=bool)[None]


DenseSpec = AttentionSpec | CausalSpec


def masked_attention(q: Array, k: Array, v: Array, spec: DenseSpec) -> Array:
    """The reference dense attention (XLA) of either spec: q [B, T, H, Dh], k/v [B, T, K, Dh]."""
    if isinstance(spec, CausalSpec):
        return attend_dense(q, k, v, spec.dense_mask(q.shape[1]))
    return attend_dense(q, k, v, spec.mask, spec.scale, spec.softcap)


@flax.struct.dataclass
class LayerKind:
    """What differs between the layers of one stack, scanned beside their parameters."""

    window: Array  # [] int32 (stacked: [layers]): sliding window, config.NO_WINDOW if global
    local: Array  # [] bool: a windowed layer (Gemma 3 reads its local RoPE base)


@flax.struct.dataclass
class ItemStreamSpec:
    """A flat stream of item tokens behind shared prefixes (see layers.attend_item_stream)."""

    prefix_valid: Array  # [B, T] bool: prefix keys the stream may read
    item_ids: Array  # [B, S] int32: item of each stream token, -1 for padding
    window: int = flax.struct.field(pytree_node=False)  # longest item the step allows


class DecoderLayer(nn.Module):
    config: ModelConfig
    dtype: Any = jnp.float32
    stream_attention: Callable[..., Array] = attend_item_stream  # see replicas.model.attention
    dense_attention: Callable[..., Array] = masked_attention  # see replicas.model.attention
    # A quantized model's residual stream split by tokens (model.token_split).
    split: TokenSplit | None = None

    def setup(self) -> None:
        c = self.config
        eps, offset = c.rms_norm_eps, c.norm_offset
        self.attn_norm = RMSNorm(eps, self.dtype, offset)
        self.attn = Attention(c, self.dtype, self.split)
        self.mlp_norm = RMSNorm(eps, self.dtype, offset)
        self.mlp = MLP(c, self.dtype, self.split)
        if c.post_norms:
            self.post_attn_norm = RMSNorm(eps, self.dtype, offset)
            self.post_mlp_norm = RMSNorm(eps, self.dtype, offset)

    def _mlp_block(self, x: Array, lora: Any = None) -> Array:
        out = self.mlp(self.mlp_norm(x), lora)
        return self._tokens(x + (self.post_mlp_norm(out) if self.config.post_norms else out))

    def _attn_block(self, x: Array, attended: Array, lora: Any = None) -> Array:
        out = self.attn.out(attended, lora)
        return self._tokens(x + (self.post_attn_norm(out) if self.config.post_norms else out))

    def _tokens(self, x: Array) -> Array:
        """The residual stream ``[B, T, D]`` where ``split`` keeps it (unchanged without)."""
        return x if self.split is None else self.split.tokens(x)

    def _qkv(
        self, x: Array, positions: Array, kind: LayerKind | None, lora: Any = None
    ) -> tuple[Array, ...]:
        local = None if kind is None else kind.local
        return self.attn.qkv(self.attn_norm(x), positions, local, lora)

    def _dense_spec(self, spec: DenseSpec, positions: Array, kind: LayerKind | None) -> DenseSpec:
        """``spec`` with this layer's window, logit scale and soft-cap (unchanged when the
        family has none, so a fused causal kernel still sees a ``CausalSpec``)."""
        c = self.config
        if not c.windowed and c.query_scale is None and c.attn_softcap is None:
            return spec
        mask = spec.dense_mask(positions.shape[1]) if isinstance(spec, CausalSpec) else spec.mask
        if c.windowed and kind is not None:
            mask = mask & within_window(positions, positions, kind.window)  # [B, T, T]
        return AttentionSpec(mask=mask, scale=c.query_scale, softcap=c.attn_softcap)

    def __call__(
        self,
        x: Array,
        positions: Array,
        spec: DenseSpec,
        kind: LayerKind | None = None,
        lora: Any = None,
    ) -> tuple[Array, Array, Array]:
        """x: [B, T, D] -> (x one layer on, this layer's keys and values [B, T, K, Dh]).
        ``lora``: (this layer's adapter stacks, how the step's tokens reach their slots), see
        model.lora."""
        x = self._tokens(x)
        q, k, v = self._qkv(x, positions, kind, lora)
        attended = self.dense_attention(q, k, v, self._dense_spec(spec, positions, kind))
        return self._mlp_block(self._attn_block(x, attended, lora), lora), k, v

    def _stream_options(self, positions: Array, kind: LayerKind | None) -> dict[str, Any]:
        """Keyword arguments of ``attend_item_stream`` that this family needs."""
        c = self.config
        options: dict[str, Any] = {}
        if c.query_scale is not None:
            options["scale"] = c.query_scale
        if c.attn_softcap is not None:
            options["softcap"] = c.attn_softcap
        if c.windowed and kind is not None:
            options.update(positions=positions, sliding_window=kind.window)
        return options

    def stream(
        self,
        x: Array,
        positions: Array,
        spec: ItemStreamSpec,
        prefix_k: Array,
        prefix_v: Array,
        kind: LayerKind | None = None,
        lora: Any = None,
    ) -> tuple[Array, Array, Array]:
        """x: [B, S, D] item stream reading prefix keys/values [B, T, K, Dh] -> (x one layer
        on [B, S, D], the stream's own keys and values [B, S, K, Dh])."""
        x = self._tokens(x)
        q, k, v = self._qkv(x, positions, kind, lora)
        attended = self.stream_attention(
            q, prefix_k, prefix_v, spec.prefix_valid, k, v, spec.item_ids, spec.window,
            **self._stream_options(positions, kind),
        )  # fmt: skip
        return self._mlp_block(self._attn_block(x, attended, lora), lora), k, v


@dataclass(frozen=True)
class CausalLM:
    """Functional wrapper: all state is in ``params``; methods are jit-friendly. A DecoderModel."""

    decoder: ClassVar[bool] = True
    config: ModelConfig
    dtype: Any = jnp.float32
    # The item stream's attention (layers.attend_item_stream, or the Pallas kernels that
    # replicas.model.attention selects for the mesh's platform); parameters do not depend on it.
    stream_attention: Callable[..., Array] = attend_item_stream
    # Dense rows' attention (``masked_attention``, or a fused causal kernel on GPU).
    dense_attention: Callable[..., Array] = masked_attention
    # Groups of rows the LoRA update sorts tokens by slot within (model.slot_routing): the
    # mesh's data axis, so no token moves across data shards.
    lora_groups: int = 1
    # The LoRA update's form (model.lora.update_form): "auto", "dense" or "grouped".
    lora_update: str = "auto"
    # A quantized model's residual stream split by tokens on the model axis (model.token_split).
    token_split: TokenSplit | None = None

    @property
    def layer(self) -> DecoderLayer:
        return DecoderLayer(
            self.config, self.dtype, self.stream_attention, self.dense_attention, self.token_split
        )

    def init_params(self, rng: Array) -> Params:
        """Random parameters with the loaders' tree structure (also for jax.eval_shape); a
        quantized config's layer weights are random float ones quantized (model.quant)."""
        c = self.config
        embed_rng, layers_rng, head_rng = jax.random.split(rng, 3)
        x = jnp.zeros((1, 1, c.hidden_size), self.dtype)
        pos = jnp.zeros((1, 1), jnp.int32)
        spec = AttentionSpec(mask=jnp.ones((1, 1, 1), bool))
        float_layer = DecoderLayer(c.replace(quantization="none"), self.dtype)

        def init_layer(key: Array) -> Params:
            return float_layer.init(key, x, pos, spec)["params"]

        layers = jax.vmap(init_layer)(jax.random.split(layers_rng, c.num_layers))
        params: Params = {
            "embed": 0.02 * jax.random.normal(embed_rng, (c.vocab_size, c.hidden_size), self.dtype),
            "layers": quantize_layers(layers, c.quantization),
            "final_norm": {
                "scale": (jnp.zeros if c.norm_offset else jnp.ones)((c.hidden_size,), self.dtype)
            },
        }
        if c.head is not None:
            params["head"] = init_head_params(c.head, c.hidden_size, head_rng, self.dtype)
        elif not c.tie_word_embeddings and c.pooling is None:
            params["lm_head"] = 0.02 * jax.random.normal(
                head_rng, (c.hidden_size, c.vocab_size), self.dtype
            )
        return params

    def layer_kinds(self) -> LayerKind | None:
        """Every layer's ``LayerKind`` stacked ``[layers]``; None when all layers are alike."""
        c = self.config
        if not c.windowed and c.local_rope_theta is None:
            return None
        local = c.sliding_layers or (c.sliding_window is not None,) * c.num_layers
        return LayerKind(
            window=jnp.asarray(np.asarray(c.layer_windows(), np.int32)),
            local=jnp.asarray(np.asarray(local, bool)),
        )

    def _embed(self, params: Params, tokens: Array) -> Array:
        x = jnp.take(params["embed"], tokens, axis=0).astype(self.dtype)
        if self.config.embed_scale:
            x = x * jnp.asarray(self.config.hidden_size**0.5, self.dtype)
        # Split by tokens from here (model.token_split), so what follows the layers gathers
        # them the same with or without layers (the projection's compile with none).
        return x if self.token_split is None else self.token_split.tokens(x)

    def _final_norm(self, params: Params, x: Array) -> Array:
        norm = RMSNorm(self.config.rms_norm_eps, self.dtype, self.config.norm_offset)
        return norm.apply({"params": params["final_norm"]}, x)

    def hidden_and_kv(
        self, params: Params, tokens: Array, positions: Array, spec: DenseSpec
    ) -> tuple[Array, Array, Array]:
        """tokens, positions: [B, T] -> final-normed hidden [B, T, D] and every layer's
        keys and values [layers, B, T, K, Dh] (what an item stream reads as its prefix).
        With adapter slots (``params["lora"]``) tokens are tagged ids (model.lora)."""
        return self._through_layers(params, tokens, positions, spec)

    def hidden_states(
        self, params: Params, tokens: Array, positions: Array, spec: DenseSpec
    ) -> Array:
        """tokens, positions: [B, T] -> final-normed hidden states [B, T, D]."""
        return self.hidden_and_kv(params, tokens, positions, spec)[0]

    def stream_hidden(
        self,
        params: Params,
        tokens: Array,
        positions: Array,
        spec: ItemStreamSpec,
        prefix_k: Array,
        prefix_v: Array,
        token_types: Array | None = None,
    ) -> Array:
        """Item stream tokens, positions [B, S] behind prefix keys/values [layers, B, T, K, Dh]
        -> final-normed hidden states [B, S, D] (a decoder reads no ``token_types``)."""
        return self.stream_hidden_and_kv(params, tokens, positions, spec, prefix_k, prefix_v)[0]

    def stream_hidden_and_kv(
        self,
        params: Params,
        tokens: Array,
        positions: Array,
        spec: ItemStreamSpec,
        prefix_k: Array,
        prefix_v: Array,
    ) -> tuple[Array, Array, Array]:
        """``stream_hidden``, and the stream's keys and values [layers, B, S, K, Dh] (a prefix
        extended by its stream: one item of the query's remaining tokens)."""
        stream = DecoderLayer.stream
        return self._through_layers(params, tokens, positions, spec, prefix_k, prefix_v, stream)

    def _through_layers(
        self, params: Params, tokens: Array, positions: Array, spec: DenseSpec | ItemStreamSpec,
        prefix_k: Array | None = None, prefix_v: Array | None = None,
        method: Callable[..., Any] | None = None,
    ) -> tuple[Array, Array, Array]:  # fmt: skip
        """Tagged ``tokens`` embedded and through every layer (``DecoderLayer.__call__``, or
        ``method`` reading each layer's slice of ``prefix_k``/``prefix_v``) -> final-normed
        hidden and every layer's keys and values stacked ``[layers, ...]``."""
        layer = self.layer
        prefix = () if prefix_k is None else (prefix_k, prefix_v)
        tokens, slots = split_tagged(params, tokens, self.config.vocab_size)
        stacks, slot_map = layer_inputs(params, slots, self.lora_groups, self.lora_update)

        def step(h: Array, scanned: tuple[Any, ...]) -> tuple[Array, tuple[Array, Array]]:
            layer_params, *kv, kind, lora = scanned
            lora_in = None if lora is None else (lora, slot_map)
            variables = {"params": layer_params}
            h, k, v = layer.apply(variables, h, positions, spec, *kv, kind, lora_in, method=method)
            return h, (k, v)

        x, (keys, values) = loop_layers(
            step, self._embed(params, tokens), params["layers"], *prefix, self.layer_kinds(),
            stacks, small=small_steps(params),
        )  # fmt: skip
        return self._final_norm(params, x), keys, values

    def logits(self, params: Params, hidden: Array) -> Array:
        """LM head for the given positions only: [..., D] -> [..., V] float32."""
        if self.config.tie_word_embeddings:
            out = jnp.einsum("...d,vd->...v", hidden, params["embed"])
        else:
            out = jnp.einsum("...d,dv->...v", hidden, params["lm_head"])
        return soft_cap(out.astype(jnp.float32), self.config.final_softcap)

    def label_logprobs(self, params: Params, hidden: Array, labels: Array) -> Array:
        """Full-vocabulary log-softmax, then the labels.

        hidden: [..., D] (scoring positions only); labels: [..., C] -> [..., C] float32.
        A model with a score head returns its outputs instead, ``labels`` indexing them.
        """
        if self.config.head is not None:
            if "lora" in params and has_head_slots(self.config):
                outputs = head_slot_outputs(params, hidden)  # [..., M * L]: labels are tagged
            else:
                outputs = head_outputs(self.config.head, params["head"], hidden)  # [..., L]
            return jnp.take_along_axis(outputs, labels, axis=-1)
        logprobs = jax.nn.log_softmax(self.logits(params, hidden), axis=-1)  # [..., V]
        return jnp.take_along_axis(logprobs, labels, axis=-1)
