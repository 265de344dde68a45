"""The stage skeleton every batch mode runs on Arrow tables (``Dataset.map_batches``),
written once; a mode (batch.modes) supplies only what differs.

``PrepareRows`` (CPU actor): each row, read once from Arrow as Python values, prepared by
the route's own code (a subclass's ``prepare``) -> the mode's helper columns (its works as
token ids), or the route's 400 in ``error`` / ``error_message``. ``EngineStage`` (one engine
per accelerator host) makes the engine as a serving replica makes it; a subclass packs the
batch's works into one ``score_batch`` call (``call``: the works' limits checked first, as a
replica checks them) and writes the answers' columns.
``finish_rows`` (CPU): the tally, the helper columns dropped.
"""

from __future__ import annotations

from typing import Any, Self

import pyarrow as pa

from app.service import ScoringService
from replicas.contract import check_model_limits
from replicas.errors import ScoringError
from replicas.serving.setup import DEFAULT_ENGINE, load_engine_factory
from replicas.settings import ReplicaSettings

# The engine's counters a batch job sums (batch.summary).
COUNTERS = (
    "computed_tokens",
    "useful_tokens",
    "reused_prefix_tokens",
    "query_cache_hits",
    "steps",
)


def with_columns(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    """``table`` with ``columns`` added (or replaced, by name)."""
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, values)
    return table


def report(tally: Any, counts: dict[str, int]) -> None:
    """Add ``counts`` to the job's tally, and wait: the summary read at the end sees them."""
    if tally is not None:
        import ray

        ray.get(tally.add.remote(counts))


def counted_call(engine: Any, works: list[Any], tally: Any) -> list[Any]:
    """``engine.score_batch(works)``; the engine's counters of the call go to ``tally``."""
    before = engine.stats()
    answers = engine.score_batch(works) if works else []
    after = engine.stats()
    counts = {name: getattr(after, name) - getattr(before, name) for name in COUNTERS}
    engine_ms = round(1000 * (after.engine_seconds - before.engine_seconds))
    report(tally, counts | {"engine_ms": engine_ms})
    return answers


def error_columns(errors: list[ScoringError | None]) -> dict[str, pa.Array]:
    """``error`` (the 400's reason) and ``error_message`` of each row (null: prepared)."""
    return {
        "error": pa.array([e.reason.value if e else None for e in errors], pa.string()),
        "error_message": pa.array([e.message if e else None for e in errors], pa.string()),
    }


class PrepareRows:
    """The route's ScoringService per CPU actor; ``prepare(row)`` (a subclass's) gives a
    row's prepared work or the route's ScoringError; ``helper_columns`` (a subclass's) the
    prepared rows (None: refused) as the columns the engine stage reads."""

    def __init__(self, settings: ReplicaSettings, columns: Any) -> None:
        self._service = ScoringService.from_settings(settings)
        self._columns = columns

    @classmethod
    def around(cls, service: ScoringService, columns: Any) -> Self:
        """The stage over a service already built (in-process use, tests)."""
        stage = cls.__new__(cls)
        stage._service, stage._columns = service, columns
        return stage

    def prepare(self, row: dict[str, Any]) -> Any:
        raise TypeError(f"{type(self).__name__} does not prepare rows")

    def helper_columns(self, prepared: list[Any]) -> dict[str, pa.Array]:
        raise TypeError(f"{type(self).__name__} writes no helper columns")

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = [self.prepare(row) for row in batch.to_pylist()]
        errors = [p if isinstance(p, ScoringError) else None for p in prepared]
        kept = [None if isinstance(p, ScoringError) else p for p in prepared]
        return with_columns(batch, self.helper_columns(kept) | error_columns(errors))


class EngineStage:
    """One engine per actor, made as a serving replica makes it (``engine_factory``, the
    same settings); ``payload``: what the mode's ``__call__`` turns answers into columns with
    (its columns, a results function, the dimensions); ``tally``: a ``batch.summary.Tally``
    actor (or None) the engine's counters go to; ``adapter``: the job's ``--model``."""

    def __init__(
        self,
        settings: ReplicaSettings,
        payload: Any,
        tally: Any,
        engine_factory: str = DEFAULT_ENGINE,
        adapter: str | None = None,
    ) -> None:
        self._engine = load_engine_factory(engine_factory)(settings)
        self._payload, self._tally, self._adapter = payload, tally, adapter

    @classmethod
    def around(
        cls, engine: Any, payload: Any = None, tally: Any = None, adapter: str | None = None
    ) -> Self:
        """The stage over an engine already built (in-process use, tests)."""
        stage = cls.__new__(cls)
        stage._engine, stage._payload, stage._tally = engine, payload, tally
        stage._adapter = adapter
        return stage

    def call(self, works: list[Any]) -> list[Any]:
        """The engine's answers to ``works``, its counters to the tally; each work is checked
        against the limits first, as a replica checks it (the engine trusts both)."""
        info = self._engine.info
        for work in works:
            check_model_limits(work, info)
        return counted_call(self._engine, works, self._tally)


def finish_rows(
    batch: pa.Table, result: str, helpers: tuple[str, ...], tally: Any, items: int | None = None
) -> pa.Table:
    """Rows, items (default: rows with a ``result``) and refusals by reason to ``tally``; the
    ``helpers`` columns dropped."""
    errors = [e for e in batch.column("error").to_pylist() if e is not None]
    if items is None:
        items = sum(v is not None for v in batch.column(result).to_pylist())
    counts = {"rows": batch.num_rows, "items": items}
    report(tally, counts | {f"error:{e}": errors.count(e) for e in set(errors)})
    return batch.drop_columns([c for c in helpers if c in batch.column_names])
