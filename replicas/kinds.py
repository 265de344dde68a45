"""The model kinds, one registry: what a model is, recognized once from what its checkpoint
declares (its score head, its pooling), and what that means for the replica (whether its
steps embed, whether it has a language-model head). How each kind answers each workload is
its ingress half, ``app/kinds/<name>.py``; ``ModelInfo.model_kind`` is the one place a
served model's kind is read (docs/architecture.md, "Adding a model kind").

Jax-free and rank 0 beside ``contract`` (which imports it): the recognizers read the head's
and the pooling's fields, never their classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (the checkpoint's ScoreHead or None, its PoolingHead or None) -> whether it is this kind
Recognizer = Callable[[Any, Any], bool]


@dataclass(frozen=True)
class ModelKind:
    """One kind of model, declared once."""

    name: str
    """What /v1/models reports as ``kind`` and ``app/kinds/<name>.py`` answers for."""
    recognizes: Recognizer
    """Whether a checkpoint with this head and pooling is this kind."""
    embeds: bool
    """Its steps take EmbedWork (inputs in, one row each out: vectors, or a head's logits);
    otherwise ScoreWork and PromptWork through the decoder layouts."""
    lm_head: bool
    """It answers token log-probabilities (/v1/completions, label tokens, rerank templates)."""
    pairs: bool
    """Its inputs are (query, document) pairs read by a head (a cross-encoder)."""
    answer: str
    """What its steps return per work."""
    output: str = "vector"
    """What its EmbedWork asks for (``replicas.embed_contract.OUTPUTS``)."""

    @property
    def vectors(self) -> bool:
        """Its steps answer one dense vector per input (an embedding model)."""
        return self.embeds and not self.pairs and self.output == "vector"


def _is_cross_encoder(head: Any, pooling: Any) -> bool:
    return pooling is None and head is not None and head.kind == "cross_encoder"


def _output(pooling: Any) -> str | None:
    """What a model with this pooling embeds (None: it has none)."""
    return None if pooling is None else pooling.output


def _embedder(name: str, output: str, answer: str) -> ModelKind:
    """A kind whose steps embed each input alone: recognized by what its pooling embeds."""
    return ModelKind(
        name,
        lambda head, pooling: _output(pooling) == output,
        embeds=True,
        lm_head=False,
        pairs=False,
        answer=answer,
        output=output,
    )


EMBEDDING = _embedder("embedding", "vector", "vectors [inputs, dimension]")
CROSS_ENCODER = ModelKind(
    "cross_encoder",
    _is_cross_encoder,
    embeds=True,
    lm_head=False,
    pairs=True,
    answer="logits [pairs, labels]",
)
LATE_INTERACTION = _embedder(
    "late_interaction", "tokens", "token vectors, per input [tokens, dimension]"
)
SPARSE = _embedder(
    "sparse", "sparse", "sparse vectors, per input (indices [k], values [k]) over the vocabulary"
)
HYBRID = _embedder(
    "hybrid",
    "hybrid",
    "per input (dense [D], multi-vector [tokens - 1, C], lexical weights [tokens])",
)
SCORE_HEAD = ModelKind(
    "score_head",
    lambda head, pooling: pooling is None and head is not None and head.kind != "cross_encoder",
    embeds=False,
    lm_head=False,
    pairs=False,
    answer="head outputs [items, labels]",
)
CAUSAL_LM = ModelKind(
    "causal_lm",
    lambda head, pooling: head is None and pooling is None,
    embeds=False,
    lm_head=True,
    pairs=False,
    answer="label log-probs [items, labels]; PromptLogprobs per prompt",
)

# Exactly one recognizes any checkpoint (tests/unit/test_kinds.py); in the order messages
# and documents list them.
KINDS: tuple[ModelKind, ...] = (
    CAUSAL_LM, SCORE_HEAD, EMBEDDING, CROSS_ENCODER, LATE_INTERACTION, SPARSE, HYBRID,
)  # fmt: skip
KIND_NAMES: tuple[str, ...] = tuple(kind.name for kind in KINDS)


def recognize(head: Any, pooling: Any) -> ModelKind:
    """The kind of a model with this score head and pooling (each None when absent)."""
    return next(kind for kind in KINDS if kind.recognizes(head, pooling))


def kind_named(name: str) -> ModelKind:
    """The kind called ``name`` (KeyError naming the kinds otherwise)."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"model kind {name!r}: one of {[kind.name for kind in KINDS]}")


def served_parts(head: Any, pooling: Any) -> tuple[Any, Any]:
    """The (head, pooling) a model is served with: an embedding model pools, and a head its
    checkpoint also holds is not served."""
    return (head if pooling is None else None), pooling
