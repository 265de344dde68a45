"""Which score head a Hugging Face config asks for (jax-free: the ingress reads it too).

The families declare their head architectures (``Family.heads``). A decoder's
``*ForSequenceClassification`` puts a bias-free linear ``score`` [D -> num_labels] on the
final hidden state (no final soft-cap: that belongs to Gemma's LM head); Qwen2's reward
model D -> D, ReLU, D -> 1. Both read the last token of a sequence.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from replicas.contract import PROBLEM_TYPES, ScoreHead
from replicas.model.errors import UnsupportedHeadError
from replicas.model.family.bert import position_offset
from replicas.model.family.registry import HEAD_ARCHITECTURES, family_named

# CrossEncoder's ``activation_fn`` (config_sentence_transformers.json, else config.json's
# ``sentence_transformers``) -> ScoreHead.activation
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
}


def _head_architecture(hf: Any) -> str | None:
    for arch in getattr(hf, "architectures", None) or ():
        if arch in HEAD_ARCHITECTURES:
            return arch
    return None


def _id2label(hf: Any, num_labels: int) -> tuple[str, ...]:
    given = dict(getattr(hf, "id2label", None) or {})
    if sorted(int(k) for k in given) != list(range(num_labels)):
        return tuple(f"LABEL_{i}" for i in range(num_labels))
    return tuple(str(given[k]) for k in sorted(given, key=int))


def score_head_from_hf(hf: Any) -> ScoreHead | None:
    """The head of a transformers config (config.json), or None for a causal LM."""
    arch = _head_architecture(hf)
    if arch is None:
        return None
    family, kind = HEAD_ARCHITECTURES[arch]
    num_labels = 1 if kind == "reward_mlp" else int(getattr(hf, "num_labels", 0) or 0)
    if num_labels < 1:
        raise UnsupportedHeadError(f"num_labels: {num_labels} (a head needs at least one)")
    problem_type = getattr(hf, "problem_type", None)
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise UnsupportedHeadError(f"problem_type: {problem_type!r} not in {PROBLEM_TYPES}")
    if kind != "cross_encoder":
        return ScoreHead(kind, num_labels, _id2label(hf, num_labels), problem_type)
    saved = dict(getattr(hf, "sentence_transformers", None) or {}).get("activation_fn")
    return ScoreHead(
        kind, num_labels, _id2label(hf, num_labels), problem_type,
        activation=_activation(saved, num_labels, "config.json"),
        max_length=int(hf.max_position_embeddings) - position_offset(hf),
        **family_named(family).head_fields(hf),
    )  # fmt: skip


def _activation(saved: Any, num_labels: int, where: str) -> str:
    """CrossEncoder's activation: the saved one, else sigmoid for one label, else identity."""
    if saved is None:
        return "sigmoid" if num_labels == 1 else "identity"
    if saved not in CROSS_ENCODER_ACTIVATIONS:
        raise UnsupportedHeadError(
            f"{where}: activation_fn {saved!r} not in {sorted(CROSS_ENCODER_ACTIVATIONS)}"
        )
    return CROSS_ENCODER_ACTIVATIONS[saved]


def with_saved_activation(head: ScoreHead | None, directory: Path | None) -> ScoreHead | None:
    """A cross-encoder's head with the activation its sentence-transformers directory saved
    (``config_sentence_transformers.json``, which CrossEncoder reads first); others as
    they are."""
    path = None if directory is None else directory / "config_sentence_transformers.json"
    if head is None or head.kind != "cross_encoder" or path is None or not path.is_file():
        return head
    saved = json.loads(path.read_text()).get("activation_fn")
    if saved is None:
        return head
    return dataclasses.replace(head, activation=_activation(saved, head.num_labels, path.name))


def is_cross_encoder(hf: Any) -> bool:
    arch = _head_architecture(hf)
    return arch is not None and HEAD_ARCHITECTURES[arch][1] == "cross_encoder"
