"""The real ScoringEngine, made to fail on demand for the chaos tests.

``MarkedFailingEngine`` scores like ``replicas.engine.ScoringEngine`` until a marker file
(path in ``SCOREJAX_CHAOS_MARKER``) appears that is newer than the engine: from then on its
steps raise. A replica started after the marker (Serve's replacement) scores again, so a test
sees a failing replica turn unhealthy and be replaced without coordinating with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings

MARKER_ENV = "SCOREJAX_CHAOS_MARKER"


class MarkedFailingEngine:
    def __init__(self, engine: ScoringEngine) -> None:
        self._engine = engine
        self._born = time.time()

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> MarkedFailingEngine:
        return cls(ScoringEngine.from_settings(settings))

    def _failing(self) -> bool:
        marker = Path(os.environ.get(MARKER_ENV, "/nonexistent"))
        return marker.exists() and marker.stat().st_mtime > self._born

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        if self._failing():
            raise RuntimeError("injected engine failure (chaos test)")
        return self._engine.score_batch(works)

    def __getattr__(self, name: str) -> Any:  # info, compile_count, stats, ...
        return getattr(self._engine, name)
