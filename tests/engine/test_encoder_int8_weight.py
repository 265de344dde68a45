"""``quantization: int8_weight`` on the BERT-like encoders (BERT, XLM-RoBERTa; docs/
quantization.md): their attention and MLP projections in int8 blocks of 32 with float32
scales, activations unquantized, so an input's output never depends on what shares its step.
Every late-interaction token vector, sparse vector and embedding of a tiny random model stays
within int8_weight's embedding bound of the same model in float32 (cosine >= 0.999); ModernBERT
(fused projections) and the activation forms are refused naming the setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.errors import UnsupportedModelError
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import save_bert_embedder, sentences
from tests.support.http_support import ask, engine_api
from tests.support.retrieval_helpers import save_colbert, save_splade


def settings_of(directory: Path, quantization: str) -> Any:
    return embed_settings(
        directory, token_buckets=(128,), item_token_buckets=(64, 128), item_tokens_per_step=128,
        background_compile=False, quantization=quantization,
    )  # fmt: skip


def answers(directory: Path, quantization: str, texts: list[str]) -> np.ndarray:
    """Each text's output as rows: token vectors, a dense vocabulary vector, an embedding."""
    api, engine = engine_api(settings_of(directory, quantization), warm=False)
    kind, vocab = engine.info.kind, engine.info.vocab_size
    path, body = {
        "late_interaction": ("/pooling", {"input": texts}),
        "sparse": ("/embed_sparse", {"inputs": texts}),
        "embedding": ("/v1/embeddings", {"input": texts}),
    }[kind]
    reply = ask(api, "POST", path, json.dumps(body).encode())
    assert reply.status == 200, reply.body
    if kind == "late_interaction":
        return np.concatenate([np.asarray(row["data"]) for row in reply.body["data"]])
    if kind == "sparse":
        dense = np.zeros((len(texts), vocab))
        for i, pairs in enumerate(reply.body):
            for pair in pairs:
                dense[i, pair["index"]] = pair["value"]
        return dense
    return np.asarray([row["embedding"] for row in reply.body["data"]])


@pytest.mark.parametrize(
    ("kind", "family"),
    [
        ("colbert", "bert"),
        pytest.param("splade", "xlm_roberta", marks=pytest.mark.deep),
        pytest.param("embedder", "bert", marks=pytest.mark.deep),
    ],
)  # make test keeps the ColBERT's; the others are the same projections (make test-deep)
def test_int8_weight_keeps_every_vector_within_its_bound(
    tmp_path: Path, kind: str, family: str
) -> None:
    if kind == "colbert":
        directory = save_colbert(tmp_path / kind, family=family)
    elif kind == "splade":
        directory = save_splade(tmp_path / kind, family=family)
    else:
        directory = save_bert_embedder(tmp_path / kind, "mean", family=family)
    texts = sentences(7, 8, longest=60)
    full, quantized = (answers(directory, form, texts) for form in ("none", "int8_weight"))
    assert full.shape == quantized.shape
    cosines = np.sum(full * quantized, -1) / (
        np.linalg.norm(full, axis=-1) * np.linalg.norm(quantized, axis=-1)
    )
    assert (cosines >= 0.999).all(), cosines.min()
    assert np.abs(full - quantized).max() > 1e-6  # the weights were quantized


def test_modernbert_and_the_activation_forms_are_refused_naming_the_setting(tmp_path) -> None:
    modern = save_colbert(tmp_path / "modern", family="modernbert")
    with pytest.raises(UnsupportedModelError, match="quantization: 'int8_weight'"):
        ScoringEngine.from_settings(settings_of(modern, "int8_weight"), warm=False)
    bert = save_colbert(tmp_path / "bert")
    with pytest.raises(UnsupportedModelError, match="quantization: 'int8'"):
        ScoringEngine.from_settings(settings_of(bert, "int8"), warm=False)
