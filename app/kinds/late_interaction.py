"""A late-interaction (ColBERT) model's answers (replicas.kinds.LATE_INTERACTION): /pooling
(vLLM's ``token_embed`` task) answers each text's scored token vectors, as
``MultiVectorEncoder.encode_query`` / ``encode_document`` return them; /v1/score and
/v1/rerank answer MaxSim (app.retrieval_scores; semantics 26)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import numpy as np

from app.embeddings import input_limit
from app.kinds.kind import KindAnswers
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.retrieval_inputs import (
    embed_work,
    encode_role,
    head_of,
    request_texts,
    role_prompt,
    scored_tokens,
    skiplist_ids,
)
from app.retrieval_schema import PoolingRequest
from app.served import Answered, Served, tokenized
from app.timings import Backend, replica_answer
from app.validation import check_model_name, validate_body
from replicas.answers import TokenVectors
from replicas.contract import EmbedWork, ModelInfo


def pooling_work(info: ModelInfo, tokenizer: Any, payload: Any) -> tuple[PoolingRequest, EmbedWork]:
    """A /pooling body: its texts encoded in their ``input_type``'s role."""
    request = validate_body(payload, PoolingRequest)
    adapter = check_model_name(request.model, info)
    texts = request_texts(request.input, info, "input")
    head, role = head_of(info), request.input_type
    encoded = encode_role(
        tokenizer, texts, role, role_prompt(head, role), head, input_limit(info), "input"
    )
    work = dataclasses.replace(embed_work([encoded], info, "input"), adapter=adapter)
    return request, work


async def token_vectors(served: Served, payload: Any, backend: Backend) -> Answered:
    info, tokenizer = served.info, served.tokenizer
    (request, work), timings = tokenized(pooling_work, info, tokenizer, payload)
    answer, timings = await replica_answer(work, backend, timings)
    head = head_of(info)
    vectors = TokenVectors.checked(answer, [len(ids) for ids in work.inputs], head.dimension)
    skip = skiplist_ids(tokenizer, head.late)
    role = request.input_type
    rows = [
        scored_tokens(v, ids, role, head.late, skip)
        for v, ids in zip(vectors, work.inputs, strict=True)
    ]
    return pooling_body(served, work, rows), timings


def pooling_body(served: Served, work: EmbedWork, rows: list[np.ndarray]) -> dict[str, Any]:
    """vLLM's /pooling response: each input's token vectors ``rows[i] [tokens, D]``."""
    data = [{"index": i, "object": "pooling", "data": row.tolist()} for i, row in enumerate(rows)]
    tokens = sum(len(ids) for ids in work.inputs)
    return {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(served.clock()),
        "model": work.adapter or served.info.name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


KIND = KindAnswers(
    name="late_interaction",
    answers={"score": similarity_scores, "rerank": similarity_rerank, "pooling": token_vectors},
    similarity="maxsim",
)
