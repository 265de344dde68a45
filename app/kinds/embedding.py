"""An embedding model's answers (replicas.kinds.EMBEDDING, app.embeddings): /v1/embeddings
and /v2/embed answer its vectors; /v1/score and /v1/rerank the cosine of the query's vector
and each item's (app.embed_scores)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from app.embed_scores import cosine_rerank_work, cosine_score_work
from app.embeddings import cohere_body, cosines, openai_body, pooling_of
from app.kinds.kind import Answer, KindAnswers
from app.rerank import rerank_body
from app.served import Answered, Served, tokenized
from app.timings import Backend, Timings, replica_answer
from replicas.answers import Vectors
from replicas.contract import EmbedWork


async def embedded(
    served: Served, work: EmbedWork, backend: Backend, timings: Timings
) -> tuple[np.ndarray, Timings]:
    """The replica's vectors ``[inputs, dimension]``, checked, and timings."""
    answer, timings = await replica_answer(work, backend, timings)
    dimension = pooling_of(served.info).dimension
    return Vectors.checked(answer, work.num_items, dimension), timings


# (what is served, the work, the replica call, timings) -> (vectors [inputs, D], timings)
Embedded = Callable[[Served, EmbedWork, Backend, Timings], Awaitable[tuple[np.ndarray, Timings]]]


def vectors_in(cohere: bool, vectors_of: Embedded | None = None) -> Answer:
    """/v1/embeddings (OpenAI's shape) or, with ``cohere``, /v2/embed; ``vectors_of``: how
    the replica's answer gives the dense vectors (None: ``embedded``)."""
    fetch = vectors_of or embedded

    async def embed(served: Served, payload: Any, backend: Backend) -> Answered:
        texts: list[str] = []
        if cohere:
            (prepared, texts), timings = tokenized(served.embedder.prepare_cohere, payload)
        else:
            prepared, timings = tokenized(served.embedder.prepare, payload)
        vectors, timings = await fetch(served, prepared.work, backend, timings)
        vectors = prepared.fold(vectors)
        if cohere:
            body = cohere_body(prepared, vectors, texts, uuid.uuid4().hex, served.calibration)
            return body, timings
        model = prepared.work.adapter or served.info.name
        return openai_body(prepared, vectors, model, served.calibration), timings

    return embed


async def cosine_scores(served: Served, payload: Any, backend: Backend) -> Answered:
    (request, cosine), timings = tokenized(cosine_score_work, served.embedder, payload)
    scores: list[list[float]] = []
    tokens = 0
    if cosine is not None:
        vectors, timings = await embedded(served, cosine.work, backend, timings)
        scores = [[float(c)] for c in cosines(vectors[0], vectors[1:])]
        tokens = cosine.prompt_tokens
    usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
    model = request.model or served.info.name  # checked: the base's name or an adapter's
    body = {"object": "scoring", "model": model, "scores": scores, "usage": usage}
    return {**body, "created": int(served.clock())}, timings


async def cosine_rerank(served: Served, payload: Any, backend: Backend) -> Answered:
    embedder, chunking = served.embedder, served.chunking
    (request, cosine, chunks), timings = tokenized(cosine_rerank_work, embedder, payload, chunking)
    relevance, tokens = np.zeros((0,), np.float64), 0
    if cosine is not None:
        vectors, timings = await embedded(served, cosine.work, backend, timings)
        relevance, tokens = cosines(vectors[0], vectors[1:]), cosine.prompt_tokens
    model = request.model or served.info.name
    return rerank_body(request, relevance, tokens, model, chunks), timings


KIND = KindAnswers(
    name="embedding",
    answers={
        "score": cosine_scores,
        "rerank": cosine_rerank,
        "embeddings": vectors_in(cohere=False),
        "embed": vectors_in(cohere=True),
    },
    similarity="cosine",
)
