"""A score-head model served for real (Ray Serve, HTTP, the engine): a tiny random
``Qwen3ForSequenceClassification`` (one label, SmolLM2's tokenizer) answers /v1/score,
/v1/classify and /v1/rerank with transformers' fp32 head outputs of the same token rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.special import expit

from app.builder import scoring_app
from app.rerank import RerankTemplate
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.head_helpers import hf_head_outputs, save_tiny_head
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.deep, RAY_SERVE]

TOLERANCE = 1e-4
PROMPT = "<|im_start|>user\nWrite a haiku about rain.<|im_end|>\n<|im_start|>assistant\n"
RESPONSES = [
    "Soft rain on the roof<|im_end|>",
    "No.<|im_end|>",
    "Clouds weep, earth drinks<|im_end|>",
]


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("tiny-qwen3-seqcls")
    save_tiny_head("qwen3-seqcls-1", directory, vocab_size=49152)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, head_dir: Path) -> Iterator[httpx.Client]:  # noqa: F811
    settings = ReplicaSettings.from_keys(
        model=str(head_dir),
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 64, 128),
        item_token_buckets=(16, 64, 128),
        batch_buckets=(1, 4),
        max_items_per_request=8,
        max_multi_item_seq_len=256,
        warmup_shapes=((16, 4, 16, 1),),
        rerank_method="head",
    )
    small = {"ray_actor_options": {"num_cpus": 0.1}}
    app = scoring_app(settings, replica_options=small, ingress_options=small)
    serve_cluster.deploy(app, "heads", "/heads")
    with serve_cluster.client() as http:
        http.base_url = http.base_url.join("/heads")
        yield http


def tokens(head_dir: Path, text: str, special: bool) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(head_dir)(text, add_special_tokens=special)["input_ids"]


def test_score_best_of_n_equals_transformers_and_each_conversation_alone(client, head_dir):
    response = client.post("/v1/score", json={"query": PROMPT, "items": RESPONSES})
    assert response.status_code == 200, response.text
    rewards = np.array(response.json()["scores"])  # raw logits, one per response
    query = tokens(head_dir, PROMPT, True)
    rows = [query + tokens(head_dir, r, False) for r in RESPONSES]
    assert np.abs(rewards - hf_head_outputs(head_dir, rows, left=False)).max() <= TOLERANCE
    alone = client.post("/v1/score", json={"query": PROMPT, "items": RESPONSES[1:2]}).json()
    assert_fp32_close(alone["scores"][0][0], rewards[1, 0])
    soft = client.post(
        "/v1/score", json={"query": PROMPT, "items": RESPONSES, "apply_softmax": True}
    )
    np.testing.assert_allclose(soft.json()["scores"], expit(rewards), atol=1e-9)
    refused = client.post(
        "/v1/score", json={"query": PROMPT, "items": ["a"], "label_token_ids": [1]}
    )
    assert refused.status_code == 400
    assert refused.json()["reason"] == "label_token_ids_with_head"


def test_classify_equals_transformers(client, head_dir):
    texts = ["It rained all day.", "A sunny, bright and warm afternoon"]
    response = client.post("/v1/classify", json={"input": texts})
    assert response.status_code == 200, response.text
    body = response.json()
    rows = [tokens(head_dir, text, True) for text in texts]
    expected = expit(hf_head_outputs(head_dir, rows, left=True))
    assert [entry["index"] for entry in body["data"]] == [0, 1]
    assert np.abs(np.array([e["probs"] for e in body["data"]]) - expected).max() <= TOLERANCE
    assert body["data"][0]["num_classes"] == 1 and body["object"] == "list"


def test_rerank_with_the_head_equals_transformers(client, head_dir):
    documents = ["Rain falls from clouds.", "Bananas are yellow.", "Storms bring heavy rain."]
    body = {"query": "what is rain?", "documents": documents}
    response = client.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    template = RerankTemplate()
    query = template.query.format(instruction=template.instruction, query="what is rain?")
    rows = [
        tokens(head_dir, query, True)
        + tokens(head_dir, template.document.format(document=d), False)
        for d in documents
    ]
    expected = expit(hf_head_outputs(head_dir, rows, left=False)[:, 0])
    got = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    assert np.abs(np.array([got[i] for i in range(3)]) - expected).max() <= TOLERANCE


def test_models_says_head(client: httpx.Client) -> None:
    card = client.get("/v1/models").json()["data"][0]
    assert (card["scoring"], card["num_labels"], card["rerank_method"]) == ("head", 1, "head")
    completions = client.post("/v1/completions", json={"prompt": "x", "echo": True})
    assert completions.status_code == 400 and completions.json()["reason"] == "no_lm_head"
