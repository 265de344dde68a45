"""What a family's tensor names declare (``replicas.checkpoints.name_map`` reads them): every
leaf of ``replicas.model.params.param_logical_axes`` has exactly one ``TensorMapping``, its
Hugging Face name, its GGUF name and the layout change from the Hugging Face layout
(``nn.Linear`` weights are ``[out, in]``) to ours. Shapes: D hidden, H query heads, K
key/value heads, Dh head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYER = "{layer}"
# Layout kinds: Hugging Face layout -> our layout of one (per-layer) tensor.
SAME = "same"  # identical: embeddings [V, D], norm scales [D] or [Dh]
TRANSPOSE = "transpose"  # [out, in] -> [in, out]: MLP [F, D] -> [D, F], lm_head [V, D] -> [D, V]
HEADS_IN = "heads_in"  # q/k/v_proj.weight [H*Dh, D] -> [D, H, Dh]
HEADS_OUT = "heads_out"  # o_proj.weight [D, H*Dh] -> [H, Dh, D]
HEADS_BIAS = "heads_bias"  # q/k/v_proj.bias [H*Dh] -> [H, Dh]
LAYOUTS = (SAME, TRANSPOSE, HEADS_IN, HEADS_OUT, HEADS_BIAS)


@dataclass(frozen=True)
class TensorMapping:
    """One parameter leaf and where it comes from.

    ``hf_name`` and ``gguf_name`` contain ``{layer}`` for leaves stacked on the layers axis.
    """

    path: tuple[str, ...]
    hf_name: str
    gguf_name: str
    layout: str
    first: int = 0  # the first stacked layer the file holds (earlier ones: zeros, unread)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} not in {LAYOUTS}")
        if (LAYER in self.hf_name) != (LAYER in self.gguf_name):
            raise ValueError(f"{self.hf_name} and {self.gguf_name} disagree on {LAYER}")

    @property
    def per_layer(self) -> bool:
        return LAYER in self.hf_name

    def names(self, num_layers: int) -> list[tuple[str, str]]:
        """(hf_name, gguf_name) of every stacked slice, layer 0 first."""
        if not self.per_layer:
            return [(self.hf_name, self.gguf_name)]
        return [
            (self.hf_name.format(layer=i), self.gguf_name.format(layer=i))
            for i in range(self.first, num_layers)
        ]


def hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Hugging Face shape of a tensor whose shape in our layout is ``shape``."""
    if layout == SAME:
        return shape
    if layout == TRANSPOSE:
        return shape[::-1]
    if layout == HEADS_IN:  # ours [D, H, Dh]
        return (shape[1] * shape[2], shape[0])
    if layout == HEADS_OUT:  # ours [H, Dh, D]
        return (shape[2], shape[0] * shape[1])
    if layout == HEADS_BIAS:  # ours [H, Dh]
        return (shape[0] * shape[1],)
    raise ValueError(f"layout {layout!r} not in {LAYOUTS}")


def to_our_layout(layout: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Hugging Face layout -> our layout; ``shape`` is the target (per-layer) shape."""
    if layout in (SAME, HEADS_BIAS):
        return array.reshape(shape)
    if layout == TRANSPOSE:
        return array.T
    if layout in (HEADS_IN, HEADS_OUT):
        return array.T.reshape(shape)  # [H*Dh, D] -> [D, H*Dh]; [D, H*Dh] -> [H*Dh, D]
    raise ValueError(f"layout {layout!r} not in {LAYOUTS}")
