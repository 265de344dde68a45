"""ScoringReplica without a cluster: batching, reconfigure rules, health, start-up checks.

The deployment's class is used directly (``ScoringReplica.func_or_class``) with fake engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replicas.contract import ScoreWork, work_cost
from replicas.engine_contract import EngineStats
from replicas.errors import Reason, ScoringError
from replicas.serving.admission import QueueEstimate
from replicas.serving.deployment import ScoringReplica
from replicas.serving.setup import (
    RECONFIGURABLE,
    apply_user_config,
    check_model_settings,
    load_engine_factory,
)
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import FakeEngine, fake_logprobs

Replica = ScoringReplica.func_or_class


class PickyEngine(FakeEngine):
    """Refuses (a ScoringError, as the engine's own checks raise) any work whose first label
    is 13; fails on label 99."""

    calls: int = 0

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> PickyEngine:
        base = FakeEngine.from_settings(settings)
        return cls(settings=base.settings, model_info=base.model_info)

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        self.batches += 1
        if any(w.label_ids[0] == 99 for w in works):
            raise RuntimeError("device fell over")
        for work in works:
            if work.label_ids[0] == 13:
                raise ScoringError(Reason.INVALID_REQUEST, "label 13 is refused")
        return [fake_logprobs(work) for work in works]


class GatedEngine(FakeEngine):
    """Records each call's works; its first call waits until ``release`` is set."""

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> GatedEngine:
        base = FakeEngine.from_settings(settings)
        engine = cls(settings=base.settings, model_info=base.model_info)
        engine.calls, engine.release = [], threading.Event()
        return engine

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        self.calls.append(list(works))
        if len(self.calls) == 1:
            assert self.release.wait(60)
        return super().score_batch(works)


class CompilingEngine(FakeEngine):
    """Reports a background compile pending while ``compiling`` is set (as ScoringEngine's
    stats do while a traffic signature compiles beside its steps)."""

    compiling: bool = True

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> CompilingEngine:
        base = FakeEngine.from_settings(settings)
        return cls(settings=base.settings, model_info=base.model_info)

    def stats(self) -> EngineStats:
        pending = int(self.compiling)
        return dataclasses.replace(EngineStats.zero(), background_pending=pending)


@pytest.fixture
def settings(tiny_llama_dir: Path) -> ReplicaSettings:
    return ReplicaSettings.from_keys(
        model=str(tiny_llama_dir),
        multi_item_scoring_delimiter=0,
        max_batch_size=8,
        batch_wait_timeout_s=0.05,
        max_multi_item_seq_len=64,
    )


def many(replica: Any, works: list[ScoreWork]) -> Any:
    """``_score_many`` as @serve.batch calls it: the works and their costs (score_timed's)."""
    multi = replica._settings.model.multi_item
    return replica._score_many(works, [work_cost(w, multi) for w in works])


def work(label: int = 1, query_len: int = 3) -> ScoreWork:
    return ScoreWork(tuple(range(1, query_len + 1)), ((5,), (6, 7)), (label, 2))


@pytest.mark.parametrize(
    ("max_call_s", "rate", "calls"),
    # Ten one-work batches of 4, 5, ..., 13 tokens to compute (cost 36..45 with a call's 32)
    # wait behind the first step: up to 8 works a call; at most 2 s at 95 units/s (190) a
    # call: 36+37+38+39+40, 41+42+43+44, 45; no rate yet: each alone.
    [(0, 95.0, [1, 8, 2]), (2, 95.0, [1, 5, 4, 1]), (2, None, [1] * 11)],
)
def test_batches_that_arrive_during_a_step_share_the_next_engine_call(
    settings: ReplicaSettings, max_call_s: float, rate: float | None, calls: list[int]
) -> None:
    """Serve hands batches over while a step runs (max_concurrent_batches); every batch
    waiting when the engine frees runs in one call, up to max_batch_size (8) works and
    max_call_s seconds of work at the replica's recent work rate."""
    settings = settings.replace(max_call_s=max_call_s)
    replica = Replica(settings, "tests.unit.test_serve_replica:GatedEngine")
    replica._queue.work_rate = lambda: rate  # what admission measured of recent calls
    engine = replica._engine
    later = [[work(query_len=n)] for n in range(1, 11)]  # ten one-work batches

    async def scenario() -> list:
        first = asyncio.create_task(many(replica, [work(query_len=11)]))
        while not engine.calls:  # the first step has started and holds the engine
            await asyncio.sleep(0.001)
        waiting = [asyncio.create_task(many(replica, batch)) for batch in later]
        while len(replica._waiting) < len(later):
            await asyncio.sleep(0.001)
        engine.release.set()
        return await asyncio.gather(first, *waiting)

    results = asyncio.run(scenario())
    assert [len(call) for call in engine.calls] == calls
    for (got,), (w,) in zip(results[1:], later, strict=True):
        np.testing.assert_array_equal(got.scores, fake_logprobs(w))


def test_a_batch_is_one_engine_call(settings: ReplicaSettings) -> None:
    # @serve.batch itself needs a running Serve replica; tests/serve/test_serve_http.py covers it.
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    works = [work(query_len=n) for n in range(1, 7)]
    results = asyncio.run(many(replica, works))
    for got, w in zip(results, works, strict=True):
        np.testing.assert_array_equal(got.scores, fake_logprobs(w))
        assert got.scores.dtype == np.float32
    # one step scored them all: each answer carries that step's seconds
    assert len({got.inference_s for got in results}) == 1 and results[0].inference_s > 0
    assert replica._engine.batches == 1
    assert replica.stats()["largest_batch"] == 6


def test_the_replica_answers_the_engine_stats_inside_its_own_counters(
    settings: ReplicaSettings,
) -> None:
    """GET /v1/stats's keys: the replica's, the engine's ``as_dict()`` (a real EngineStats
    under the fake too), then batching and admission; plain JSON."""
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    asyncio.run(many(replica, [work()]))
    answered = replica.stats()
    engine = EngineStats.zero().as_dict()  # the fake counts nothing
    assert list(answered) == [
        "requests", "works", "batches", "largest_batch", *engine, "max_batch_size",
        "batch_wait_timeout_s", "queued_works", "queued_tokens", "expected_wait_s",
        "rejected_overloaded", "dropped_expired", "worker_niceness",
    ]  # fmt: skip
    assert {k: answered[k] for k in engine} == engine and answered["batches"] == 1
    assert json.loads(json.dumps(answered)) == answered


def test_steps_beside_a_compile_are_left_out_of_the_work_rate(settings: ReplicaSettings) -> None:
    """Issue 43: right after a start, steps run on covering signatures beside background
    compiles, slower than the engine really is; admission must not learn its rate from
    them (a burst of small requests got 503s). Their answers say so (``clean``), the
    replica's estimate counts none of them, then counts clean ones again."""
    replica = Replica(settings, "tests.unit.test_serve_replica:CompilingEngine")

    async def one_work_batches(work: ScoreWork, cost: int) -> object:  # @serve.batch: a replica
        return (await replica._score_many([work], [cost]))[0]

    replica._score_batched = one_work_batches
    for n in range(6):
        assert not asyncio.run(replica.score_timed(work(query_len=n + 1))).clean
    assert replica._queue.work_rate() is None  # no basis: admit
    replica._engine.compiling = False
    for n in range(6):
        assert asyncio.run(replica.score_timed(work(query_len=n + 1))).clean
    assert replica._queue.work_rate() is not None  # from the clean steps' busy time alone
    assert replica._queue._origin > 0  # the window starts after the last unclean step


def test_a_refused_work_does_not_fail_its_batch(settings: ReplicaSettings) -> None:
    replica = Replica(settings, "tests.unit.test_serve_replica:PickyEngine")
    good, refused, other = asyncio.run(many(replica, [work(1), work(13), work(2)]))
    np.testing.assert_array_equal(good.scores, fake_logprobs(work(1)))
    np.testing.assert_array_equal(other.scores, fake_logprobs(work(2)))
    assert isinstance(refused, ScoringError) and refused.reason == "invalid_request"
    assert refused.message == "label 13 is refused" and refused.engine_failure is None
    replica.check_health()  # refusing bad work is not an engine failure


def test_limits_are_checked_before_batching(settings: ReplicaSettings) -> None:
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    with pytest.raises(ScoringError) as caught:
        asyncio.run(replica.score_timed(work(query_len=80)))
    assert caught.value.reason == "sequence_too_long"
    assert replica._engine.batches == 0


def test_work_past_its_deadline_is_dropped_before_the_engine(settings: ReplicaSettings) -> None:
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    live = work(1)
    late = dataclasses.replace(work(2), deadline=time.time() - 1)
    later = dataclasses.replace(work(3), deadline=time.time() + 60)
    got_live, got_late, got_later = asyncio.run(many(replica, [live, late, later]))
    np.testing.assert_array_equal(got_live.scores, fake_logprobs(live))
    np.testing.assert_array_equal(got_later.scores, fake_logprobs(later))
    assert isinstance(got_late, ScoringError) and got_late.reason == "overloaded"
    assert replica._engine.batches == 1 and replica.stats()["dropped_expired"] == 1
    (alone,) = asyncio.run(many(replica, [late]))
    assert isinstance(alone, ScoringError) and replica._engine.batches == 1  # no step


def test_an_overloaded_replica_refuses_before_batching(settings: ReplicaSettings) -> None:
    replica = Replica(
        settings.replace(max_queue_wait_s=2.0), "tests.support.fake_engine:FakeEngine"
    )
    now = [0.0]
    replica._queue = QueueEstimate(clock=lambda: now[0])
    tickets = [replica._queue.started() for _ in range(14)]
    for ticket in tickets[:4]:  # 4 units served in 2 s: the 10 queued units wait 5 s
        now[0] += 0.5
        replica._queue.finished(ticket)
    with pytest.raises(ScoringError) as caught:
        asyncio.run(replica.score_timed(work()))
    assert caught.value.reason == "overloaded" and caught.value.retry_after_s == 3
    assert replica._engine.batches == 0 and replica.stats()["rejected_overloaded"] == 1
    assert pickle.loads(pickle.dumps(caught.value)).retry_after_s == 3
    assert pickle.loads(pickle.dumps(caught.value)).excess_wait_s == pytest.approx(3.0)


def test_a_fresh_replica_admits_one_calls_worth_before_it_has_a_work_rate(
    settings: ReplicaSettings,
) -> None:
    """No completion yet, so no basis for a wait: ``max_batch_size`` (8) calls in flight are
    the most it admits; the next is refused at once (Retry-After 1), not queued behind them."""
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")

    async def one_work_batches(work: ScoreWork, cost: int) -> object:  # @serve.batch: a replica
        return (await replica._score_many([work], [cost]))[0]

    replica._score_batched = one_work_batches
    for _ in range(7):
        replica._queue.started(1000)
    assert asyncio.run(replica.score_timed(work())).scores.shape == (2, 2)  # the 8th
    replica._queue.started(1000)
    with pytest.raises(ScoringError) as caught:
        asyncio.run(replica.score_timed(work()))
    assert caught.value.reason == "overloaded" and caught.value.retry_after_s == 1
    assert "no work rate measured yet" in caught.value.message
    assert replica._engine.batches == 1 and replica.stats()["rejected_overloaded"] == 1


def test_a_request_the_engine_fails_on_alone_is_a_500_and_the_replica_stays_healthy(
    settings: ReplicaSettings,
) -> None:
    """Issue 43: a valid body that broke the engine got 503 'retry, another replica may
    answer' and failed the same way on every retry. The engine still scores a probe, so the
    fault is the engine's on this request: internal_error (500), its neighbours answered."""
    replica = Replica(settings, "tests.unit.test_serve_replica:PickyEngine")
    for _ in range(4):
        bad, good = asyncio.run(many(replica, [work(99), work(2)]))
        assert isinstance(bad, ScoringError) and bad.reason == "internal_error", bad
        assert "IndexError" not in bad.message and "device fell over" in bad.message
        assert "fails the same way" in bad.message and bad.retry_after_s is None
        np.testing.assert_array_equal(good.scores, fake_logprobs(work(2)))
    replica.check_health()  # the probe scored: never counted as a failing engine


class BrokenEngine(FakeEngine):
    """Raises on every step (a device gone wrong)."""

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> BrokenEngine:
        base = FakeEngine.from_settings(settings)
        return cls(settings=base.settings, model_info=base.model_info)

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        raise RuntimeError("device fell over")


def test_repeated_engine_failures_make_the_replica_unhealthy(settings: ReplicaSettings) -> None:
    """Each failed request's probe fails too (two failed steps a request): the second one
    turns the health check red, and Serve replaces the replica."""
    replica = Replica(settings, "tests.unit.test_serve_replica:BrokenEngine")
    replica.check_health()
    for attempt in range(2):
        (result,) = asyncio.run(many(replica, [work(1)]))
        assert isinstance(result, ScoringError) and result.reason == "unavailable"
        assert "scoring engine failed" in result.message and result.retry_after_s == 1
        if attempt < 1:
            replica.check_health()
    with pytest.raises(RuntimeError, match="4 scoring batches failed in a row"):
        replica.check_health()


def test_reconfigure_changes_batching_only(settings: ReplicaSettings) -> None:
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    engine = replica._engine
    replica.reconfigure({"max_batch_size": 3, "batch_wait_timeout_s": 0.5, "dtype": "float32"})
    assert replica._score_batched._get_max_batch_size() == 3
    assert replica._score_batched._get_batch_wait_timeout_s() == 0.5
    assert replica.stats()["max_batch_size"] == 3
    assert replica._engine is engine  # nothing reloaded
    with pytest.raises(SettingsError, match=r"^dtype: changing it needs a model reload"):
        replica.reconfigure({"dtype": "bfloat16"})
    assert replica.stats()["max_batch_size"] == 3


def test_apply_user_config_rules() -> None:
    current = ReplicaSettings.from_keys(mesh_shape=(1, 1))
    assert apply_user_config(current, {}) is current
    assert apply_user_config(current, {"mesh_shape": [1, 1]}) is current  # YAML lists
    assert apply_user_config(current, {"max_batch_size": 4}).batching.max_batch_size == 4
    with pytest.raises(SettingsError, match=r"^max_batch: unknown"):
        apply_user_config(current, {"max_batch": 4})
    with pytest.raises(SettingsError, match=r"^token_buckets: changing it"):
        apply_user_config(current, {"token_buckets": [16]})
    with pytest.raises(SettingsError, match=r"^max_batch_size: must be >= 1"):
        apply_user_config(current, {"max_batch_size": 0})
    assert {"max_batch_size", "batch_wait_timeout_s"} == RECONFIGURABLE


def test_start_up_checks_name_the_setting(tiny_llama_dir: Path, tmp_path: Path) -> None:
    good = ReplicaSettings.from_keys(model=str(tiny_llama_dir), multi_item_scoring_delimiter=0)
    assert check_model_settings(good) == 49152
    with pytest.raises(SettingsError, match=r"^multi_item_scoring_delimiter: token id 49152"):
        check_model_settings(good.replace(multi_item_scoring_delimiter=49152))
    with pytest.raises(SettingsError, match=r"^model: cannot load"):
        check_model_settings(good.replace(model=str(tmp_path / "missing")))
    with pytest.raises(SettingsError, match=r"^model: cannot load"):
        Replica(good.replace(model=str(tmp_path)), "tests.support.fake_engine:FakeEngine")


def test_engine_factory_paths() -> None:
    factory = load_engine_factory("tests.support.fake_engine:FakeEngine")
    assert factory == FakeEngine.from_settings
    with pytest.raises(SettingsError, match=r"^engine_factory"):
        load_engine_factory("tests.support.fake_engine.FakeEngine")


def test_describe_and_rejection_pickling(settings: ReplicaSettings) -> None:
    replica = Replica(settings, "tests.support.fake_engine:FakeEngine")
    info = replica.describe()
    assert (info.vocab_size, info.multi_item_scoring_delimiter) == (49152, 0)
    copy = pickle.loads(pickle.dumps(ScoringError("too_many_items", "9 > 8")))
    assert (copy.reason, copy.message) == ("too_many_items", "9 > 8")
