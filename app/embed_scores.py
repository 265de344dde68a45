"""Bi-encoder scoring on an embedding model (semantics 20): /v1/score without labels answers
each item's cosine with the query as a one-element row, /v1/rerank ranks documents by it.

The query gets the model's ``query`` prompt when it has one (the rerank ``instruction``, when
given, in its place), items and documents none: vLLM's score semantics for embedding models.
Query and items go to the replica as one EmbedWork, the query first, so the query is
embedded once per request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.chunks import NO_CHUNKING, ChunkOptions, Chunks, request_chunks
from app.embeddings import Embedder, pooling_of
from app.schema import RerankRequest, ScoreRequest
from app.validation import (
    check_item_count,
    check_model_name,
    check_token_ids,
    check_unicode,
    is_text_request,
    validate_body,
    validate_request,
)
from replicas.contract import EmbedWork
from replicas.errors import Reason, ScoringError


@dataclass(frozen=True)
class CosineWork:
    """The query (input 0) and items of a cosine score or rerank request, and its tokens."""

    work: EmbedWork
    prompt_tokens: int

    def with_adapter(self, adapter: str | None) -> CosineWork:
        """The same request run with a LoRA adapter (semantics 21; None: the base)."""
        return dataclasses.replace(self, work=dataclasses.replace(self.work, adapter=adapter))


def _joined(query: EmbedWork, items: EmbedWork) -> CosineWork:
    lengths = ()
    if query.prompt_lengths or items.prompt_lengths:
        lengths = (
            query.prompt_length(0),
            *(items.prompt_length(i) for i in range(items.num_items)),
        )
    work = EmbedWork(query.inputs + items.inputs, lengths)
    return CosineWork(work, sum(len(ids) for ids in work.inputs))


def _texts(
    embedder: Embedder, query: str, items: list[str], prompt: str | None, param: str
) -> CosineWork:
    for name, text in (("query", query), *((param, item) for item in items)):
        if not text:
            raise ScoringError(Reason.EMPTY_INPUT, f"{name}: empty text is not embedded", name)
        check_unicode(text, name)
    return _joined(embedder.text_work([query], prompt), embedder.text_work(items, None))


def cosine_score_work(embedder: Embedder, payload: Any) -> tuple[ScoreRequest, CosineWork | None]:
    """A /v1/score body on an embedding model; None for ``items: []`` (no call)."""
    info = embedder.info
    request = validate_request(payload)
    adapter = check_model_name(request.model, info)
    head = pooling_of(info)
    if request.label_token_ids is not None:
        raise ScoringError(
            Reason.LABELS_WITH_HEAD,
            f"label_token_ids: model {info.name!r} is an embedding model; its score is the "
            "cosine of query and item, omit label_token_ids",
            param="label_token_ids",
        )
    check_item_count(len(request.items), info)
    text = is_text_request(request)
    if not request.items:
        return request, None
    if text:
        items = [str(item) for item in request.items]
        cosine = _texts(embedder, str(request.query), items, head.prompt("query"), "items")
        return request, cosine.with_adapter(adapter)
    lists = [list(request.query), *(list(item) for item in request.items)]  # type: ignore[arg-type]
    for name, ids in zip(["query"] + ["items"] * len(request.items), lists, strict=True):
        if not ids:
            raise ScoringError(Reason.EMPTY_INPUT, f"{name}: an empty token list", name)
        check_token_ids(ids, info.vocab_size, name)
    query = EmbedWork((tuple(lists[0]),))
    cosine = _joined(query, EmbedWork(tuple(tuple(ids) for ids in lists[1:])))
    return request, cosine.with_adapter(adapter)


def cosine_rerank_work(
    embedder: Embedder, payload: Any, defaults: ChunkOptions = NO_CHUNKING
) -> tuple[RerankRequest, CosineWork | None, Chunks]:
    """A /v1/rerank body on an embedding model (its documents chunked by ``defaults`` and
    the request, app.chunks); None for ``documents: []``."""
    info = embedder.info
    request = validate_body(payload, RerankRequest)
    adapter = check_model_name(request.model, info)
    head = pooling_of(info)
    check_item_count(len(request.documents), info)
    chunks = request_chunks(embedder.tokenizer, request, defaults, info)
    if not chunks.texts:
        return request, None, chunks
    prompt = request.instruction if request.instruction is not None else head.prompt("query")
    cosine = _texts(embedder, request.query, list(chunks.texts), prompt, "documents")
    return request, cosine.with_adapter(adapter), chunks
