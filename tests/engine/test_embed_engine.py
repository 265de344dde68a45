"""Embeddings in the engine (semantics 20) equal sentence-transformers' ``encode`` (fp32).

Tiny random Qwen3 (last token), Llama (mean) and Gemma 3 (mean, Dense 64 -> 48 with tanh)
base models saved as sentence-transformers directories (tests/support/embed_helpers.py), each with a
``query`` prompt and Normalize: every vector equals ``encode``'s within 1e-5 per component,
alone and inside mixed batches of 1..64 inputs of 1..512 tokens, and does not depend on the
other inputs of its step; Matryoshka equals ``truncate_dim`` (renormalized); padding stays
small (within the first test). One engine per family (shared by the session), two
compiled signatures each (``embed_helpers.embed_settings``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.embeddings import Embedder, matryoshka
from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
from replicas.contract import EmbedWork
from tests.support.embed_helpers import (
    QUERY_PROMPT,
    assert_split_as_whole,
    chunk_reference,
    reference_vectors,
    texts_of,
)

TOL = 1e-5  # tiny models: docs/semantics.md, "The float32 floor"


def family_of(variant: str, embedding_dirs: dict, embedding_engine: Any) -> tuple:
    directory = embedding_dirs[variant]
    engine = embedding_engine(variant)
    tokenizer = load_tokenizer(resolve_model_source(directory))
    return directory, engine, Embedder(engine.info, tokenizer)


@pytest.fixture(scope="module", params=["qwen3-last", "llama-mean", "gemma3-mean-dense"])
def family(request: pytest.FixtureRequest, embedding_dirs: dict, embedding_engine) -> tuple:
    return family_of(request.param, embedding_dirs, embedding_engine)


def test_vectors_equal_sentence_transformers_alone_and_in_mixed_batches(family) -> None:
    directory, engine, embedder = family
    count = 64 if engine.info.pooling.pooling == "lasttoken" else 24
    texts = texts_of(1, count)
    reference = reference_vectors(directory, texts)
    work = embedder.text_work(texts, None)
    assert max(len(ids) for ids in work.inputs) <= 512
    before = engine.stats()
    (together,) = engine.score_batch([work])
    after = engine.stats()
    np.testing.assert_allclose(together, reference, atol=TOL, rtol=0)
    computed = after.computed_tokens - before.computed_tokens
    assert computed / (after.useful_tokens - before.useful_tokens) <= 1.3  # last row pads
    # the same inputs split over concurrent works of 1, 8 and the rest, in another order
    assert_split_as_whole(engine, work, reference, [1, 9], seed=2, alone=(5,), tol=TOL)
    assert engine.stats().request_path_compiles == 0
    assert engine.info.pooling.dimension == reference.shape[1]


def test_the_query_prompt_applies_as_sentence_transformers_applies_it(family) -> None:
    directory, engine, embedder = family
    texts = texts_of(3, 5, longest=40)
    reference = reference_vectors(directory, texts, prompt_name="query")
    assert engine.info.pooling.prompt("query") == QUERY_PROMPT
    (vectors,) = engine.score_batch([embedder.text_work(texts, QUERY_PROMPT)])
    np.testing.assert_allclose(vectors, reference, atol=TOL, rtol=0)


def test_a_long_input_is_embedded_as_its_chunks_folded(family) -> None:
    """truncate: CHUNK (app.embed_chunks): an input past max_seq_length (512) runs as chunks
    of 512 tokens in the same steps as the other inputs, folded into one vector."""
    directory, engine, embedder = family
    long_text = " ".join(["river stone cloud seven blue"] * 260)  # 1300 words
    texts = [long_text, "alpha beta", long_text[:900]]
    work, chunking = embedder.chunked_work(texts, None)
    assert chunking is not None and chunking.starts == (0, 3, 4, 5)
    assert [len(ids) for ids in work.inputs[:3]] == [512, 512, len(work.inputs[2])]
    (raw,) = engine.score_batch([work])
    folded = chunking.fold(raw)
    pooling = engine.info.pooling.pooling
    expected = chunk_reference(directory, list(work.inputs[:3]), pooling)
    np.testing.assert_allclose(folded[0], expected, atol=TOL, rtol=0)
    reference = reference_vectors(directory, texts[1:])  # within the limit: encode's vectors
    np.testing.assert_allclose(folded[1:], reference, atol=TOL, rtol=0)
    assert engine.stats().request_path_compiles == 0
    plain, none = embedder.chunked_work(texts[1:], None)  # all fit: the plain work
    assert none is None and plain == embedder.text_work(texts[1:], None)


def test_a_vector_does_not_depend_on_its_step(embedding_dirs, embedding_engine) -> None:
    """Mean pooling (segment sums) on Llama; the layout is every family's."""
    _, engine, embedder = family_of("llama-mean", embedding_dirs, embedding_engine)
    texts = texts_of(4, 12, longest=200)
    work = embedder.text_work(texts, None)
    (base,) = engine.score_batch([work])
    changed = EmbedWork((work.inputs[0], tuple(reversed(work.inputs[1])), *work.inputs[2:]))
    (other,) = engine.score_batch([changed])
    np.testing.assert_allclose(np.delete(other, 1, 0), np.delete(base, 1, 0), atol=1e-6, rtol=0)


def test_matryoshka_equals_truncate_dim_renormalized(embedding_dirs, embedding_engine) -> None:
    directory, engine, embedder = family_of("qwen3-last", embedding_dirs, embedding_engine)
    texts = texts_of(5, 6, longest=60)
    (vectors,) = engine.score_batch([embedder.text_work(texts, None)])
    truncated = reference_vectors(directory, texts, truncate_dim=16)
    expected = truncated / np.linalg.norm(truncated, axis=1, keepdims=True)
    np.testing.assert_allclose(matryoshka(vectors, 16), expected, atol=TOL, rtol=0)


def test_a_bare_base_model_is_pooled_by_the_settings(embedding_dirs: dict) -> None:
    """The LlamaModel that sentence-transformers wrapped, served alone (safetensors names
    without ``model.``, no LM head) with ``pooling: mean`` (normalized by default), equals the
    directory's vectors; a base model with no setting pools by the last token, normalized."""
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.model.catalog import model_config
    from tests.support.embed_helpers import embed_settings

    directory = embedding_dirs["llama-mean"]
    base = directory.parent / f"{directory.name}-hf"
    settings = embed_settings(base, pooling="mean", item_token_buckets=(256,),
                              item_tokens_per_step=256)  # fmt: skip
    engine = ScoringEngine.from_settings(settings, warm=True)
    assert "lm_head" not in engine._params
    tokenizer = load_tokenizer(resolve_model_source(base))
    texts = texts_of(41, 6, longest=40)
    (vectors,) = engine.score_batch([Embedder(engine.info, tokenizer).text_work(texts, None)])
    np.testing.assert_allclose(vectors, reference_vectors(directory, texts), atol=TOL, rtol=0)
    pooled = model_config("Qwen3-Embedding-0.6B").pooling
    assert (pooled.pooling, pooled.normalize, pooled.dimension) == ("lasttoken", True, 1024)
