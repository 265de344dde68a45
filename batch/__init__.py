"""Batch scoring on Ray Data (docs/batch.md): a dataset's rows scored exactly as /v1/score
scores them, rows that share a query packed into one multi-item work per engine call.

``score_dataset`` (a Dataset in, a Dataset out), ``run_score_job`` (read, score, write,
summary), ``python -m batch score`` (the command).
"""

from batch.pipeline import EngineOptions, run_score_job, score_dataset, settings_from_config
from batch.rows import ScoreColumns

__all__ = [
    "EngineOptions",
    "ScoreColumns",
    "run_score_job",
    "score_dataset",
    "settings_from_config",
]
