"""The real SmolLM2-135M-Instruct served over HTTP by Ray Serve (multi-item scoring on)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from replicas.settings import ReplicaSettings
from tests.conftest import smollm2_package_dir
from tests.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

PARIS, LONDON, BERLIN = 7042, 4528, 11452  # " Paris", " London", " Berlin"


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster) -> Iterator[httpx.Client]:  # noqa: F811
    smollm2_package_dir()
    settings = ReplicaSettings(
        model="SmolLM2-135M-Instruct",
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 64, 256),
        item_token_buckets=(16, 64, 256),
        batch_buckets=(1, 4),
        max_items_per_request=16,
        max_multi_item_seq_len=256,
    )
    app = scoring_app(
        settings,
        replica_options={"ray_actor_options": {"num_cpus": 0.5}},
        ingress_options={"ray_actor_options": {"num_cpus": 0.1}},
    )
    serve_cluster.deploy(app, "smollm2", "/")
    with serve_cluster.client(timeout_s=120) as http:
        yield http


def scores(client: httpx.Client, **payload: object) -> np.ndarray:
    response = client.post("/v1/score", json=payload)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "SmolLM2-135M-Instruct"
    return np.array(body["scores"])


def test_paris_is_the_capital_of_france(client: httpx.Client) -> None:
    labels = [PARIS, LONDON, BERLIN]
    query = "The capital of France is"
    probabilities = scores(client, query=query, items=[""], label_token_ids=labels)[0]
    assert probabilities.argmax() == 0
    assert probabilities[0] > 10 * max(probabilities[1:])
    relative = scores(client, query=query, items=[""], label_token_ids=labels, apply_softmax=True)
    np.testing.assert_allclose(relative[0], probabilities / probabilities.sum(), rtol=1e-5)


def test_the_france_context_leads_to_paris(client: httpx.Client) -> None:
    items = [" France is", " Germany is", " Italy is"]
    by_item = scores(client, query="The capital of", items=items, label_token_ids=[PARIS])[:, 0]
    assert by_item.argmax() == 0
    # The same sequence scored as one query gives the same probability (semantics 2 and 3).
    whole = scores(client, query="The capital of France is", items=[""], label_token_ids=[PARIS])
    assert abs(np.log(by_item[0]) - np.log(whole[0, 0])) < 1e-4


def test_multi_item_scores_match_items_scored_alone(client: httpx.Client) -> None:
    query = "Question: which city is the capital of France? Answer:"
    items = ["", " I think", " The answer is", " It is obviously"]
    together = scores(client, query=query, items=items, label_token_ids=[PARIS, LONDON])
    for row, item in zip(together, items, strict=True):
        alone = scores(client, query=query, items=[item], label_token_ids=[PARIS, LONDON])[0]
        assert np.max(np.abs(np.log(row) - np.log(alone))) < 1e-4
