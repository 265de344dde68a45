"""The stages of ``rerank`` and ``loglik``, each a callable class (or function) for
``Dataset.map_batches`` on Arrow tables, as ``score``'s (batch.stages):

``PrepareRows`` (CPU): each row prepared by the route's own code (``prepare``, a subclass's)
-> its work as token-id columns (batch.works), or the route's 400 in ``error`` /
``error_message``. ``EngineWorks`` (one per accelerator host): the batch's works packed ->
one ``score_batch`` call -> the mode's result columns (``results``, token ids and answers
only: no tokenizer on the engine actors). ``finish_rows`` (CPU): the tally, helper columns
dropped. ``--engine serve`` swaps ``EngineWorks`` for ``batch.serve_stage.ServeWorks``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from app.service import ScoringService
from batch.stages import counted_call, report, with_columns
from batch.works import WORK_COLUMNS, Work, read_works, row_answers, work_columns
from replicas.errors import ScoringError
from replicas.serving.setup import DEFAULT_ENGINE, load_engine_factory
from replicas.settings import ReplicaSettings

Results = Callable[[pa.Table, list[Work | None], list[Any]], dict[str, pa.Array]]


class PrepareRows:
    """The route's ScoringService per CPU actor; ``prepare(row)`` (a subclass's) gives a
    row's work or the route's ScoringError; ``extra(prepared)`` more helper columns."""

    def __init__(self, settings: ReplicaSettings, columns: Any) -> None:
        self._service = ScoringService.from_settings(settings)
        self._columns = columns

    @classmethod
    def around(cls, service: ScoringService, columns: Any) -> Any:
        """The stage over a service already built (in-process use, tests)."""
        stage = cls.__new__(cls)
        stage._service, stage._columns = service, columns
        return stage

    def prepare(self, row: dict[str, Any]) -> Any:
        raise TypeError(f"{type(self).__name__} does not prepare rows")

    def extra(self, prepared: list[Any]) -> dict[str, pa.Array]:
        return {}

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = [self.prepare(row) for row in batch.to_pylist()]
        errors = [p if isinstance(p, ScoringError) else None for p in prepared]
        works = [None if isinstance(p, ScoringError) else self.work_of(p) for p in prepared]
        return with_columns(
            batch,
            work_columns(works)
            | self.extra(prepared)
            | {
                "error": pa.array([e.reason.value if e else None for e in errors], pa.string()),
                "error_message": pa.array([e.message if e else None for e in errors], pa.string()),
            },
        )

    def work_of(self, prepared: Any) -> Work:
        """The work of a prepared row (``prepared.work``)."""
        return prepared.work


class EngineWorks:
    """One engine per actor, made as a serving replica makes it; ``results`` (a module-level
    function of the mode) turns each row's answer into the mode's columns."""

    def __init__(
        self,
        settings: ReplicaSettings,
        results: Results,
        tally: Any,
        engine_factory: str = DEFAULT_ENGINE,
        adapter: str | None = None,
    ) -> None:
        self._engine = load_engine_factory(engine_factory)(settings)
        self._results, self._tally, self._adapter = results, tally, adapter

    @classmethod
    def around(
        cls, engine: Any, results: Results, tally: Any = None, adapter: str | None = None
    ) -> EngineWorks:
        """The stage over an engine already built (in-process use, tests)."""
        stage = cls.__new__(cls)
        stage._engine, stage._results, stage._tally = engine, results, tally
        stage._adapter = adapter
        return stage

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = read_works(batch, self._adapter)
        info = self._engine.info
        multi_item = info.multi_item_scoring_delimiter is not None

        def call(packed: list[Work]) -> list[Any]:
            return counted_call(self._engine, packed, self._tally)

        answers = row_answers(works, info.limits, multi_item, call)
        return with_columns(batch, self._results(batch, works, answers))


def finish_rows(batch: pa.Table, result: str, helpers: tuple[str, ...], tally: Any) -> pa.Table:
    """Rows, items (rows with a ``result``) and refusals by reason to ``tally``; the helper
    columns dropped."""
    errors = [e for e in batch.column("error").to_pylist() if e is not None]
    items = sum(v is not None for v in batch.column(result).to_pylist())
    counts = {"rows": batch.num_rows, "items": items}
    report(tally, counts | {f"error:{e}": errors.count(e) for e in set(errors)})
    return batch.drop_columns([c for c in (*WORK_COLUMNS, *helpers) if c in batch.column_names])
