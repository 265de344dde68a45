"""Mistral: Llama's layers and names, with an optional ``sliding_window`` on every layer."""

from __future__ import annotations

from typing import Any

from replicas.model.family.entry import Family
from replicas.model.family.fields import decoder_fields, rope_theta
from replicas.model.family.llama import decoder_mappings


def _mistral(hf: Any) -> dict[str, Any]:
    return {**decoder_fields(hf, "mistral"), "rope_theta": rope_theta(hf)}


MISTRAL = Family(
    "mistral", _mistral, decoder_mappings, ("MistralForCausalLM",),
    heads=(("MistralForSequenceClassification", "linear"),), base=("MistralModel",),
    model_types=("mistral",),
)  # fmt: skip
