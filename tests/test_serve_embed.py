"""An embedding model served for real (Ray Serve, HTTP, the engine; semantics 20): the tiny
Qwen3 sentence-transformers directory answers the OpenAI SDK's ``embeddings.create`` (float
and base64, as the SDK decodes it) and the Cohere SDK's ``embed`` with sentence-transformers'
vectors, and cosine /v1/score. One deployment for the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from tests.embed_helpers import embed_settings, reference_vectors, texts_of
from tests.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

TOL = 1e-5
PREFIX = "/embed"


@pytest.fixture(scope="module")
def directory(embedding_dirs: dict) -> Path:
    return embedding_dirs["qwen3-last"]


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, directory: Path) -> Iterator[httpx.Client]:  # noqa: F811
    small = {"ray_actor_options": {"num_cpus": 0.1}}
    app = scoring_app(embed_settings(directory), replica_options=small, ingress_options=small)
    serve_cluster.deploy(app, "embed", PREFIX)
    with serve_cluster.client() as http:
        http.base_url = http.base_url.join(PREFIX)
        yield http


def test_the_openai_and_cohere_sdks_embed_as_sentence_transformers(
    serve_cluster: ServeCluster,  # noqa: F811
    client: httpx.Client,
    directory: Path,
) -> None:
    import cohere
    import openai

    texts = texts_of(21, 6, longest=120)
    reference = reference_vectors(directory, texts)
    model = client.get("/v1/models").json()["data"][0]["id"]
    sdk = openai.OpenAI(api_key="unused", base_url=f"{serve_cluster.http_url}{PREFIX}/v1")
    floats = sdk.embeddings.create(model=model, input=texts, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in floats.data], reference, atol=TOL, rtol=0)
    decoded = sdk.embeddings.create(model=model, input=texts)  # the SDK asks for base64
    np.testing.assert_array_equal(
        np.asarray([d.embedding for d in decoded.data], np.float32),
        np.asarray([d.embedding for d in floats.data], np.float32),
    )
    assert floats.usage.prompt_tokens > len(texts)
    co = cohere.ClientV2(api_key="unused", base_url=f"{serve_cluster.http_url}{PREFIX}")
    queried = co.embed(
        texts=texts, model=model, input_type="search_query", embedding_types=["float"]
    )
    query = reference_vectors(directory, texts, prompt_name="query")
    np.testing.assert_allclose(queried.embeddings.float_, query, atol=TOL, rtol=0)
    scores = client.post("/v1/score", json={"query": texts[0], "items": texts[1:3]})
    assert scores.status_code == 200, scores.text
    cos = reference[1:3] @ query[0] / np.linalg.norm(reference[1:3], axis=1)
    np.testing.assert_allclose(np.asarray(scores.json()["scores"])[:, 0], cos, atol=TOL)
