"""A hybrid model (BGE-M3: a tiny random XLM-RoBERTa saved by sentence-transformers, its
colbert and sparse heads beside it, tests/support/bge_m3_helpers.py) serves its three outputs
from one pass equal to FlagEmbedding's formulas on the same directory within 1e-5: dense
vectors on /v1/embeddings, multi-vectors on /pooling, lexical weights on /embed_sparse, the
``colbert+sparse+dense`` score on /v1/rerank and /v1/score. Its heads as shipped (``.pt``
pickles) are refused at start-up naming the conversion command, which converts them with
torch's weights-only loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.service import ScoringService
from replicas.checkpoints.convert_pt import main as convert_main
from replicas.model.st_inputs import UnsupportedEmbeddingError
from tests.support.bge_m3_helpers import m3_encode, m3_scores, save_bge_m3
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import sentences
from tests.support.http_support import Reply, ask, engine_api

TOL = 1e-5


def settings_of(directory: Path) -> Any:
    return embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
    )  # fmt: skip


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:

    directory = save_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")
    with pytest.raises(UnsupportedEmbeddingError, match=r"replicas\.checkpoints\.convert_pt"):
        ScoringService.from_settings(settings_of(directory))
    assert convert_main([str(directory)]) == 0
    assert (directory / "colbert_linear.safetensors").is_file()
    api, engine = engine_api(settings_of(directory))
    assert engine.info.kind == "hybrid"
    return api, directory


def post(api: Any, path: str, body: Any) -> Reply:
    reply = ask(api, "POST", path, json.dumps(body).encode())
    assert reply.status == 200, reply.body
    return reply


def test_dense_multi_vector_and_lexical_outputs_equal_flagembedding(m3) -> None:
    api, directory = m3
    texts = sentences(5, 14, longest=90)
    reference = m3_encode(directory, texts)
    dense = post(api, "/v1/embeddings", {"input": texts}).body["data"]
    got = np.asarray([row["embedding"] for row in dense])
    np.testing.assert_allclose(got, np.stack(reference["dense"]), atol=TOL, rtol=0)
    multi = post(api, "/pooling", {"input": texts}).body["data"]
    for row, expected in zip(multi, reference["colbert"], strict=True):
        np.testing.assert_allclose(np.asarray(row["data"]), expected, atol=TOL, rtol=0)
    lexical = post(api, "/embed_sparse", {"inputs": texts, "return_tokens": True}).body
    for pairs, expected in zip(lexical, reference["lexical"], strict=True):
        assert [p["index"] for p in pairs] == sorted(expected)
        values = [p["value"] for p in pairs]
        np.testing.assert_allclose(values, [expected[i] for i in sorted(expected)], atol=TOL)
    # the tokenizer's [CLS], padding and unknown tokens are left out (a WordPiece tokenizer
    # has no end-of-sequence token: its [SEP] is weighted, as in FlagEmbedding)
    tokens = {p["token"] for pairs in lexical for p in pairs}
    assert not tokens & {"[CLS]", "[PAD]", "[UNK]"} and len(tokens) > 5


def test_the_hybrid_score_equals_compute_score_on_rerank_and_score(m3) -> None:
    api, directory = m3
    documents = sentences(8, 12, longest=100)
    query = "what is the river of stone"
    expected = m3_scores(directory, query, documents)
    results = post(api, "/v1/rerank", {"query": query, "documents": documents}).body["results"]
    got = np.zeros(len(documents))
    for result in results:
        got[result["index"]] = result["relevance_score"]
    np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    scores = post(api, "/v1/score", {"query": query, "items": documents[:3]}).body["scores"]
    np.testing.assert_allclose([row[0] for row in scores], expected[:3], atol=TOL, rtol=0)
