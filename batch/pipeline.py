"""Score a Ray Dataset: tokenize (CPU tasks) -> engine actors -> scores, and the whole job
(read, score, write, summary) that ``python -m batch score`` runs.

No scheduler of our own: Ray Data streams the blocks, sizes the actor pool, retries the work
of a dead actor and checkpoints written ids (``CheckpointConfig`` on the id column).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from batch.classify_stage import ClassifyColumns, ClassifyPrepare, ClassifyResults
from batch.grouping import (
    GroupBy,
    Grouping,
    engine_map,
    job_grouping,
    shuffle_blocks,
    shuffle_cost,
)
from batch.loglik_stage import CONTINUATION, LoglikColumns, LoglikPrepare, loglik_columns
from batch.rerank_stage import RerankColumns, RerankPrepare, relevance_columns
from batch.rows import ScoreColumns
from batch.serve_stage import ServeScore, ServeWorks
from batch.stages import EngineScore, Tokenize, finish
from batch.summary import Summary, Tally
from batch.work_stages import EngineWorks, finish_rows
from planning.serve_args import SERVE_CONFIG, serve_args
from replicas.serving.setup import DEFAULT_ENGINE
from replicas.settings import ReplicaSettings, SettingsError

RESULT_COLUMNS = ("scores", "error", "error_message")
FORMATS = ("parquet", "jsonl", "csv")
TALLY_PREFIX = "scorejax-batch-tally-"  # a running job's counts actor (named: findable)


def settings_from_config(config: Path | None = None) -> ReplicaSettings:
    """The scoring app's settings from a serve config (the shipped serve_config.yaml)."""
    return ReplicaSettings.from_mapping(serve_args(config or SERVE_CONFIG))


def engine_remote_args(
    settings: ReplicaSettings, env: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    """One engine actor holds one host's ``host_resources`` (as a serving replica does)."""
    resources = dict(settings.placement.host_bundle)
    args: dict[str, Any] = {
        "num_cpus": resources.pop("CPU", 0),
        "num_gpus": resources.pop("GPU", 0),
    }
    if resources:
        args["resources"] = resources
    if settings.placement.host_label_selector:
        args["label_selector"] = dict(settings.placement.host_label_selector)
    if env:
        args["runtime_env"] = {"env_vars": dict(env)}
    return args


@dataclass(frozen=True)
class EngineOptions:
    """How many engine actors, and how many rows each engine call receives."""

    replicas: int = 1
    batch_size: int = 512
    # CPUs of each tokenize actor, score task, read and write task: light work, so that on a
    # small cluster they never hold the CPUs an engine actor is waiting for.
    cpu_share: float = 0.25
    # "module:Class" whose from_settings makes the engine, as serving's engine_factory.
    engine_factory: str = DEFAULT_ENGINE
    # Environment variables of the engine actors (XLA/libtpu flags, a test's fault marker).
    engine_env: tuple[tuple[str, str], ...] = ()
    # "local": engine actors in the job; "serve": the running Serve app ``app`` scores.
    engine: str = "local"
    app: str = "scorejax"
    # --engine serve: calls each caller actor keeps in flight (so the job adds at most
    # replicas x max_in_flight calls to the app's queues).
    max_in_flight: int = 4
    # Rows brought together by query (or length) before the engine stage (batch.grouping);
    # False (--no-group): input already grouped, each call takes the next batch_size rows.
    group: bool = True
    # Rows per shuffled block when grouping (0: batch_size): one Ray Data task of the engine
    # stage, retried whole if its actor dies.
    block_rows: int = 0
    # The LoRA adapter every row runs with (``--model``; semantics 21); None: the base model.
    adapter: str | None = None


def score_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: ScoreColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """``ds`` scored as ``/v1/score`` scores each row: ``keep`` (None: every input column),
    the id column, then ``scores`` (null on a refused row), ``error`` and ``error_message``."""
    options = options or EngineOptions()
    _check_options(options)  # before the row count grouping takes
    shuffled = shuffle_blocks(ds, options)
    scored = ds.map_batches(
        Tokenize,
        fn_constructor_args=(settings, columns),
        batch_format="pyarrow",
        batch_size=options.batch_size,
        concurrency=1,
        num_cpus=options.cpu_share,
    )
    scored = _scoring_stage(scored, settings, columns, options, tally, shuffled)
    scored = scored.map_batches(
        finish,
        fn_kwargs={"apply_softmax": columns.apply_softmax, "tally": tally},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=options.cpu_share,
    )
    if keep is None:
        return scored
    return scored.select_columns(list(dict.fromkeys([columns.id, *keep, *RESULT_COLUMNS])))


def input_format(path: str) -> str:
    """``parquet``, ``jsonl`` or ``csv`` from a path's suffix (a local folder: its files')."""
    suffixes = {Path(path).suffix}
    if not Path(path).suffix and "://" not in path and Path(path).is_dir():
        suffixes = {p.suffix for p in Path(path).iterdir()}
    for name, endings in (
        ("parquet", {".parquet"}),
        ("csv", {".csv"}),
        ("jsonl", {".jsonl", ".json"}),
    ):
        if suffixes & endings:
            return name
    raise SettingsError(
        f"--input-format: none given, and {path} has no .jsonl, .parquet or .csv files"
    )


def _scoring_stage(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: ScoreColumns,
    options: EngineOptions,
    tally: Any,
    shuffled: int | None = None,
) -> ray.data.Dataset:
    """Engine actors (``local``) or handle callers (``serve``), ``options.replicas`` of them;
    ``shuffled``: the rows grouped by query into that many blocks first (None: not grouped)."""
    _check_options(options)
    grouping = (
        None if shuffled is None else Grouping(GroupBy("score"), shuffled, options.cpu_share, tally)
    )
    if options.engine == "serve":
        args = (options.app, settings, columns, tally, options.max_in_flight)
        return engine_map(ds, ServeScore, args, options, grouping, num_cpus=options.cpu_share)
    _check_local(settings)
    args = (settings, columns, tally, options.engine_factory)
    remote = engine_remote_args(settings, options.engine_env)
    return engine_map(ds, EngineScore, args, options, grouping, **remote)


def _check_options(options: EngineOptions) -> None:
    if options.engine not in ("local", "serve"):
        raise SettingsError(f"--engine: local or serve, got {options.engine!r}")
    if options.max_in_flight < 1:
        raise SettingsError(f"--max-in-flight: at least 1, got {options.max_in_flight}")


def _check_local(settings: ReplicaSettings) -> None:
    if settings.placement.hosts_per_replica > 1:
        raise SettingsError(
            "hosts_per_replica: --engine local runs one engine actor per host "
            f"(hosts_per_replica 1), got {settings.placement.hosts_per_replica}"
        )


def read_input(path: str, fmt: str | None = None, num_cpus: float = 0.25) -> ray.data.Dataset:
    """Parquet, JSON lines or CSV (``fmt``, else by suffix) from a path or URI."""
    fmt = fmt or input_format(path)
    if fmt == "parquet":
        return ray.data.read_parquet(path, num_cpus=num_cpus)
    if fmt == "csv":
        return ray.data.read_csv(path, num_cpus=num_cpus)
    if fmt == "jsonl":
        return ray.data.read_json(path, num_cpus=num_cpus)  # Arrow blocks (lines: pandas)
    raise SettingsError(f"--input-format: one of {FORMATS}, got {fmt!r}")


def _json_cells(batch: pa.Table) -> pa.Table:
    """Nested list columns as JSON text (CSV holds no lists)."""
    for name in batch.column_names:
        if pa.types.is_list(batch.schema.field(name).type):
            text = pa.array([None if v is None else json.dumps(v) for v in batch[name].to_pylist()])
            index = batch.column_names.index(name)
            batch = batch.set_column(index, name, text)
    return batch


def write_output(
    ds: ray.data.Dataset, output: str, output_format: str, num_cpus: float = 0.25
) -> ray.data.Dataset:
    """``ds`` written; the dataset that ran the write (its stats)."""
    if output_format == "parquet":
        ds.write_parquet(output, ray_remote_args={"num_cpus": num_cpus})
    elif output_format == "jsonl":
        ds.write_json(output, ray_remote_args={"num_cpus": num_cpus})
    elif output_format == "csv":
        ds = ds.map_batches(_json_cells, batch_format="pyarrow", batch_size=None, num_cpus=num_cpus)
        ds.write_csv(output, ray_remote_args={"num_cpus": num_cpus})
    else:
        raise SettingsError(f"--output-format: one of {FORMATS}, got {output_format!r}")
    return ds


def use_checkpoint(directory: str | None, id_column: str) -> None:
    """Ray Data's checkpointing on ``id_column`` under ``directory`` (None: off): rows whose
    id a write already recorded are filtered out at read, so a job run again with the same
    command computes only the rest."""
    from ray.data.checkpoint import CheckpointConfig

    context = ray.data.DataContext.get_current()
    context.checkpoint_config = (
        None
        if directory is None
        else CheckpointConfig(
            id_column, str(Path(directory).resolve()), delete_checkpoint_on_success=False
        )
    )


def _absolute(path: str) -> str:
    return path if "://" in path else str(Path(path).resolve())


def run_score_job(
    input_path: str,
    output: str,
    settings: ReplicaSettings,
    columns: ScoreColumns,
    options: EngineOptions | None = None,
    output_format: str = "parquet",
    keep: Sequence[str] | None = None,
    checkpoint: str | None = None,
    input_format: str | None = None,
) -> Summary:
    """Read, score, write; the job's summary."""
    options = options or EngineOptions()

    def scored(ds: ray.data.Dataset, tally: Any) -> ray.data.Dataset:
        return score_dataset(ds, settings, columns, options, keep, tally)

    job = Job(input_path, output, output_format, input_format, checkpoint, options.cpu_share)
    return job.run(scored, columns.id)


def rerank_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: RerankColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each (query, document) row's ``relevance`` as /v1/rerank gives it (the configured
    ``rerank_method``), with ``error`` and ``error_message`` as ``score_dataset``'s."""
    mode = WorkMode(RerankPrepare, relevance_columns, ("relevance",), group="query")
    return _work_dataset(ds, settings, mode, columns, options or EngineOptions(), keep, tally)


def loglik_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: LoglikColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each (context, continuation) row's ``logprob`` and ``is_greedy`` as /v1/completions
    with echo gives them, with ``error`` and ``error_message`` as ``score_dataset``'s."""
    outputs = ("logprob", "is_greedy")
    mode = WorkMode(LoglikPrepare, loglik_columns, outputs, (CONTINUATION,), "context")
    return _work_dataset(ds, settings, mode, columns, options or EngineOptions(), keep, tally)


def classify_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: ClassifyColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each row's ``label`` and ``probs`` as /v1/classify gives them on a score-head model,
    with ``error`` and ``error_message`` as ``score_dataset``'s."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.head_config import score_head_from_hf

    head = score_head_from_hf(load_hf_config(resolve_model_source(settings.model.name)))
    if head is None:
        raise SettingsError(
            f"model: {settings.model.name} has no score head; classify needs a sequence-"
            "classification or reward model"
        )
    results = ClassifyResults(head, columns.activation)
    mode = WorkMode(ClassifyPrepare, results, ("probs", "label"), group="length")
    return _work_dataset(ds, settings, mode, columns, options or EngineOptions(), keep, tally)


@dataclass(frozen=True)
class WorkMode:
    """A mode on token-id works (rerank, loglik): its CPU stage, its result columns from
    the answers, their names, its own helper columns, and what groups its rows
    (``batch.grouping.GroupBy``'s kind; ``context``: the first helper counts the tail)."""

    prepare: type
    results: Any  # batch.work_stages.Results
    outputs: tuple[str, ...]
    helpers: tuple[str, ...] = ()
    group: str = "query"

    def group_by(self, settings: ReplicaSettings) -> GroupBy:
        tail = self.helpers[0] if self.group == "context" else None
        return GroupBy(self.group, settings.engine.token_buckets, tail)


def _work_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    mode: WorkMode,
    columns: Any,
    options: EngineOptions,
    keep: Sequence[str] | None,
    tally: Any,
) -> ray.data.Dataset:
    """Prepare (CPU actor) -> engine actors or handle callers -> tally (CPU tasks)."""
    _check_options(options)
    grouping = job_grouping(ds, options, mode.group_by(settings), tally)
    prepared = ds.map_batches(
        mode.prepare,
        fn_constructor_args=(settings, columns),
        batch_format="pyarrow",
        batch_size=options.batch_size,
        concurrency=1,
        num_cpus=options.cpu_share,
    )
    if options.engine == "serve":
        args = (options.app, settings, mode.results, tally, options.max_in_flight, options.adapter)
        scored = engine_map(
            prepared, ServeWorks, args, options, grouping, num_cpus=options.cpu_share
        )
    else:
        _check_local(settings)
        args = (settings, mode.results, tally, options.engine_factory, options.adapter)
        remote = engine_remote_args(settings, options.engine_env)
        scored = engine_map(prepared, EngineWorks, args, options, grouping, **remote)
    finished = scored.map_batches(
        finish_rows,
        fn_kwargs={"result": mode.outputs[0], "helpers": mode.helpers, "tally": tally},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=options.cpu_share,
    )
    if keep is None:
        return finished
    wanted = [columns.id, *keep, *mode.outputs, "error", "error_message"]
    return finished.select_columns(list(dict.fromkeys(wanted)))


@dataclass(frozen=True)
class Job:
    """Where a job reads and writes, and its checkpoint folder."""

    input_path: str
    output: str
    output_format: str = "parquet"
    input_format: str | None = None
    checkpoint: str | None = None
    cpu_share: float = 0.25

    def run(self, scored: Any, id_column: str) -> Summary:
        """Read, ``scored(ds, tally)``, write; the summary."""
        use_checkpoint(self.checkpoint, id_column)
        # On the driver's node: a node lost mid-job must not take the job's counts with it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        name = f"{TALLY_PREFIX}{uuid.uuid4().hex}"
        tally = ray.remote(Tally).options(name=name, num_cpus=0, scheduling_strategy=here).remote()
        try:  # the tally's worker process ends with the job (many jobs run from one driver)
            start = time.perf_counter()
            ds = read_input(self.input_path, self.input_format, self.cpu_share)
            out = write_output(scored(ds, tally), self.output, self.output_format, self.cpu_share)
            wall = time.perf_counter() - start
            return Summary.from_totals(ray.get(tally.totals.remote()) | shuffle_cost(out), wall)
        finally:
            ray.kill(tally)
