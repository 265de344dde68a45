"""serve_config.yaml deployed the way `serve run serve_config.yaml` deploys it (a declarative
config through the Serve controller), with the real engine on the tiny Llama: the file as
shipped with only ``model`` changed (the shipped model's kind, a causal LM; the other kinds
on the shipped ``args``: tests/serve/test_serve_embed.py and
tests/engine/test_shipped_config_kinds.py). Every route the kind serves answers over HTTP,
and the Cohere SDKs rerank long documents by their best chunk.

Also the operations it enables: a ``user_config`` change of batching settings is applied to
the running replica without a reload; a change that needs a reload is refused, naming it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray import serve

from replicas.serving.deployment import ScoringReplica
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import (  # noqa: F401
    RAY_SERVE,
    ServeCluster,
    app_status,
    replica_stats,
    serve_cluster,
    wait_for,
)
from tests.support.shipped import shipped_config

pytestmark = [pytest.mark.slow, RAY_SERVE]

PAYLOAD = {"query": "The capital of France is", "items": ["", " Paris"], "label_token_ids": [1, 2]}


def replica_deployment(config: dict[str, Any]) -> dict[str, Any]:
    (app,) = config["applications"]
    return next(d for d in app["deployments"] if d["name"] == ScoringReplica.name)


@pytest.fixture(scope="module")
def deployed(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[tuple[Any, Any]]:  # noqa: F811
    config = shipped_config(tiny_llama_dir)  # only model changed
    serve_cluster.deploy_config(config, "scorejax", "/health")
    yield serve_cluster, config


def test_the_shipped_config_serves_multi_item_scores(deployed: tuple[Any, Any]) -> None:
    cluster, _ = deployed
    with cluster.client() as http:
        model = http.get("/v1/models").json()["data"][0]
        assert model["multi_item_scoring_delimiter"] == 0
        response = http.post("/v1/score", json=PAYLOAD)
    assert response.status_code == 200, response.text
    scores = np.array(response.json()["scores"])
    assert scores.shape == (2, 2) and np.all((scores > 0) & (scores < 1))


def test_every_route_of_the_kind_answers_and_classify_names_the_kind(
    deployed: tuple[Any, Any],
) -> None:
    cluster, _ = deployed
    echo = {"prompt": "Paris is a city", "echo": True, "max_tokens": 0, "logprobs": 1}
    with cluster.client() as http:
        ranked = http.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
        completed = http.post("/v1/completions", json=echo)
        refused = http.post("/v1/classify", json={"input": "a"})
    assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2, ranked.text
    assert completed.status_code == 200, completed.text
    (choice,) = completed.json()["choices"]
    assert len(choice["logprobs"]["token_logprobs"]) > 1
    assert refused.status_code == 400 and "/v1/classify" in refused.text, refused.text


def test_the_cohere_sdks_rank_long_documents_by_their_best_chunk(
    deployed: tuple[Any, Any],
) -> None:
    """Semantics 24 through both Cohere SDKs on the shipped settings (``rerank_method:
    query_likelihood``, chunking off unless asked). v1 sends ``max_chunks_per_doc``, v2
    ``relevant_spans``; neither has ``chunk_tokens``, so it goes as an extra body field. A
    document's relevance is its best chunk's, each chunk scoring as its text ranked alone."""
    import cohere
    from cohere.core.request_options import RequestOptions
    from cohere.types import RerankRelevantSpans

    cluster, _ = deployed
    with cluster.client() as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
    query = "Which city is the capital of France?"
    filler = " The weather was grey and wet, and the trains ran late all week."
    docs = ["Bananas are yellow." + filler, filler * 3 + " Paris is the capital of France."]
    extra = RequestOptions(additional_body_parameters={"chunk_tokens": 16})
    v1 = cohere.Client(api_key="unused", base_url=cluster.http_url, timeout=60)
    ranked = v1.rerank(query=query, documents=docs, max_chunks_per_doc=8, return_documents=True,
                       request_options=extra)  # fmt: skip
    v2 = cohere.ClientV2(api_key="unused", base_url=cluster.http_url, timeout=60)
    spans = RerankRelevantSpans(mode="enabled", threshold=0.0)
    spanned = v2.rerank(model=model, query=query, documents=docs, relevant_spans=spans,
                        request_options=extra).results  # fmt: skip
    by_index = {r.index: r for r in spanned}
    listed = by_index[1].relevant_spans
    assert len(listed) >= 4 and len(by_index[0].relevant_spans) >= 2
    for result in ranked.results:
        assert result.document.text == docs[result.index]
        best = by_index[result.index].relevant_spans[0].score
        assert abs(result.relevance_score - best) <= 1e-6
    chunks = [docs[1][span.start : span.end] for span in listed]
    alone = v2.rerank(model=model, query=query, documents=chunks).results
    scores = {r.index: r.relevance_score for r in alone}
    assert_fp32_close([span.score for span in listed], [scores[i] for i in range(len(chunks))])


def test_batching_changes_apply_to_the_running_replica(deployed: tuple[Any, Any]) -> None:
    cluster, config = deployed
    with cluster.client() as http:
        assert http.post("/v1/score", json=PAYLOAD).status_code == 200
    before = replica_stats("scorejax")
    changed = copy.deepcopy(config)
    replica_deployment(changed)["user_config"] = {"max_batch_size": 4, "batch_wait_timeout_s": 0.02}
    cluster.deploy_config(changed, "scorejax", "/health")
    wait_for(lambda: replica_stats("scorejax")["max_batch_size"] == 4, 60, "reconfigure")
    after = replica_stats("scorejax")
    assert after["batch_wait_timeout_s"] == 0.02
    assert after["requests"] >= before["requests"] > 0  # same replica: no reload, no restart


def test_a_reload_only_change_is_refused_naming_the_setting(deployed: tuple[Any, Any]) -> None:
    _, config = deployed
    bad = copy.deepcopy(config)
    replica_deployment(bad)["user_config"] = {"dtype": "bfloat16"}
    replica_deployment(bad)["max_constructor_retry_count"] = 1  # fail on the first try
    client = serve.context._get_global_client()
    from ray.serve.schema import ServeDeploySchema

    client.deploy_apps(ServeDeploySchema.model_validate(bad), _blocking=False)
    wait_for(lambda: app_status("scorejax") == "DEPLOY_FAILED", 120, "the update to fail")
    message = serve.status().applications["scorejax"].deployments[ScoringReplica.name].message
    assert "dtype: changing it needs a model reload" in message
    # Rolling back is deploying the previous file again (docs/serving.md); not repeated
    # here: it is the fixture's own deploy, and a replica start is the suite's costliest step.
