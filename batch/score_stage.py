"""``python -m batch score``: each row's /v1/score answer, on the stage skeleton
(batch.stages).

``Tokenize`` (CPU): each row -> its /v1/score work, or its 400 reason (app/'s rules).
``EngineScore`` (one per accelerator host): the batch's works packed by query -> one
``ScoringEngine.score_batch`` call -> each row's log-probabilities.
``finish`` (CPU): log-probabilities -> scores (``app.scores.to_scores``), helper columns dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from app.scores import to_scores
from batch.packing import Pack, pack_works, unpack
from batch.rows import ScoreColumns, row_payload
from batch.stages import EngineStage, PrepareRows, finish_rows, with_columns
from replicas.contract import ScoreWork
from replicas.errors import ScoringError

QUERY_IDS, ITEM_IDS, LOGPROBS = "_sj_query_ids", "_sj_item_ids", "_sj_logprobs"
HELPERS = (QUERY_IDS, ITEM_IDS, LOGPROBS)
IDS = pa.list_(pa.int32())  # [tokens]
ITEMS = pa.list_(IDS)  # [items, tokens]
MATRIX = pa.list_(pa.list_(pa.float64()))  # [items, labels]


class Tokenize(PrepareRows):
    """Validation and tokenization in CPU workers, with the ingress's own code: a row gets
    exactly the work (or the error) that the same row sent to ``/v1/score`` gets."""

    def prepare(self, row: dict[str, Any]) -> ScoreWork | ScoringError:
        try:
            return self._service.prepare(row_payload(row, self._columns)).work
        except ScoringError as error:
            return error

    def helper_columns(self, prepared: list[Any]) -> dict[str, pa.Array]:
        works: list[ScoreWork | None] = prepared
        return {
            QUERY_IDS: pa.array([list(w.query_ids) if w else None for w in works], IDS),
            ITEM_IDS: pa.array(
                [[list(i) for i in w.item_ids] if w else None for w in works], ITEMS
            ),
        }


def row_works(batch: pa.Table, columns: ScoreColumns) -> list[ScoreWork | None]:
    """The works ``Tokenize`` wrote into ``batch`` (None: the row was refused)."""
    queries = batch.column(QUERY_IDS).to_pylist()
    items = batch.column(ITEM_IDS).to_pylist()
    return [
        None
        if query is None
        else ScoreWork(
            tuple(query),
            tuple(tuple(i) for i in item),
            columns.label_token_ids,
            columns.item_first,
            adapter=columns.model,
        )
        for query, item in zip(queries, items, strict=True)
    ]


class EngineScore(EngineStage):
    """The engine stage of ``score`` (payload: the ``ScoreColumns``, whose ``model`` is the
    adapter every row runs with)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = row_works(batch, self._payload)
        info = self._engine.info
        packs = pack_works(works, info.limits, info.multi_item_scoring_delimiter is not None)
        answers = self.call([pack.work for pack in packs])
        return with_columns(batch, {LOGPROBS: logprob_column(works, packs, answers)})


def logprob_column(
    works: list[ScoreWork | None], packs: list[Pack], answers: list[Any]
) -> pa.Array:
    """Each row's ``[items, labels]`` log-probabilities from its pack's answer (null: refused)."""
    rows = unpack(packs, answers, len(works))
    return pa.array(
        [None if w is None else r.tolist() for w, r in zip(works, rows, strict=True)], MATRIX
    )


def _scores(logprobs: list[list[float]] | None, apply_softmax: bool) -> list[list[float]] | None:
    if logprobs is None:
        return None
    return (
        to_scores(np.asarray(logprobs, np.float64).reshape(len(logprobs), -1), apply_softmax)
        if logprobs
        else []
    )


def finish(batch: pa.Table, apply_softmax: bool, tally: Any = None) -> pa.Table:
    """Log-probabilities -> the ``scores`` /v1/score answers (null for a refused row), the
    helper columns dropped; rows, items and errors by reason go to ``tally``."""
    scores = [_scores(row, apply_softmax) for row in batch.column(LOGPROBS).to_pylist()]
    items = sum(len(s) for s in scores if s)
    finished = finish_rows(batch, LOGPROBS, HELPERS, tally, items)
    return with_columns(finished, {"scores": pa.array(scores, MATRIX)})


def finish_scores(batch: pa.Table, columns: ScoreColumns, tally: Any = None) -> pa.Table:
    """``finish`` with the job's ``apply_softmax`` (the mode's finishing step)."""
    return finish(batch, columns.apply_softmax, tally)
