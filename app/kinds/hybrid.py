"""A hybrid (BGE-M3) model's answers (replicas.kinds.HYBRID), every one from the same pass:
/v1/embeddings and /v2/embed its dense vectors (app.embeddings' bodies), /pooling its
multi-vectors (``token_embed``: a vector per token after [CLS]), /embed_sparse its lexical
weights (each token id's largest, special tokens left out), /v1/score and /v1/rerank its
``colbert+sparse+dense`` score (app.retrieval_scores)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import numpy as np

from app.embeddings import cohere_body, openai_body
from app.kinds.kind import Answer, KindAnswers
from app.kinds.late_interaction import pooling_work
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.kinds.sparse import sparse_work
from app.retrieval_inputs import head_of, lexical_weights, special_ids
from app.served import Answered, Served, tokenized
from app.timings import Backend, Timings, replica_answer
from replicas.answers import HybridVectors
from replicas.contract import EmbedWork


async def hybrid_answer(
    served: Served, work: EmbedWork, backend: Backend, timings: Timings
) -> tuple[HybridVectors, Timings]:
    """The replica's three outputs per input, checked."""
    work = dataclasses.replace(work, output="hybrid")
    answer, timings = await replica_answer(work, backend, timings)
    head = head_of(served.info)
    lengths = [len(ids) for ids in work.inputs]
    colbert = head.hybrid.colbert_dimension
    return HybridVectors.checked(answer, lengths, head.dimension, colbert), timings


def dense_in(cohere: bool) -> Answer:
    """/v1/embeddings (OpenAI's shape) or, with ``cohere``, /v2/embed: the dense vectors."""

    async def embed(served: Served, payload: Any, backend: Backend) -> Answered:
        texts: list[str] = []
        if cohere:
            (prepared, texts), timings = tokenized(served.embedder.prepare_cohere, payload)
        else:
            prepared, timings = tokenized(served.embedder.prepare, payload)
        parts, timings = await hybrid_answer(served, prepared.work, backend, timings)
        vectors = prepared.fold(np.stack([dense for dense, _, _ in parts]))
        if cohere:
            body = cohere_body(prepared, vectors, texts, uuid.uuid4().hex, served.calibration)
            return body, timings
        model = prepared.work.adapter or served.info.name
        return openai_body(prepared, vectors, model, served.calibration), timings

    return embed


async def multi_vectors(served: Served, payload: Any, backend: Backend) -> Answered:
    """/pooling: each text's multi-vector, a vector per token after [CLS]."""
    info = served.info
    (_, work), timings = tokenized(pooling_work, info, served.tokenizer, payload)
    parts, timings = await hybrid_answer(served, work, backend, timings)
    data = [
        {"index": i, "object": "pooling", "data": vectors.tolist()}
        for i, (_, vectors, _) in enumerate(parts)
    ]
    tokens = sum(len(ids) for ids in work.inputs)
    body = {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(served.clock()),
        "model": work.adapter or info.name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
    return body, timings


async def lexical(served: Served, payload: Any, backend: Backend) -> Answered:
    """/embed_sparse: each text's lexical weights as ``{index, value}`` pairs."""
    tokenizer = served.tokenizer
    (request, work), timings = tokenized(sparse_work, served.info, tokenizer, payload)
    parts, timings = await hybrid_answer(served, work, backend, timings)
    specials = special_ids(tokenizer)
    body = []
    for ids, (_, _, weights) in zip(work.inputs, parts, strict=True):
        indices, values = lexical_weights(ids, weights, specials)
        pairs = [{"index": int(i), "value": float(v)} for i, v in zip(indices, values, strict=True)]
        if request.return_tokens:
            names = tokenizer.convert_ids_to_tokens(indices.tolist())
            pairs = [{**pair, "token": name} for pair, name in zip(pairs, names, strict=True)]
        body.append(pairs)
    return body, timings


KIND = KindAnswers(
    name="hybrid",
    answers={
        "score": similarity_scores,
        "rerank": similarity_rerank,
        "embeddings": dense_in(cohere=False),
        "embed": dense_in(cohere=True),
        "pooling": multi_vectors,
        "embed_sparse": lexical,
    },
    similarity="hybrid",
)
