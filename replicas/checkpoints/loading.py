"""Load a checkpoint (Hugging Face safetensors directory or GGUF file) onto a device mesh.

``load_model`` resolves the source, builds the ``ModelConfig`` from the same transformers
config the tokenizer side sees, checks every tensor against ``replicas.model.params.param_shapes``
before reading any data, then builds one parameter leaf at a time on the host (all layers
stacked, already in the target dtype) and places it straight into its ``NamedSharding``:
each device receives only its own shard, nothing is first replicated on device.

A quantized projection (the ``quantization`` setting, docs/quantization.md) is placed as
its values and scales: as the file stores them where it stores them in the served form (a
GGUF's Q8_0 blocks for ``int8_weight``, a compressed-tensors checkpoint's int8 or fp8 weights
and channel scales: ``read_quantized``), else quantized here from float32.

Pickle checkpoints (``*.bin``, ``*.pt``) are never opened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from replicas.checkpoints.compressed_tensors import check_stored, checkpoint_form, served_form
from replicas.checkpoints.gguf_loading import GGUFTensors, gguf_config_overrides, open_gguf
from replicas.checkpoints.name_map import (
    CheckpointError,
    TensorMapping,
    get_path,
    hf_shape,
    set_path,
    tensor_mappings,
    text_tower_name,
    to_our_layout,
)
from replicas.checkpoints.smoothing import calibration_ids, smoothed_params
from replicas.checkpoints.sources import ModelSource, load_hf_config, resolve_model_source
from replicas.contract import PoolingHead
from replicas.model.causal_lm import CausalLM, Params
from replicas.model.classes import model_for
from replicas.model.config import ModelConfig, config_from_hf
from replicas.model.encoder import Encoder
from replicas.model.head_config import with_saved_activation
from replicas.model.params import param_shapes, param_shardings
from replicas.model.quant import (
    QUANTIZED,
    SCALE_SUFFIX,
    check_backend,
    quantize,
    scale_shape,
    stored_dtype,
)

logger = logging.getLogger(__name__)

DTYPES: dict[str, Any] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(jnp.bfloat16),
    "float16": np.dtype(np.float16),
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SAFETENSORS_INDEX = "model.safetensors.index.json"
# safetensors dtypes that numpy cannot name; read from the raw bytes instead.
_RAW_DTYPES = {"BF16": np.dtype(jnp.bfloat16), "F8_E4M3": np.dtype(jnp.float8_e4m3fn)}
_UNUSED_BY_EMBEDDERS = ("pooler.dense.weight", "pooler.dense.bias")  # a BertModel's pooler


@dataclass(frozen=True)
class LoadedModel:
    model: CausalLM | Encoder
    params: Params
    config: ModelConfig
    source: ModelSource


class TensorFile(Protocol):
    """Tensors of one checkpoint, by the names the file uses, in the Hugging Face layout."""

    name_kind: int  # 0: names are Hugging Face names, 1: GGUF names

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str) -> np.ndarray: ...

    def read_quantized(self, name: str, form: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``name`` as stored in ``form`` (values ``[out, in]``, float32 scales ``[out, k]``),
        or None where the file stores it otherwise."""
        ...


# ----------------------------------------------------------------------------- safetensors


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({directory / name for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"{file.name}: listed in {SAFETENSORS_INDEX} but missing")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{directory}: only pickle checkpoints ({', '.join(pickles)}); they are never loaded "
            "(arbitrary code). Convert them to safetensors, e.g. save_pretrained("
            "safe_serialization=True)"
        )
    raise CheckpointError(f"{directory}: no *.safetensors weights")


def _read_raw(path: Path, name: str, dtype: np.dtype) -> np.ndarray:
    """A tensor read straight from the safetensors layout (for dtypes numpy cannot name)."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_len))[name]
    begin, end = entry["data_offsets"]
    start = 8 + header_len + begin
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=end - begin)
    return data.view(dtype).reshape(entry["shape"])


class SafetensorsFiles:
    """All ``*.safetensors`` files of a Hugging Face directory (sharded or not)."""

    name_kind = 0

    def __init__(self, directory: Path, stack: contextlib.ExitStack) -> None:
        from safetensors import safe_open

        self._handles: dict[str, Any] = {}
        self._paths: dict[str, Path] = {}
        self._file_names: dict[str, str] = {}  # our name -> the file's (a text tower's)
        for path in _safetensors_files(directory):
            try:
                handle = stack.enter_context(safe_open(str(path), framework="numpy"))
            except Exception as error:
                message = f"{path.name}: not a readable safetensors file: {error}"
                raise CheckpointError(message) from error
            for file_name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = text_tower_name(file_name)
                if name is not None:
                    self._handles[name] = handle
                    self._paths[name] = path
                    self._file_names[name] = file_name

    def names(self) -> set[str]:
        return set(self._handles)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[name].get_slice(self._file_names[name]).get_shape())

    def kind(self, name: str) -> str:
        """The safetensors dtype (F32, BF16, I8, F8_E4M3, ...)."""
        return str(self._handles[name].get_slice(self._file_names[name]).get_dtype())

    def read_quantized(self, name: str, form: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A compressed-tensors weight and its scale, as stored (checked by
        ``compressed_tensors.check_stored``); None for a float weight."""
        scale = name + SCALE_SUFFIX
        if form not in ("int8", "fp8") or scale not in self._handles:
            return None
        return self.read(name), self.read(scale).astype(np.float32)

    def read(self, name: str) -> np.ndarray:
        handle, file_name = self._handles[name], self._file_names[name]
        kind = handle.get_slice(file_name).get_dtype()
        if kind in _RAW_DTYPES:
            return _read_raw(self._paths[name], file_name, _RAW_DTYPES[kind])
        try:
            return handle.get_tensor(file_name)
        except (TypeError, KeyError) as error:
            message = f"{name}: unsupported safetensors dtype {kind}: {error}"
            raise CheckpointError(message) from error


# ----------------------------------------------------------------------------- assembly


def _place(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Each device (also on other hosts) gets only its own shard of the host array."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def check_tensors(tensors: TensorFile, config: ModelConfig) -> None:
    """Every expected tensor present with the expected shape, else one error naming them."""
    shapes = param_shapes(config)
    available = tensors.names()
    problems: list[str] = []
    for mapping in tensor_mappings(config):
        full = get_path(shapes, mapping.path)
        expected = hf_shape(mapping.layout, full[1:] if mapping.per_layer else full)
        for names in mapping.names(config.num_layers):
            name = names[tensors.name_kind]
            if name not in available:
                problems.append(f"missing tensor {name}")
            elif (got := tensors.shape(name)) != expected:
                problems.append(f"{name}: expected shape {expected}, got {got}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError("; ".join(problems[:5]) + more)


def _quantized_leaf(
    tensors: TensorFile,
    mapping: TensorMapping,
    config: ModelConfig,
    full: tuple[int, ...],
    n_in: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A quantized leaf's values ``[layers, *in, *out]`` and float32 scales on the host: each
    layer's as the file stores it where it stores the served form (``read_quantized``), else
    quantized here from float32 (per layer, as ``quantize`` does it stacked)."""
    form, per_layer = config.quantization, full[1:]
    scales = np.empty(scale_shape(full, n_in, form, lead=1), np.float32)
    values = np.empty(full, np.dtype(stored_dtype(form)))
    for i, names in enumerate(mapping.names(config.num_layers)):
        name = names[tensors.name_kind]
        stored = tensors.read_quantized(name, form)
        # A GGUF's Q8_0 blocks of 32 along H * Dh are ours along Dh only where 32 divides Dh.
        if stored is not None and stored[1].size == scales[i].size:
            values[i] = to_our_layout(mapping.layout, stored[0], per_layer)
            scales[i] = to_our_layout(mapping.layout, stored[1], scales.shape[1:]).reshape(
                scales.shape[1:]
            )
            continue
        if stored is not None:
            logger.warning("%s: its blocks do not fit %s's; re-quantized", name, form)
        value = to_our_layout(mapping.layout, tensors.read(name), per_layer)
        values[i], scales[i] = quantize(value.astype(np.float32), n_in, form, xp=np)
    return values, scales


def assemble_params(
    tensors: TensorFile, config: ModelConfig, mesh: Mesh, dtype: np.dtype
) -> tuple[Params, set[str]]:
    """The parameter tree on ``mesh`` and the names of the file tensors it used."""
    check_tensors(tensors, config)
    shapes = param_shapes(config)
    shardings = param_shardings(config, mesh)
    params: Params = {}
    used: set[str] = set()
    for mapping in tensor_mappings(config):
        full = get_path(shapes, mapping.path)
        quantized = config.quantization != "none" and mapping.path[0] == "layers"
        n_in = QUANTIZED.get(mapping.path[1:]) if quantized else None  # type: ignore[arg-type]
        if n_in is not None:  # the input axes it contracts
            values, scale = _quantized_leaf(tensors, mapping, config, full, n_in)
            scale_path = (*mapping.path[:-1], mapping.path[-1] + SCALE_SUFFIX)
            set_path(params, mapping.path, _place(values, get_path(shardings, mapping.path)))
            set_path(params, scale_path, _place(scale, get_path(shardings, scale_path)))
            used.update(names[tensors.name_kind] for names in mapping.names(config.num_layers))
            continue
        per_layer = full[1:] if mapping.per_layer else full
        host = np.zeros(full, dtype)  # [layers, ...] or unstacked
        for i, names in enumerate(mapping.names(config.num_layers), start=mapping.first):
            name = names[tensors.name_kind]
            value = to_our_layout(mapping.layout, tensors.read(name), per_layer)
            value = value.astype(host.dtype)
            if mapping.per_layer:
                host[i] = value
            else:
                host[...] = value
            used.add(name)
        set_path(params, mapping.path, _place(host, get_path(shardings, mapping.path)))
        del host
    return params, used


def _as_source(source: ModelSource | str | os.PathLike[str]) -> ModelSource:
    if not isinstance(source, ModelSource):
        return resolve_model_source(source)
    if not source.is_gguf and not (source.directory / "config.json").is_file():
        raise CheckpointError(f"{source.directory}: no config.json")  # a GGUF: open_gguf
    return source


def _open(
    source: ModelSource, stack: contextlib.ExitStack
) -> tuple[ModelConfig, TensorFile, tuple[str, ...], str | None]:
    """The model config, the checkpoint's tensors, the names not to warn about, and the form
    the checkpoint is already quantized in (compressed-tensors), if any."""
    if source.is_gguf:
        reader = open_gguf(source.gguf_path)
        config = config_from_hf(load_hf_config(source))
        config = config.replace(**gguf_config_overrides(reader, config))
        return config, GGUFTensors(reader, config), (), None
    found = checkpoint_form(json.loads((source.directory / "config.json").read_text()))
    config = config_from_hf(load_hf_config(source))
    if found is not None and config.encoder:
        raise CheckpointError(
            f"{source.directory}: a compressed-tensors {found} checkpoint of a {config.family} "
            "encoder: load its float checkpoint (an encoder quantizes at load: int8_weight)"
        )
    ignorable = ("rotary_emb.inv_freq", "lm_head.weight", *_UNUSED_BY_EMBEDDERS)
    if found is not None:
        ignorable += ("weight_scale", "weight_zero_point")
    return config, SafetensorsFiles(source.directory, stack), ignorable, found


def load_model(
    source: ModelSource | str | os.PathLike[str],
    mesh: Mesh,
    dtype: str = "float32",
    pooling: PoolingHead | None = None,
    quantization: str = "none",
) -> LoadedModel:
    """Load a model's weights from local files into their shardings on ``mesh``.

    ``source``: a known name (``SmolLM2-135M-Instruct``), a ``.gguf`` path, a Hugging Face
    directory (config.json + safetensors), or a resolved ``ModelSource``. ``dtype``:
    float32, bfloat16 or float16 (parameters and activations). ``pooling``: load it as an
    embedding model (``replicas.model.pooling_config``: no LM head is read).
    ``quantization``: the layers' projections quantized at load (replicas.model.quant); a
    compressed-tensors checkpoint runs in its own form (``none`` or that form: else a
    ``SettingsError``); a form the mesh's backend cannot run is refused before any tensor is
    read.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype: {dtype!r} not in {sorted(DTYPES)}")
    np_dtype = DTYPES[dtype]
    source = _as_source(source)
    with contextlib.ExitStack() as stack:
        config, tensors, ignorable, found = _open(source, stack)
        quantization = served_form(quantization, found)
        device = mesh.devices.flat[0]
        check_backend(quantization, device.platform, getattr(device, "device_kind", ""))
        directory = None if source.is_gguf else source.directory
        head = with_saved_activation(config.head, directory)
        config = config.replace(pooling=pooling, head=head, quantization=quantization)
        if found is not None:
            check_stored(tensors, config, found)  # type: ignore[arg-type]
        smooth = quantization == "int8_smooth"  # placed in float first, calibrated, then int8
        float_config = config.replace(quantization="none") if smooth else config
        params, used = assemble_params(tensors, float_config, mesh, np_dtype)
        unused = sorted(n for n in tensors.names() - used if not n.endswith(ignorable))
        if unused:
            logger.warning("checkpoint tensors not used by the model: %s", ", ".join(unused[:10]))
    if smooth:
        float_model = model_for(float_config, jnp.dtype(np_dtype))
        params = smoothed_params(params, float_model, config, calibration_ids(source), mesh)
    model = model_for(config, jnp.dtype(np_dtype))
    return LoadedModel(model=model, params=params, config=config, source=source)


def load_configured(
    model: str,
    mesh: Mesh,
    dtype: str = "float32",
    pooling: str | None = None,
    normalize: bool | None = None,
    quantization: str = "none",
) -> tuple[LoadedModel, tuple[Any, ...]]:
    """The ``model`` setting's weights on ``mesh`` and, for an embedding model (a
    sentence-transformers directory, a base model, or ``pooling``/``normalize`` set), its
    Dense layers (``replicas.checkpoints.dense``); none for other models."""
    from replicas.checkpoints.dense import load_dense_layers
    from replicas.model.pooling_config import pooling_head_for

    source = resolve_model_source(model)
    directory = None if source.is_gguf else source.directory
    head = pooling_head_for(directory, load_hf_config(source), pooling, normalize)
    loaded = load_model(source, mesh, dtype, head, quantization)
    dense = load_dense_layers(source.directory, head) if head is not None else ()
    return loaded, dense
