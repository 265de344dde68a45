"""Chunked rerank (semantics 24): long documents cut into chunks, each chunk an item behind
the one query, and the chunks' scores folded back into one relevance per document.

Every ``rerank_method`` (yes_no, query_likelihood, head, cosine, a cross-encoder) and the
batch ``rerank`` mode use the same two steps: ``chunk_documents`` turns the request's
documents into the texts the method scores (one per document when chunking is off, so
today's answers stay), and ``Chunks.fold`` turns one score per chunk into each document's
relevance (its best chunk's or the mean) and, asked for, its ``relevant_spans``.

A chunk is a window of ``chunk_tokens`` document tokens (the tokenizer's, without special
tokens, after ``max_tokens_per_doc``); its text is the document's slice from its first token's
start to its last token's end (the fast tokenizer's offset mapping, in codepoints), so
``document[start:end]`` is exactly what was scored and a chunk scores as that slice sent as a
document of its own. The first chunk starts at 0 and a chunk that reaches the end of the
document ends at its end, so a document that fits in one chunk is scored whole, as without
chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.schema import RerankRequest
from app.tokenization import fast_offsets
from app.validation import encodable
from replicas.contract import ModelInfo
from replicas.errors import Reason, ScoringError
from replicas.settings import HttpSettings

DEFAULT_SPAN_THRESHOLD = 0.1
SEARCH_UNIT_DOCUMENTS = 100  # Cohere: a search unit is one query with up to 100 documents


@dataclass(frozen=True)
class SpanOptions:
    """``relevant_spans: {mode: enabled}``: which chunks a result lists."""

    threshold: float = DEFAULT_SPAN_THRESHOLD
    max_spans: int | None = None


@dataclass(frozen=True)
class ChunkOptions:
    """How one request's documents are chunked and their chunk scores folded."""

    max_chunks: int = 1
    chunk_tokens: int = 512
    overlap: int = 0
    aggregation: str = "max"
    spans: SpanOptions | None = None  # None: no relevant_spans in the results

    @property
    def on(self) -> bool:
        return self.max_chunks > 1 or self.spans is not None

    @classmethod
    def from_settings(cls, http: HttpSettings) -> ChunkOptions:
        """The config's defaults (``max_chunks_per_doc`` ... ``chunk_aggregation``)."""
        return cls(
            http.max_chunks_per_doc, http.chunk_tokens, http.chunk_overlap, http.chunk_aggregation
        )

    def for_request(self, request: RerankRequest, max_items: int) -> ChunkOptions:
        """The request's fields over these defaults. Spans turn chunking on: without a
        ``max_chunks_per_doc`` of its own such a request may cut a document into as many
        chunks as ``max_items_per_request`` holds."""
        spans = request.relevant_spans
        span_options = None
        if spans is not None and spans.mode == "enabled":
            threshold = DEFAULT_SPAN_THRESHOLD if spans.threshold is None else spans.threshold
            span_options = SpanOptions(threshold, spans.max_spans)
        max_chunks = request.max_chunks_per_doc or self.max_chunks
        if span_options is not None and request.max_chunks_per_doc is None and max_chunks == 1:
            max_chunks = max_items
        chunk_tokens = request.chunk_tokens or self.chunk_tokens
        overlap = self.overlap if request.chunk_overlap is None else request.chunk_overlap
        if request.chunk_overlap is None and overlap >= chunk_tokens:
            overlap = 0  # the config's overlap is for its own chunk size
        if overlap >= chunk_tokens:
            raise ScoringError(
                Reason.INVALID_CHUNKING,
                f"chunk_overlap: {overlap} must be below chunk_tokens={chunk_tokens}",
                "chunk_overlap",
            )
        aggregation = request.chunk_aggregation or self.aggregation
        return ChunkOptions(max_chunks, chunk_tokens, overlap, aggregation, span_options)


NO_CHUNKING = ChunkOptions()  # the shipped defaults: chunking off


@dataclass(frozen=True)
class Chunks:
    """The texts a rerank method scores: each document's chunks, in document order."""

    texts: tuple[str, ...]
    owners: tuple[int, ...]  # the document of each chunk
    bounds: tuple[tuple[int, int], ...]  # each chunk's [start, end) codepoints in its document
    documents: int
    options: ChunkOptions

    @property
    def search_units(self) -> int:
        """Cohere's billing: every 100 scored texts (a chunk counts as a document) a unit."""
        return max(1, -(-len(self.texts) // SEARCH_UNIT_DOCUMENTS))

    def check_count(self, max_items: int) -> None:
        """A 400 naming ``max_items_per_request`` when the chunks exceed it."""
        if len(self.texts) > max_items:
            raise ScoringError(
                Reason.TOO_MANY_CHUNKS,
                f"{self.documents} documents make {len(self.texts)} chunks (items), which "
                f"exceed max_items_per_request={max_items}; lower max_chunks_per_doc or "
                "raise chunk_tokens",
                param="max_chunks_per_doc",
            )

    def fold(self, scores: np.ndarray) -> tuple[np.ndarray, list[list[dict[str, Any]]] | None]:
        """Each document's relevance from its chunks' scores ``[chunks]`` (max or mean), and
        with spans asked each document's chunks scoring >= threshold, best first."""
        scores = np.asarray(scores, np.float64).reshape(len(self.texts))
        owners = np.asarray(self.owners, np.int64)
        how = self.options.aggregation
        relevance = np.asarray(
            [aggregate(scores[owners == doc], how) for doc in range(self.documents)], np.float64
        )
        spans = self.options.spans
        if spans is None:
            return relevance, None
        listed: list[list[dict[str, Any]]] = [[] for _ in range(self.documents)]
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], self.bounds[i][0]))
        for i in order:
            chosen = listed[self.owners[i]]
            full = spans.max_spans is not None and len(chosen) >= spans.max_spans
            if scores[i] >= spans.threshold and not full:
                start, end = self.bounds[i]
                chosen.append({"start": start, "end": end, "score": float(scores[i])})
        return relevance, listed


def aggregate(scores: np.ndarray, aggregation: str) -> float:
    """One document's relevance from its chunks' scores ``[chunks]``: max or mean."""
    values = np.asarray(scores, np.float64)
    return float(values.max() if aggregation == "max" else values.mean())


def request_chunks(
    tokenizer: Any, request: RerankRequest, defaults: ChunkOptions, info: ModelInfo
) -> Chunks:
    """The texts a rerank method scores for ``request``: its documents cut to
    ``max_tokens_per_doc`` and chunked by its options over ``defaults``; a 400 naming
    ``max_items_per_request`` when they are too many."""
    texts = [doc if isinstance(doc, str) else doc.text for doc in request.documents]
    max_items = info.limits.max_items_per_request
    options = defaults.for_request(request, max_items)
    chunks = chunk_documents(tokenizer, texts, options, request.max_tokens_per_doc)
    chunks.check_count(max_items)
    return chunks


def chunk_documents(
    tokenizer: Any, texts: Sequence[str], options: ChunkOptions, max_tokens: int | None
) -> Chunks:
    """The chunks of ``texts`` (``max_tokens``: the request's ``max_tokens_per_doc``). With
    chunking off, one text per document: cut as ``cut_texts`` cuts it."""
    if not options.on or not all(encodable(text) for text in texts):
        cut = cut_texts(tokenizer, list(texts), max_tokens) if max_tokens else list(texts)
        bounds = tuple((0, len(text)) for text in cut)
        return Chunks(tuple(cut), tuple(range(len(texts))), bounds, len(texts), options)
    chunked, owners, bounds = [], [], []
    # each text's tokens as [start, end) codepoint offsets (a fast tokenizer's mapping)
    for doc, offsets in enumerate(fast_offsets(tokenizer, texts, "max_chunks_per_doc")):
        for start, end in _windows(offsets, len(texts[doc]), options, max_tokens):
            chunked.append(texts[doc][start:end])
            owners.append(doc)
            bounds.append((start, end))
    return Chunks(tuple(chunked), tuple(owners), tuple(bounds), len(texts), options)


def _windows(
    offsets: list[tuple[int, int]], length: int, options: ChunkOptions, max_tokens: int | None
) -> list[tuple[int, int]]:
    """A document's chunks as codepoint bounds: windows of ``chunk_tokens`` tokens every
    ``chunk_tokens - overlap`` tokens, at most ``max_chunks``."""
    cut = offsets[:max_tokens] if max_tokens else offsets
    whole = len(cut) == len(offsets)  # nothing cut: the last chunk ends at the text's end
    size, step = options.chunk_tokens, options.chunk_tokens - options.overlap
    windows: list[tuple[int, int]] = []
    for first in range(0, max(len(cut), 1), step):
        if len(windows) == options.max_chunks:
            break
        window = cut[first : first + size]
        last = first + size >= len(cut)
        start = 0 if first == 0 else window[0][0]
        end = length if last and whole else max((e for _, e in window), default=length)
        windows.append((start, end))
        if last:
            break
    return windows


def cut_texts(tokenizer: Any, texts: list[str], limit: int) -> list[str]:
    """Each text cut to its first ``limit`` tokens (decoded back to text): the rerank
    request's ``max_tokens_per_doc`` without chunking."""
    if not texts or not all(encodable(text) for text in texts):
        return texts  # the route refuses text that cannot be encoded
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        text if len(ids) <= limit else tokenizer.decode(ids[:limit])
        for text, ids in zip(texts, encoded, strict=True)
    ]
