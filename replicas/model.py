"""The causal LM: embeddings, a scanned stack of decoder layers, final norm, LM head.

The forward pass takes token ids, explicit positions and an explicit attention
specification. A spec is a dense mask over one token stream and, optionally, a second stream
of items that read the first one as a shared prefix. Parameters are a plain pytree whose
layer leaves are stacked on a leading ``layers`` axis, so the stack compiles once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from replicas.config import ModelConfig
from replicas.layers import MLP, Attention, RMSNorm, attend_dense, attend_items

Array = jax.Array
Params = dict[str, Any]


@flax.struct.dataclass
class ItemStream:
    """Items that read a shared prefix (the main stream) and causally themselves."""

    tokens: Array  # [B, N, L] int32
    positions: Array  # [B, N, L] int32
    prefix_visible: Array  # [B, T] bool: main-stream keys every item token may read
    self_mask: Array  # [B, N, L, L] bool: item token l may read token m of the same item


@flax.struct.dataclass
class AttentionSpec:
    """Who attends to whom. ``mask[b, t, s]``: token t of row b may read token s."""

    mask: Array  # [B, T, T] bool
    items: ItemStream | None = None


class DecoderLayer(nn.Module):
    config: ModelConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        eps = self.config.rms_norm_eps
        self.attn_norm = RMSNorm(eps, self.dtype)
        self.attn = Attention(self.config, self.dtype)
        self.mlp_norm = RMSNorm(eps, self.dtype)
        self.mlp = MLP(self.config, self.dtype)

    def _mlp_block(self, x: Array) -> Array:
        return x + self.mlp(self.mlp_norm(x))

    def __call__(
        self, x: Array, positions: Array, spec: AttentionSpec, item_x: Array | None
    ) -> tuple[Array, Array | None]:
        """x: [B, T, D]; item_x: [B, N, L, D] or None -> the same shapes, one layer on."""
        q, k, v = self.attn.qkv(self.attn_norm(x), positions)
        new_x = self._mlp_block(x + self.attn.out(attend_dense(q, k, v, spec.mask)))
        if spec.items is None or item_x is None:
            return new_x, None
        items = spec.items
        iq, ik, iv = self.attn.qkv(self.attn_norm(item_x), items.positions)
        attended = attend_items(iq, k, v, items.prefix_visible, ik, iv, items.self_mask)
        return new_x, self._mlp_block(item_x + self.attn.out(attended))


@dataclass(frozen=True)
class CausalLM:
    """Functional wrapper: all state is in ``params``; methods are jit-friendly."""

    config: ModelConfig
    dtype: Any = jnp.float32

    @property
    def layer(self) -> DecoderLayer:
        return DecoderLayer(self.config, self.dtype)

    def init_params(self, rng: Array) -> Params:
        """Random parameters with the loaders' tree structure (also for jax.eval_shape)."""
        c = self.config
        embed_rng, layers_rng, head_rng = jax.random.split(rng, 3)
        x = jnp.zeros((1, 1, c.hidden_size), self.dtype)
        pos = jnp.zeros((1, 1), jnp.int32)
        spec = AttentionSpec(mask=jnp.ones((1, 1, 1), bool))

        def init_layer(key: Array) -> Params:
            return self.layer.init(key, x, pos, spec, None)["params"]

        params: Params = {
            "embed": 0.02 * jax.random.normal(embed_rng, (c.vocab_size, c.hidden_size), self.dtype),
            "layers": jax.vmap(init_layer)(jax.random.split(layers_rng, c.num_layers)),
            "final_norm": {"scale": jnp.ones((c.hidden_size,), self.dtype)},
        }
        if not c.tie_word_embeddings:
            params["lm_head"] = 0.02 * jax.random.normal(
                head_rng, (c.hidden_size, c.vocab_size), self.dtype
            )
        return params

    def hidden_states(
        self, params: Params, tokens: Array, positions: Array, spec: AttentionSpec
    ) -> tuple[Array, Array | None]:
        """tokens, positions: [B, T] -> final-normed hidden [B, T, D], items [B, N, L, D]."""
        embed = params["embed"]
        x = jnp.take(embed, tokens, axis=0).astype(self.dtype)
        item_x = None
        if spec.items is not None:
            item_x = jnp.take(embed, spec.items.tokens, axis=0).astype(self.dtype)
        layer = self.layer

        def step(carry: tuple[Array, Array | None], layer_params: Params) -> tuple[Any, None]:
            h, ih = carry
            return layer.apply({"params": layer_params}, h, positions, spec, ih), None

        (x, item_x), _ = jax.lax.scan(step, (x, item_x), params["layers"])
        norm = RMSNorm(self.config.rms_norm_eps, self.dtype)
        final = {"params": params["final_norm"]}
        x = norm.apply(final, x)
        item_x = None if item_x is None else norm.apply(final, item_x)
        return x, item_x

    def logits(self, params: Params, hidden: Array) -> Array:
        """LM head for the given positions only: [..., D] -> [..., V] float32."""
        if self.config.tie_word_embeddings:
            out = jnp.einsum("...d,vd->...v", hidden, params["embed"])
        else:
            out = jnp.einsum("...d,dv->...v", hidden, params["lm_head"])
        return out.astype(jnp.float32)

    def label_logprobs(self, params: Params, hidden: Array, labels: Array) -> Array:
        """Full-vocabulary log-softmax, then the labels.

        hidden: [B, K, D] (scoring positions only); labels: [B, C] -> [B, K, C] float32.
        """
        logprobs = jax.nn.log_softmax(self.logits(params, hidden), axis=-1)  # [B, K, V]
        return jnp.take_along_axis(logprobs, labels[:, None, :], axis=-1)
