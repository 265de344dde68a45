"""The real ScoringEngine with the faults of the batch job tests (tests/batch/test_batch.py).

Set in the engine actors' environment (``EngineOptions.engine_env``):
``SCOREJAX_BATCH_DIE``: a marker path. The first engine to score while it is absent creates
it and ends its own process at once, mid-batch (Ray Data restarts the actor and retries the
batch; the restarted engine finds the marker and scores).
``SCOREJAX_BATCH_STOP``: a checkpoint folder. An engine that already scored a batch waits
(polling) until a written block's checkpoint is committed there, then raises: the job stops
half-way, with some rows written and others not.

``HeldEngine`` (tests/support/batch_nodes_check.py, the 2-node run): ``SCOREJAX_BATCH_HOLD`` is a
folder, ``SCOREJAX_BATCH_HEAD_NODE`` the head node's id. The first engine off the head node
to receive a batch writes ``held`` there (its node and pid) and holds the batch, unscored,
until the test kills its node or process (or raises after the timeout: a job whose kill never
came fails). Every batch an engine scores writes a ``scored-*.json`` (its node, its works).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings

DIE_ENV, STOP_ENV = "SCOREJAX_BATCH_DIE", "SCOREJAX_BATCH_STOP"
HOLD_ENV, HEAD_ENV = "SCOREJAX_BATCH_HOLD", "SCOREJAX_BATCH_HEAD_NODE"


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path``, atomically (a reader never sees half a file)."""
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    part.write_text(json.dumps(value))
    os.replace(part, path)


def _checkpointed(folder: Path, timeout_s: float = 120.0) -> bool:
    """Whether a block's checkpoint is committed in ``folder`` within the timeout (Ray Data
    writes ``<name>.pending.parquet`` before the block's data, ``<name>.parquet`` after)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = folder.rglob("*.parquet") if folder.exists() else []
        if any(not p.name.endswith(".pending.parquet") for p in files):
            return True
        time.sleep(0.1)
    return False


class FaultyEngine:
    def __init__(self, engine: ScoringEngine) -> None:
        self._engine = engine
        self._calls = 0

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> FaultyEngine:
        return cls(ScoringEngine.from_settings(settings))

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Any]:
        marker = os.environ.get(DIE_ENV)
        if marker and not Path(marker).exists():
            Path(marker).touch()
            os._exit(1)
        stop = os.environ.get(STOP_ENV)
        if stop and self._calls and _checkpointed(Path(stop)):
            raise RuntimeError("injected stop (batch resume test)")
        self._calls += 1
        return self._engine.score_batch(works)

    def __getattr__(self, name: str) -> Any:  # info, stats, ...
        return getattr(self._engine, name)


class HeldEngine:
    def __init__(self, engine: ScoringEngine) -> None:
        import ray

        self._engine = engine
        self._node = ray.get_runtime_context().get_node_id()
        self._folder = Path(os.environ[HOLD_ENV])

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> HeldEngine:
        return cls(ScoringEngine.from_settings(settings))

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Any]:
        held = self._folder / "held"
        if self._node != os.environ[HEAD_ENV] and not held.exists():
            write_json(held, {"node": self._node, "pid": os.getpid()})
            deadline = time.monotonic() + 120.0
            while time.monotonic() < deadline:  # the test kills this process meanwhile
                time.sleep(0.1)
            raise RuntimeError("held batch: its node was not killed within 120 s")
        answers = self._engine.score_batch(works)
        scored = self._folder / f"scored-{uuid.uuid4().hex}.json"
        write_json(scored, {"node": self._node, "works": len(works)})
        return answers

    def __getattr__(self, name: str) -> Any:  # info, stats, ...
        return getattr(self._engine, name)
