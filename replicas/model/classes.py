"""The model class that runs a ``ModelConfig``: one line per class that is not ``CausalLM``.

``Encoder`` (``replicas.model.encoder``) for the bidirectional encoders (BERT, XLM-RoBERTa,
ModernBERT), ``EmbeddingGemma`` (``replicas.model.embedding_gemma``) for its family, else
``CausalLM``. Each keeps ``model.protocol.ScoringModel`` (the decoders ``DecoderModel``),
so the loaders and the engine hold any of them.
"""

from __future__ import annotations

from typing import Any

from replicas.model.causal_lm import CausalLM
from replicas.model.config import ModelConfig
from replicas.model.embedding_gemma import FAMILY as EMBEDDING_GEMMA
from replicas.model.embedding_gemma import EmbeddingGemma
from replicas.model.encoder import Encoder

MODEL_CLASSES: dict[str, type] = {EMBEDDING_GEMMA: EmbeddingGemma}  # family -> its class


def model_for(config: ModelConfig, dtype: Any) -> Any:
    """The model of ``config`` in ``dtype`` (parameters and activations)."""
    if config.encoder:
        return Encoder(config, dtype)
    return MODEL_CLASSES.get(config.family, CausalLM)(config, dtype)
