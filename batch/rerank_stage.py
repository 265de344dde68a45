"""``python -m batch rerank``: each row's (query, document) relevance as /v1/rerank gives it.

One stage on the engine actors: each row is prepared by the route's own ``Reranker`` (the
configured ``rerank_method`` and template), the batch's works are merged (yes_no: rows that
share a query as one multi-item work, as ``score`` packs; query_likelihood: every row's
prompt in one prompt work per query, whose shared blocks the engine computes once), scored in
one engine call, and each row's relevance is ``Reranker.relevance`` of its own answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from app.errors import ScoreRequestError
from app.rerank import RerankWork
from batch.packing import pack_works, unpack
from batch.stages import ServiceStage
from replicas.contract import PromptWork, ScoringLimitError, ScoringLimits, check_limits


@dataclass(frozen=True)
class RerankColumns:
    query: str = "query"
    document: str = "document"
    id: str = "id"


def _fits(work: PromptWork, limits: ScoringLimits) -> bool:
    try:
        check_limits(work, limits, True)
    except ScoringLimitError:
        return False
    return True


def pack_prompts(
    works: Sequence[PromptWork | None], limits: ScoringLimits
) -> list[tuple[PromptWork, list[int]]]:
    """One-prompt works of the same kind (scored tail, top_k) merged into prompt works, in row
    order, cut where the next prompt would break a limit; with the rows each holds."""
    groups: dict[tuple, list[int]] = {}
    for row, work in enumerate(works):
        if work is not None:
            groups.setdefault((work.scored_tail, work.top_k, work.keep_lone_prefixes), []).append(
                row
            )
    packs: list[tuple[PromptWork, list[int]]] = []
    for rows in groups.values():
        first = works[rows[0]]
        assert first is not None
        current: list[int] = []
        for row in rows:
            prompts = tuple(p for r in [*current, row] for p in works[r].prompts)  # type: ignore[union-attr]
            candidate = PromptWork(
                prompts, first.top_k, None, first.keep_lone_prefixes, first.scored_tail
            )
            if current and not _fits(candidate, limits):
                packs.append(_prompt_pack(works, current))
                current = []
            current.append(row)
        packs.append(_prompt_pack(works, current))
    return packs


def _prompt_pack(
    works: Sequence[PromptWork | None], rows: list[int]
) -> tuple[PromptWork, list[int]]:
    first = works[rows[0]]
    assert first is not None
    prompts = tuple(p for r in rows for p in works[r].prompts)  # type: ignore[union-attr]
    return PromptWork(prompts, first.top_k, None, first.keep_lone_prefixes, first.scored_tail), rows


class RerankScore(ServiceStage):
    """An engine and the route's Reranker per actor."""

    def _prepare(self, row: dict[str, Any]) -> RerankWork | ScoreRequestError:
        payload = {
            "query": row.get(self._columns.query),
            "documents": [row.get(self._columns.document)],
        }
        reranker = self._service.reranker
        if reranker is None:
            raise ValueError("rerank: the model has no rerank template (setting rerank_template)")
        try:
            return reranker.prepare(payload, self._service.info)
        except ScoreRequestError as error:
            return error

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = [self._prepare(row) for row in batch.to_pylist()]
        answers = self._answers([p if isinstance(p, RerankWork) else None for p in prepared])
        reranker = self._service.reranker
        relevance = [
            None if a is None else float(reranker.relevance(p, a)[0])  # type: ignore[union-attr,arg-type]
            for p, a in zip(prepared, answers, strict=True)
        ]
        items = sum(r is not None for r in relevance)
        return self.finish(batch, prepared, items, {"relevance": pa.array(relevance, pa.float64())})

    def _answers(self, prepared: list[RerankWork | None]) -> list[Any]:
        """Each row's own answer (a ``[1, 2]`` log-prob array or a one-prompt list), None for
        a refused row or one without a document."""
        limits = self._engine.info.limits
        scoring = [
            p.work if p and not isinstance(p.work, PromptWork) and p.work.num_items else None
            for p in prepared
        ]
        prompts = [
            p.work if p and isinstance(p.work, PromptWork) and p.work.num_items else None
            for p in prepared
        ]
        multi_item = self._engine.info.multi_item_scoring_delimiter is not None
        score_packs = pack_works(scoring, limits, multi_item)
        prompt_packs = pack_prompts(prompts, limits)
        results = self._engine.score_batch(
            [p.work for p in score_packs] + [w for w, _ in prompt_packs]
        )
        out: list[Any] = [None] * len(prepared)
        for row, rows in enumerate(unpack(score_packs, results[: len(score_packs)], len(prepared))):
            if scoring[row] is not None:
                out[row] = rows
        for (_, rows), answer in zip(prompt_packs, results[len(score_packs) :], strict=True):
            for at, row in enumerate(rows):
                out[row] = [answer[at]]
        return out
