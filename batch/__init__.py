"""Batch scoring on Ray Data (docs/batch.md): a dataset's rows scored exactly as /v1/score
scores them, rows that share a query packed into one multi-item work per engine call.

``MODES`` (batch.modes: each mode the twin of a workload of app.workloads), ``mode_dataset``
(any mode: a Dataset in, a Dataset out), ``score_dataset``, ``rerank_dataset``,
``loglik_dataset``, ``classify_dataset`` and ``embed_dataset`` (``mode_dataset`` of one
mode), ``run_score_job`` (read, score, write, summary), ``python -m batch
score|rerank|loglik|classify|embed`` (the command, one subcommand per mode).
"""

from batch.classify_stage import ClassifyColumns
from batch.embed_stage import EmbedColumns
from batch.loglik_stage import LoglikColumns
from batch.modes import MODES, BatchMode
from batch.pipeline import (
    EngineOptions,
    classify_dataset,
    embed_dataset,
    loglik_dataset,
    mode_dataset,
    rerank_dataset,
    run_score_job,
    score_dataset,
    settings_from_config,
)
from batch.rerank_stage import RerankColumns
from batch.rows import ScoreColumns

__all__ = [
    "MODES",
    "BatchMode",
    "ClassifyColumns",
    "EmbedColumns",
    "EngineOptions",
    "LoglikColumns",
    "RerankColumns",
    "ScoreColumns",
    "classify_dataset",
    "embed_dataset",
    "loglik_dataset",
    "mode_dataset",
    "rerank_dataset",
    "run_score_job",
    "score_dataset",
    "settings_from_config",
]
