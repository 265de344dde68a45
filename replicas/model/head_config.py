"""Which score head a Hugging Face config asks for (jax-free: the ingress reads it too).

``*ForSequenceClassification`` of the Llama, Qwen2, Qwen3, Mistral, Gemma 2 and Gemma 3
(text) families put a bias-free linear ``score`` [D -> num_labels] on the final hidden state
(no final soft-cap: that belongs to Gemma's LM head); ``Qwen2ForRewardModel`` (remote code of
Qwen2.5-Math-RM and process reward models) puts D -> D, ReLU, D -> 1 there. Both read the
last token of a sequence.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from replicas.contract import PROBLEM_TYPES, ScoreHead

HEAD_ARCHITECTURES = {
    "LlamaForSequenceClassification": ("llama", "linear"),
    "Qwen2ForSequenceClassification": ("qwen2", "linear"),
    "Qwen3ForSequenceClassification": ("qwen3", "linear"),
    "Qwen2ForRewardModel": ("qwen2", "reward_mlp"),
    "MistralForSequenceClassification": ("mistral", "linear"),
    "Gemma2ForSequenceClassification": ("gemma2", "linear"),
    "Gemma3TextForSequenceClassification": ("gemma3", "linear"),
    "BertForSequenceClassification": ("bert", "cross_encoder"),
    "XLMRobertaForSequenceClassification": ("xlm_roberta", "cross_encoder"),
    "ModernBertForSequenceClassification": ("modernbert", "cross_encoder"),
}
# CrossEncoder's ``activation_fn`` (config_sentence_transformers.json, else config.json's
# ``sentence_transformers``) -> ScoreHead.activation
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
}


class UnsupportedHeadError(ValueError):
    """The config's head fields are unusable (they are named in the message)."""


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
    kind = HEAD_ARCHITECTURES[arch][1]
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
        **_modernbert_head(hf, arch),
    )  # fmt: skip


def _modernbert_head(hf: Any, arch: str) -> dict[str, Any]:
    """ModernBERT's head: its pooling and LayerNorm eps (its activation must be GELU)."""
    if arch != "ModernBertForSequenceClassification":
        return {}
    act = getattr(hf, "classifier_activation", "gelu")
    if act != "gelu":
        raise UnsupportedHeadError(f"classifier_activation: {act!r} (only gelu)")
    pooling = getattr(hf, "classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise UnsupportedHeadError(f"classifier_pooling: {pooling!r} not in ('cls', 'mean')")
    return {"pooling": pooling, "norm_eps": float(hf.norm_eps)}


def position_offset(hf: Any) -> int:
    """What an encoder adds to each position: XLM-RoBERTa counts from ``pad_token_id + 1``
    (transformers' ``create_position_ids_from_input_ids`` on an unpadded sequence)."""
    return int(hf.pad_token_id) + 1 if getattr(hf, "model_type", None) == "xlm-roberta" else 0


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
