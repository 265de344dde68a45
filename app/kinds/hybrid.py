"""A hybrid (BGE-M3) model's answers (replicas.kinds.HYBRID), every one from the same pass:
/v1/embeddings and /v2/embed its dense vectors (app.embeddings' bodies), /pooling its
multi-vectors (``token_embed``: a vector per token after [CLS]), /embed_sparse its lexical
weights (each token id's largest, special tokens left out), /v1/score and /v1/rerank its
``colbert+sparse+dense`` score (app.retrieval_scores; semantics 28)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from app.kinds.embedding import vectors_in
from app.kinds.kind import KindAnswers
from app.kinds.late_interaction import pooling_body, pooling_work
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.kinds.sparse import sparse_body, sparse_work
from app.retrieval_inputs import head_of, lexical_weights, special_ids
from app.served import Answered, Served, tokenized
from app.timings import Backend, Timings, replica_answer
from replicas.answers import HybridVectors
from replicas.contract import EmbedWork, PoolingHead


async def hybrid_answer(
    served: Served, work: EmbedWork, backend: Backend, timings: Timings
) -> tuple[HybridVectors, Timings]:
    """The replica's three outputs per input, checked."""
    work = dataclasses.replace(work, output="hybrid")
    answer, timings = await replica_answer(work, backend, timings)
    return hybrid_parts(head_of(served.info), work, answer), timings


def hybrid_parts(head: PoolingHead, work: EmbedWork, answer: Any) -> HybridVectors:
    """The replica's answer to ``work`` as ``HybridVectors``, checked against the head's
    dense and multi-vector widths (python -m batch reads answers with it too)."""
    lengths = [len(ids) for ids in work.inputs]
    colbert = head.hybrid.colbert_dimension
    return HybridVectors.checked(answer, lengths, head.dimension, colbert)


def lexical_vectors(
    work: EmbedWork, parts: HybridVectors, specials: frozenset[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """/embed_sparse's values: each input's token weights folded by token id, ``specials``
    (``app.retrieval_inputs.special_ids``) left out."""
    return [lexical_weights(ids, p[2], specials) for ids, p in zip(work.inputs, parts, strict=True)]


async def dense_vectors(
    served: Served, work: EmbedWork, backend: Backend, timings: Timings
) -> tuple[np.ndarray, Timings]:
    """The dense vectors ``[inputs, D]`` of the three outputs."""
    parts, timings = await hybrid_answer(served, work, backend, timings)
    return np.stack([dense for dense, _, _ in parts]), timings


async def multi_vectors(served: Served, payload: Any, backend: Backend) -> Answered:
    """/pooling: each text's multi-vector, a vector per token after [CLS]."""
    (_, work), timings = tokenized(pooling_work, served.info, served.tokenizer, payload)
    parts, timings = await hybrid_answer(served, work, backend, timings)
    return pooling_body(served, work, [vectors for _, vectors, _ in parts]), timings


async def lexical(served: Served, payload: Any, backend: Backend) -> Answered:
    """/embed_sparse: each text's lexical weights as ``{index, value}`` pairs."""
    tokenizer = served.tokenizer
    (request, work), timings = tokenized(sparse_work, served.info, tokenizer, payload)
    parts, timings = await hybrid_answer(served, work, backend, timings)
    folded = lexical_vectors(work, parts, special_ids(tokenizer))
    return sparse_body(tokenizer, folded, request.return_tokens), timings


KIND = KindAnswers(
    name="hybrid",
    answers={
        "score": similarity_scores,
        "rerank": similarity_rerank,
        "embeddings": vectors_in(cohere=False, vectors_of=dense_vectors),
        "embed": vectors_in(cohere=True, vectors_of=dense_vectors),
        "pooling": multi_vectors,
        "embed_sparse": lexical,
    },
    similarity="hybrid",
)
