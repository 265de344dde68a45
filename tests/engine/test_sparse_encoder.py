"""A sparse (SPLADE) model served in process (app.http over a warm engine, no Ray) answers as
sentence-transformers 6.2's ``SparseEncoder`` does, in float32 within 1e-5: ``/embed_sparse``
(TEI's shape) each text's non-zero vocabulary weights (the same index sets, ``max_active_dims``
applied), ``return_tokens`` naming each index's vocabulary token, ``/v1/score`` and
``/v1/rerank`` the sparse dot product of ``encode_query`` and ``encode_document``
(``model.similarity``), the rerank order the library's. One engine per variant: BERT (no
``max_active_dims``), XLM-RoBERTa (``max_active_dims`` 4), ModernBERT (``log1p_relu``, sum
pooling) and a directory in ST 5's deprecated ``MLMTransformer`` layout; rows of 64 and 256
tokens, so a step packs many inputs, and a vector does not depend on what shares its step.
The refusals (a 400 with a reason) and ``/v1/models``' kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.schema import ModelList
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import SPECIALS, WORDS, sentences
from tests.support.http_support import Reply, ask, engine_api
from tests.support.retrieval_helpers import save_splade, splade_scores, splade_vectors

TOL = 1e-5
# Sum pooling adds a token's weights over up to 120 tokens: weights reach ~40, where float32's
# spacing is 4e-6, so on top of 1e-5 a weight may differ by 1e-6 of itself (a few roundings).
RTOL = 1e-6
# A dot product sums at most 27 (the vocabulary) products of weights of ~1 (relu) to ~10 (sum
# pooling), each within ~1e-6 of the library's: relative 1e-5 of the score's scale.
SCORE_RTOL = 1e-5
# Sum pooling adds a token's weights over up to 120 tokens: weights reach ~40, where float32's
# spacing is 4e-6, so on top of 1e-5 a weight may differ by 1e-6 of itself (a few roundings).
RTOL = 1e-6
VARIANTS = {
    "bert-prompts": {"family": "bert"},
    "xlmr-top4": {"family": "xlm_roberta", "max_active_dims": 4},
    "modernbert-log1p-sum": {"family": "modernbert", "activation": "log1p_relu", "pooling": "sum"},
    "bert-legacy": {"family": "bert", "legacy": True, "seed": 2},
}
VOCAB = SPECIALS + WORDS
LONG = " ".join(["river stone . blue"] * 35)  # 175 tokens: past max_seq_length 120


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:

    root = tmp_path_factory.mktemp("splade")
    directory = save_splade(root / request.param, **VARIANTS[request.param])
    if "prompts" in request.param:  # encode_query / encode_document put these in front
        add_prompts(directory, {"query": "what ", "document": "the "})
    settings = embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
    )  # fmt: skip
    api, engine = engine_api(settings)
    assert engine.info.kind == "sparse"
    return api, directory


def add_prompts(directory: Path, prompts: dict[str, str]) -> None:
    path = directory / "config_sentence_transformers.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "prompts": prompts}))


def post(api: Any, path: str, body: Any) -> Reply:
    return ask(api, "POST", path, json.dumps(body).encode())


def sparse(reply: Reply) -> list[dict[int, float]]:
    assert reply.status == 200, reply.body
    vectors = []
    for pairs in reply.body:
        indices = [pair["index"] for pair in pairs]
        assert indices == sorted(set(indices)), indices  # ascending, each once
        vectors.append({pair["index"]: pair["value"] for pair in pairs})
    return vectors


def assert_sparse(got: list[dict[int, float]], expected: list[dict[int, float]]) -> None:
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        assert sorted(ours) == sorted(theirs)
        np.testing.assert_allclose(
            [ours[i] for i in sorted(ours)],
            [theirs[i] for i in sorted(theirs)],
            atol=TOL,
            rtol=RTOL,
        )


def texts_for(seed: int) -> list[str]:
    """12 texts of 1..100 words (within max_seq_length 120), "." and [UNK] among them."""
    return sentences(seed, 12, longest=100)


@pytest.mark.parametrize("task", [None, "query", "document"])
def test_embed_sparse_answers_the_librarys_weights(served, task: str | None) -> None:
    api, directory = served
    texts = texts_for(41)
    body: dict[str, Any] = {"inputs": texts}
    if task is not None:
        body["input_type"] = task
    got = sparse(post(api, "/embed_sparse", body))
    expected = splade_vectors(directory, texts, task or "document")  # the default role
    assert_sparse(got, expected)
    assert all(got)  # every text has weights
    if "top4" in directory.name:
        assert max(len(v) for v in got) == 4
    if "prompts" in directory.name and task is not None:  # its prompt, or another's: not equal
        other = "document" if task == "query" else "query"
        assert got != splade_vectors(directory, texts, other)
        named = sparse(post(api, "/embed_sparse", {"inputs": texts, "prompt_name": task}))
        assert_sparse(named, expected)


def test_return_tokens_names_each_index(served) -> None:
    api, _ = served
    texts = texts_for(42)[:5]
    reply = post(api, "/embed_sparse", {"inputs": texts, "return_tokens": True})
    assert reply.status == 200, reply.body
    assert all(pair["token"] == VOCAB[pair["index"]] for pairs in reply.body for pair in pairs)
    plain = post(api, "/embed_sparse", {"inputs": texts}).body
    assert [[{"index": p["index"], "value": p["value"]} for p in r] for r in reply.body] == plain
    assert all("token" not in pair for pairs in plain for pair in pairs)


def test_a_vector_does_not_depend_on_what_shares_its_step(served) -> None:
    api, directory = served
    texts = texts_for(43)
    expected = splade_vectors(directory, texts, "document")
    (alone,) = sparse(post(api, "/embed_sparse", {"inputs": texts[4]}))
    assert_sparse([alone], [expected[4]])
    others = texts_for(44)[:6]
    mixed = sparse(post(api, "/embed_sparse", {"inputs": [*others[:3], texts[4], *others[3:]]}))
    assert_sparse([mixed[3]], [expected[4]])
    assert_sparse(sparse(post(api, "/embed_sparse", {"inputs": texts[::-1]}))[::-1], expected)


def test_rerank_and_score_answer_the_sparse_dot_product(served) -> None:
    api, directory = served
    documents = texts_for(45)
    query = "what is the blue river . zebra"
    expected = splade_scores(directory, query, documents)
    atol = SCORE_RTOL * float(np.abs(expected).max())
    reply = post(api, "/v1/rerank", {"query": query, "documents": documents})
    assert reply.status == 200, reply.body
    results = reply.body["results"]
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    relevance = np.zeros(len(documents))
    for r in results:
        relevance[r["index"]] = r["relevance_score"]
    np.testing.assert_allclose(relevance, expected, atol=atol, rtol=0)
    scored = post(api, "/v1/score", {"query": query, "items": documents})
    assert scored.status == 200, scored.body
    rows = np.asarray(scored.body["scores"])
    assert rows.shape == (len(documents), 1)
    np.testing.assert_allclose(rows[:, 0], expected, atol=atol, rtol=0)


def test_an_over_long_text_is_refused_unless_truncate_cuts_it(served) -> None:
    api, directory = served
    refused = post(api, "/embed_sparse", {"inputs": ["alpha", LONG]})
    assert refused.status == 400, refused.body
    assert (refused.body["reason"], refused.body["param"]) == ("sequence_too_long", "inputs")
    cut = sparse(post(api, "/embed_sparse", {"inputs": ["alpha", LONG], "truncate": True}))
    assert_sparse(
        cut, splade_vectors(directory, ["alpha", LONG], "document")
    )  # the library cuts at 120


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/embed_sparse", {"inputs": []}, "empty_input"),
        ("/embed_sparse", {"inputs": ""}, "empty_input"),
        ("/embed_sparse", {"inputs": ["alpha", ""]}, "empty_input"),
        ("/embed_sparse", {"inputs": "alpha", "prompt_name": "nope"}, "unknown_prompt"),
        ("/embed_sparse", {"inputs": "alpha", "truncate": "yes"}, "invalid_request"),
        ("/embed_sparse", {"inputs": "alpha", "extra": 1}, "invalid_request"),
        ("/embed_sparse", {"inputs": [5, 6]}, "invalid_request"),
        ("/embed_sparse", {"inputs": ["alpha"] * 65}, "too_many_items"),
        ("/v1/score", {"query": [5, 6], "items": [[7, 8]]}, "invalid_request"),
        ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": [5, 6]},
         "label_token_ids_with_head"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "unknown": 1}, "invalid_request"),
        ("/v1/embeddings", {"input": "alpha"}, "unsupported_for_model"),
        ("/pooling", {"input": "alpha"}, "unsupported_for_model"),
    ],
)  # fmt: skip
def test_bad_bodies_get_a_400_with_a_reason(served, path: str, body: Any, reason: str) -> None:
    api, _ = served
    reply = post(api, path, body)
    assert reply.status == 400, reply.body
    assert reply.body["reason"] == reason, reply.body


def test_models_says_sparse(served) -> None:
    api, directory = served
    body = ask(api, "GET", "/v1/models").body
    card = body["data"][0]
    assert (card["id"], card["kind"], card["dimension"]) == (directory.name, "sparse", len(VOCAB))
    assert (card["scoring"], card["rerank_method"], card["outputs"]) == (
        "sparse_dot", "sparse_dot", ["sparse"]
    )  # fmt: skip
    ModelList.model_validate(body)  # the card matches its documented schema
