"""What the engine and its layouts use of a model, all of it: the model protocol.

``ScoringModel`` is what every model the engine takes has (the embedding layout reads
nothing else, nor the engine of a model that is no ``decoder``): ``Encoder`` (BERT,
XLM-RoBERTa, ModernBERT) keeps it and nothing more. ``DecoderModel`` adds the decoder
layouts' forwards (dense rows, prefixes, item streams, the LM head): ``CausalLM`` and
``EmbeddingGemma`` keep it. Which layouts an engine
builds is the model kind's (``replicas.kinds``) and ``decoder``'s: an embedding model or a
cross-encoder only the embedding layout, any other kind (decoders only) the decoder layouts.
``tests/unit/test_model_protocol.py`` checks each model class has every member, and that the
engine and the layouts read no other.

Shapes: B rows, T dense (prefix) tokens, S stream tokens, D hidden, K kv heads, Dh head dim,
V vocabulary, C labels; ``layers`` the model's layer count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import jax

from replicas.model.causal_lm import DenseSpec, ItemStreamSpec
from replicas.model.config import ModelConfig
from replicas.model.token_split import TokenSplit

Array = jax.Array
Params = dict[str, Any]


class ScoringModel(Protocol):
    """A frozen dataclass over a ``ModelConfig``; all state is in ``params``."""

    decoder: ClassVar[bool]
    """Decoder layers (``CausalLM``'s): run through ``layer_loop`` (the engine may hold them
    unrolled), their residual stream split by tokens (``token_split``), and the decoder
    layouts' steps (``DecoderModel``). False: an encoder, which only embeds and reads each
    row whole (``embed_packing``)."""
    config: ModelConfig
    dtype: Any  # parameters' and activations' dtype
    lora_groups: int  # row groups LoRA sorts tokens within (the engine: the mesh's data axis)
    lora_update: str  # the LoRA update's form (model.lora.update_form)

    def stream_hidden(
        self, params: Params, tokens: Array, positions: Array, spec: ItemStreamSpec,
        prefix_k: Array, prefix_v: Array, token_types: Array | None = None,
    ) -> Array:  # fmt: skip
        """The embed step's forward (and the item stream's): tokens, positions [B, S] behind
        prefix keys/values [layers, B, T, K, Dh] -> final-normed hidden states [B, S, D].
        ``token_types`` [B, S]: an encoder's (a pair's second part 1); a decoder has none."""
        ...


class DecoderModel(ScoringModel, Protocol):
    """A model the decoder layouts run (single-item, shared-prefix, packed, prompts)."""

    # Set by the engine (``dataclasses.replace``, ``attention.with_attention``):
    token_split: TokenSplit | None  # a quantized model's residual stream split by tokens
    stream_attention: Callable[..., Array]  # the item stream's (layers.attend_item_stream)
    dense_attention: Callable[..., Array]  # dense rows' (causal_lm.masked_attention)

    def hidden_and_kv(
        self, params: Params, tokens: Array, positions: Array, spec: DenseSpec
    ) -> tuple[Array, Array, Array]:
        """Dense rows: tokens, positions [B, T] -> hidden [B, T, D] and every layer's keys and
        values [layers, B, T, K, Dh] (what an item stream reads as its prefix)."""
        ...

    def hidden_states(
        self, params: Params, tokens: Array, positions: Array, spec: DenseSpec
    ) -> Array:
        """``hidden_and_kv``'s hidden [B, T, D] alone."""
        ...

    def stream_hidden_and_kv(
        self, params: Params, tokens: Array, positions: Array, spec: ItemStreamSpec,
        prefix_k: Array, prefix_v: Array,
    ) -> tuple[Array, Array, Array]:  # fmt: skip
        """``stream_hidden``'s [B, S, D], and the stream's keys and values
        [layers, B, S, K, Dh] (a prefix extended by its stream)."""
        ...

    def logits(self, params: Params, hidden: Array) -> Array:
        """The LM head: hidden [..., D] -> [..., V] float32."""
        ...

    def label_logprobs(self, params: Params, hidden: Array, labels: Array) -> Array:
        """hidden [..., D], labels [..., C] -> the labels' log-probs [..., C] float32 (a score
        head's outputs, ``labels`` indexing them)."""
        ...


__all__ = ["DecoderModel", "ScoringModel"]
