"""What the late-interaction and sparse kinds answer alike (app.retrieval_scores): /v1/score
and /v1/rerank by the similarity of the query's and each document's encodings."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.rerank import rerank_body
from app.retrieval_scores import rerank_pair_work, score_pair_work, similarities
from app.served import Answered, Served, tokenized
from app.timings import Backend


async def similarity_scores(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/score: one one-element row per item, its similarity with the query."""
    (request, pair), timings = tokenized(score_pair_work, served.info, served.tokenizer, payload)
    scores: list[list[float]] = []
    tokens = 0
    if pair is not None:
        relevance, timings = await similarities(
            served.info, served.tokenizer, pair, backend, timings
        )
        scores, tokens = [[float(s)] for s in relevance], pair.prompt_tokens
    usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
    model = request.model or served.info.name
    body = {"object": "scoring", "model": model, "scores": scores, "usage": usage}
    return {**body, "created": int(served.clock())}, timings


async def similarity_rerank(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/rerank: documents by their similarity with the query, best first."""
    info, tokenizer = served.info, served.tokenizer
    (request, pair, chunks), timings = tokenized(
        rerank_pair_work, info, tokenizer, payload, served.chunking
    )
    relevance, tokens = np.zeros((0,), np.float64), 0
    if pair is not None:
        relevance, timings = await similarities(info, tokenizer, pair, backend, timings)
        tokens = pair.prompt_tokens
    model = request.model or info.name
    return rerank_body(request, relevance, tokens, model, chunks), timings
