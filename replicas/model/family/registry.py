"""The model families, one registry: a line per family, each a ``Family`` of its own file.
``config``, ``head_config``, ``pooling_config``, ``classes`` and ``checkpoints.name_map``
derive their tables from it. Jax-free: the ingress reads it (``head_config``)."""

from __future__ import annotations

from typing import Any

from replicas.model.errors import UnsupportedModelError
from replicas.model.family.bert import BERT, XLM_ROBERTA
from replicas.model.family.embedding_gemma import EMBEDDING_GEMMA
from replicas.model.family.entry import Family
from replicas.model.family.gemma import GEMMA2, GEMMA3
from replicas.model.family.llama import LLAMA
from replicas.model.family.mistral import MISTRAL
from replicas.model.family.modernbert import MODERNBERT
from replicas.model.family.qwen import QWEN2, QWEN3

FAMILIES: tuple[Family, ...] = (
    LLAMA,
    QWEN2,
    QWEN3,
    MISTRAL,
    GEMMA2,
    GEMMA3,
    EMBEDDING_GEMMA,
    BERT,
    XLM_ROBERTA,
    MODERNBERT,
)
NAMES = tuple(family.name for family in FAMILIES)
ENCODERS = tuple(family.name for family in FAMILIES if family.encoder)
_NAMED = {family.name: family for family in FAMILIES}
# architecture -> (family, ScoreHead kind): the *ForSequenceClassification of each family
HEAD_ARCHITECTURES = {arch: (f.name, kind) for f in FAMILIES for arch, kind in f.heads}
BASE_ARCHITECTURES = {arch: f.name for f in FAMILIES for arch in f.base}  # bare base models
# an encoder's *ForMaskedLM (a sparse model's checkpoint) -> its family
MASKED_LM_ARCHITECTURES = {arch: f.name for f in FAMILIES for arch in f.masked_lm}
_ARCHITECTURES = {
    a: f for f in FAMILIES for a in (*f.architectures, *dict(f.heads), *f.base, *f.masked_lm)
}
_MODEL_TYPES = {model_type: f for f in FAMILIES for model_type in f.model_types}


def family_named(name: str) -> Family:
    return _NAMED[name]


def _selected(hf: Any) -> Family:
    for arch in getattr(hf, "architectures", None) or ():
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    model_type = getattr(hf, "model_type", None)
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise UnsupportedModelError(
        f"architecture: {getattr(hf, 'architectures', None) or model_type!r} is not supported "
        f"(supported: {sorted(_ARCHITECTURES)})"
    )


def recognize(hf: Any) -> Family:
    """The family of a transformers config: the one its architectures (else its
    ``model_type``) select, or a variant of it whose ``when`` holds."""
    family = _selected(hf)
    variants = (f for f in FAMILIES if f.refines == family.name and f.when and f.when(hf))
    return next(variants, family)
