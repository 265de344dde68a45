"""A late-interaction (ColBERT) model's answers (replicas.kinds.LATE_INTERACTION): /pooling
(vLLM's ``token_embed`` task) answers each text's scored token vectors, as
``MultiVectorEncoder.encode_query`` / ``encode_document`` return them; /v1/score and
/v1/rerank answer MaxSim (app.retrieval_scores)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from app.kinds.kind import KindAnswers
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.retrieval_inputs import (
    check_texts,
    embed_work,
    encode_role,
    head_of,
    role_prompt,
    scored_tokens,
    skiplist_ids,
)
from app.retrieval_schema import PoolingRequest
from app.served import Answered, Served, tokenized
from app.timings import Backend, replica_answer
from app.validation import check_item_count, check_model_name, validate_body
from replicas.answers import TokenVectors
from replicas.contract import EmbedWork, ModelInfo
from replicas.errors import Reason, ScoringError


def pooling_work(info: ModelInfo, tokenizer: Any, payload: Any) -> tuple[PoolingRequest, EmbedWork]:
    """A /pooling body: its texts encoded in their ``input_type``'s role."""
    request = validate_body(payload, PoolingRequest)
    adapter = check_model_name(request.model, info)
    texts = [request.input] if isinstance(request.input, str) else list(request.input)
    if not texts:
        raise ScoringError(Reason.EMPTY_INPUT, "input: the list is empty", "input")
    check_item_count(len(texts), info)
    check_texts(texts, "input")
    head, role = head_of(info), request.input_type
    limit = min(info.limits.max_row_tokens, head.max_seq_length or info.limits.max_row_tokens)
    encoded = encode_role(tokenizer, texts, role, role_prompt(head, role), head, limit, "input")
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
    data = [
        {
            "index": i,
            "object": "pooling",
            "data": scored_tokens(v, ids, role, head.late, skip).tolist(),
        }
        for i, (v, ids) in enumerate(zip(vectors, work.inputs, strict=True))
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


KIND = KindAnswers(
    name="late_interaction",
    answers={"score": similarity_scores, "rerank": similarity_rerank, "pooling": token_vectors},
    similarity="maxsim",
)
