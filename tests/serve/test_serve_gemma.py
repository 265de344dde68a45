"""A tiny Gemma 3 served over real Ray Serve and real HTTP: /v1/score (multi-item, past the
window), /v1/rerank (label-token yes/no and query likelihood) and /v1/completions, against
transformers' Gemma3ForCausalLM (PyTorch, fp32, same weights).

The model: Gemma 3 text with 3 layers (windowed, global, windowed; window 4 tokens), random
weights, SmolLM2's tokenizer (vocabulary 49152) so text requests tokenize for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.deep, RAY_SERVE]

QUERY = "The capital of France is a city that"  # 8 tokens: twice the window
ITEMS = ["", " Paris", " lies on the river Seine in the north"]
LABELS = [7042, 4528, 11452, 0]
SMALL = {"ray_actor_options": {"num_cpus": 0.1}}
REPLICA = {"ray_actor_options": {"num_cpus": 0.25}}
# A short yes/no template (the default, Qwen3-Reranker's, is ~100 tokens).
YES_NO = (("query", "Query: {query}\n"), ("document", "Document: {document}\nRelevant:"))
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.", "Berlin is in Germany."]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Gemma3ForCausalLM

    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
    from tests.support.model_helpers import randomize_, tiny_hf_config

    directory = tmp_path_factory.mktemp("tiny-gemma3")
    config = tiny_hf_config("gemma3")
    config.vocab_size = 49152
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).to(torch.float32)
    randomize_(model, 0)
    model.save_pretrained(directory, safe_serialization=True)
    load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct")).save_pretrained(directory)
    return directory


def _settings(model_dir: Path, **changes: Any) -> ReplicaSettings:
    return ReplicaSettings.from_keys(
        model=str(model_dir),
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 64),
        item_token_buckets=(16, 64),
        batch_buckets=(1, 4),
        max_items_per_request=8,
        max_multi_item_seq_len=128,
        warmup_shapes=((4, 4, 4, 4),),
        **changes,
    )


@pytest.fixture(scope="module")
def cluster(serve_cluster: ServeCluster, gemma_dir: Path) -> Iterator[ServeCluster]:  # noqa: F811
    apps = [
        (scoring_app(settings, replica_options=REPLICA, ingress_options=SMALL), name, prefix)
        for name, prefix, settings in (
            ("gemma", "/gemma", _settings(gemma_dir, rerank_template=YES_NO)),
            ("gemma-ql", "/gemma-ql", _settings(gemma_dir, rerank_method="query_likelihood")),
        )
    ]
    serve_cluster.deploy_many(apps)
    yield serve_cluster


@pytest.fixture(scope="module")
def client(cluster: ServeCluster) -> Iterator[httpx.Client]:
    with cluster.client() as http:
        yield http


@pytest.fixture(scope="module")
def reference(gemma_dir: Path) -> Any:
    """Log-softmax [T, V] of transformers' Gemma3ForCausalLM over one token sequence."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, -1).numpy()

    logprobs.tokenizer = AutoTokenizer.from_pretrained(gemma_dir)  # type: ignore[attr-defined]
    return logprobs


def test_scores_equal_transformers_one_item_at_a_time(client: httpx.Client, reference) -> None:
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": False}
    reply = client.post("/gemma/v1/score", json=body)
    assert reply.status_code == 200, reply.text
    served = np.log(np.asarray(reply.json()["scores"], np.float64))  # [items, labels]
    tokenizer = reference.tokenizer
    query_ids = tokenizer(QUERY)["input_ids"]
    assert len(query_ids) > 4  # past the window
    for row, item in zip(served, ITEMS, strict=True):
        ids = query_ids + tokenizer(item, add_special_tokens=False)["input_ids"]
        np.testing.assert_allclose(row, reference(ids)[-1][LABELS], atol=1e-4, rtol=0)


def test_label_token_rerank_scores_each_document_on_its_own(client: httpx.Client) -> None:
    query = "What is the capital of France?"
    ranked = client.post("/gemma/v1/rerank", json={"query": query, "documents": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    scores = [r["relevance_score"] for r in results]
    assert sorted(r["index"] for r in results) == [0, 1, 2] and scores == sorted(scores)[::-1]
    assert all(0.0 <= s <= 1.0 for s in scores)
    alone = client.post("/gemma/v1/rerank", json={"query": query, "documents": DOCUMENTS[1:2]})
    by_index = {r["index"]: r["relevance_score"] for r in results}
    assert_fp32_close(np.log(alone.json()["results"][0]["relevance_score"]), np.log(by_index[1]))


def test_query_likelihood_rerank_is_the_mean_query_log_prob(client: httpx.Client) -> None:
    body = {"query": "capital of France", "documents": DOCUMENTS}
    ranked = client.post("/gemma-ql/v1/rerank", json=body)
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores)[::-1] and len(set(scores)) == 3


def test_completions_echo_prompt_log_probs_equal_transformers(
    client: httpx.Client, reference
) -> None:
    ids = reference.tokenizer(QUERY + ITEMS[2])["input_ids"]  # 16 tokens, 4 windows
    body = {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    reply = client.post("/gemma/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    got = reply.json()["choices"][0]["logprobs"]["token_logprobs"]
    ref = reference(ids)
    want = [ref[j - 1, ids[j]] for j in range(1, len(ids))]
    assert got[0] is None
    np.testing.assert_allclose(got[1:], want, atol=1e-4, rtol=0)
