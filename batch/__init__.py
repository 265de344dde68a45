"""Batch scoring on Ray Data (docs/batch.md): a dataset's rows scored exactly as /v1/score
scores them, rows that share a query packed into one multi-item work per engine call.

``score_dataset`` (a Dataset in, a Dataset out), ``rerank_dataset``, ``loglik_dataset``,
``classify_dataset`` and ``embed_dataset`` (the other modes), ``run_score_job`` (read, score,
write, summary), ``python -m batch score|rerank|loglik|classify|embed`` (the command).
"""

from batch.classify_stage import ClassifyColumns
from batch.embed_stage import EmbedColumns, embed_dataset
from batch.loglik_stage import LoglikColumns
from batch.pipeline import (
    EngineOptions,
    classify_dataset,
    loglik_dataset,
    rerank_dataset,
    run_score_job,
    score_dataset,
    settings_from_config,
)
from batch.rerank_stage import RerankColumns
from batch.rows import ScoreColumns

__all__ = [
    "ClassifyColumns",
    "EmbedColumns",
    "EngineOptions",
    "LoglikColumns",
    "RerankColumns",
    "ScoreColumns",
    "classify_dataset",
    "embed_dataset",
    "loglik_dataset",
    "rerank_dataset",
    "run_score_job",
    "score_dataset",
    "settings_from_config",
]
