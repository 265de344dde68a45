"""EmbeddingGemma served for real: serve_config.yaml as shipped with only ``model`` changed to
the tiny EmbeddingGemma directory (tests/support/embedding_gemma.py), deployed the way `serve
run serve_config.yaml` deploys it (Ray Serve, HTTP, the engine). ``/v1/embeddings`` answers
sentence-transformers' vectors for texts of different lengths in one request, with its
``query`` prompt by ``prompt_name``; Cohere's ``/v2/embed`` with ``search_document`` applies
its ``document`` prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.embed_helpers import reference_vectors, texts_of
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401
from tests.support.shipped import shipped_config

pytestmark = [pytest.mark.slow, RAY_SERVE]

TOL = 1e-5


@pytest.fixture(scope="module")
def deployed(serve_cluster: ServeCluster, embedding_gemma_dir: Path) -> Iterator[ServeCluster]:  # noqa: F811
    serve_cluster.deploy_config(shipped_config(embedding_gemma_dir), "scorejax", "/health")
    yield serve_cluster


def test_the_shipped_config_embeds_as_sentence_transformers(
    deployed: ServeCluster, embedding_gemma_dir: Path
) -> None:
    texts = texts_of(31, 8, longest=120)
    with deployed.client() as http:
        card = http.get("/v1/models").json()["data"][0]
        plain = http.post("/v1/embeddings", json={"input": texts, "encoding_format": "float"})
        query = http.post(
            "/v1/embeddings",
            json={"input": texts[:3], "encoding_format": "float", "prompt_name": "query"},
        )
        documents = http.post(
            "/v2/embed",
            json={
                "model": card["id"],
                "texts": texts[3:],
                "input_type": "search_document",
                "embedding_types": ["float"],
            },
        )
    assert (card["kind"], card["dimension"]) == ("embedding", 64), card
    for response in (plain, query, documents):
        assert response.status_code == 200, response.text
    vectors = [row["embedding"] for row in plain.json()["data"]]
    np.testing.assert_allclose(
        vectors, reference_vectors(embedding_gemma_dir, texts), atol=TOL, rtol=0
    )
    expected = reference_vectors(embedding_gemma_dir, texts[:3], prompt_name="query")
    vectors = [row["embedding"] for row in query.json()["data"]]
    np.testing.assert_allclose(vectors, expected, atol=TOL, rtol=0)
    expected = reference_vectors(embedding_gemma_dir, texts[3:], prompt_name="document")
    np.testing.assert_allclose(documents.json()["embeddings"]["float"], expected, atol=TOL, rtol=0)
