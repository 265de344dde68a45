"""PEFT LoRA adapters (semantics 21): ``adapter_config.json`` + ``adapter_model.safetensors``
read into our layout, checked against the base model, never a pickle.

What loads: LoRA on any of q/k/v/o/gate/up/down (``target_modules`` a list or a regex; on BERT
and XLM-RoBERTa encoders their query/key/value and attention-output, intermediate and output
dense layers, ``ENCODER_MODULES``, an embedder's unused pooler skipped; on ModernBERT its
``Wqkv``, ``Wo`` and ``Wi``, ``ROTARY_MODULES``, a fused module's LoRA split exactly into its
parts: one A shared, B cut by output rows), any rank up to the
configured ``max_lora_rank``, ``lora_alpha`` with the standard (``alpha / r``) or rslora
(``alpha / sqrt(r)``) scaling, ``layers_to_transform`` (the other layers get no update), and
``modules_to_save: [score]`` (a seq-cls head the fine-tune trained, how PEFT saves classifier
and reward fine-tunes). What does not (an error naming the adapter and the
field): other PEFT methods, DoRA, LoRA biases, per-module rank or alpha patterns, targets the
model does not have, tensors whose shapes do not match the base.

Our layout per target: A ``[layers, *in, r]`` and B ``[layers, r, *out]`` (B already scaled),
in ``replicas.model.lora``'s einsum letters (q ``[D] -> [H, Dh]``, o ``[H, Dh] -> [D]``, ...).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replicas.checkpoints.loading import _RAW_DTYPES, PICKLE_SUFFIXES, _read_raw
from replicas.checkpoints.name_map import AdapterNotFound, CheckpointError
from replicas.model.config import ModelConfig
from replicas.model.lora import TARGETS, has_head_slots

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_TENSOR = re.compile(
    r"base_model\.model\.(?:model\.)?layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\."
    r"(?P<module>\w+)\.lora_(?P<part>[AB])\.weight"
)
# BERT and XLM-RoBERTa (``BertModel`` / ``XLMRobertaModel``, or under ``bert.`` / ``roberta.``
# of their ``ForSequenceClassification``): a layer's module path -> our target.
ENCODER_MODULES = {
    "attention.self.query": "q",
    "attention.self.key": "k",
    "attention.self.value": "v",
    "attention.output.dense": "o",
    "intermediate.dense": "up",
    "output.dense": "down",
}
_ENCODER_TENSOR = re.compile(
    r"base_model\.model\.(?:(?:bert|roberta)\.)?encoder\.layer\.(?P<layer>\d+)\."
    r"(?P<module>[\w.]+?)\.lora_(?P<part>[AB])\.weight"
)
# An encoder's pooler (``dense`` targets it too): an embedder never reads it (its vectors pool
# the last hidden states), a cross-encoder's classifier does.
_POOLER = re.compile(
    r"base_model\.model\.(?:(?:bert|roberta)\.)?pooler\.dense\.lora_[AB]\.weight"
    r"|base_model\.model\.head\.dense\.lora_[AB]\.weight"  # ModernBERT's prediction head
)
# ModernBERT (``ModernBertModel``, or under ``model.`` of its ``ForSequenceClassification``):
# a layer's module path -> our targets, a fused module's output rows split among them in order
# (``Wqkv``: q, k, v; ``Wi``: the GeGLU's input, then its gate).
ROTARY_MODULES = {
    "attn.Wqkv": ("q", "k", "v"),
    "attn.Wo": ("o",),
    "mlp.Wi": ("up", "gate"),
    "mlp.Wo": ("down",),
}
_ROTARY_TENSOR = re.compile(
    r"base_model\.model\.(?:model\.)?layers\.(?P<layer>\d+)\."
    r"(?P<module>(?:attn|mlp)\.\w+)\.lora_(?P<part>[AB])\.weight"
)
_HEAD = "base_model.model.score.weight"
_BY_MODULE = {module: target for target, (module, *_) in TARGETS.items()}
# Fields whose non-default value changes the computation in a way we do not implement.
_UNSUPPORTED = {
    "use_dora": False,
    "bias": "none",
    "fan_in_fan_out": False,
    "lora_bias": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layer_replication": None,
    "trainable_token_indices": None,
    "target_parameters": None,
    "alora_invocation_tokens": None,
    "use_qalora": False,
    "use_bdlora": None,
}


class AdapterError(CheckpointError):
    """An adapter that cannot serve on this base; the message starts with its name."""


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter in our layout, on the host."""

    name: str  # what a request's ``model`` names
    path: str  # the directory it was read from
    rank: int  # r (A's columns; stacks pad to max_lora_rank with zeros)
    scaling: float  # lora_alpha / r, or / sqrt(r) with rslora (folded into b)
    a: Mapping[str, np.ndarray]  # target -> [layers, *in, r]
    b: Mapping[str, np.ndarray]  # target -> [layers, r, *out], scaled
    head: np.ndarray | None = None  # a saved linear score head [D, L]; None: the base's

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.a)


def _fail(name: str, message: str) -> AdapterError:
    return AdapterError(f"lora adapter {name!r}: {message}")


def read_adapter_config(name: str, directory: Path) -> dict[str, Any]:
    """The checked ``adapter_config.json`` of ``directory``."""
    if not directory.is_dir():
        raise AdapterNotFound(f"lora adapter {name!r}: {directory}: not a directory")
    path = directory / ADAPTER_CONFIG
    if not path.is_file():
        raise _fail(name, f"{directory}: no {ADAPTER_CONFIG}")
    if not (directory / ADAPTER_WEIGHTS).is_file():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        detail = f" (only {', '.join(pickles)}: pickles are never loaded)" if pickles else ""
        raise _fail(name, f"{directory}: no {ADAPTER_WEIGHTS}{detail}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise _fail(name, f"{path}: not readable JSON: {error}") from error
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise _fail(name, f"peft_type: only LORA adapters are served, got {config!r:.80}")
    for key, default in _UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, {}, False):
            raise _fail(name, f"{key}: {config[key]!r} is not supported (only {default!r})")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail(name, f"r: must be an int >= 1, got {rank!r}")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise _fail(name, f"lora_alpha: must be a number, got {alpha!r}")
    return config


def _scheme(base: ModelConfig) -> tuple[re.Pattern[str], dict[str, tuple[str, ...]]]:
    """How ``base``'s LoRA tensors are named: their pattern, and a layer's module path ->
    its targets (a fused module's parts in output order)."""
    if base.rotary:
        return _ROTARY_TENSOR, ROTARY_MODULES
    modules = ENCODER_MODULES if base.encoder else _BY_MODULE
    return (_ENCODER_TENSOR if base.encoder else _TENSOR), {m: (t,) for m, t in modules.items()}


def _module_of(base: ModelConfig, target: str) -> str:
    """The Hugging Face module a target of ``base`` comes from (for errors)."""
    return next(module for module, parts in _scheme(base)[1].items() if target in parts)


def _check_targets(name: str, config: dict[str, Any], base: ModelConfig) -> None:
    """Listed target modules (names, or dotted paths ending in one: PEFT matches by the
    last part) must all be projections the model has."""
    targets = config.get("target_modules")
    # the last parts of the module names (an encoder's ``dense`` also names its pooler or
    # head, refused by ``_check_pooler`` where read)
    names = {module.rsplit(".", 1)[-1] for module in _scheme(base)[1]}
    names |= {"dense"} if base.rotary else set()
    if isinstance(targets, list):
        unknown = sorted({t for t in targets if str(t).rsplit(".", 1)[-1] not in names})
        if unknown:
            raise _fail(
                name, f"target_modules: {unknown} not in the model (supported: {sorted(names)})"
            )


def _targets_of(key: str, base: ModelConfig) -> tuple[tuple[str, ...], int, str] | None:
    """A LoRA tensor's (targets: one, or a fused module's parts in output order; layer;
    part "A" or "B"), or None: not one of a projection of ``base``'s layers."""
    pattern, modules = _scheme(base)
    match = pattern.fullmatch(key)
    targets = None if match is None else modules.get(match["module"])
    if match is None or targets is None:
        return None
    return targets, int(match["layer"]), match["part"]


def _split_fused(
    name: str, key: str, targets: tuple[str, ...], part: str, tensor: np.ndarray
) -> list[np.ndarray]:
    """A fused module's LoRA tensor for each of its ``targets``: A ``[r, in]`` shared (the
    input is theirs in common), B ``[out, r]`` cut into equal row blocks in order (exact:
    ``B x A`` restricted to a part's rows is that part's update)."""
    if len(targets) == 1 or part == "A":
        return [tensor] * len(targets)
    if tensor.ndim != 2 or tensor.shape[0] % len(targets):
        raise _fail(name, f"{key}: shape {tensor.shape} does not split into {targets}")
    return np.split(tensor, len(targets), axis=0)


def _expected(config: ModelConfig, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A target's (in, out) shapes in our layout."""
    heads = config.num_kv_heads if target in ("k", "v") else config.num_heads
    shapes = {
        "d": (config.hidden_size,),
        "he": (heads, config.head_dim),
        "f": (config.intermediate_size,),
    }
    _, _, inputs, outputs = TARGETS[target]
    return shapes[inputs], shapes[outputs]


def _read(handle: Any, path: Path, key: str) -> np.ndarray:
    kind = handle.get_slice(key).get_dtype()
    if kind in _RAW_DTYPES:
        return _read_raw(path, key, _RAW_DTYPES[kind]).astype(np.float32)
    return np.asarray(handle.get_tensor(key), np.float32)


def load_adapter(name: str, path: str, config: ModelConfig, max_rank: int) -> LoraAdapter:
    """Read the adapter at ``path`` for the base ``config``; refuse one that does not match
    it (AdapterError naming ``name``)."""
    from safetensors import safe_open

    directory = Path(path)
    peft = read_adapter_config(name, directory)
    _check_targets(name, peft, config)
    rank = int(peft["r"])
    if rank > max_rank:
        raise _fail(name, f"r: rank {rank} exceeds max_lora_rank {max_rank}")
    alpha = float(peft.get("lora_alpha", 8))
    scaling = alpha / math.sqrt(rank) if peft.get("use_rslora") else alpha / rank
    weights = directory / ADAPTER_WEIGHTS
    parts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    head = None
    try:
        with safe_open(str(weights), framework="numpy") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key == _HEAD:
                    head = _head(name, config, _read(handle, weights, key))
                    continue
                if config.encoder and _POOLER.fullmatch(key):
                    _check_pooler(name, config, key)
                    continue
                found = _targets_of(key, config)
                if found is None:
                    raise _fail(name, f"{key}: not a LoRA weight of a projection of the model")
                targets, layer, part = found
                if layer >= config.num_layers:
                    raise _fail(name, f"{key}: layer {layer} of {config.num_layers}")
                tensors = _split_fused(name, key, targets, part, _read(handle, weights, key))
                for target, tensor in zip(targets, tensors, strict=True):
                    parts.setdefault((target, part), {})[layer] = tensor
    except AdapterError:
        raise
    except Exception as error:  # a truncated or foreign file
        raise _fail(name, f"{weights}: not a readable safetensors file: {error}") from error
    if not parts and head is None:
        raise _fail(name, f"{weights}: no LoRA weights")
    a, b = {}, {}
    for target in TARGETS:
        if (target, "A") not in parts and (target, "B") not in parts:
            continue
        a[target], b[target] = _stack(name, config, target, rank, scaling, parts)
    return LoraAdapter(name, str(directory), rank, scaling, a, b, head)


def _check_pooler(name: str, config: ModelConfig, key: str) -> None:
    """An embedder's pooler LoRA changes nothing it returns (skipped); a cross-encoder's
    pooler (ModernBERT's prediction head) would change its scores and is not served."""
    if config.head is not None:
        layers = r"'.*layers\..*(Wqkv|Wo|Wi)'" if config.rotary else (
            r"'.*encoder\.layer\..*(query|value|dense)'"
        )  # fmt: skip
        raise _fail(
            name,
            f"{key}: LoRA on a cross-encoder's {'head' if config.rotary else 'pooler'} is not "
            "served; target the layers "
            f"(a target_modules regex such as {layers})",
        )


def _stack(
    name: str,
    config: ModelConfig,
    target: str,
    rank: int,
    scaling: float,
    parts: dict[tuple[str, str], dict[int, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """One target's A ``[layers, *in, r]`` and scaled B ``[layers, r, *out]``; layers the
    adapter does not transform stay zero."""
    module = _module_of(config, target)
    ins, outs = _expected(config, target)
    a_parts, b_parts = parts.get((target, "A"), {}), parts.get((target, "B"), {})
    if set(a_parts) != set(b_parts):
        raise _fail(name, f"{module}: lora_A and lora_B cover different layers")
    a = np.zeros((config.num_layers, *ins, rank), np.float32)
    b = np.zeros((config.num_layers, rank, *outs), np.float32)
    for layer, a_hf in a_parts.items():
        b_hf = b_parts[layer]
        want_a, want_b = (rank, math.prod(ins)), (math.prod(outs), rank)
        if a_hf.shape != want_a or b_hf.shape != want_b:
            raise _fail(
                name,
                f"layers.{layer}.{module}: lora_A {a_hf.shape} / lora_B {b_hf.shape}, the base "
                f"needs {want_a} / {want_b} (an adapter of another base model?)",
            )
        a[layer] = a_hf.T.reshape(*ins, rank)  # [r, in] -> [*in, r]
        b[layer] = (b_hf.T * np.float32(scaling)).reshape(rank, *outs)  # [out, r] -> [r, *out]
    return a, b


def _head(name: str, config: ModelConfig, weight: np.ndarray) -> np.ndarray:
    """A saved ``score`` head ``[L, D]`` -> ``[D, L]``, checked against the base's head."""
    if not has_head_slots(config):
        raise _fail(name, "modules_to_save: a score head needs a base with a linear score head")
    assert config.head is not None
    expected = (config.head.num_labels, config.hidden_size)
    if weight.shape != expected:
        raise _fail(name, f"score.weight: shape {weight.shape}, the base's head is {expected}")
    return weight.T.copy()
