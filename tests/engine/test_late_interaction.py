"""A late-interaction (ColBERT) model served in process (app.http over a warm engine, no Ray)
answers as sentence-transformers 6.2's ``MultiVectorEncoder`` does, in float32 within 1e-5:
``/pooling`` each query's and document's scored token vectors (``encode_query`` /
``encode_document``: queries cut and ``[MASK]``-filled to the expansion width, documents cut
to ``document_length`` 100 and their "." skiplist tokens left out), ``/v1/score`` and
``/v1/rerank`` MaxSim (``model.similarity``), the rerank order the library's. One engine per
variant: BERT (``fixed``, fill tokens query-only), XLM-RoBERTa (``fixed``, attended),
ModernBERT (``min``) and a PyLate v3 "ColBERT" directory; rows of 64 and 256 tokens, so a step
packs many inputs, and a vector does not depend on what shares its step. The refusals (a 400
with a reason) and ``/v1/models``' kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.schema import ModelList
from app.service import ScoringService
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import sentences
from tests.support.http_support import Reply, ask, engine_api
from tests.support.retrieval_helpers import (
    colbert_scores,
    colbert_token_ids,
    colbert_vectors,
    save_colbert,
    save_pylate_colbert,
)

TOL = 1e-5
# A MaxSim score sums query_length (12) best dot products of unit vectors, each within ~3e-7
# of the library's (float32 rounding of 16 products), so a score stays within ~4e-6: 1e-5
# holds it with room.
SCORE_TOL = 1e-5
VARIANTS = {
    "bert-fixed": ("native", {"family": "bert", "strategy": "fixed", "attend": False}),
    "xlmr-fixed-attend": ("native", {"family": "xlm_roberta", "strategy": "fixed", "attend": True}),
    "modernbert-min": ("native", {"family": "modernbert", "strategy": "min", "attend": False}),
    "pylate-v3": ("pylate", {"family": "bert", "attend": True, "seed": 3}),
}
LONG = " ".join(["river stone . blue"] * 35)  # 140 words, 175 tokens: past 100 and 120


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:

    layout, options = VARIANTS[request.param]
    root = tmp_path_factory.mktemp("colbert")
    save = save_pylate_colbert if layout == "pylate" else save_colbert
    directory = save(root / request.param, **options)
    settings = embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
    )  # fmt: skip
    api, engine = engine_api(settings)
    assert engine.info.kind == "late_interaction"
    return api, directory


def post(api: Any, path: str, body: Any) -> Reply:
    return ask(api, "POST", path, json.dumps(body).encode())


def pooled(reply: Reply) -> list[np.ndarray]:
    assert reply.status == 200, reply.body
    assert reply.body["object"] == "list"
    assert [row["index"] for row in reply.body["data"]] == list(range(len(reply.body["data"])))
    assert {row["object"] for row in reply.body["data"]} == {"pooling"}
    return [np.asarray(row["data"], np.float32) for row in reply.body["data"]]


def assert_vectors(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert [v.shape for v in got] == [v.shape for v in expected]
    for ours, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)


def texts_for(seed: int) -> list[str]:
    """12 texts of 1..140 words (some past ``document_length``), "." among their tokens."""
    texts = [*sentences(seed, 11, longest=140), LONG]
    assert any(". " in t or t.endswith(".") for t in texts[:-1])
    return texts


@pytest.mark.parametrize("role", ["query", "document"])
def test_pooling_answers_the_librarys_token_vectors(served, role: str) -> None:
    api, directory = served
    texts = texts_for(31)
    reference = colbert_vectors(directory, texts, role)
    reply = post(api, "/pooling", {"input": texts, "input_type": role})
    assert_vectors(pooled(reply), reference)
    tokens = colbert_token_ids(directory, texts, role)
    assert reply.body["usage"]["prompt_tokens"] == sum(len(ids) for ids in tokens.ids)
    if role == "document":  # cut to document_length; "." (the skiplist) left out
        assert max(len(ids) for ids in tokens.ids) == 100
        assert any(not all(scored) for scored in tokens.scored)
        assert [len(v) for v in reference] == [sum(scored) for scored in tokens.scored]
    else:  # the expansion width: exactly 12 ("fixed"), at least 12 ("min")
        assert min(len(v) for v in reference) == 12


def test_document_is_the_default_role(served) -> None:
    api, directory = served
    texts = texts_for(32)[:4]
    assert_vectors(
        pooled(post(api, "/pooling", {"input": texts})),
        colbert_vectors(directory, texts, "document"),
    )


@pytest.mark.parametrize("role", ["query", "document"])
def test_a_vector_does_not_depend_on_what_shares_its_step(served, role: str) -> None:
    """The same texts alone, with others, and in another order answer the same vectors."""
    api, directory = served
    texts = texts_for(33)
    reference = colbert_vectors(directory, texts, role)
    (alone,) = pooled(post(api, "/pooling", {"input": texts[4], "input_type": role}))
    np.testing.assert_allclose(alone, reference[4], atol=TOL, rtol=0)
    others = texts_for(34)[:6]
    mixed = [*others[:3], texts[4], *others[3:], texts[0]]
    got = pooled(post(api, "/pooling", {"input": mixed, "input_type": role}))
    np.testing.assert_allclose(got[3], reference[4], atol=TOL, rtol=0)
    np.testing.assert_allclose(got[-1], reference[0], atol=TOL, rtol=0)
    reversed_ = pooled(post(api, "/pooling", {"input": texts[::-1], "input_type": role}))
    assert_vectors(reversed_[::-1], reference)


def test_rerank_and_score_answer_maxsim(served) -> None:
    api, directory = served
    texts = texts_for(35)
    query, documents = "what is the blue river . zebra", texts
    expected = colbert_scores(directory, query, documents)
    reply = post(api, "/v1/rerank", {"query": query, "documents": documents})
    assert reply.status == 200, reply.body
    results = reply.body["results"]
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    relevance = np.zeros(len(documents))
    for r in results:
        relevance[r["index"]] = r["relevance_score"]
    np.testing.assert_allclose(relevance, expected, atol=SCORE_TOL, rtol=0)
    scored = post(api, "/v1/score", {"query": query, "items": documents})
    assert scored.status == 200, scored.body
    rows = scored.body["scores"]
    assert [len(row) for row in rows] == [1] * len(documents)
    np.testing.assert_allclose(np.asarray(rows)[:, 0], expected, atol=SCORE_TOL, rtol=0)
    top = post(api, "/v1/rerank", {"query": query, "documents": documents, "top_n": 3})
    assert [r["index"] for r in top.body["results"]] == [r["index"] for r in results[:3]]
    # one document alone scores as among the others (the query encoded once per request)
    single = post(api, "/v1/score", {"query": query, "items": [documents[5]]}).body["scores"]
    np.testing.assert_allclose(single[0][0], expected[5], atol=SCORE_TOL, rtol=0)


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/v1/score", {"query": [5, 6, 7], "items": [[8, 9]]}, "invalid_request"),
        ("/v1/score", {"query": [5, 6, 7], "items": ["alpha"]}, "mixed_input_types"),
        ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": [5, 6]},
         "label_token_ids_with_head"),
        ("/v1/score", {"query": "", "items": ["b"]}, "empty_input"),
        ("/pooling", {"input": []}, "empty_input"),
        ("/pooling", {"input": ["alpha", ""]}, "empty_input"),
        ("/pooling", {"input": "alpha", "extra": 1}, "invalid_request"),
        ("/pooling", {"input": "alpha", "input_type": "passage"}, "invalid_request"),
        ("/pooling", {"input": [5, 6]}, "invalid_request"),
        ("/pooling", {"input": ["alpha"] * 65}, "too_many_items"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "unknown": True}, "invalid_request"),
        ("/v1/embeddings", {"input": "alpha"}, "unsupported_for_model"),
        ("/embed_sparse", {"inputs": "alpha"}, "unsupported_for_model"),
    ],
)  # fmt: skip
def test_bad_bodies_get_a_400_with_a_reason(served, path: str, body: Any, reason: str) -> None:
    api, _ = served
    reply = post(api, path, body)
    assert reply.status == 400, reply.body
    assert reply.body["reason"] == reason, reply.body


def test_models_says_late_interaction(served) -> None:
    api, directory = served
    card = ask(api, "GET", "/v1/models").body["data"][0]
    assert (card["id"], card["kind"], card["dimension"]) == (directory.name, "late_interaction", 16)
    assert card["max_input_tokens"] == 120


def test_models_card_matches_its_schema(served) -> None:
    api, _ = served
    body = ask(api, "GET", "/v1/models").body
    card = body["data"][0]
    assert (card["scoring"], card["rerank_method"], card["outputs"]) == (
        "maxsim",
        "maxsim",
        ["tokens"],
    )
    ModelList.model_validate(body)  # the card matches its documented schema


def test_a_pylate_directory_saying_cosine_loads_as_maxsim(tmp_path: Path) -> None:
    """PyLate v3 saves ``similarity_fn_name: "cosine"`` (sentence-transformers' default, which
    PyLate and the library ignore: ``model.similarity`` is MaxSim)."""
    directory = save_pylate_colbert(tmp_path / "pylate-cosine")
    service = ScoringService.from_settings(embed_settings(directory))
    assert service.info.pooling.late.similarity == "maxsim"


def test_modernbert_fill_tokens_out_of_every_window(served, request) -> None:
    """A short query on ModernBERT (local layers +-4) with query-only fill tokens: "alpha beta"
    is 5 tokens, so the fills at 9..11 have no readable key within their window. They read
    nothing there (torch's SDPA answers a fully masked row with zeros), so their vectors equal
    the library's and do not depend on what shares the step."""
    api, directory = served
    if "modernbert" not in directory.name:
        pytest.skip("only the ModernBERT model has local layers")
    texts = ["alpha beta", "red blue river stone cloud"]
    (alone,) = pooled(post(api, "/pooling", {"input": texts[0], "input_type": "query"}))
    mates = [LONG, texts[0], "alpha beta gamma delta"]
    beside = pooled(post(api, "/pooling", {"input": mates, "input_type": "query"}))[1]
    np.testing.assert_allclose(beside, alone, atol=TOL, rtol=0)
    got = pooled(post(api, "/pooling", {"input": texts, "input_type": "query"}))
    assert_vectors(got, colbert_vectors(directory, texts, "query"))
