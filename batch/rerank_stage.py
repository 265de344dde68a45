"""``python -m batch rerank``: each row's (query, document) relevance as /v1/rerank gives it.

``RerankPrepare`` (CPU): each row prepared by the route's own ``Reranker`` (the configured
``rerank_method`` and template) -> a one-item ScoreWork (yes_no, head) or a one-prompt
PromptWork (query_likelihood) as token ids, or the route's 400. The engine stage
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

import pyarrow as pa

from app.chunks import aggregate
from app.rerank import RerankWork, work_relevance
from batch.works import PrepareWorks, Work
from replicas.errors import ScoringError


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

    def prepare(self, row: dict[str, Any]) -> RerankWork | ScoringError:
        payload = {
            "query": row.get(self._columns.query),
            "documents": [row.get(self._columns.document)],
            **self._columns.chunking(),
        }
        reranker = self._service.reranker
        if reranker is None:
            raise ValueError("rerank: the model has no rerank template (setting rerank_template)")
        try:
            return reranker.prepare(payload, self._service.info, self._service.chunking)
        except ScoringError as error:
            return error


@dataclass(frozen=True)
class RerankResults:
    """``relevance``: each scored row's relevance (null: refused), its chunks' scores
    folded by ``aggregation`` (the job's or the config's ``chunk_aggregation``)."""

    aggregation: str = "max"

    def __call__(
        self, batch: pa.Table, works: list[Work | None], answers: list[Any]
    ) -> dict[str, pa.Array]:
        relevance = [
            None if answer is None else aggregate(work_relevance(work, answer), self.aggregation)  # type: ignore[arg-type]
            for work, answer in zip(works, answers, strict=True)
        ]
        return {"relevance": pa.array(relevance, pa.float64())}


relevance_columns = RerankResults()  # the shipped config's aggregation (max)
