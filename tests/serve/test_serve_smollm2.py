"""The real SmolLM2-135M-Instruct served over HTTP by Ray Serve (multi-item scoring on)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from replicas.settings import ReplicaSettings
from tests.conftest import smollm2_package_dir
from tests.support.fp32 import SMOLLM2_LAYERS, assert_fp32_close
from tests.support.serve_support import (  # noqa: F401
    RAY_SERVE,
    ServeCluster,
    replica_stats,
    serve_cluster,
)

pytestmark = [pytest.mark.slow, RAY_SERVE]

PARIS, LONDON, BERLIN = 7042, 4528, 11452  # " Paris", " London", " Berlin"


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster) -> Iterator[httpx.Client]:  # noqa: F811
    smollm2_package_dir()
    settings = ReplicaSettings.from_keys(
        model="SmolLM2-135M-Instruct",
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 64, 256),
        item_token_buckets=(16, 64, 256),
        batch_buckets=(1, 4),
        max_items_per_request=16,
        max_multi_item_seq_len=256,
        fused_step_tokens=256,  # small requests in one pass, concurrent ones sharing it
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
    assert_fp32_close(np.log(by_item[0]), np.log(whole[0, 0]), SMOLLM2_LAYERS)


def test_multi_item_scores_match_items_scored_alone(client: httpx.Client) -> None:
    query = "Question: which city is the capital of France? Answer:"
    items = ["", " I think", " The answer is", " It is obviously"]
    together = scores(client, query=query, items=items, label_token_ids=[PARIS, LONDON])
    for row, item in zip(together, items, strict=True):
        alone = scores(client, query=query, items=[item], label_token_ids=[PARIS, LONDON])[0]
        assert_fp32_close(np.log(row), np.log(alone), SMOLLM2_LAYERS)


def test_a_burst_of_small_requests_after_a_larger_one_is_all_answered_in_shared_steps(
    client: httpx.Client,
) -> None:
    # Issue 37 on the real weights: 12 concurrent 2-item requests right after a 16-item one
    # are all admitted (admission counts work), each gets the scores it gets alone, and they
    # share fused steps instead of taking one (or two) each. `python -m loadtest run burst`
    # measures the step count on the shipped config; here any sharing at all is asserted,
    # robust to CI's timing.
    small = {"query": "Is Paris the capital of France? Answer:", "items": ["", " not"]}
    small["label_token_ids"] = [PARIS, LONDON, BERLIN]
    alone = scores(client, **small)
    large = [f" city number {n} of the many cities of Europe" for n in range(16)]
    scores(client, query="Which of these is the capital of France?", items=large,
           label_token_ids=[PARIS])  # fmt: skip
    before = replica_stats("smollm2")["steps"]

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=12)
        async with httpx.AsyncClient(
            base_url=str(client.base_url), timeout=120, limits=limits
        ) as h:
            return await asyncio.gather(*(h.post("/v1/score", json=small) for _ in range(12)))

    answers = asyncio.run(burst())
    steps = replica_stats("smollm2")["steps"] - before
    assert [answer.status_code for answer in answers] == [200] * 12
    for answer in answers:
        together = np.log(np.array(answer.json()["scores"]))
        assert_fp32_close(together, np.log(alone), SMOLLM2_LAYERS)
    assert steps <= 6, steps  # alone, 12 requests would take 12 fused steps
