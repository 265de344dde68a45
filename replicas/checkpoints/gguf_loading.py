"""GGUF files: dequantized tensors in the Hugging Face layout, and config fix-ups.

Tensors are dequantized with ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, the K-quants, ...). ggml lists dimensions innermost first; the reader already
returns numpy order, which is the Hugging Face ``[out, in]`` order.

With ``quantization: int8_weight`` a Q8_0 tensor is not dequantized: ``read_quantized``
hands its int8 values ``[out, in]`` and its fp16 block scales (as float32, exactly)
``[out, in / 32]`` over as they are. ggml's blocks run along ``ne[0]``, the innermost
(``in``, contracted) axis, which is also the axis ``int8_weight`` blocks (docs/quantization.md).

llama.cpp's converter permutes the rows of the q and k projections of ``llama``-architecture
models (its RoPE rotates interleaved pairs, Hugging Face rotates halves). ``unpermute_qk``
undoes it exactly as transformers' ``LlamaTensorProcessor`` does; Qwen2/Qwen3 files are not
permuted.

Gemma 2/3 files: llama.cpp's converter stores every ``*norm.weight`` as ``1 + w`` (its RMSNorm
multiplies by the weight alone), so ``GGUFTensors`` subtracts 1 again, as transformers'
``Gemma2TensorProcessor`` does; the soft-caps, RoPE scaling and query scale that transformers'
GGUF config parsing leaves at their defaults are read from the metadata here
(``gguf_config_overrides``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replicas.checkpoints.name_map import CheckpointError
from replicas.model.config import ModelConfig, UnsupportedModelError

PERMUTED_ARCHITECTURES = ("llama",)
NORM_PLUS_ONE_ARCHITECTURES = ("gemma2", "gemma3")
Q8_0_BLOCK = 32  # int8 values per Q8_0 block, after its fp16 scale (34 bytes a block)
# llama.cpp's query scale for Gemma: (hidden / heads) ** -0.5 for the 27B models (told apart
# by their layer count, as llama.cpp does), head_dim ** -0.5 otherwise.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def permute_qk(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """Hugging Face -> llama.cpp row order of q/k (what convert_hf_to_gguf.py writes).

    weights: [heads*Dh, ...] -> same shape, each head's rows reordered (halves -> pairs).
    """
    n_head = n_head if n_head_kv is None else n_head_kv
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def unpermute_qk(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp -> Hugging Face row order of q/k; the inverse of ``permute_qk``."""
    n_head = n_head if n_head_kv is None else n_head_kv
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
        .swapaxes(2, 1)
        .reshape(weights.shape)
    )


def open_gguf(path: Path) -> Any:
    """A ``gguf.GGUFReader`` (memory-mapped; tensors are read on demand)."""
    from gguf import GGUFReader

    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file not found")
    try:
        return GGUFReader(path)
    except Exception as error:
        raise CheckpointError(f"{path}: not a readable GGUF file: {error}") from error


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_architecture(reader: Any) -> str:
    return str(_field(reader, "general.architecture"))


def gguf_config_overrides(reader: Any, config: ModelConfig) -> dict[str, Any]:
    """ModelConfig fields that transformers' GGUF config parsing misses, from the metadata.

    transformers does not read ``attention.key_length`` for qwen2/qwen3 (Qwen3 head_dim is
    not hidden/heads) and ignores llama.cpp's RoPE scaling, which we refuse rather than
    silently computing different frequencies.
    """
    arch = gguf_architecture(reader)
    overrides: dict[str, Any] = {}
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length is not None and int(key_length) != config.head_dim:
        overrides["head_dim"] = int(key_length)
    if arch in NORM_PLUS_ONE_ARCHITECTURES:
        overrides.update(_gemma_overrides(reader, arch, config.replace(**overrides)))
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") and not (arch == "gemma3" and scaling == "linear"):
        raise UnsupportedModelError(f"{arch}.rope.scaling.type: {scaling!r} is not supported")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedModelError(
            "rope_freqs.weight: GGUF RoPE frequency factors (Llama 3 rope scaling) are not "
            "supported; load the Hugging Face checkpoint instead"
        )
    return overrides


def _gemma_overrides(reader: Any, arch: str, config: ModelConfig) -> dict[str, Any]:
    """Soft-caps, query scale and (Gemma 3) linear RoPE factor from llama.cpp's metadata."""
    attn_cap = _field(reader, f"{arch}.attn_logit_softcapping")
    final_cap = _field(reader, f"{arch}.final_logit_softcapping")
    scalar = config.head_dim
    if config.num_layers == GEMMA_27B_LAYERS[arch]:
        scalar = config.hidden_size // config.num_heads
    overrides: dict[str, Any] = {
        "attn_softcap": None if attn_cap is None else float(attn_cap),
        "final_softcap": None if final_cap is None else float(final_cap),
        "query_scale": float(scalar) ** -0.5,
    }
    if _field(reader, f"{arch}.rope.scaling.type") == "linear":
        overrides["rope_linear_factor"] = float(_field(reader, f"{arch}.rope.scaling.factor"))
    return overrides


class GGUFTensors:
    """The tensors of one GGUF file by GGUF name, dequantized to float32 on read."""

    name_kind = 1

    def __init__(self, reader: Any, config: ModelConfig) -> None:
        self._tensors = {t.name: t for t in reader.tensors}
        self._permuted = gguf_architecture(reader) in PERMUTED_ARCHITECTURES
        self._norm_plus_one = gguf_architecture(reader) in NORM_PLUS_ONE_ARCHITECTURES
        self._heads = (config.num_heads, config.num_kv_heads)

    def names(self) -> set[str]:
        return set(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self._tensors[name].shape))  # numpy order

    def read_quantized(self, name: str, form: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A Q8_0 tensor as it is stored, for ``int8_weight``: int8 values ``[out, in]`` and
        float32 block scales ``[out, in / 32]`` (llama q/k rows un-permuted); else None."""
        from gguf import GGMLQuantizationType

        tensor = self._tensors[name]
        if form != "int8_weight" or tensor.tensor_type != GGMLQuantizationType.Q8_0:
            return None
        out, n_in = self.shape(name)
        blocks = np.asarray(tensor.data).reshape(out * n_in // Q8_0_BLOCK, 2 + Q8_0_BLOCK)
        scales = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(out, -1)
        values = blocks[:, 2:].copy().view(np.int8).reshape(out, n_in)
        return self._rows(name, values), self._rows(name, scales)

    def _rows(self, name: str, weights: np.ndarray) -> np.ndarray:
        """llama q/k rows back in Hugging Face order (values and block scales alike)."""
        if self._permuted and ".attn_q." in name:
            return unpermute_qk(weights, self._heads[0], self._heads[0])
        if self._permuted and ".attn_k." in name:
            return unpermute_qk(weights, self._heads[0], self._heads[1])
        return weights

    def read(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as error:
            raise CheckpointError(
                f"{name}: cannot dequantize {tensor.tensor_type.name}: {error}"
            ) from error
        weights = self._rows(name, np.asarray(weights, np.float32).reshape(self.shape(name)))
        if self._norm_plus_one and name.endswith("norm.weight"):
            weights = weights - 1.0
        return weights
