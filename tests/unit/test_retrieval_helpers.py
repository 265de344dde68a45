"""tests/support/retrieval_helpers: one ColBERT (native and PyLate v3) and one SPLADE (native
and MLMTransformer-legacy) per layout, BERT, and the facts the reference values must show:
the query width, [MASK] expansion, the document skiplist, ``max_active_dims``, finite scores
that tell documents apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.encoder_helpers import SPECIALS, WORDS
from tests.support.retrieval_helpers import (
    colbert_scores,
    colbert_token_ids,
    colbert_vectors,
    save_colbert,
    save_pylate_colbert,
    save_splade,
    splade_scores,
    splade_vectors,
)

# the fixtures' own facts; make test keeps the engine tests against the same fixtures
pytestmark = pytest.mark.deep

QUERY = "what is the blue river"
DOCUMENTS = ["the blue river . seven stone", "red cloud of zebra", "alpha . beta . gamma"]
MASK, DOT = (SPECIALS + WORDS).index("[MASK]"), (SPECIALS + WORDS).index(".")


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_colbert(tmp_path_factory.mktemp("colbert") / "model", query_length=12)


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_splade(tmp_path_factory.mktemp("splade") / "model", max_active_dims=3)


def test_colbert_layout(colbert: Path) -> None:
    types = [m["type"].rsplit(".", 1)[1] for m in _json(colbert / "modules.json")]
    assert types == ["Transformer", "Dense", "MultiVectorMask", "Normalize"]
    transformer = _json(colbert / "sentence_bert_config.json")
    assert transformer["query_expansion"]["length"] == 12
    assert transformer["document_length"] == 100
    st = _json(colbert / "config_sentence_transformers.json")
    assert st["prompts"] == {"query": "what ", "document": "the "}


def test_colbert_queries_hold_query_length_rows_expanded_with_mask(colbert: Path) -> None:
    long_query = " ".join(["river stone"] * 10)
    vectors = colbert_vectors(colbert, [QUERY, long_query], "query")
    assert [v.shape for v in vectors] == [(12, 16), (12, 16)]
    norms = [np.linalg.norm(v.astype(np.float64), axis=1) for v in vectors]
    assert all(np.allclose(n, 1, atol=1e-5) for n in norms)
    tokens = colbert_token_ids(colbert, [QUERY, long_query], "query")
    short, long = tokens.ids
    assert len(short) == len(long) == 12
    # [CLS] "what" (prompt) what is the blue river [SEP], then four [MASK]: scored, not attended
    assert short[-4:] == [MASK] * 4 and short[7] == 3
    assert tokens.attended[0] == [True] * 8 + [False] * 4 and all(tokens.scored[0])
    assert MASK not in long and long[-1] == 3  # truncated to the width, [SEP] kept


def test_colbert_documents_skip_punctuation(colbert: Path) -> None:
    tokens = colbert_token_ids(colbert, DOCUMENTS, "document")
    for ids, scored, vectors in zip(
        tokens.ids, tokens.scored, colbert_vectors(colbert, DOCUMENTS, "document"), strict=True
    ):
        assert MASK not in ids and len(vectors) == sum(scored)
        assert sum(scored) == len(ids) - ids.count(DOT)
    assert sum(tokens.scored[0]) < len(tokens.ids[0])
    # the skiplist is the documents': a query keeps its "."
    assert all(colbert_token_ids(colbert, ["blue . river"], "query").scored[0])
    long = colbert_token_ids(colbert, [" ".join(["river"] * 150)], "document").ids[0]
    assert len(long) == 100 and long[-1] == 3  # document_length, [SEP] kept


def test_colbert_scores_finite_and_distinct(colbert: Path, tmp_path: Path) -> None:
    scores = colbert_scores(colbert, QUERY, DOCUMENTS)
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert len(set(scores.round(5).tolist())) == 3
    assert (np.abs(scores) <= 12 + 1e-4).all()  # 12 unit query vectors
    other = save_colbert(tmp_path / "seed1", seed=1)
    assert not np.allclose(colbert_scores(other, QUERY, DOCUMENTS), scores)


def test_pylate_layout_loads_as_the_native_save(colbert: Path, tmp_path: Path) -> None:
    pylate = save_pylate_colbert(tmp_path / "pylate", query_length=12)
    types = [m["type"] for m in _json(pylate / "modules.json")]
    assert types == ["sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    for task, texts in (("query", [QUERY]), ("document", DOCUMENTS)):
        ours, theirs = colbert_vectors(colbert, texts, task), colbert_vectors(pylate, texts, task)
        assert [v.shape for v in ours] == [v.shape for v in theirs]
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a.astype(np.float64), b, atol=1e-6)
        assert colbert_token_ids(colbert, texts, task) == colbert_token_ids(pylate, texts, task)


def test_splade_max_active_dims_and_scores(splade: Path, tmp_path: Path) -> None:
    st = _json(splade / "config_sentence_transformers.json")
    assert (st["model_type"], st["max_active_dims"]) == ("SparseEncoder", 3)
    vectors = splade_vectors(splade, DOCUMENTS)
    assert all(0 < len(v) <= 3 for v in vectors)
    assert all(w > 0 for v in vectors for w in v.values())
    scores = splade_scores(splade, QUERY, DOCUMENTS)
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert len(set(scores.round(5).tolist())) == 3
    query = splade_vectors(splade, [QUERY], "query")[0]
    for score, doc in zip(scores, splade_vectors(splade, DOCUMENTS, "document"), strict=True):
        dot = sum(w * doc.get(i, 0.0) for i, w in query.items())
        assert score == pytest.approx(dot, rel=1e-5, abs=1e-6)
    full = save_splade(tmp_path / "full")
    assert max(len(v) for v in splade_vectors(full, DOCUMENTS)) > 3


def test_splade_legacy_mlm_transformer_loads_alike(splade: Path, tmp_path: Path) -> None:
    legacy = save_splade(tmp_path / "legacy", max_active_dims=3, legacy=True)
    types = [m["type"] for m in _json(legacy / "modules.json")]
    assert types[0] == "sentence_transformers.sparse_encoder.models.MLMTransformer"
    ours, theirs = splade_vectors(splade, DOCUMENTS), splade_vectors(legacy, DOCUMENTS)
    assert [sorted(v) for v in ours] == [sorted(v) for v in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert [a[i] for i in sorted(a)] == pytest.approx([b[i] for i in sorted(b)], abs=1e-6)
