"""The family registry (replicas/model/family/registry.py): each architecture and model_type
selects one family, a variant refines a family of the registry, each family names a model
class that imports, and a config is recognized by its architectures, then its model_type,
then a variant's condition."""

from __future__ import annotations

import importlib
from collections import Counter
from types import SimpleNamespace

import pytest

from replicas.model.errors import UnsupportedModelError
from replicas.model.family.registry import (
    FAMILIES,
    MASKED_LM_ARCHITECTURES,
    family_named,
    recognize,
)


def test_each_architecture_and_model_type_selects_one_family() -> None:
    archs = Counter(
        a for f in FAMILIES for a in {*f.architectures, *dict(f.heads), *f.base, *f.masked_lm}
    )
    types = Counter(t for f in FAMILIES for t in f.model_types)
    assert max(archs.values()) == 1 and max(types.values()) == 1
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_a_variant_refines_a_family_of_the_registry() -> None:
    variants = [f for f in FAMILIES if f.refines]
    assert [f.name for f in variants] == ["embeddinggemma"]
    for variant in variants:
        assert variant.when is not None and family_named(variant.refines) in FAMILIES
        assert not (variant.architectures or variant.heads or variant.base or variant.model_types)
        assert not variant.masked_lm


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_names_a_model_class_that_imports(family) -> None:
    module, name = family.model_path.split(":")
    assert getattr(importlib.import_module(module), name).decoder is not family.encoder


def test_a_config_is_recognized_by_architecture_then_model_type_then_variant() -> None:
    def named(**fields) -> str:
        return recognize(SimpleNamespace(**fields)).name

    assert named(architectures=["GPT2LMHeadModel", "Qwen2ForRewardModel"]) == "qwen2"
    assert named(architectures=None, model_type="xlm-roberta") == "xlm_roberta"
    assert named(architectures=["Gemma3TextModel"]) == "gemma3"
    assert named(architectures=["XLMRobertaForMaskedLM"], model_type="xlm-roberta") == "xlm_roberta"
    bidirectional = {"architectures": ["Gemma3TextModel"], "use_bidirectional_attention": True}
    assert named(**bidirectional) == "embeddinggemma"
    with pytest.raises(UnsupportedModelError, match=r"^architecture: \['GPT2LMHeadModel'\]"):
        named(architectures=["GPT2LMHeadModel"], model_type="gpt2")


def test_a_masked_lm_architecture_selects_its_encoder_family() -> None:
    """BERT's, XLM-RoBERTa's and ModernBERT's *ForMaskedLM (a sparse model's checkpoint) read
    as the encoder, not as a causal LM or a score head."""
    assert MASKED_LM_ARCHITECTURES == {
        "BertForMaskedLM": "bert",
        "XLMRobertaForMaskedLM": "xlm_roberta",
        "ModernBertForMaskedLM": "modernbert",
    }
    for arch, name in MASKED_LM_ARCHITECTURES.items():
        family = recognize(SimpleNamespace(architectures=[arch]))
        assert family.name == name and family.encoder
        assert arch not in {*family.architectures, *dict(family.heads), *family.base}
