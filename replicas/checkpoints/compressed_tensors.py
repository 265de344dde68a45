"""compressed-tensors checkpoints (llm-compressor's output), read as they are stored.

What is read (docs/quantization.md, "Checkpoints that are already quantized"): a Hugging Face
directory whose config.json has ``quantization_config`` with ``quant_method:
compressed-tensors``, format ``int-quantized``, ``float-quantized`` or ``naive-quantized``
(the three store the same tensors), and one config group whose weights are ``num_bits: 8``,
``type: int`` or ``float``, ``strategy: channel``, symmetric and static, and whose input
activations are the same type, ``dynamic: true``, ``strategy: token``: W8A8 as scorejax's
``int8`` or ``fp8`` form. Each of the seven decoder projections stores ``*.weight`` (int8 or
float8_e4m3fn, ``[out, in]``) and ``*.weight_scale`` (``[out, 1]``, any float dtype; an
all-zero ``*.weight_zero_point`` is allowed); the loader places both as they are.

Everything else is refused at start-up, naming what the checkpoint says: other quant
methods (gptq, awq, ...), packed or sparse formats (``pack-quantized``: int4), group, block or
tensor strategies, weights-only schemes, static or asymmetric scales, several config groups,
a quantized KV cache, a projection left unquantized (``ignore``), a quantized LM head or
score head (issue 60 keeps heads in ``dtype``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from replicas.checkpoints.name_map import CheckpointError, tensor_mappings
from replicas.model.config import ModelConfig
from replicas.model.quant import QUANTIZED
from replicas.settings.common import SettingsError

QUANT_METHOD = "compressed-tensors"
READ_FORMATS = ("int-quantized", "float-quantized", "naive-quantized")
FORMS = {"int": "int8", "float": "fp8"}  # the weights' ``type`` -> scorejax's form
STORED = {"int8": "I8", "fp8": "F8_E4M3"}  # the safetensors dtype of ``*.weight``
SCALE = "_scale"  # ``<name>.weight`` + this: its scale
ZERO_POINT = "_zero_point"
_WEIGHTS = {"num_bits": 8, "symmetric": True, "dynamic": False, "strategy": "channel"}
_INPUTS = {"num_bits": 8, "symmetric": True, "dynamic": True, "strategy": "token"}
_DEFAULTS = {"symmetric": True, "dynamic": False}  # compressed-tensors' QuantizationArgs
_UNSUPPORTED = ("group_size", "block_structure", "actorder")  # must be null


class StoredTensors(Protocol):
    """What the checks need of a checkpoint's tensors (``loading.SafetensorsFiles``)."""

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def kind(self, name: str) -> str: ...

    def read(self, name: str) -> np.ndarray: ...


def checkpoint_form(hf_config: Mapping[str, Any]) -> str | None:
    """The form config.json's ``quantization_config`` says (``int8`` or ``fp8``); None for a
    float checkpoint. Anything scorejax cannot run raises ``CheckpointError`` naming it."""
    config = hf_config.get("quantization_config")
    if config is None:
        return None
    where = "config.json quantization_config"
    method = config.get("quant_method")
    if method != QUANT_METHOD:
        raise CheckpointError(
            f"{where}.quant_method: {method!r} is not read; scorejax reads float checkpoints "
            f"and {QUANT_METHOD} int8/fp8 W8A8 (channel-wise weights, per-token activations)"
        )
    _refuse_extras(config, where)
    groups = config.get("config_groups") or {}
    if len(groups) != 1:
        raise CheckpointError(
            f"{where}.config_groups: {len(groups)} groups ({', '.join(groups) or 'none'}); "
            "scorejax reads one scheme for every Linear"
        )
    ((group, scheme),) = groups.items()
    where = f"{where}.config_groups.{group}"
    weights = scheme.get("weights")
    inputs = scheme.get("input_activations")
    if weights is None or inputs is None:
        missing = "weights" if weights is None else "input_activations"
        raise CheckpointError(
            f"{where}.{missing}: null (a weights-only or activations-only scheme); scorejax "
            "reads W8A8: channel-wise 8-bit weights with dynamic per-token 8-bit activations"
        )
    _check_args(weights, _WEIGHTS, f"{where}.weights")
    _check_args(inputs, _INPUTS, f"{where}.input_activations")
    if inputs.get("type") != weights.get("type"):
        raise CheckpointError(
            f"{where}: weights of type {weights.get('type')!r} with input activations of "
            f"type {inputs.get('type')!r}; scorejax runs both int or both float"
        )
    if scheme.get("output_activations") is not None:
        raise CheckpointError(f"{where}.output_activations: quantized outputs are not run")
    return FORMS[weights["type"]]


def _refuse_extras(config: Mapping[str, Any], where: str) -> None:
    form = config.get("format")
    if form not in READ_FORMATS:
        raise CheckpointError(
            f"{where}.format: {form!r} is not read (scorejax reads {', '.join(READ_FORMATS)}: "
            "8-bit values stored one per byte; packed int4 and sparse formats are not run)"
        )
    if config.get("kv_cache_scheme") is not None:
        raise CheckpointError(f"{where}.kv_cache_scheme: a quantized KV cache is not run")
    sparsity = config.get("sparsity_config") or {}
    if sparsity.get("format", "dense") != "dense":
        raise CheckpointError(f"{where}.sparsity_config: {sparsity.get('format')!r} not run")
    status = config.get("quantization_status", "compressed")
    if status != "compressed":
        raise CheckpointError(f"{where}.quantization_status: {status!r}; expected 'compressed'")


def _check_args(args: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
    """One QuantizationArgs against what scorejax runs."""
    if args.get("type") not in FORMS:
        raise CheckpointError(f"{where}.type: {args.get('type')!r}; scorejax reads int or float")
    for key, want in expected.items():
        got = args.get(key, _DEFAULTS.get(key))
        if got != want:
            raise CheckpointError(f"{where}.{key}: {got!r} is not run; scorejax reads {want!r}")
    for key in _UNSUPPORTED:
        if args.get(key) is not None:
            raise CheckpointError(f"{where}.{key}: {args[key]!r} is not run (null expected)")


def check_stored(tensors: StoredTensors, config: ModelConfig, form: str) -> None:
    """Every decoder projection stored in ``form`` with one scale per output channel and no
    zero point; no other tensor quantized (an LM head or score head). Before any is placed."""
    projections: set[str] = set()
    for mapping in tensor_mappings(config):
        if mapping.path[0] == "layers" and mapping.path[1:] in QUANTIZED:
            for name, _ in mapping.names(config.num_layers):
                _check_projection(tensors, name, form)
                projections.add(name)
    others = sorted(
        name.removesuffix(SCALE)
        for name in tensors.names()
        if name.endswith(".weight" + SCALE) and name.removesuffix(SCALE) not in projections
    )
    if others:
        raise CheckpointError(
            f"{others[0]} is quantized ({len(others)} such tensors); scorejax keeps the "
            "embeddings, LM head and score heads in dtype: list them under the recipe's ignore"
        )


def _check_projection(tensors: StoredTensors, name: str, form: str) -> None:
    available = tensors.names()
    if name + SCALE not in available:
        raise CheckpointError(
            f"{name}: no {name + SCALE}: the projection is not quantized (in ignore?); scorejax "
            "runs all seven decoder projections of every layer quantized, or none"
        )
    if tensors.kind(name) != STORED[form]:
        raise CheckpointError(
            f"{name}: stored as {tensors.kind(name)}; a {form} checkpoint stores {STORED[form]}"
        )
    out = tensors.shape(name)[0]
    scale_shape = tensors.shape(name + SCALE)
    if scale_shape not in ((out, 1), (out,)):
        raise CheckpointError(
            f"{name + SCALE}: shape {scale_shape}; one scale per output channel is {(out, 1)}"
        )
    if name + ZERO_POINT in available and np.any(tensors.read(name + ZERO_POINT) != 0):
        raise CheckpointError(f"{name + ZERO_POINT}: not zero (asymmetric); symmetric is run")


def served_form(setting: str, found: str | None) -> str:
    """The form a model runs in: the ``quantization`` setting, or for a checkpoint that is
    already quantized, its own form (the setting ``none`` or the same form)."""
    if found is None or setting in ("none", found):
        return found or setting
    raise SettingsError(
        f"quantization: {setting} conflicts with the checkpoint, which is already {found} "
        f"({QUANT_METHOD}, config.json quantization_config); set quantization: {found} or none"
    )
