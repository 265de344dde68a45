"""Any batch mode (batch.modes) on a Ray Dataset, by one pipeline: the mode's CPU stage
(each row -> its work, the route's own code) -> engine actors (``--engine local``) or
handle callers (``--engine serve``) -> the finishing step (scores, tally) -> the output
columns. ``score_dataset``, ``rerank_dataset``, ``loglik_dataset``, ``classify_dataset`` and
``embed_dataset`` are ``mode_dataset`` of their mode; ``run_score_job`` is a whole
``score`` job (batch.job).

No scheduler of our own: Ray Data streams the blocks, sizes the actor pool, retries the work
of a dead actor and checkpoints written ids (``CheckpointConfig`` on the id column).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.data

from batch.classify_stage import ClassifyColumns
from batch.embed_stage import EmbedColumns
from batch.grouping import Grouping, engine_map, job_grouping
from batch.job import Job
from batch.loglik_stage import LoglikColumns
from batch.modes import BatchMode, mode_named
from batch.rerank_stage import RerankColumns
from batch.rows import ScoreColumns
from batch.stages import finish_rows
from batch.summary import Summary
from planning.serve_args import SERVE_CONFIG, serve_args
from replicas.serving.setup import DEFAULT_ENGINE
from replicas.settings import ReplicaSettings, SettingsError

ERROR_COLUMNS = ("error", "error_message")


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


CROSS_ENCODER_MODES = ("rerank", "classify")  # the routes a cross-encoder serves, as jobs


def _refuse_cross_encoder(settings: ReplicaSettings, mode: BatchMode) -> None:
    """A SettingsError before any row is read when the model is a cross-encoder and the mode
    is not one it runs (its rows would be built as a decoder's works)."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.head_config import is_cross_encoder

    source = resolve_model_source(settings.model.name)
    if mode.name in CROSS_ENCODER_MODES or source.is_gguf:
        return
    if is_cross_encoder(load_hf_config(source)):
        raise SettingsError(
            f"model: {settings.model.name} is a cross-encoder; python -m batch {mode.name} "
            f"does not run one (it runs {' and '.join(CROSS_ENCODER_MODES)})"
        )


def mode_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    mode: BatchMode,
    columns: Any,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """``ds`` answered row by row as ``mode``'s workload answers: ``keep`` (None: every input
    column), the id column, the mode's outputs (null on a refused row), ``error`` and
    ``error_message``. A SettingsError, before any row is read, for a model that does not
    serve the mode or options the job refuses."""
    options = options or EngineOptions()
    _refuse_cross_encoder(settings, mode)
    payload = mode.payload(settings, columns)
    _check_options(options)  # before the row count grouping takes
    grouping = job_grouping(ds, options, mode.group_by(settings), tally)
    prepared = ds.map_batches(
        mode.prepare,
        fn_constructor_args=(settings, columns),
        batch_format="pyarrow",
        batch_size=options.batch_size,
        concurrency=1,
        num_cpus=options.cpu_share,
    )
    scored = _engine_stage(prepared, settings, mode, payload, options, tally, grouping)
    finish, kwargs = _finishing(mode, columns)
    finished = scored.map_batches(
        finish,
        fn_kwargs=kwargs | {"tally": tally},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=options.cpu_share,
    )
    if keep is None:
        return finished
    wanted = [columns.id, *keep, *mode.outputs_of(columns, payload), *ERROR_COLUMNS]
    return finished.select_columns(list(dict.fromkeys(wanted)))


def _engine_stage(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    mode: BatchMode,
    payload: Any,
    options: EngineOptions,
    tally: Any,
    grouping: Grouping | None,
) -> ray.data.Dataset:
    """Engine actors (``local``) or handle callers (``serve``), ``options.replicas`` of them;
    ``grouping``: the rows brought together first (None: not grouped)."""
    if options.engine == "serve":
        args = (options.app, settings, payload, tally, options.max_in_flight, options.adapter)
        return engine_map(ds, mode.serve, args, options, grouping, num_cpus=options.cpu_share)
    _check_local(settings)
    args = (settings, payload, tally, options.engine_factory, options.adapter)
    remote = engine_remote_args(settings, options.engine_env)
    return engine_map(ds, mode.engine, args, options, grouping, **remote)


def _finishing(mode: BatchMode, columns: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The mode's finishing step and its arguments (all but the tally)."""
    if mode.finish is None:
        return finish_rows, {"result": mode.outputs[0], "helpers": mode.helpers}
    return mode.finish, {"columns": columns}


def score_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: ScoreColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """``ds`` scored as ``/v1/score`` scores each row: ``scores``, ``error``, ``error_message``."""
    return mode_dataset(ds, settings, mode_named("score"), columns, options, keep, tally)


def rerank_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: RerankColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each (query, document) row's ``relevance`` as /v1/rerank gives it (the configured
    ``rerank_method``)."""
    return mode_dataset(ds, settings, mode_named("rerank"), columns, options, keep, tally)


def loglik_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: LoglikColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each (context, continuation) row's ``logprob`` and ``is_greedy`` as /v1/completions
    with echo gives them."""
    return mode_dataset(ds, settings, mode_named("loglik"), columns, options, keep, tally)


def classify_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: ClassifyColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each row's ``label`` and ``probs`` as /v1/classify gives them on a score-head model."""
    return mode_dataset(ds, settings, mode_named("classify"), columns, options, keep, tally)


def embed_dataset(
    ds: ray.data.Dataset,
    settings: ReplicaSettings,
    columns: EmbedColumns,
    options: EngineOptions | None = None,
    keep: Sequence[str] | None = None,
    tally: Any = None,
) -> ray.data.Dataset:
    """Each row's ``embedding`` as /v1/embeddings gives it, on an embedding model."""
    return mode_dataset(ds, settings, mode_named("embed"), columns, options, keep, tally)


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
