"""A sparse (SPLADE) model's answers (replicas.kinds.SPARSE): /embed_sparse (TEI's shape)
answers each text's non-zero vocabulary weights as ``{index, value}`` pairs (with
``return_tokens``, each pair's vocabulary token too), as ``SparseEncoder.encode_query`` /
``encode_document`` compute them; /v1/score and /v1/rerank answer the sparse dot product
(app.retrieval_scores; semantics 27)."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.embeddings import input_limit
from app.kinds.kind import KindAnswers
from app.kinds.retrieval import similarity_rerank, similarity_scores
from app.retrieval_inputs import embed_work, encode_role, head_of, request_texts, role_prompt
from app.retrieval_schema import EmbedSparseRequest
from app.served import Answered, Served, tokenized
from app.timings import Backend, replica_answer
from app.validation import check_model_name, validate_body
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
    texts = request_texts(request.inputs, info, "inputs")
    head, limit = head_of(info), input_limit(info)
    prompt, role = _prompt(info, request), request.input_type
    encoded = encode_role(tokenizer, texts, role, prompt, head, limit, "inputs", request.truncate)
    return request, dataclasses.replace(embed_work([encoded], info, "inputs"), adapter=adapter)


async def sparse_vectors(served: Served, payload: Any, backend: Backend) -> Answered:
    info, tokenizer = served.info, served.tokenizer
    (request, work), timings = tokenized(sparse_work, info, tokenizer, payload)
    answer, timings = await replica_answer(work, backend, timings)
    vectors = SparseVectors.checked(answer, work.num_items, head_of(info).dimension)
    return sparse_body(tokenizer, vectors, request.return_tokens), timings


def sparse_body(tokenizer: Any, vectors: Any, tokens: bool) -> list[list[dict[str, Any]]]:
    """TEI's /embed_sparse response: per input its ``(indices, values)`` as ``{index,
    value}`` pairs, with ``tokens`` each index's vocabulary token too."""
    body = []
    for indices, values in vectors:
        pairs = [{"index": int(i), "value": float(v)} for i, v in zip(indices, values, strict=True)]
        if tokens:
            names = tokenizer.convert_ids_to_tokens([int(i) for i in indices])
            pairs = [{**pair, "token": name} for pair, name in zip(pairs, names, strict=True)]
        body.append(pairs)
    return body


KIND = KindAnswers(
    name="sparse",
    answers={
        "score": similarity_scores,
        "rerank": similarity_rerank,
        "embed_sparse": sparse_vectors,
    },
    similarity="sparse_dot",
)
