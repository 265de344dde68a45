"""The whole serving path on a real in-process Ray Serve, over real HTTP, with the real engine.

Model: the tiny random-weight Llama (``tiny_llama_dir``). Three applications share one cluster:
``multi`` (multi-item scoring on, delimiter 0, at ``/``), ``single`` (off, at ``/single``) and
``caller``, a second Serve app that calls ``multi`` through a DeploymentHandle.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ray import serve

from app.builder import scoring_app
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import (  # noqa: F401
    RAY_SERVE,
    ServeCluster,
    replica_stats,
    serve_cluster,
    wait_for,
)

pytestmark = [pytest.mark.slow, RAY_SERVE]

QUERY = "The capital of France is"
PARIS, LONDON, BERLIN = 7042, 4528, 11452
LABELS = [PARIS, LONDON, BERLIN, 0]
ITEMS = ["", " Paris", " a city in Europe", " known for the Eiffel Tower and more"]
SMALL = {"ray_actor_options": {"num_cpus": 0.1}}
REPLICA = {"ray_actor_options": {"num_cpus": 0.25}}


def tiny_settings(model_dir: Path, delimiter: int | None) -> ReplicaSettings:
    return ReplicaSettings.from_keys(
        model=str(model_dir),
        multi_item_scoring_delimiter=delimiter,
        token_buckets=(16, 64, 128),
        item_token_buckets=(16, 64, 128),
        batch_buckets=(1, 4, 8),
        max_items_per_request=8,
        max_multi_item_seq_len=128,
        max_batch_size=8,
        batch_wait_timeout_s=0.05,
        warmup_shapes=((8, 4, 8, 4),),
        max_queue_wait_s=0,  # 32 requests at once test batching here, not admission
    )


@serve.deployment(name="Caller", ray_actor_options={"num_cpus": 0.1})
class Caller:
    """A second application's deployment that scores through the scoring app's handle."""

    def __init__(self, app_name: str) -> None:
        self._app_name = app_name

    async def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        handle = serve.get_app_handle(self._app_name)
        try:
            return await handle.score.remote(**payload)
        except ScoringError as error:
            # Ray re-raises it as RayTaskError(ScoringError), still a ScoringError.
            return {"raised": isinstance(error, ScoringError), "body": error.body}


@pytest.fixture(scope="module")
def cluster(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[ServeCluster]:  # noqa: F811
    apps = [
        (
            scoring_app(
                tiny_settings(tiny_llama_dir, delimiter),
                replica_options=REPLICA,
                ingress_options=SMALL,
            ),
            name,
            prefix,
        )
        for name, prefix, delimiter in (("multi", "/", 0), ("single", "/single", None))
    ]
    serve_cluster.deploy_many([*apps, (Caller.bind("multi"), "caller", None)])
    yield serve_cluster


@pytest.fixture
def client(cluster: ServeCluster) -> Iterator[httpx.Client]:
    with cluster.client() as http:
        yield http


def post(client: httpx.Client, payload: Any, prefix: str = "") -> httpx.Response:
    return client.post(f"{prefix}/v1/score", json=payload)


def logprobs_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.log(np.array(response.json()["scores"], dtype=np.float64))


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path) -> Any:
    """Next-token log-probabilities from transformers (PyTorch, fp32, same weights)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)

    def score(ids: list[int], labels: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        return torch.log_softmax(logits, -1)[labels].numpy()

    score.tokenizer = tokenizer  # type: ignore[attr-defined]
    return score


def test_response_envelope(client: httpx.Client, reference: Any) -> None:
    started = int(time.time())
    response = post(client, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"object", "model", "scores", "usage", "created"}
    assert body["object"] == "scoring"
    assert body["model"] == client.get("/v1/models").json()["data"][0]["id"]
    assert started <= body["created"] <= time.time() + 1
    tokenizer = reference.tokenizer
    query_len = len(tokenizer(QUERY)["input_ids"])
    item_lens = [len(tokenizer(i, add_special_tokens=False)["input_ids"]) for i in ITEMS]
    prompt = sum(query_len + n for n in item_lens)
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 0,
        "total_tokens": prompt,
    }
    assert np.array(body["scores"]).shape == (len(ITEMS), len(LABELS))


def test_scores_match_transformers(client: httpx.Client, reference: Any) -> None:
    tokenizer = reference.tokenizer
    query_ids = tokenizer(QUERY)["input_ids"]
    for item_first in (False, True):
        response = post(
            client,
            {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "item_first": item_first},
        )
        got = logprobs_of(response)
        for row, item in zip(got, ITEMS, strict=True):
            item_ids = tokenizer(item, add_special_tokens=False)["input_ids"]
            ids = item_ids + query_ids if item_first else query_ids + item_ids
            np.testing.assert_allclose(row, reference(ids, LABELS), atol=1e-4)


def test_apply_softmax_both_ways(client: httpx.Client) -> None:
    payload = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}
    raw = np.array(post(client, payload).json()["scores"])
    soft = np.array(post(client, {**payload, "apply_softmax": True}).json()["scores"])
    assert np.all(raw > 0) and np.all(raw.sum(axis=1) < 1)  # full-vocabulary probabilities
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-9)
    np.testing.assert_allclose(soft, raw / raw.sum(axis=1, keepdims=True), rtol=1e-5)


def test_text_and_token_inputs_agree(client: httpx.Client, reference: Any) -> None:
    tokenizer = reference.tokenizer
    text = post(client, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS})
    tokens = post(
        client,
        {
            "query": tokenizer(QUERY)["input_ids"],
            "items": [tokenizer(i, add_special_tokens=False)["input_ids"] for i in ITEMS],
            "label_token_ids": LABELS,
        },
    )
    assert text.json()["usage"] == tokens.json()["usage"]  # the same tokens scored
    # The same request, but not always the same executable: a background compile of its
    # exact signature can finish between the two posts (the first ran on a covering one),
    # and another padding changes the last bits (CI saw 9.5e-7 relative).
    assert_fp32_close(logprobs_of(text), logprobs_of(tokens))


@pytest.mark.parametrize("item_first", [False, True])
def test_multi_item_on_and_off_agree(client: httpx.Client, item_first: bool) -> None:
    payload = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "item_first": item_first}
    multi = logprobs_of(post(client, payload))
    single = logprobs_of(post(client, payload, prefix="/single"))
    assert_fp32_close(multi, single)


def test_item_first_changes_the_sequence(client: httpx.Client) -> None:
    payload = {"query": QUERY, "items": ITEMS[1:], "label_token_ids": LABELS}
    first = logprobs_of(post(client, {**payload, "item_first": True}))
    last = logprobs_of(post(client, payload))
    assert np.max(np.abs(first - last)) > 1e-3


def test_empty_items_answer_without_the_replica(client: httpx.Client) -> None:
    before = replica_stats("multi")["requests"]
    response = post(client, {"query": QUERY, "items": [], "label_token_ids": [PARIS]})
    assert response.status_code == 200
    assert response.json()["scores"] == []
    assert replica_stats("multi")["requests"] == before


BAD_PAYLOADS: list[tuple[Any, str]] = [
    ({"query": QUERY, "items": ["a"], "label_token_ids": []}, "empty_label_token_ids"),
    ({"query": QUERY, "items": ["a"]}, "empty_label_token_ids"),
    ({"query": QUERY, "items": ["a"], "label_token_ids": [-3]}, "negative_token_id"),
    ({"query": QUERY, "items": ["a"], "label_token_ids": [49152]}, "token_id_exceeds_vocab"),
    ({"query": QUERY, "items": ["a"], "label_token_ids": [10**30]}, "token_id_exceeds_vocab"),
    ({"query": [1, 2], "items": [[1], [-1]], "label_token_ids": [1]}, "negative_token_id"),
    ({"query": [1, 2], "items": [[70000]], "label_token_ids": [1]}, "token_id_exceeds_vocab"),
    ({"query": QUERY, "items": [[1, 2]], "label_token_ids": [1]}, "mixed_input_types"),
    ({"query": "", "items": ["a"], "label_token_ids": [1]}, "empty_query"),
    ({"query": [], "items": [[1]], "label_token_ids": [1]}, "empty_query"),
    ({"query": QUERY, "items": ["a"] * 9, "label_token_ids": [1]}, "too_many_items"),
    ({"query": QUERY, "items": [" word" * 130], "label_token_ids": [1]}, "sequence_too_long"),
    ({"query": "x<|endoftext|>", "items": ["a"], "label_token_ids": [1]}, "delimiter_in_content"),
    ({"query": [5], "items": [[1], [0]], "label_token_ids": [1]}, "delimiter_in_content"),
    ({"query": QUERY, "items": ["a"], "label_token_ids": ["1"]}, "invalid_request"),
    ({"query": QUERY, "items": ["a"], "label_token_ids": [True]}, "invalid_request"),
    (
        {"query": QUERY, "items": ["a"], "label_token_ids": [1], "apply_softmax": 1},
        "invalid_request",
    ),
    ({"query": QUERY, "items": ["a"], "label_token_ids": [1], "extra": 1}, "invalid_request"),
    (
        {"query": {"a": [[[{"b": None}]]]}, "items": ["a"], "label_token_ids": [1]},
        "invalid_request",
    ),
    ({"query": QUERY, "items": [[[1]]], "label_token_ids": [1]}, "invalid_request"),
    ([QUERY, ["a"], [1]], "invalid_request"),
    ("just a string", "invalid_request"),
    (None, "invalid_request"),
]

BAD_BODIES: list[bytes] = [
    b"",
    b"{",
    b"not json at all",
    b"\xff\xfe garbage",
    b'{"query": "q", "items": ["a"], "label_token_ids": [NaN]}',
    b'{"query": "q", "items": ["a"], "label_token_ids": [1' + b"0" * 5000 + b"]}",
    b"[" * 50_000 + b"]" * 50_000,
    b'{"query": "q", "items": ["a"], "label_token_ids": [1e400]}',
]


def test_every_bad_request_is_a_400_that_never_reaches_the_replica(client: httpx.Client) -> None:
    before = replica_stats("multi")["requests"]
    seen: dict[str, str] = {}
    for payload, reason in BAD_PAYLOADS:
        response = client.post("/v1/score", content=json.dumps(payload).encode())
        assert response.status_code == 400, (payload, response.text)
        body = response.json()
        assert body["object"] == "error" and body["type"] == "BadRequestError"
        assert body["code"] == 400 and set(body) == {
            "object",
            "message",
            "type",
            "param",
            "code",
            "reason",
        }
        assert body["reason"] == reason, (payload, body)
        seen[reason] = body["message"]
    for raw in BAD_BODIES:
        response = client.post("/v1/score", content=raw)
        assert response.status_code == 400, (raw[:40], response.text)
        assert response.json()["reason"] in {"invalid_json", "invalid_request"}
    assert replica_stats("multi")["requests"] == before
    design_reasons = {
        "empty_label_token_ids",
        "negative_token_id",
        "token_id_exceeds_vocab",
        "mixed_input_types",
        "empty_query",
        "too_many_items",
        "sequence_too_long",
        "delimiter_in_content",
    }
    assert design_reasons <= set(seen)


def test_routes(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["vocab_size"] == 49152
    assert models["data"][0]["multi_item_scoring_delimiter"] == 0
    assert models["data"][0]["rerank_method"] == "yes_no"  # the setting's default
    single = client.get("/single/v1/models").json()
    assert single["data"][0]["multi_item_scoring_delimiter"] is None
    assert client.get("/health").json()["status"] == "ok"
    openapi = client.get("/openapi.json").json()
    assert "/v1/score" in openapi["paths"]
    assert client.get("/v1/score").status_code == 405
    assert client.get("/nowhere").json()["reason"] == "not_found"


def test_concurrent_requests_are_batched_and_correct(client: httpx.Client) -> None:
    queries = [f"Question {i}: which city is the capital of country {i}?" for i in range(32)]
    payloads = [
        {"query": q, "items": ITEMS[: 1 + i % 4], "label_token_ids": LABELS}
        for i, q in enumerate(queries)
    ]
    expected = [logprobs_of(post(client, p)) for p in payloads]  # one at a time
    before = replica_stats("multi")

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=120) as http:
            return await asyncio.gather(*(http.post("/v1/score", json=p) for p in payloads))

    responses = asyncio.run(fire())
    after = replica_stats("multi")
    for response, want in zip(responses, expected, strict=True):
        assert_fp32_close(logprobs_of(response), want)
    assert after["requests"] - before["requests"] == 32
    assert after["batches"] - before["batches"] < 32, "concurrent work was never batched"


def test_deployment_handle_from_another_app(client: httpx.Client) -> None:
    payload = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": True}
    caller = serve.get_app_handle("caller")
    via_handle = caller.remote(payload).result(timeout_s=60)
    via_http = post(client, payload).json()
    assert via_handle.keys() == via_http.keys()
    assert via_handle["scores"] == via_http["scores"]
    assert via_handle["usage"] == via_http["usage"]
    bad = {**payload, "label_token_ids": [-1]}
    error = caller.remote(bad).result(timeout_s=60)
    assert error["raised"] is True
    assert error["body"] == post(client, bad).json()


def test_handle_and_replica_agree_on_the_model(client: httpx.Client) -> None:
    replica = serve.get_deployment_handle("ScoringReplica", "multi")
    ingress = serve.get_app_handle("multi")
    replica_info = replica.describe.remote().result(timeout_s=60)
    ingress_info = ingress.describe.remote().result(timeout_s=60)
    assert replica_info.vocab_size == ingress_info.vocab_size == 49152
    assert replica_info.multi_item_scoring_delimiter == 0
    assert replica_info.limits == ingress_info.limits
    assert math.isfinite(replica_stats("multi")["compile_count"])


def test_the_replica_runs_at_niceness_zero_where_ray_is_started_like_make_serve(
    client: httpx.Client,
) -> None:
    # start_cluster sets Ray's worker_niceness to 0 as make serve does; Ray's default (15)
    # made the replica 10-20x slower beside busy processes (cluster/niceness.py). Workers add
    # their niceness to the cluster's starter's (this process: 0, or 19 under nice -n 19).
    assert replica_stats("multi")["worker_niceness"] == os.getpriority(os.PRIO_PROCESS, 0)


def test_every_answer_carries_its_request_id_and_a_scored_one_tei_timings(
    client: httpx.Client,
) -> None:
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}
    scored = client.post("/v1/score", json=body, headers={"x-request-id": "trace-7"})
    assert scored.status_code == 200, scored.text
    assert scored.headers["x-request-id"] == "trace-7"
    times = {n: int(scored.headers[f"x-{n}-time"]) for n in ("tokenization", "queue", "inference")}
    total = int(scored.headers["x-total-time"])
    assert times["inference"] >= 1 and total >= sum(times.values()) - 3
    refused = client.post("/v1/score", json={**body, "label_token_ids": []})
    assert refused.status_code == 400 and len(refused.headers["x-request-id"]) >= 16
    assert "x-total-time" in refused.headers and "x-inference-time" not in refused.headers


def test_the_cohere_sdk_reranks_against_the_app_as_v1_score_scores(
    cluster: ServeCluster, client: httpx.Client
) -> None:
    import cohere

    from app.rerank import RerankTemplate

    docs = ["Paris is the capital.", "Bananas are yellow."]
    model = client.get("/v1/models").json()["data"][0]["id"]
    sdk = cohere.ClientV2(api_key="unused", base_url=cluster.http_url, timeout=60)
    ranked = sdk.rerank(model=model, query=QUERY, documents=docs)
    template = RerankTemplate()
    yes, no = 10407, 4607  # "yes", "no" in SmolLM2's tokenizer
    prompt = template.query.format(instruction=template.instruction, query=QUERY)
    items = [template.document.format(document=d) for d in docs]
    scored = post(client, {"query": prompt, "items": items, "label_token_ids": [yes, no]})
    logprobs = logprobs_of(scored)
    p_yes = 1 / (1 + np.exp(logprobs[:, 1] - logprobs[:, 0]))
    assert [r.index for r in ranked.results] == list(np.argsort(-p_yes, kind="stable"))
    for result in ranked.results:
        assert abs(result.relevance_score - p_yes[result.index]) <= 1e-5
    (best,) = sdk.rerank(model=model, query=QUERY, documents=docs, top_n=1).results
    assert best.index == ranked.results[0].index


def scorejax_samples(metrics_url: str) -> dict[str, list[Any]]:
    """The node's Prometheus text, parsed: scorejax samples by name (Ray adds ``ray_``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(metrics_url, timeout=10).text
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ray_scorejax_"):
                samples.setdefault(sample.name, []).append(sample)
    return samples


def test_prometheus_scrapes_scorejax_metrics_from_the_ray_node(
    cluster: ServeCluster, client: httpx.Client
) -> None:
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}
    assert post(client, body).status_code == 200
    assert post(client, {**body, "label_token_ids": []}).status_code == 400

    def exported() -> dict[str, list[Any]] | None:
        samples = scorejax_samples(cluster.metrics_url)
        requests = samples.get("ray_scorejax_requests_total", [])
        refused = [s for s in requests if s.labels.get("reason") == "empty_label_token_ids"]
        steps = samples.get("ray_scorejax_step_seconds_count", [])
        return samples if refused and steps else None

    samples = wait_for(exported, 60, "scorejax metrics on the metrics export port", 1.0)
    scored = [
        s
        for s in samples["ray_scorejax_requests_total"]
        if s.labels["route"] == "/v1/score" and s.labels["status"] == "200"
    ]
    assert scored and sum(s.value for s in scored) >= 1
    assert {"application", "deployment"} <= set(scored[0].labels)
    stages = {s.labels["stage"] for s in samples["ray_scorejax_latency_seconds_count"]}
    assert {"total", "tokenize", "queue", "inference"} <= stages
    for name in ("batch_size", "padding_ratio", "items_per_request", "tokens_per_request"):
        assert samples.get(f"ray_scorejax_{name}_count"), name
    compiles = samples["ray_scorejax_compiles_total"]
    assert sum(s.value for s in compiles if s.labels["source"] == "warmup") >= 1
