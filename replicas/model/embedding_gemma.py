"""EmbeddingGemma: Gemma 3's decoder layers, each input read both ways (semantics 20).

google/embeddinggemma-300m is a sentence-transformers directory: a ``Gemma3TextModel``
(``model_type: gemma3_text``) with ``use_bidirectional_attention: true`` at its root, then
mean Pooling, Dense 768 -> 3072 and 3072 -> 768 (no biases, identity), Normalize, its task
prompts (``query``: "task: search result | query: ", ``document``: "title: none | text: ",
...) in ``config_sentence_transformers.json`` and ``max_seq_length`` 2048.
Its family (``replicas.model.family.embedding_gemma``, ``embeddinggemma``) has Gemma 3's
fields (``(1 + w)`` norms before and after each block, QK-norm, embeddings times
sqrt(hidden), gelu-tanh MLP, ``query_pre_attn_scalar``, a RoPE base per layer kind); the
tensor names are Gemma 3's, the Pooling, Dense and Normalize modules every
sentence-transformers directory's (``pooling_config``, ``checkpoints.dense``, the embedding
layout). What differs is attention, as transformers computes it (``Gemma3TextModel.forward``):

- a global layer's token reads every token of its input;
- a windowed layer's token at position p reads the keys at q with ``|p - q| < sliding_window``,
  the value transformers' config holds (config.json's ``sliding_window // 2 + 1``: 512 there,
  257 here, 256 positions to either side).

The embedding layout (``replicas.engine.layouts.embed``) puts inputs end to end in rows, each
at positions 0..len-1 behind an empty prefix; ``attend_bidirectional`` takes the item
stream's place in ``DecoderLayer.stream`` and reads each input alone
(``encoder.attend_segments``' blocks), so a vector never depends on what shares its row. It
runs the XLA reference on every platform (the Pallas segment kernel has no windows). Only
embed steps run it: without a pooling head the model is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from replicas.model.causal_lm import CausalLM, DecoderLayer
from replicas.model.config import NO_WINDOW
from replicas.model.encoder import attend_segments
from replicas.model.errors import UnsupportedModelError

Array = jax.Array


def attend_bidirectional(
    q: Array, prefix_k: Array, prefix_v: Array, prefix_valid: Array, k: Array, v: Array,
    item_ids: Array, window: int, scale: float | None = None, softcap: float | None = None,
    positions: Array | None = None, sliding_window: Array | None = None,
) -> Array:  # fmt: skip
    """``layers.attend_item_stream``'s signature, each input read whole in both directions.

    q: [B, S, H, Dh]; k, v: [B, S, K, Dh]; item_ids: [B, S] (-1 padding) -> [B, S, H, Dh].
    The prefix (the embedding layout's, empty) is not read. ``sliding_window`` ([] int,
    ``NO_WINDOW`` on a global layer) with the stream's ``positions`` [B, S]: a key also has
    to be less than ``sliding_window`` positions from its query, on either side.
    """
    del prefix_k, prefix_v, prefix_valid
    if softcap is not None:
        raise UnsupportedModelError("attn_logit_softcapping: not supported by EmbeddingGemma")
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))  # [B, S, H, Dh]: kv head per group
    local = None
    if sliding_window is not None and positions is not None:
        local = (positions, sliding_window < NO_WINDOW, sliding_window - 1)
    return attend_segments(q, k, v, item_ids, window, local, scale)


@dataclass(frozen=True)
class EmbeddingGemma(CausalLM):
    """``CausalLM`` whose layers run ``attend_bidirectional`` in the item stream, whatever
    stream attention the engine sets (``attention.with_attention``); parameters, RoPE and
    norms are Gemma 3's. It embeds only: ``stream_hidden`` is the embed step's forward."""

    def __post_init__(self) -> None:
        if self.config.pooling is None:
            raise UnsupportedModelError(
                "use_bidirectional_attention: an EmbeddingGemma model only embeds (a "
                "sentence-transformers directory, a Gemma3TextModel, or the pooling setting)"
            )

    @property
    def layer(self) -> DecoderLayer:
        return DecoderLayer(
            self.config, self.dtype, attend_bidirectional, self.dense_attention, self.token_split
        )


__all__ = ["EmbeddingGemma", "attend_bidirectional"]
