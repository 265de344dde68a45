"""A jax-free stand-in for replicas.engine.ScoringEngine with hand-checkable arithmetic; it
keeps the whole engine contract (replicas/engine_contract.py), without LoRA slots; its stats
are a real ``EngineStats`` that counts nothing (``EngineStats.zero()``).

logprob(label, query, item) = -(label % 7) - 0.1 * (len(query) + len(item))

Used by the CPU-side unit tests and by the Serve tests that are about serving (autoscaling,
overload), not about the model. ``SlowFakeEngine`` takes a fixed time per batch,
``WorkFakeEngine`` a time that grows with the batch's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from replicas.checkpoints.sources import load_hf_config, resolve_model_source
from replicas.contract import ModelInfo, ScoreWork, work_cost
from replicas.engine_contract import EngineStats
from replicas.errors import Reason, ScoringError
from replicas.settings import ReplicaSettings


def fake_logprob(label: int, query_len: int, item_len: int) -> float:
    return -(label % 7) - 0.1 * (query_len + item_len)


def fake_logprobs(work: ScoreWork) -> np.ndarray:
    rows = [
        [fake_logprob(label, len(work.query_ids), len(item)) for label in work.label_ids]
        for item in work.item_ids
    ]
    return np.asarray(rows, dtype=np.float32).reshape(len(work.item_ids), len(work.label_ids))


@dataclass
class FakeEngine:
    settings: ReplicaSettings
    model_info: ModelInfo
    batches: int = 0
    delay_s: float = 0.0  # per batch
    delay_per_token_s: float = 0.0  # per cost unit of the batch's works (admission's count)

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> FakeEngine:
        source = resolve_model_source(settings.model.name)
        vocab_size = load_hf_config(source).vocab_size
        info = ModelInfo(
            name=source.name,
            vocab_size=vocab_size,
            multi_item_scoring_delimiter=settings.model.multi_item_scoring_delimiter,
            limits=settings.limits,
        )
        return cls(settings=settings, model_info=info)

    @property
    def info(self) -> ModelInfo:
        return self.model_info

    @property
    def compile_count(self) -> int:
        return 0

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        self.batches += 1  # like ScoringEngine, it trusts its replica's limit check
        tokens = sum(work_cost(work, self.settings.model.multi_item) for work in works)
        if self.delay_s or self.delay_per_token_s:
            time.sleep(self.delay_s + self.delay_per_token_s * tokens)
        return [fake_logprobs(work) for work in works]

    def stats(self) -> EngineStats:
        return EngineStats.zero()  # no counters of its own

    def check_health(self) -> None:
        """Nothing to check."""

    def load_adapter(self, name: str, path: str) -> None:
        raise ScoringError(Reason.INVALID_REQUEST, "max_loras: 0, a fake engine has no LoRA slots")

    def unload_adapter(self, name: str) -> None:
        raise ScoringError(Reason.INVALID_REQUEST, "max_loras: 0, a fake engine has no LoRA slots")


class SlowFakeEngine(FakeEngine):
    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> FakeEngine:
        engine = FakeEngine.from_settings(settings)
        return cls(settings=engine.settings, model_info=engine.model_info, delay_s=0.25)


class WorkFakeEngine(FakeEngine):
    """20 ms per batch plus 0.2 ms per token: a 128-item request takes about 0.6 s, a
    2-item one about 30 ms, as a real step's cost grows with its tokens."""

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> FakeEngine:
        engine = FakeEngine.from_settings(settings)
        return cls(engine.settings, engine.model_info, delay_s=0.02, delay_per_token_s=2e-4)
