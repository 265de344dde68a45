"""The batch modes, each defined once as the twin of a workload of ``app.workloads.WORKLOADS``:
``python -m batch <mode>`` answers each row as the workload's route answers it.

A ``BatchMode`` names its workload, its command-line arguments and how they make the mode's
columns (which input columns hold what, the fields every row shares), the CPU stage that
makes a row the engine's work with the route's own code (a ``batch.stages.PrepareRows``), the
engine stages that score the works (``batch.stages.EngineStage`` with the job's engine,
``batch.serve_stage.ServeStage`` through the app) and the payload they turn answers into
output columns with, what brings its rows together (``batch.grouping.GroupBy``) and how its
rows are finished. Everything else is derived from ``MODES``: the subcommands of
``python -m batch`` (batch.__main__) and the one pipeline that runs any mode
(``batch.pipeline.mode_dataset``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.embed_types import EMBEDDING_TYPES
from app.retrieval_inputs import ROLES
from batch.classify_stage import ClassifyColumns, ClassifyPrepare, classify_results, model_head
from batch.embed_stage import HELPERS as EMBED_HELPERS
from batch.embed_stage import IDS as EMBED_IDS
from batch.embed_stage import (
    EmbedColumns,
    EmbedEngine,
    EmbedPrepare,
    ServeEmbed,
    embed_output,
    finish_embed,
)
from batch.grouping import GroupBy
from batch.loglik_stage import CONTINUATION, LoglikColumns, LoglikPrepare, loglik_columns
from batch.rerank_stage import RerankColumns, RerankPrepare, RerankResults
from batch.retrieval import PARTS, retrieval_of
from batch.rows import ScoreColumns
from batch.score_stage import EngineScore, Tokenize, finish_scores
from batch.serve_stage import ServeScore, ServeWorks
from batch.works import WORK_COLUMNS, EngineWorks
from replicas.settings import ReplicaSettings

# The columns of a mode from the parsed command line and the job's adapter (``--model``).
Columns = Callable[[argparse.Namespace, str | None], Any]
# The engine stages' payload for the job's settings and columns; it checks that the model
# serves the mode (a SettingsError before the job reads a row).
Payload = Callable[[ReplicaSettings, Any], Any]


@dataclass(frozen=True)
class Argument:
    """One command-line argument of a mode: its flag and ``add_argument``'s keywords."""

    flag: str
    options: tuple[tuple[str, Any], ...] = ()

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(self.flag, **dict(self.options))


def argument(flag: str, **options: Any) -> Argument:
    return Argument(flag, tuple(options.items()))


@dataclass(frozen=True)
class BatchMode:
    """One batch mode, defined once."""

    name: str
    """The subcommand of ``python -m batch``."""
    workload: str
    """The workload (``app.workloads.Workload.name``) whose route answers a row as it does."""
    help: str
    """One line for the command's help."""
    arguments: tuple[Argument, ...]
    """Its own arguments, beside the common ones (batch.__main__)."""
    columns: Columns
    """Its columns (a frozen dataclass with an ``id`` field) from the parsed arguments."""
    prepare: type
    """CPU stage ``prepare(settings, columns)``: each row -> its work, or the route's 400."""
    engine: type
    """Engine stage ``engine(settings, payload, tally, engine_factory, adapter)``."""
    serve: type
    """``--engine serve`` stage ``serve(app, settings, payload, tally, max_in_flight,
    adapter)``."""
    payload: Payload
    """What the engine stages turn answers into output columns with."""
    outputs: tuple[str, ...]
    """Its result columns (after the id and kept columns; then ``error``, ``error_message``);
    a payload or columns with an ``outputs`` property name the job's own (``embed``: its
    ``--embedding-types``, the model's kind)."""
    group: GroupBy
    """What brings its rows together (the token buckets are the job's settings')."""
    helpers: tuple[str, ...] = ()
    """The helper columns its stages add, dropped by the finishing step."""
    finish: Callable[..., Any] | None = None
    """Its finishing step ``finish(batch, columns, tally)``; None: ``batch.stages.finish_rows``
    on its first output and its helpers."""

    def outputs_of(self, columns: Any, payload: Any = None) -> tuple[str, ...]:
        """The job's result columns: its payload's or its columns' ``outputs`` where they
        name them."""
        named = getattr(payload, "outputs", None)
        return tuple(named if named is not None else getattr(columns, "outputs", self.outputs))

    def group_by(self, settings: ReplicaSettings) -> GroupBy:
        """``group`` with the job's token buckets."""
        return GroupBy(
            self.group.kind,
            settings.engine.token_buckets,
            self.group.context_column,
            self.group.ids_column,
        )


def token_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated token ids, got {text!r}") from None


def _score_columns(args: argparse.Namespace, adapter: str | None) -> ScoreColumns:
    return ScoreColumns(
        label_token_ids=args.labels,
        query=args.query_column,
        item=args.item_column,
        id=args.id_column,
        apply_softmax=args.apply_softmax,
        item_first=args.item_first,
        model=adapter,
    )


def _rerank_columns(args: argparse.Namespace, adapter: str | None) -> RerankColumns:
    return RerankColumns(
        args.query_column,
        args.document_column,
        args.id_column,
        args.max_chunks_per_doc,
        args.chunk_tokens,
        args.chunk_aggregation,
    )


def _rerank_results(settings: ReplicaSettings, columns: RerankColumns) -> RerankResults:
    head = model_head(settings)
    activation = head.activation if head is not None else None  # a cross-encoder's only
    aggregation = columns.chunk_aggregation or settings.http.chunk_aggregation
    return RerankResults(aggregation, activation, retrieval_of(settings))


def _loglik_columns(args: argparse.Namespace, adapter: str | None) -> LoglikColumns:
    return LoglikColumns(args.context_column, args.continuation_column, args.id_column)


def _classify_columns(args: argparse.Namespace, adapter: str | None) -> ClassifyColumns:
    return ClassifyColumns(args.input_column, args.id_column, not args.no_activation)


def _embed_columns(args: argparse.Namespace, adapter: str | None) -> EmbedColumns:
    types = args.embedding_types or ()
    return EmbedColumns(
        args.input_column, args.id_column, args.prompt_name, args.dimensions, types,
        args.truncate, args.input_type, args.outputs,
    )  # fmt: skip


def embedding_types(text: str) -> tuple[str, ...]:
    """``--embedding-types``: names from ``app.embed_types.EMBEDDING_TYPES``, comma-separated."""
    kinds = tuple(dict.fromkeys(kind.strip() for kind in text.split(",") if kind.strip()))
    unknown = [kind for kind in kinds if kind not in EMBEDDING_TYPES]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"{unknown or text!r}: choose from {', '.join(EMBEDDING_TYPES)}"
        )
    return kinds


def hybrid_parts(text: str) -> tuple[str, ...]:
    """``--outputs``: a hybrid model's parts from ``batch.retrieval.PARTS``, comma-separated."""
    parts = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not parts or any(part not in PARTS for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(PARTS)}")
    return parts


def _columns_themselves(settings: ReplicaSettings, columns: Any) -> Any:
    return columns


def _results(results: Callable[..., Any]) -> Payload:
    """A payload that is the same results function for every job."""
    return lambda settings, columns: results


MODES: tuple[BatchMode, ...] = (
    BatchMode(
        name="score",
        workload="score",
        help="label-token scores of each row, as /v1/score",
        arguments=(
            argument("--query-column", default="query"),
            argument("--labels", required=True, type=token_ids, help="label token ids"),
            argument("--item-column", default="item"),
            argument("--apply-softmax", action="store_true"),
            argument("--item-first", action="store_true"),
        ),
        columns=_score_columns,
        prepare=Tokenize,
        engine=EngineScore,
        serve=ServeScore,
        payload=_columns_themselves,
        outputs=("scores",),
        group=GroupBy("score"),
        finish=finish_scores,
    ),
    BatchMode(
        name="rerank",
        workload="rerank",
        help="each (query, document) row's relevance",
        arguments=(
            argument("--query-column", default="query"),
            argument("--document-column", default="document"),
            argument("--max-chunks-per-doc", type=int, help="chunks per document (config's)"),
            argument("--chunk-tokens", type=int, help="document tokens per chunk (config's)"),
            argument("--chunk-aggregation", choices=("max", "mean"), help="(config's)"),
        ),
        columns=_rerank_columns,
        prepare=RerankPrepare,
        engine=EngineWorks,
        serve=ServeWorks,
        payload=_rerank_results,
        outputs=("relevance",),
        group=GroupBy("query"),
        helpers=WORK_COLUMNS,
    ),
    BatchMode(
        name="loglik",
        workload="completions",
        help="lm-eval loglikelihood of each row's continuation",
        arguments=(
            argument("--context-column", default="context"),
            argument("--continuation-column", default="continuation"),
        ),
        columns=_loglik_columns,
        prepare=LoglikPrepare,
        engine=EngineWorks,
        serve=ServeWorks,
        payload=_results(loglik_columns),
        outputs=("logprob", "is_greedy"),
        group=GroupBy("context", context_column=CONTINUATION),
        helpers=(*WORK_COLUMNS, CONTINUATION),
    ),
    BatchMode(
        name="classify",
        workload="classify",
        help="each row's label and probs, as /v1/classify",
        arguments=(
            argument("--input-column", default="input"),
            argument("--no-activation", action="store_true", help="the raw head outputs"),
        ),
        columns=_classify_columns,
        prepare=ClassifyPrepare,
        engine=EngineWorks,
        serve=ServeWorks,
        payload=classify_results,
        outputs=("probs", "label"),
        group=GroupBy("length"),
        helpers=WORK_COLUMNS,
    ),
    BatchMode(
        name="embed",
        workload="embeddings",
        help="each row's vector, as /v1/embeddings",
        arguments=(
            argument("--input-column", default="text"),
            argument("--prompt-name", default=None, help="one of the model's prompts"),
            argument("--dimensions", type=int, default=None, help="Matryoshka: first d"),
            argument(
                "--embedding-types",
                type=embedding_types,
                default=None,
                help="comma-separated embedding types, each its own embedding_<type> column",
            ),
            argument(
                "--truncate",
                choices=("NONE", "START", "END", "CHUNK"),
                default=None,
                help="a text past the model's limit, as /v1/embeddings' truncate (default: an "
                "error row); CHUNK: its chunks' vectors folded into one",
            ),
            argument(
                "--input-type",
                choices=ROLES,
                default=None,
                help="late-interaction and sparse models: the texts' role (default: document)",
            ),
            argument(
                "--outputs",
                type=hybrid_parts,
                default=None,
                help="a hybrid model's parts, comma-separated: dense (embedding), tokens "
                "(token_embeddings), sparse (sparse_indices, sparse_values); default all",
            ),
        ),
        columns=_embed_columns,
        prepare=EmbedPrepare,
        engine=EmbedEngine,
        serve=ServeEmbed,
        payload=embed_output,
        outputs=("embedding",),
        group=GroupBy("length", ids_column=EMBED_IDS),
        helpers=EMBED_HELPERS,
        finish=finish_embed,
    ),
)


def mode_named(name: str, modes: tuple[BatchMode, ...] = MODES) -> BatchMode:
    """The mode ``name`` of ``modes`` (a KeyError names the modes there are)."""
    for mode in modes:
        if mode.name == name:
            return mode
    raise KeyError(f"batch mode: one of {[m.name for m in modes]}, got {name!r}")
