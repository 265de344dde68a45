"""A model family, declared once in its file and listed once in ``registry.FAMILIES``: what
selects it from a checkpoint's ``config.json``, how its config becomes a ``ModelConfig``, its
tensor names, the model class that runs it. A family file declares and converts; the layer
math is ``replicas.model.layers``', ``encoder``'s and the model classes'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicas.model.tensors import TensorMapping

_CLASSES = ("replicas.model.causal_lm:CausalLM", "replicas.model.encoder:Encoder")


@dataclass(frozen=True)
class Family:
    """One model family (``ModelConfig.family`` is its ``name``)."""

    name: str
    # ModelConfig's keyword arguments but ``head``, from a transformers config (a multimodal
    # one's text tower); errors name the config field that is not supported.
    fields: Callable[[Any], dict[str, Any]]
    mappings: Callable[[Any], tuple[TensorMapping, ...]]  # every leaf of a ModelConfig's tree
    architectures: tuple[str, ...] = ()  # that select it: its causal LM, a multimodal wrapper
    # (architecture, ScoreHead kind): its *ForSequenceClassification (model.head_config)
    heads: tuple[tuple[str, str], ...] = ()
    base: tuple[str, ...] = ()  # its bare base model: an embedder (model.pooling_config)
    # its *ForMaskedLM: the encoder and its masked-LM head, which a sparse (SPLADE) model's
    # weights read (model.mlm_head); the trunk's names as the base model's (``renames``)
    masked_lm: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()  # select it when none of the architectures does
    encoder: bool = False  # bidirectional (ModelConfig.encoder): embed steps only
    # ``module:Class`` of its model when not CausalLM (an encoder: Encoder), imported when a
    # model is built (model.classes): the registry stays jax-free.
    model_class: str | None = None
    # ScoreHead fields its cross-encoder head reads from the config, beyond the shared ones
    head_fields: Callable[[Any], dict[str, Any]] = lambda hf: {}
    # (prefix, ours): a wrapper's safetensors names read as the model's (a multimodal text
    # tower, a *ForSequenceClassification's encoder)
    renames: tuple[tuple[str, str], ...] = ()
    refines: str = ""  # a variant: what this family's config selects, when ``when`` holds
    when: Callable[[Any], bool] | None = None

    @property
    def model_path(self) -> str:
        return self.model_class or _CLASSES[self.encoder]
