"""``python -m batch rerank``: each row's (query, document) relevance as /v1/rerank gives it.

``RerankPrepare`` (CPU): each row prepared by the route's own ``Reranker`` (the configured
``rerank_method`` and template) -> a one-item ScoreWork (yes_no, head) or a one-prompt
PromptWork (query_likelihood) as token ids, or the route's 400. The engine stage
(``batch.works.EngineWorks``, or ``ServeWorks``) packs a batch's works (yes_no: rows
that share a query as one multi-item work, as ``score`` packs; query_likelihood: every row's
prompt in one prompt work, whose shared blocks the engine computes once) and
``relevance_columns`` gives each row ``app.rerank.work_relevance`` of its own answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from app.rerank import RerankWork, work_relevance
from batch.works import PrepareWorks, Work
from replicas.contract import PromptWork
from replicas.errors import ScoringError


@dataclass(frozen=True)
class RerankColumns:
    query: str = "query"
    document: str = "document"
    id: str = "id"


class RerankPrepare(PrepareWorks):
    """The route's Reranker per CPU actor."""

    def prepare(self, row: dict[str, Any]) -> RerankWork | ScoringError:
        payload = {
            "query": row.get(self._columns.query),
            "documents": [row.get(self._columns.document)],
        }
        reranker = self._service.reranker
        if reranker is None:
            raise ValueError("rerank: the model has no rerank template (setting rerank_template)")
        try:
            return reranker.prepare(payload, self._service.info)
        except ScoringError as error:
            return error


def relevance_columns(
    batch: pa.Table, works: list[Work | None], answers: list[Any]
) -> dict[str, pa.Array]:
    """``relevance``: each scored row's relevance in [0, 1] (null: refused)."""
    relevance = [
        None
        if answer is None
        else float(work_relevance(work, [answer] if isinstance(work, PromptWork) else answer)[0])  # type: ignore[arg-type]
        for work, answer in zip(works, answers, strict=True)
    ]
    return {"relevance": pa.array(relevance, pa.float64())}
