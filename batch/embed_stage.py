"""``python -m batch embed``: each row's /v1/embeddings vector on an embedding model
(semantics 20) in an ``embedding`` column (a fixed-size list of float32), with ``error`` and
``error_message`` as the other modes write them.

``EmbedPrepare`` (CPU actor): the row's text prepared by the route's own code
(``app.embeddings.Embedder``: the prompt in front, the model's length limit), or the route's
400. ``EmbedEngine`` (one engine per actor) or ``ServeEmbed`` (``--engine serve``: the
ingress's ``score_work`` through its handle): the batch's rows packed by length into
EmbedWorks within the request limits, so every engine call runs full rows of inputs end to
end, then each row's vector (Matryoshka ``--dimensions`` applied). ``embed_dataset`` chains
them; ``finish_embed`` tallies the rows and drops the helper columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import ray.data

from app.embeddings import matryoshka
from batch.grouping import GroupBy, engine_map, job_grouping
from batch.pipeline import EngineOptions, engine_remote_args
from batch.rows import plain
from batch.serve_stage import call_all
from batch.stages import counted_call, report, with_columns
from batch.work_stages import PrepareRows
from replicas.contract import EmbedWork, ScoringLimits
from replicas.errors import Reason, ScoringError
from replicas.serving.setup import DEFAULT_ENGINE, load_engine_factory
from replicas.settings import ReplicaSettings, SettingsError

IDS, SKIP = "_sj_embed_ids", "_sj_embed_skip"
HELPERS = (IDS, SKIP)


@dataclass(frozen=True)
class EmbedColumns:
    input: str = "text"
    id: str = "id"
    prompt_name: str | None = None
    dimensions: int | None = None


class EmbedPrepare(PrepareRows):
    """The route's tokenizer and prompts per CPU actor (``PrepareRows``'s service and
    columns; its own ``prepare`` and call)."""

    def prepare(self, row: dict[str, Any]) -> EmbedWork | ScoringError:
        text = plain(row.get(self._columns.input))
        if not isinstance(text, str):
            return ScoringError(Reason.INVALID_REQUEST, "input: one text per row", "input")
        payload: dict[str, Any] = {"input": text}
        if self._columns.prompt_name is not None:
            payload["prompt_name"] = self._columns.prompt_name
        try:
            return self._service.embedder.prepare(payload).work
        except ScoringError as error:
            return error

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = [self.prepare(row) for row in batch.to_pylist()]
        errors = [p if isinstance(p, ScoringError) else None for p in prepared]
        works = [p if isinstance(p, EmbedWork) else None for p in prepared]
        return with_columns(
            batch,
            {
                IDS: pa.array(
                    [list(w.inputs[0]) if w else None for w in works], pa.list_(pa.int32())
                ),
                SKIP: pa.array([w.prompt_length(0) if w else None for w in works], pa.int32()),
                "error": pa.array([e.reason.value if e else None for e in errors], pa.string()),
                "error_message": pa.array([e.message if e else None for e in errors], pa.string()),
            },
        )


def pack_rows(
    batch: pa.Table, limits: ScoringLimits, adapter: str | None = None
) -> list[tuple[EmbedWork, list[int]]]:
    """The batch's prepared rows, longest first, in EmbedWorks of at most
    ``max_items_per_request`` inputs and ``max_request_tokens`` tokens, each run with
    ``adapter`` (``--model``; None: the base); with each one's rows."""
    ids, skips = batch.column(IDS).to_pylist(), batch.column(SKIP).to_pylist()
    rows = sorted((r for r, i in enumerate(ids) if i is not None), key=lambda r: -len(ids[r]))
    packs: list[tuple[EmbedWork, list[int]]] = []
    current: list[int] = []
    tokens = 0
    budget = limits.max_request_tokens or 1 << 62
    for row in rows:
        length = len(ids[row])
        if current and (len(current) >= limits.max_items_per_request or tokens + length > budget):
            packs.append((_work(ids, skips, current, adapter), current))
            current, tokens = [], 0
        current.append(row)
        tokens += length
    if current:
        packs.append((_work(ids, skips, current, adapter), current))
    return packs


def _work(ids: list[Any], skips: list[Any], rows: list[int], adapter: str | None) -> EmbedWork:
    lengths = tuple(int(skips[r] or 0) for r in rows)
    inputs = tuple(tuple(ids[r]) for r in rows)
    return EmbedWork(inputs, lengths if any(lengths) else (), adapter=adapter)


def embedding_column(
    rows: int, packs: Sequence[tuple[EmbedWork, list[int]]], answers: Sequence[Any], size: int,
    dimensions: int | None,
) -> pa.Array:  # fmt: skip
    """Each row's vector (Matryoshka-cut) as a fixed-size list of float32; null: refused."""
    width = dimensions or size
    values = np.zeros((rows, width), np.float32)
    valid = np.zeros(rows, bool)
    for (_, members), answer in zip(packs, answers, strict=True):
        values[members] = matryoshka(np.asarray(answer, np.float32), dimensions)
        valid[members] = True
    flat = pa.array(values.reshape(-1), pa.float32())
    array = pa.FixedSizeListArray.from_arrays(flat, width)
    return pa.array(
        [v if ok else None for v, ok in zip(array.to_pylist(), valid, strict=True)],
        pa.list_(pa.float32(), width),
    )


class EmbedEngine:
    """One engine per actor, made as a serving replica makes it."""

    def __init__(
        self, settings: ReplicaSettings, dimensions: int | None, tally: Any,
        engine_factory: str = DEFAULT_ENGINE, adapter: str | None = None,
    ) -> None:  # fmt: skip
        self._engine = load_engine_factory(engine_factory)(settings)
        self._dimensions, self._tally, self._adapter = dimensions, tally, adapter

    @classmethod
    def around(
        cls, engine: Any, dimensions: int | None = None, tally: Any = None,
        adapter: str | None = None,
    ) -> EmbedEngine:  # fmt: skip
        stage = cls.__new__(cls)
        stage._engine, stage._dimensions, stage._tally = engine, dimensions, tally
        stage._adapter = adapter
        return stage

    def __call__(self, batch: pa.Table) -> pa.Table:
        info = self._engine.info
        packs = pack_rows(batch, info.limits, self._adapter)
        answers = counted_call(self._engine, [w for w, _ in packs], self._tally)
        size = info.pooling.dimension
        column = embedding_column(batch.num_rows, packs, answers, size, self._dimensions)
        return with_columns(batch, {"embedding": column})


class ServeEmbed:
    """``--engine serve``: each pack to the ingress's ``score_work`` (checked again there),
    at most ``max_in_flight`` calls outstanding; 503s sent again after Retry-After."""

    def __init__(
        self, app: str, dimensions: int | None, tally: Any, max_in_flight: int = 4,
        adapter: str | None = None,
    ) -> None:  # fmt: skip
        from ray import serve

        self._handle = serve.get_app_handle(app)
        self._info = self._handle.describe.remote().result()
        self._dimensions, self._tally, self._max = dimensions, tally, max_in_flight
        self._adapter = adapter

    def __call__(self, batch: pa.Table) -> pa.Table:
        packs = pack_rows(batch, self._info.limits, self._adapter)
        send: Callable[[Any], Any] = self._handle.score_work.remote
        answers = call_all(send, [w for w, _ in packs], self._max, self._tally)
        size = self._info.pooling.dimension
        column = embedding_column(batch.num_rows, packs, answers, size, self._dimensions)
        return with_columns(batch, {"embedding": column})


def finish_embed(batch: pa.Table, tally: Any) -> pa.Table:
    errors = [e for e in batch.column("error").to_pylist() if e is not None]
    items = sum(v is not None for v in batch.column("embedding").to_pylist())
    counts = {"rows": batch.num_rows, "items": items}
    report(tally, counts | {f"error:{e}": errors.count(e) for e in set(errors)})
    return batch.drop_columns([c for c in HELPERS if c in batch.column_names])


def embed_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: EmbedColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each row's ``embedding`` as /v1/embeddings gives it, with ``error`` and
    ``error_message``: prepare (CPU actor) -> engine actors or handle callers -> tally."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.pooling_config import pooling_head_for

    options = options or EngineOptions()
    source = resolve_model_source(settings.model.name)
    directory = None if source.is_gguf else source.directory
    head = pooling_head_for(
        directory, load_hf_config(source), settings.model.pooling, settings.model.normalize
    )
    if head is None:
        raise SettingsError(f"model: {settings.model.name} is not an embedding model")
    if columns.dimensions is not None and not 1 <= columns.dimensions <= head.dimension:
        raise SettingsError(f"--dimensions: 1..{head.dimension}, got {columns.dimensions}")
    # Rows of one token bucket together, whatever the input order: a call packs full steps.
    by_length = GroupBy("length", settings.engine.token_buckets, ids_column=IDS)
    grouping = job_grouping(ds, options, by_length, tally)
    prepared = ds.map_batches(
        EmbedPrepare, fn_constructor_args=(settings, columns), batch_format="pyarrow",
        batch_size=options.batch_size, concurrency=1, num_cpus=options.cpu_share,
    )  # fmt: skip
    if options.engine == "serve":
        args: tuple[Any, ...] = (
            options.app, columns.dimensions, tally, options.max_in_flight, options.adapter
        )  # fmt: skip
        embedded = engine_map(
            prepared, ServeEmbed, args, options, grouping, num_cpus=options.cpu_share
        )
    else:
        args = (settings, columns.dimensions, tally, options.engine_factory, options.adapter)
        remote = engine_remote_args(settings, options.engine_env)
        embedded = engine_map(prepared, EmbedEngine, args, options, grouping, **remote)
    finished = embedded.map_batches(
        finish_embed, fn_kwargs={"tally": tally}, batch_format="pyarrow", batch_size=None,
        num_cpus=options.cpu_share,
    )  # fmt: skip
    if keep is None:
        return finished
    wanted = [columns.id, *keep, "embedding", "error", "error_message"]
    return finished.select_columns(list(dict.fromkeys(wanted)))
