"""A late-interaction (ColBERT) and a sparse (SPLADE) model served for real (Ray Serve, HTTP,
the engine; semantics 20), two apps deployed side by side: ``/pooling``, ``/embed_sparse`` and
``/v1/rerank`` over HTTP answer as sentence-transformers' ``MultiVectorEncoder`` and
``SparseEncoder`` (float32, within 1e-5), and the Cohere SDK's ``rerank`` ranks by MaxSim
against the ColBERT app. The in-process tests of every variant and refusal:
tests/engine/test_late_interaction.py and test_sparse_encoder.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import sentences
from tests.support.retrieval_helpers import (
    colbert_scores,
    colbert_vectors,
    save_colbert,
    save_splade,
    splade_scores,
    splade_vectors,
)
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

TOL = 1e-5
SMALL = {"ray_actor_options": {"num_cpus": 0.1}}
COLBERT, SPLADE = "/colbert", "/splade"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval")
    return {
        COLBERT: save_colbert(root / "colbert", family="bert"),
        SPLADE: save_splade(root / "splade", family="xlm_roberta"),
    }


@pytest.fixture(scope="module")
def cluster(
    serve_cluster: ServeCluster,  # noqa: F811
    models: dict[str, Path],
) -> Iterator[ServeCluster]:
    apps = []
    for prefix, directory in models.items():
        settings = embed_settings(
            directory, token_buckets=(256,), item_token_buckets=(64, 256),
            item_tokens_per_step=256, compilation_cache_dir=None,
        )  # fmt: skip
        app = scoring_app(settings, replica_options=SMALL, ingress_options=SMALL)
        apps.append((app, prefix.strip("/"), prefix))
    serve_cluster.deploy_many(apps)
    yield serve_cluster


@pytest.fixture(scope="module")
def client(cluster: ServeCluster) -> Iterator[httpx.Client]:
    with cluster.client() as http:
        yield http


def relevance_of(reply: httpx.Response, count: int) -> tuple[list[int], np.ndarray]:
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    relevance = np.zeros(count)
    for result in results:
        relevance[result["index"]] = result["relevance_score"]
    return [result["index"] for result in results], relevance


def test_pooling_and_rerank_answer_as_multi_vector_encoder(
    client: httpx.Client, models: dict[str, Path]
) -> None:
    directory, texts = models[COLBERT], sentences(51, 10, longest=140)
    for role in ("query", "document"):
        reply = client.post(f"{COLBERT}/pooling", json={"input": texts, "input_type": role})
        assert reply.status_code == 200, reply.text
        got = [np.asarray(row["data"], np.float32) for row in reply.json()["data"]]
        expected = colbert_vectors(directory, texts, role)
        assert [v.shape for v in got] == [v.shape for v in expected]
        for ours, theirs in zip(got, expected, strict=True):
            np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)
    query = "what is the blue river . zebra"
    expected = colbert_scores(directory, query, texts)
    reply = client.post(f"{COLBERT}/v1/rerank", json={"query": query, "documents": texts})
    order, relevance = relevance_of(reply, len(texts))
    assert order == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose(relevance, expected, atol=TOL, rtol=0)


def test_embed_sparse_and_rerank_answer_as_sparse_encoder(
    client: httpx.Client, models: dict[str, Path]
) -> None:
    directory, texts = models[SPLADE], sentences(52, 10, longest=100)
    reply = client.post(f"{SPLADE}/embed_sparse", json={"inputs": texts, "return_tokens": True})
    assert reply.status_code == 200, reply.text
    expected = splade_vectors(directory, texts, "document")
    for pairs, theirs in zip(reply.json(), expected, strict=True):
        assert [pair["index"] for pair in pairs] == sorted(theirs)
        values = [pair["value"] for pair in pairs]
        np.testing.assert_allclose(values, [theirs[i] for i in sorted(theirs)], atol=TOL, rtol=0)
        assert all(isinstance(pair["token"], str) for pair in pairs)
    query = "what is the blue river . zebra"
    scores = splade_scores(directory, query, texts)
    reply = client.post(f"{SPLADE}/v1/rerank", json={"query": query, "documents": texts})
    order, relevance = relevance_of(reply, len(texts))
    assert order == list(np.argsort(-scores, kind="stable"))
    np.testing.assert_allclose(relevance, scores, atol=TOL, rtol=0)
    refused = client.post(f"{SPLADE}/pooling", json={"input": "alpha"})
    assert refused.status_code == 400 and refused.json()["reason"] == "unsupported_for_model"


def test_the_cohere_sdk_reranks_by_maxsim(
    cluster: ServeCluster, client: httpx.Client, models: dict[str, Path]
) -> None:
    import cohere

    directory, documents = models[COLBERT], sentences(53, 6, longest=60)
    query = "red stone . cloud"
    expected = colbert_scores(directory, query, documents)
    model = client.get(f"{COLBERT}/v1/models").json()["data"][0]["id"]
    sdk = cohere.ClientV2(api_key="unused", base_url=f"{cluster.http_url}{COLBERT}", timeout=60)
    ranked = sdk.rerank(model=model, query=query, documents=documents)
    assert [r.index for r in ranked.results] == list(np.argsort(-expected, kind="stable"))
    for result in ranked.results:
        assert abs(result.relevance_score - expected[result.index]) <= TOL
    (best,) = sdk.rerank(model=model, query=query, documents=documents, top_n=1).results
    assert best.index == ranked.results[0].index
