"""EmbeddingGemma: a Gemma 3 config with ``use_bidirectional_attention`` (google/
embeddinggemma-300m's ``Gemma3TextModel``), Gemma 3's fields and tensor names, run by
``replicas.model.embedding_gemma.EmbeddingGemma`` (its layers read each input both ways).
``sliding_window`` is kept as transformers holds it (config.json's ``// 2 + 1``: keys less
than it apart).
"""

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
