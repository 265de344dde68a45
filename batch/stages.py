"""The pipeline's stages, each a callable class for ``Dataset.map_batches`` on Arrow tables.

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
from app.service import ScoringService
from batch.packing import Pack, pack_works, unpack
from batch.rows import PreparedRow, ScoreColumns, prepare_rows
from replicas.contract import ScoreWork
from replicas.serving.setup import DEFAULT_ENGINE, load_engine_factory
from replicas.settings import ReplicaSettings

QUERY_IDS, ITEM_IDS, LOGPROBS = "_sj_query_ids", "_sj_item_ids", "_sj_logprobs"
HELPERS = (QUERY_IDS, ITEM_IDS, LOGPROBS)
# The engine's counters a batch job sums (batch.summary).
COUNTERS = (
    "computed_tokens",
    "useful_tokens",
    "reused_prefix_tokens",
    "query_cache_hits",
    "steps",
)
IDS = pa.list_(pa.int32())  # [tokens]
ITEMS = pa.list_(IDS)  # [items, tokens]
MATRIX = pa.list_(pa.list_(pa.float64()))  # [items, labels]


def _work_columns(prepared: list[PreparedRow]) -> dict[str, pa.Array]:
    works = [p.work for p in prepared]
    return {
        QUERY_IDS: pa.array([list(w.query_ids) if w else None for w in works], IDS),
        ITEM_IDS: pa.array([[list(i) for i in w.item_ids] if w else None for w in works], ITEMS),
        "error": pa.array([p.error for p in prepared], pa.string()),
        "error_message": pa.array([p.message for p in prepared], pa.string()),
    }


def with_columns(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    """``table`` with ``columns`` added (or replaced, by name)."""
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, values)
    return table


class Tokenize:
    """Validation and tokenization in CPU workers, with the ingress's own code."""

    def __init__(self, settings: ReplicaSettings, columns: ScoreColumns) -> None:
        self._service = ScoringService.from_settings(settings)
        self._columns = columns

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = prepare_rows(self._service, batch.to_pylist(), self._columns)
        return with_columns(batch, _work_columns(prepared))


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


class EngineScore:
    """One engine per actor, made as a serving replica makes it (``engine_factory``, the same
    settings); each batch's engine counters go to ``tally`` (a ``batch.summary.Tally``
    actor, or None)."""

    def __init__(
        self,
        settings: ReplicaSettings,
        columns: ScoreColumns,
        tally: Any,
        engine_factory: str = DEFAULT_ENGINE,
    ) -> None:
        self._engine = load_engine_factory(engine_factory)(settings)
        self._columns, self._tally = columns, tally

    @classmethod
    def around(cls, engine: Any, columns: ScoreColumns, tally: Any = None) -> EngineScore:
        """The stage over an engine already built (in-process use, tests)."""
        stage = cls.__new__(cls)
        stage._engine, stage._columns, stage._tally = engine, columns, tally
        return stage

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = row_works(batch, self._columns)
        info = self._engine.info
        packs = pack_works(works, info.limits, info.multi_item_scoring_delimiter is not None)
        answers = counted_call(self._engine, [pack.work for pack in packs], self._tally)
        return with_columns(batch, {LOGPROBS: logprob_column(works, packs, answers)})


def counted_call(engine: Any, works: list[Any], tally: Any) -> list[Any]:
    """``engine.score_batch(works)``; the engine's counters of the call go to ``tally``."""
    before = engine.stats()
    answers = engine.score_batch(works) if works else []
    after = engine.stats()
    counts = {name: after[name] - before[name] for name in COUNTERS}
    engine_ms = round(1000 * (after["engine_seconds"] - before["engine_seconds"]))
    report(tally, counts | {"engine_ms": engine_ms})
    return answers


def logprob_column(
    works: list[ScoreWork | None], packs: list[Pack], answers: list[Any]
) -> pa.Array:
    """Each row's ``[items, labels]`` log-probabilities from its pack's answer (null: refused)."""
    rows = unpack(packs, answers, len(works))
    return pa.array(
        [None if w is None else r.tolist() for w, r in zip(works, rows, strict=True)], MATRIX
    )


def report(tally: Any, counts: dict[str, int]) -> None:
    """Add ``counts`` to the job's tally, and wait: the summary read at the end sees them."""
    if tally is not None:
        import ray

        ray.get(tally.add.remote(counts))


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
    errors = [e for e in batch.column("error").to_pylist() if e is not None]
    counts = {"rows": batch.num_rows, "items": sum(len(s) for s in scores if s)}
    report(tally, counts | {f"error:{e}": errors.count(e) for e in set(errors)})
    return with_columns(batch.drop_columns(list(HELPERS)), {"scores": pa.array(scores, MATRIX)})
