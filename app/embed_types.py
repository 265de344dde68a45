"""Embedding types (semantics 25): Cohere v2's ``embedding_types`` as sentence-transformers
6.2's ``quantize_embeddings`` defines them, in NumPy at the ingress (app never imports jax).

- ``float``: the float32 vector; ``base64``: its little-endian float32 bytes, base64.
- ``binary`` / ``ubinary``: the sign bits (``v > 0``) packed 8 per byte (``numpy.packbits``,
  big-endian bit order), ubinary as uint8, binary as that minus 128 (int8).
- ``int8`` / ``uint8``: each dimension's ``[low, high]`` range cut into 255 steps,
  ``q = clip(floor((v - low) / step), 0, 255)``, int8 as ``q - 128``. The ranges are the
  per-dimension min and max of the calibration vectors the config names
  (``embedding_calibration``), after the same Matryoshka cut as the request's, else
  ``[-1, 1]`` in every dimension (the bounds of a normalized vector's components).

Matryoshka's ``output_dimension`` applies first: every type quantizes the cut, normalized
vector.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replicas.embed_contract import l2_normalized
from replicas.settings.common import SettingsError

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
CALIBRATION_TENSOR = "embeddings"


def matryoshka(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first ``dimensions`` components, L2-normalized (float32); None: as they are."""
    vectors = np.asarray(vectors, np.float32)
    if dimensions is None:
        return vectors
    return l2_normalized(vectors[:, :dimensions])


@dataclass(frozen=True, eq=False)
class Calibration:
    """The calibration vectors ``[N, D]`` float32 of int8/uint8 (None: ``[-1, 1]`` ranges)."""

    vectors: np.ndarray | None = None

    def ranges(self, dimension: int, cut: int | None) -> np.ndarray:
        """``[2, d]`` float32: each dimension's low and high, ``d`` the cut (or ``dimension``)."""
        d = cut or dimension
        if self.vectors is None:
            return np.stack([np.full(d, -1.0, np.float32), np.full(d, 1.0, np.float32)])
        vectors = matryoshka(self.vectors, cut)  # the request's cut, on the calibration set
        return np.stack([vectors.min(axis=0), vectors.max(axis=0)]).astype(np.float32)


NO_CALIBRATION = Calibration()


def load_calibration(path: str | None, dimension: int | None) -> Calibration:
    """The ``embedding_calibration`` setting: a safetensors file whose ``embeddings`` tensor
    ``[N, dimension]`` holds the model's vectors of representative texts; None: none.
    Start-up errors name the setting."""
    if path is None:
        return NO_CALIBRATION
    from safetensors.numpy import load_file

    if not Path(path).is_file():
        raise SettingsError(f"embedding_calibration: {path!r} is not a file")
    tensors = load_file(path)
    vectors = tensors.get(CALIBRATION_TENSOR)
    if vectors is None or vectors.ndim != 2 or len(vectors) < 1:
        raise SettingsError(
            f"embedding_calibration: {path!r} holds no {CALIBRATION_TENSOR!r} tensor [N, D]"
        )
    if dimension is not None and vectors.shape[1] != dimension:
        raise SettingsError(
            f"embedding_calibration: {path!r} holds {vectors.shape[1]}-dimensional vectors, "
            f"the model's are {dimension}-dimensional"
        )
    return Calibration(np.asarray(vectors, np.float32))


def quantize(vectors: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """``vectors [N, d]`` float32 as ``kind`` (one of EMBEDDING_TYPES but base64):
    float32 [N, d], int8/uint8 [N, d], binary/ubinary [N, ceil(d / 8)]."""
    vectors = np.asarray(vectors, np.float32)
    if kind == "float":
        return vectors
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)  # [N, ceil(d / 8)] uint8
        return (packed - 128).astype(np.int8) if kind == "binary" else packed
    if kind in ("int8", "uint8"):
        assert ranges is not None, "int8/uint8 need ranges [2, d]"
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return q.astype(np.uint8) if kind == "uint8" else (q - 128).astype(np.int8)
    raise ValueError(f"embedding type {kind!r} is not one of {EMBEDDING_TYPES}")


def base64_of(vector: np.ndarray) -> str:
    """A vector's little-endian float32 bytes, base64 (OpenAI's and Cohere's base64)."""
    return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")


def typed_embeddings(
    vectors: np.ndarray, kinds: Sequence[str], calibration: Calibration, cut: int | None
) -> dict[str, list[Any]]:
    """``{kind: [one JSON value per vector]}`` of the cut ``vectors [N, d]`` for each kind,
    once each, in the order asked."""
    out: dict[str, list[Any]] = {}
    for kind in dict.fromkeys(kinds):
        if kind == "base64":
            out[kind] = [base64_of(v) for v in vectors]
            continue
        ranges = calibration.ranges(vectors.shape[-1], cut) if kind.endswith("int8") else None
        out[kind] = quantize(vectors, kind, ranges).tolist()
    return out
