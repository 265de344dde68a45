"""/v1/score and /v1/rerank on a late-interaction model (MaxSim of the query's token vectors
and each document's) or a sparse model (the dot product of their sparse vectors), semantics
20: the query (its ``query`` prompt, a rerank ``instruction`` in its place) and the
documents (their ``document`` prompt) go to the replica as one EmbedWork, the query first,
so it is encoded once per request and the documents are packed end to end in its steps;
rerank documents are chunked as for every other rerank method, a document's relevance its
best chunk's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.chunks import NO_CHUNKING, ChunkOptions, Chunks, request_chunks
from app.embeddings import input_limit
from app.retrieval_inputs import (
    check_texts,
    embed_work,
    encode_role,
    head_of,
    lexical_weights,
    maxsim,
    role_prompt,
    scored_tokens,
    skiplist_ids,
    sparse_dots,
    special_ids,
)
from app.schema import RerankRequest, ScoreRequest
from app.timings import Backend, Timings, replica_answer
from app.validation import (
    check_item_count,
    check_model_name,
    is_text_request,
    validate_body,
    validate_request,
)
from replicas.answers import HybridVectors, SparseVectors, TokenVectors
from replicas.contract import EmbedWork, ModelInfo, PoolingHead
from replicas.embed_contract import LateInteraction
from replicas.errors import Reason, ScoringError

MEAN_MAXSIM = LateInteraction(similarity="meanmaxsim")  # BGE-M3's colbert_score


@dataclass(frozen=True)
class PairWork:
    """A query (input 0) and its documents as one EmbedWork, and the tokens it holds."""

    work: EmbedWork
    prompt_tokens: int


def pair_work(
    info: ModelInfo, tokenizer: Any, query: str, documents: Sequence[str],
    instruction: str | None, adapter: str | None, param: str,
) -> PairWork:  # fmt: skip
    """The query and ``documents`` encoded in their roles, one work."""
    check_texts([query], "query")
    check_texts(documents, param)
    head, limit = head_of(info), input_limit(info)
    prompt = role_prompt(head, "query", instruction)
    first = encode_role(tokenizer, [query], "query", prompt, head, limit, "query", cut=False)
    docs = role_prompt(head, "document")
    rest = encode_role(tokenizer, documents, "document", docs, head, limit, param, cut=False)
    work = embed_work([first, rest], info, param)
    work = dataclasses.replace(work, adapter=adapter)
    return PairWork(work, sum(len(ids) for ids in work.inputs))


def score_pair_work(
    info: ModelInfo, tokenizer: Any, payload: Any
) -> tuple[ScoreRequest, PairWork | None]:
    """A /v1/score body (text query and items, no labels); None for ``items: []``."""
    request = validate_request(payload)
    adapter = check_model_name(request.model, info)
    if request.label_token_ids is not None:
        raise ScoringError(
            Reason.LABELS_WITH_HEAD,
            f"label_token_ids: model {info.name!r} is a {info.kind} model; its score is the "
            "query's and the item's similarity, omit label_token_ids",
            param="label_token_ids",
        )
    check_item_count(len(request.items), info)
    if not is_text_request(request):
        raise ScoringError(
            Reason.INVALID_REQUEST,
            f"query: a {info.kind} model scores text (its prompts and lengths are applied "
            "to it); token ids are not taken",
            "query",
        )
    if not request.items:
        return request, None
    items = [str(item) for item in request.items]
    return request, pair_work(info, tokenizer, str(request.query), items, None, adapter, "items")


def rerank_pair_work(
    info: ModelInfo, tokenizer: Any, payload: Any, defaults: ChunkOptions = NO_CHUNKING
) -> tuple[RerankRequest, PairWork | None, Chunks]:
    """A /v1/rerank body, its documents chunked (app.chunks); None for ``documents: []``."""
    request = validate_body(payload, RerankRequest)
    adapter = check_model_name(request.model, info)
    check_item_count(len(request.documents), info)
    chunks = request_chunks(tokenizer, request, defaults, info)
    if not chunks.texts:
        return request, None, chunks
    texts = list(chunks.texts)
    pair = pair_work(
        info, tokenizer, request.query, texts, request.instruction, adapter, "documents"
    )
    return request, pair, chunks


async def similarities(
    info: ModelInfo, tokenizer: Any, pair: PairWork, backend: Backend, timings: Timings
) -> tuple[np.ndarray, Timings]:
    """Each document's similarity with the query (float64), from the replica's answer."""
    answer, timings = await replica_answer(pair.work, backend, timings)
    head, work = head_of(info), pair.work
    if head.late is not None:
        lengths = [len(ids) for ids in work.inputs]
        vectors = TokenVectors.checked(answer, lengths, head.dimension)
        skip = skiplist_ids(tokenizer, head.late)
        query = scored_tokens(vectors[0], work.inputs[0], "query", head.late, skip)
        documents = [
            scored_tokens(v, ids, "document", head.late, skip)
            for v, ids in zip(vectors[1:], work.inputs[1:], strict=True)
        ]
        return maxsim(query, documents, head.late), timings
    if head.hybrid is not None:
        return hybrid_scores(special_ids(tokenizer), work, answer, head), timings
    sparse = SparseVectors.checked(answer, work.num_items, head.dimension)
    return sparse_dots(sparse[0], sparse[1:]), timings


def hybrid_scores(
    specials: frozenset[int], work: EmbedWork, answer: Any, head: PoolingHead
) -> np.ndarray:
    """BGE-M3's ``colbert+sparse+dense`` score of each document (FlagEmbedding's
    ``compute_score``): the weighted mean of the dense dot product, the lexical weights'
    dot product (``specials``: the tokenizer's ``special_ids``, left out) and the
    multi-vector score (MaxSim over the query's vectors' count)."""
    hybrid = head.hybrid
    lengths = [len(ids) for ids in work.inputs]
    parts = HybridVectors.checked(answer, lengths, head.dimension, hybrid.colbert_dimension)
    lexical = [
        lexical_weights(ids, p[2], specials) for ids, p in zip(work.inputs, parts, strict=True)
    ]
    (dense, vectors, _), rest = parts[0], parts[1:]
    dense_scores = np.asarray([np.dot(dense, p[0]) for p in rest], np.float64)
    sparse_scores = sparse_dots(lexical[0], lexical[1:])
    colbert_scores = maxsim(vectors, [p[1] for p in rest], MEAN_MAXSIM)
    w_dense, w_sparse, w_colbert = hybrid.weights
    total = w_dense * dense_scores + w_sparse * sparse_scores + w_colbert * colbert_scores
    return total / (w_dense + w_sparse + w_colbert)
