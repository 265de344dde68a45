"""Tiny random ``*ForMaskedLM`` encoders (tests/engine/test_mlm_head.py): the families'
configs of ``tests.support.encoder_helpers`` (ModernBERT's dense with its bias), every weight
random (``randomize_bert_``: the head's LayerNorm and biases too, the tied decoder as the word
embeddings), saved with safetensors. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.encoder_helpers import FAMILIES, randomize_bert_

MASKED_LM = {
    "bert": "BertForMaskedLM",
    "xlm_roberta": "XLMRobertaForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
}


def masked_lm_config(family: str, **changes: Any) -> Any:
    """The family's tiny config as its ``*ForMaskedLM``'s (``architectures`` set)."""
    extra = {"classifier_bias": True} if family == "modernbert" else {}
    return FAMILIES[family][0](architectures=[MASKED_LM[family]], **{**extra, **changes})


def save_masked_lm(directory: Path, family: str, seed: int = 0) -> Any:
    """A tiny random ``*ForMaskedLM`` of ``family`` saved in ``directory``; the model (eval)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, MASKED_LM[family])(masked_lm_config(family))
    randomize_bert_(model, seed)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model
