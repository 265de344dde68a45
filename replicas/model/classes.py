"""The model class that runs a ``ModelConfig``: its family's (``Family.model_path``:
``CausalLM``, ``Encoder`` for an encoder, or one of the family's own, as EmbeddingGemma's),
imported here, when a model is built, so that the family registry stays jax-free. Each keeps
``model.protocol.ScoringModel`` (the decoders ``DecoderModel``), so the loaders and the
engine hold any of them.
"""

from __future__ import annotations

import importlib
from typing import Any

from replicas.model.config import ModelConfig
from replicas.model.family.registry import family_named


def model_for(config: ModelConfig, dtype: Any) -> Any:
    """The model of ``config`` in ``dtype`` (parameters and activations)."""
    module, name = family_named(config.family).model_path.split(":")
    return getattr(importlib.import_module(module), name)(config, dtype)
