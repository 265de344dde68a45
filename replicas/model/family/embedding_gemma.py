"""EmbeddingGemma: a Gemma 3 config with ``use_bidirectional_attention``, Gemma 3's fields
and names, run by ``replicas.model.embedding_gemma.EmbeddingGemma`` (each input read both
ways; ``sliding_window`` as transformers holds it: config.json's ``// 2 + 1``)."""

from __future__ import annotations

from typing import Any

from replicas.model.family.entry import Family
from replicas.model.family.fields import text_config
from replicas.model.family.gemma import gemma3_fields, gemma_mappings

NAME = "embeddinggemma"


def _bidirectional(hf: Any) -> bool:
    return bool(getattr(text_config(hf), "use_bidirectional_attention", False))


EMBEDDING_GEMMA = Family(
    NAME, lambda hf: {**gemma3_fields(hf), "family": NAME}, gemma_mappings,
    model_class="replicas.model.embedding_gemma:EmbeddingGemma",
    refines="gemma3", when=_bidirectional,
)  # fmt: skip
