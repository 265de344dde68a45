"""The Dense layers of a sentence-transformers directory (semantics 20), read from safetensors.

A Dense module's folder (``2_Dense``, ...) holds ``config.json`` and ``model.safetensors``
with ``linear.weight [out, in]`` and optionally ``linear.bias [out]``. A folder with only a
pickle (``pytorch_model.bin``) is refused: pickles are never opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replicas.checkpoints.name_map import CheckpointError
from replicas.contract import PoolingHead
from replicas.model.retrieval_config import HYBRID_HEADS, dense_paths, hybrid_files


@dataclass(frozen=True)
class DenseLayer:
    """``activation(x @ weight + bias)`` in float32; weight ``[in, out]``."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight
        if self.bias is not None:
            y = y + self.bias
        return np.tanh(y) if self.activation == "tanh" else y


def _linear(file: Path) -> DenseLayer:
    """A torch Linear saved as safetensors (``weight [out, in]``, ``bias [out]``)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(file))
    bias = tensors.get("bias")
    weight = np.ascontiguousarray(tensors["weight"].T, np.float32)
    return DenseLayer(weight, None if bias is None else bias.astype(np.float32), "identity")


def load_dense_layers(directory: Path, head: PoolingHead) -> tuple[DenseLayer, ...]:
    """The Dense layers ``head.dense`` describes, in order (none for a base model); a
    hybrid model's (BGE-M3's) two heads: its multi-vector then its lexical linear."""
    if head.hybrid is not None:
        files = hybrid_files(directory) or {}
        return tuple(_linear(files[name]) for name in HYBRID_HEADS)
    if not head.dense:
        return ()
    from safetensors.numpy import load_file

    paths = dense_paths(directory)
    layers = []
    for path, (inputs, outputs, activation) in zip(paths, head.dense, strict=True):
        file = path / "model.safetensors"
        if not file.is_file():
            raise CheckpointError(
                f"{path.name}: no model.safetensors (pickle weights are never loaded)"
            )
        tensors = load_file(str(file))
        weight = tensors.get("linear.weight")
        if weight is None or weight.shape != (outputs, inputs):
            shape = None if weight is None else weight.shape
            raise CheckpointError(
                f"{path.name}: linear.weight {shape}, expected {(outputs, inputs)}"
            )
        bias = tensors.get("linear.bias")
        layers.append(
            DenseLayer(
                np.ascontiguousarray(weight.T, np.float32),
                None if bias is None else bias.astype(np.float32),
                activation,
            )
        )
    return tuple(layers)
