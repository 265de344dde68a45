"""Embedding types (semantics 25) against sentence-transformers 6.2's ``quantize_embeddings``:
every type of the Matryoshka-cut vector, the default [-1, 1] ranges and a calibration file's,
and both routes' bodies (in-process, no Ray)."""

from __future__ import annotations

import base64
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from app.embed_openapi import cohere_embed_request_schema, embedding_request_schema
from app.embed_types import load_calibration, matryoshka, quantize, typed_embeddings
from app.embeddings import EmbedPrepared, cohere_body, openai_body
from replicas.contract import EmbedWork, ModelInfo, PoolingHead, ScoringLimits
from replicas.settings.common import SettingsError


def _reference_quantize() -> Any:
    """sentence-transformers' own ``quantize_embeddings``: where the package is not imported
    yet, its module (and the ``tensor`` module beside it: numpy, scipy, torch) read from the
    installed package without running the package's ``__init__``, which imports its trainers,
    transformers' models and scikit-learn (about 4 s a process, most of this module's cost).
    A layout this cannot read falls back to the ordinary import."""
    loaded = sys.modules.get("sentence_transformers.util.quantization")
    spec = importlib.util.find_spec("sentence_transformers")  # finds it, runs nothing
    if loaded is None and spec is not None and spec.submodule_search_locations:
        name = "_sentence_transformers_util"
        package = types.ModuleType(name)
        package.__path__ = [str(Path(next(iter(spec.submodule_search_locations))) / "util")]
        sys.modules.setdefault(name, package)
        try:
            return importlib.import_module(f"{name}.quantization").quantize_embeddings
        except ImportError:
            pass
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings


quantize_embeddings = _reference_quantize()

DIMENSION = 37  # not a multiple of 8: packbits pads the last byte
DEFAULT_RANGES = np.stack([-np.ones(DIMENSION), np.ones(DIMENSION)])


def vectors(n: int, seed: int = 0) -> np.ndarray:
    """``[n, DIMENSION]`` normalized float32 vectors, some components exactly 0."""
    raw = np.random.default_rng(seed).normal(size=(n, DIMENSION)).astype(np.float32)
    raw[:, 5] = 0.0
    return matryoshka(raw / np.linalg.norm(raw, axis=1, keepdims=True), None)


@pytest.mark.parametrize("kind", ["float", "int8", "uint8", "binary", "ubinary"])
def test_every_type_equals_sentence_transformers(kind: str) -> None:
    v = vectors(9)
    ranges = DEFAULT_RANGES if kind.endswith("int8") else None
    expected = quantize_embeddings(v, "float32" if kind == "float" else kind, ranges=ranges)
    got = quantize(v, kind, None if ranges is None else ranges.astype(np.float32))
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_a_calibration_file_gives_sentence_transformers_ranges_after_the_cut(
    tmp_path: Path,
) -> None:
    calibration_vectors, v = vectors(50, seed=1), vectors(6, seed=2)
    path = tmp_path / "calibration.safetensors"
    save_file({"embeddings": calibration_vectors}, str(path))
    calibration = load_calibration(str(path), DIMENSION)
    cut = 20
    typed = typed_embeddings(matryoshka(v, cut), ["int8", "uint8"], calibration, cut)
    for kind in ("int8", "uint8"):
        expected = quantize_embeddings(
            matryoshka(v, cut), kind, calibration_embeddings=matryoshka(calibration_vectors, cut)
        )
        np.testing.assert_array_equal(np.asarray(typed[kind]), expected)
    with pytest.raises(SettingsError, match=r"embedding_calibration.*16-dimensional"):
        load_calibration(str(path), 16)
    with pytest.raises(SettingsError, match=r"embedding_calibration.*not a file"):
        load_calibration(str(tmp_path / "missing.safetensors"), DIMENSION)


def test_both_bodies_carry_every_type_once_of_the_cut_vector() -> None:
    v, cut = vectors(3), 16
    types = ("ubinary", "float", "int8", "binary", "uint8", "base64", "int8")
    prepared = EmbedPrepared(EmbedWork(((1,),) * 3), cut, False, 3, types)
    embeddings = cohere_body(prepared, v, ["a", "b", "c"], "id")["embeddings"]
    assert list(embeddings) == ["ubinary", "float", "int8", "binary", "uint8", "base64"]
    short = matryoshka(v, cut)
    np.testing.assert_array_equal(embeddings["float"], short)
    np.testing.assert_array_equal(embeddings["binary"], quantize_embeddings(short, "binary"))
    ranges = DEFAULT_RANGES[:, :cut]
    np.testing.assert_array_equal(embeddings["int8"], quantize_embeddings(short, "int8", ranges))
    decoded = [np.frombuffer(base64.b64decode(s), "<f4") for s in embeddings["base64"]]
    np.testing.assert_array_equal(decoded, short)
    data = openai_body(prepared, v, "m")["data"]
    assert [item["embeddings"] for item in data] == [
        {kind: values[i] for kind, values in embeddings.items()} for i in range(3)
    ]
    np.testing.assert_array_equal([item["embedding"] for item in data], short)


def test_the_openapi_schemas_state_the_types_exactly() -> None:
    """Any of the six types, at least one (duplicates answered once); nothing else."""
    from jsonschema import Draft202012Validator

    pooling = PoolingHead("mean", True, DIMENSION)
    info = ModelInfo("m", 100, None, ScoringLimits(8, 256, 256), pooling=pooling)
    every = ["float", "int8", "uint8", "binary", "ubinary", "base64", "int8"]
    for schema, body in (
        (cohere_embed_request_schema(info, pooling), {"texts": ["a"]}),
        (embedding_request_schema(info, pooling), {"input": "a"}),
    ):
        types = Draft202012Validator(schema["properties"]["embedding_types"])
        assert types.is_valid(every)
        assert not any(types.is_valid(bad) for bad in ([], ["int4"], "int8", ["Float"]))
        assert Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize(
    ("matryoshka", "valid", "invalid"),
    [
        (None, (None, DIMENSION), (1, 16, DIMENSION - 1, DIMENSION + 1)),
        ((8, 16), (None, 8, 16, DIMENSION), (1, 12, DIMENSION + 1)),
        ((), (None, 1, 12, DIMENSION), (0, DIMENSION + 1)),
    ],
)
def test_the_openapi_schemas_state_the_matryoshka_sizes(
    matryoshka: tuple[int, ...] | None, valid: tuple[int | None, ...], invalid: tuple[int, ...]
) -> None:
    """``dimensions`` / ``output_dimension``: the sizes app.embeddings.check_dimensions takes."""
    from jsonschema import Draft202012Validator

    pooling = PoolingHead("mean", True, DIMENSION, matryoshka=matryoshka)
    info = ModelInfo("m", 100, None, ScoringLimits(8, 256, 256), pooling=pooling)
    for schema, field in (
        (cohere_embed_request_schema(info, pooling), "output_dimension"),
        (embedding_request_schema(info, pooling), "dimensions"),
    ):
        sizes = Draft202012Validator(schema["properties"][field])
        assert all(sizes.is_valid(d) for d in valid), field
        assert not any(sizes.is_valid(d) for d in invalid), field
