"""``python -m batch rerank``: each row's (query, document) relevance as /v1/rerank gives it.

``RerankPrepare`` (CPU): each row prepared by the route's own ``Reranker`` (the configured
``rerank_method`` and template) -> a one-item ScoreWork (yes_no, head) or a one-prompt
PromptWork (query_likelihood) as token ids, or the route's 400; on a cross-encoder by the
route's ``prepare_pairs`` -> an EmbedWork of its (query, document) pairs (one per chunk),
whose logits go through the model's activation (``CrossEncoder.predict``); on a
late-interaction, sparse or hybrid model by the route's ``rerank_pair_work`` -> one EmbedWork
of the query and the document's chunks, whose relevance is their MaxSim, sparse dot product
or ``colbert+sparse+dense`` score (``batch.retrieval.similarities``, as
``app.retrieval_scores`` reads the answer). The engine stage
(``batch.works.EngineWorks``, or ``ServeWorks``) packs a batch's works (yes_no: rows
that share a query as one multi-item work, as ``score`` packs; query_likelihood: every row's
prompt in one prompt work, whose shared blocks the engine computes once) and
``RerankResults`` gives each row ``app.rerank.work_relevance`` of its own answer.

Chunking (semantics 24) is the route's: the config's ``max_chunks_per_doc``, ``chunk_tokens``,
``chunk_overlap`` and ``chunk_aggregation``, or the job's ``--max-chunks-per-doc``,
``--chunk-tokens``, ``--chunk-aggregation``; a chunked row's work holds its chunks as items
(prompts), and its relevance is their max or mean (``app.chunks.aggregate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.chunks import aggregate
from app.cross_encoder import Pairs, activated, prepare_pairs
from app.rerank import RerankWork, work_relevance
from app.retrieval_scores import PairWork, rerank_pair_work
from batch.retrieval import Retrieval, similarities
from batch.works import PrepareWorks, Work
from replicas.contract import EmbedWork
from replicas.errors import Reason, ScoringError


@dataclass(frozen=True)
class RerankColumns:
    query: str = "query"
    document: str = "document"
    id: str = "id"
    max_chunks_per_doc: int | None = None  # None: the config's (the route's defaults)
    chunk_tokens: int | None = None
    chunk_aggregation: str | None = None

    def chunking(self) -> dict[str, Any]:
        """The request fields the job sets (the route's names)."""
        fields = ("max_chunks_per_doc", "chunk_tokens", "chunk_aggregation")
        return {name: getattr(self, name) for name in fields if getattr(self, name) is not None}


class RerankPrepare(PrepareWorks):
    """The route's Reranker per CPU actor."""

    def prepare(self, row: dict[str, Any]) -> RerankWork | Pairs | PairWork | ScoringError:
        payload = {
            "query": row.get(self._columns.query),
            "documents": [row.get(self._columns.document)],
            **self._columns.chunking(),
        }
        service = self._service
        reranker, kind = service.reranker, service.info.model_kind
        similarity = kind.embeds and not kind.pairs and not kind.vectors
        if reranker is None and not (kind.pairs or similarity):
            raise ValueError("rerank: the model has no rerank template (setting rerank_template)")
        try:
            if reranker is None and similarity:  # the query's and the document's encodings
                info, tokenizer = service.info, service.tokenizer
                pair = rerank_pair_work(info, tokenizer, payload, service.chunking)[1]
                if pair is None:  # no text to score: as documents []
                    return ScoringError(Reason.EMPTY_INPUT, "document: no text", "documents")
                return pair
            if reranker is None:  # a cross-encoder scores the pairs themselves
                tokenizer, route = service.tokenizer, "/v1/rerank"
                return prepare_pairs(tokenizer, service.info, payload, route, service.chunking)
            return reranker.prepare(payload, service.info, service.chunking)
        except ScoringError as error:
            return error


@dataclass(frozen=True)
class RerankResults:
    """``relevance``: each scored row's relevance (null: refused), its chunks' scores
    folded by ``aggregation`` (the job's or the config's ``chunk_aggregation``); a
    cross-encoder's logits through its ``activation`` first; a late-interaction, sparse or
    hybrid model's the similarities of its query and its chunks (``retrieval``)."""

    aggregation: str = "max"
    activation: str | None = None
    retrieval: Retrieval | None = None

    def __call__(
        self, batch: pa.Table, works: list[Work | None], answers: list[Any]
    ) -> dict[str, pa.Array]:
        relevance = [
            None if answer is None else aggregate(self._scores(work, answer), self.aggregation)  # type: ignore[arg-type]
            for work, answer in zip(works, answers, strict=True)
        ]
        return {"relevance": pa.array(relevance, pa.float64())}

    def _scores(self, work: Work, answer: Any) -> np.ndarray:
        if isinstance(work, EmbedWork) and self.retrieval is not None:  # [query, chunks...]
            return similarities(work, answer, self.retrieval)
        if isinstance(work, EmbedWork):  # [chunks, 1] logits, as the route scores them
            return activated(np.asarray(answer, np.float32), self.activation)[:, 0]
        return work_relevance(work, answer)


relevance_columns = RerankResults()  # the shipped config's aggregation (max)
