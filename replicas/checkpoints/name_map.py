"""Explicit checkpoint name maps: which file tensor fills which leaf of the parameter tree.

Every leaf of ``replicas.model.params.param_logical_axes`` has exactly one ``TensorMapping``
(``replicas.model.tensors``), declared by its family's file
(``replicas/model/family/``): its Hugging Face name, its GGUF name and the layout change to
ours. GGUF tensors are first brought to the Hugging Face layout (ggml order reversed, llama
q/k rows un-permuted, see ``replicas.checkpoints.gguf_loading``), so one layout table serves
both formats. Here: the errors and the names of a wrapper's tensors.
"""

from __future__ import annotations

from typing import Any

from replicas.model.config import ModelConfig
from replicas.model.family.registry import FAMILIES, family_named
from replicas.model.tensors import TensorMapping as TensorMapping
from replicas.model.tensors import hf_shape as hf_shape
from replicas.model.tensors import to_our_layout as to_our_layout


class CheckpointError(ValueError):
    """The checkpoint files are missing, unreadable or do not match the config."""


class AdapterNotFound(CheckpointError):
    """No LoRA adapter directory at the path a load names (the load route's 404)."""


def tensor_mappings(config: ModelConfig) -> tuple[TensorMapping, ...]:
    """Every leaf of ``param_logical_axes(config)`` with its source names and layout: its
    family's (``Family.mappings``)."""
    return family_named(config.family).mappings(config)


# A wrapper's names (a multimodal checkpoint's text tower, a *ForSequenceClassification's
# encoder) as the model's (``Family.renames``); vision parts are not read.
_TEXT_TOWERS = tuple(rename for family in FAMILIES for rename in family.renames)
_VISION_PARTS = ("vision_tower.", "multi_modal_projector.")
_BASE_PARTS = ("embed_tokens.", "layers.", "norm.")


def text_tower_name(name: str) -> str | None:
    """A safetensors name as the causal LM's name, or None for a vision-tower tensor."""
    for prefix, ours in _TEXT_TOWERS:
        if name.startswith(prefix):
            return ours + name[len(prefix) :]
    bare = name.removeprefix("model.")
    if bare.startswith(_VISION_PARTS):
        return None
    if name.startswith(_BASE_PARTS):  # a base model's (Qwen3Model...): no ``model.`` prefix
        return "model." + name
    return name


def get_path(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
