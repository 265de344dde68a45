"""A sparse (SPLADE) model's answers (replicas.kinds.SPARSE): /embed_sparse (TEI's shape)
answers each text's non-zero vocabulary weights as ``{index, value}`` pairs (with
``return_tokens``, each pair's vocabulary token too), as ``SparseEncoder.encode_query`` /
``encode_document`` compute them; /v1/score and /v1/rerank answer the sparse dot product
(app.retrieval_scores)."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.kinds.kind import KindAnswers
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.retrieval_inputs import check_texts, embed_work, encode_role, head_of, role_prompt
from app.retrieval_schema import EmbedSparseRequest
from app.served import Answered, Served, tokenized
from app.timings import Backend, replica_answer
from app.validation import check_item_count, check_model_name, validate_body
from replicas.answers import SparseVectors
from replicas.contract import EmbedWork, ModelInfo
from replicas.errors import Reason, ScoringError


def _prompt(info: ModelInfo, request: EmbedSparseRequest) -> str | None:
    head = head_of(info)
    if request.prompt_name is None:
        return role_prompt(head, request.input_type)
    prompt = head.prompt(request.prompt_name)
    if prompt is None:
        known = ", ".join(name for name, _ in head.prompts) or "none"
        raise ScoringError(
            Reason.UNKNOWN_PROMPT,
            f"prompt_name: {request.prompt_name!r} is not a prompt of this model ({known})",
            "prompt_name",
        )
    return prompt


def sparse_work(
    info: ModelInfo, tokenizer: Any, payload: Any
) -> tuple[EmbedSparseRequest, EmbedWork]:
    """An /embed_sparse body: its texts behind their prompt, cut only with ``truncate``."""
    request = validate_body(payload, EmbedSparseRequest)
    adapter = check_model_name(request.model, info)
    texts = [request.inputs] if isinstance(request.inputs, str) else list(request.inputs)
    if not texts:
        raise ScoringError(Reason.EMPTY_INPUT, "inputs: the list is empty", "inputs")
    check_item_count(len(texts), info)
    check_texts(texts, "inputs")
    head = head_of(info)
    limit = min(info.limits.max_row_tokens, head.max_seq_length or info.limits.max_row_tokens)
    prompt, role = _prompt(info, request), request.input_type
    encoded = encode_role(tokenizer, texts, role, prompt, head, limit, "inputs", request.truncate)
    return request, dataclasses.replace(embed_work([encoded], info, "inputs"), adapter=adapter)


async def sparse_vectors(served: Served, payload: Any, backend: Backend) -> Answered:
    info, tokenizer = served.info, served.tokenizer
    (request, work), timings = tokenized(sparse_work, info, tokenizer, payload)
    answer, timings = await replica_answer(work, backend, timings)
    vectors = SparseVectors.checked(answer, work.num_items, head_of(info).dimension)
    body = []
    for indices, values in vectors:
        pairs = [{"index": int(i), "value": float(v)} for i, v in zip(indices, values, strict=True)]
        if request.return_tokens:
            tokens = tokenizer.convert_ids_to_tokens([int(i) for i in indices])
            pairs = [{**pair, "token": token} for pair, token in zip(pairs, tokens, strict=True)]
        body.append(pairs)
    return body, timings


KIND = KindAnswers(
    name="sparse",
    answers={
        "score": similarity_scores,
        "rerank": similarity_rerank,
        "embed_sparse": sparse_vectors,
    },
    similarity="sparse_dot",
)
