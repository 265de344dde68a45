"""The ScoringReplica Serve deployment: one engine (``replicas.engine_contract.Engine``), fed
by @serve.batch.

Concurrent works (ScoreWork, PromptWork, EmbedWork) from any number of ingress replicas are
gathered into one ``engine.score_batch`` call (max batch size and wait from ReplicaSettings;
both can change at run time through ``user_config``). The engine class (ScoringEngine,
GroupEngine or SliceEngine) is loaded by name when the replica starts (``engine_factory``,
``setup.load_engine_factory``); of the engine package this module imports only
``replicas.engine.memory`` (ctypes), so importing it does not import jax: the CPU ingress
imports it (``app/builder.py`` binds ScoringReplica; ``tests/unit/test_app_layering.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter
from typing import Any

from ray import serve
from ray.serve.exceptions import RayServeException

from cluster.niceness import (
    set_thread_niceness,
    start_compute_niced,
    warn_if_niced,
    worker_niceness,
)
from replicas.answers import answered
from replicas.checkpoints.name_map import AdapterNotFound
from replicas.contract import (
    EmbedWork,
    ModelInfo,
    ScoredWork,
    ScoreWork,
    check_model_limits,
    work_cost,
)
from replicas.engine.memory import release_free_heap
from replicas.engine_contract import Engine, EngineStats
from replicas.errors import (
    EngineUnavailable,
    Reason,
    ScoringError,
    engine_failed,
    failed_on_this_request,
)
from replicas.serving.adapter_registry import AdapterFollower, apply_to_engine
from replicas.serving.admission import MIN_COMPLETIONS, QueueEstimate, admit
from replicas.serving.merging import call_budget, take_for_one_call, waits_for_company
from replicas.serving.metrics import ReplicaMetrics
from replicas.serving.setup import (
    DEFAULT_ENGINE,
    GROUP_ENGINE,
    SLICE_ENGINE,
    apply_user_config,
    check_model_settings,
    coerce_settings,
    load_engine_factory,
)
from replicas.settings import ReplicaSettings, check_delimiter_in_vocab

logger = logging.getLogger(__name__)

UNHEALTHY_AFTER_FAILED_BATCHES = 3
# Steps free and allocate step buffers and query-cache entries of many sizes; glibc keeps the
# freed pages, and a 10-minute soak's replica RSS crept up 8 % with the cache at its bound.
# At most this often after a step, malloc_trim hands them back (replicas/engine/memory.py).
TRIM_INTERVAL_S = 10.0
# Serve batches admitted into _score_many at once; those waiting for the engine are merged.
CONCURRENT_BATCHES = 4
Answers = list[ScoredWork | Exception]  # an engine call's, one per work


def deployed_user_config() -> Mapping[str, Any]:
    """The ``user_config`` this replica's deployment was deployed with (Serve sets the replica
    context before the constructor runs); {} outside a Serve replica."""
    try:
        context = serve.get_replica_context()
    except RayServeException:  # not in a replica: one built in process
        return {}
    config = getattr(context, "_deployment_config", None)  # Serve's own, not public API
    return getattr(config, "user_config", None) or {}


# max_ongoing_requests: admission (max_queue_wait_s) decides what waits, not Serve's handle
# queue, which the replica cannot see (docs/operations.md).
@serve.deployment(name="ScoringReplica", max_ongoing_requests=256, health_check_period_s=10)
class ScoringReplica:
    """Owns one engine; answers ``score_timed(work)``: ``[items, labels]`` log-probabilities."""

    def __init__(
        self,
        settings: ReplicaSettings | Mapping[str, Any],
        engine_factory: str = DEFAULT_ENGINE,
        adapter_registry: Any = None,
    ) -> None:
        # A user_config that needs a reload fails here, before the weights load, not in the
        # ``reconfigure`` Serve calls once the constructor has loaded and warmed them.
        self._settings = apply_user_config(coerce_settings(settings), deployed_user_config())
        warn_if_niced("scoring replica", logger)
        self._ready = False
        self._requests = 0
        self._works = 0
        self._batches = 0
        self._largest_batch = 0
        self._failed_batches_in_a_row = 0
        self._last_error = ""
        self._queue = QueueEstimate()  # works queued or in a step (tokens), recent work rate
        self._shed = {"overloaded": 0, "expired": 0}
        self._metrics = ReplicaMetrics()
        self._trimmed_at = time.monotonic()
        # _shared_step's batches: each work with its cost (``work_cost``, from score_timed)
        self._waiting: deque[tuple[list[tuple[ScoreWork, int]], asyncio.Future]] = deque()
        self._drainer: asyncio.Task | None = None
        vocab_size = check_model_settings(self._settings)
        if engine_factory == DEFAULT_ENGINE and self._settings.placement.hosts_per_replica > 1:
            engine_factory = SLICE_ENGINE if self._settings.placement.tpu_slice else GROUP_ENGINE
        factory = load_engine_factory(engine_factory)
        niceness = self._settings.engine.engine_niceness
        self._engine: Engine = start_compute_niced(niceness, lambda: factory(self._settings))
        # Steps run on one thread at the engine's niceness; the event loop keeps its own.
        self._steps = ThreadPoolExecutor(1, "scorejax-step", set_thread_niceness, (niceness,))
        info = self._engine.info
        if info.vocab_size != vocab_size:
            logger.warning("engine vocab %d != config vocab %d", info.vocab_size, vocab_size)
        check_delimiter_in_vocab(self._settings.model, info.vocab_size, info.name)
        # One batch queue per replica object (the decorator form keeps one per class).
        # Batches may enter _score_many while a step runs (Serve's default runs one at a
        # time, so each would become an engine call of its own); _shared_step runs all that
        # wait as one call.
        self._score_batched = serve.batch(
            max_batch_size=self._settings.batching.max_batch_size,
            batch_wait_timeout_s=self._settings.batching.batch_wait_timeout_s,
            max_concurrent_batches=CONCURRENT_BATCHES,
        )(self._score_many)
        self._adapters = None  # LoRA on: the app's registry, followed (adapter_registry.py)
        if adapter_registry is not None:
            apply = apply_to_engine(self._engine, self._between_steps)
            known = dict(self._settings.adapters.lora_adapters)
            self._adapters = AdapterFollower(adapter_registry, known, apply)
        self._ready = True  # from_settings returns after weights load and warm-up

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Serve calls this with ``user_config`` at start and on every config change."""
        self._settings = apply_user_config(self._settings, user_config or {})
        self._score_batched.set_max_batch_size(self._settings.batching.max_batch_size)
        self._score_batched.set_batch_wait_timeout_s(self._settings.batching.batch_wait_timeout_s)

    def check_health(self) -> None:
        if not self._ready:
            raise RuntimeError("scoring engine is not loaded and warmed up yet")
        self._engine.check_health()  # a host group pings its followers
        if self._failed_batches_in_a_row >= UNHEALTHY_AFTER_FAILED_BATCHES:
            raise RuntimeError(
                f"{self._failed_batches_in_a_row} scoring batches failed in a row; "
                f"last error: {self._last_error}"
            )

    def describe(self) -> ModelInfo:
        return self._engine.info

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter here (between steps), before the registry records it: a 400
        ``invalid_request`` naming what does not fit (files, base, slots)."""
        if self._adapters is None:
            raise ScoringError(Reason.INVALID_REQUEST, "max_loras: 0, LoRA adapters are off")
        await self._adapters.follow(force=True)
        try:
            await self._between_steps(lambda: self._engine.load_adapter(name, path))
        except ScoringError:
            raise
        except AdapterNotFound as error:
            raise ScoringError(Reason.NOT_FOUND, str(error)) from None
        except (ValueError, OSError, AttributeError) as error:
            raise ScoringError(Reason.INVALID_REQUEST, str(error)) from None
        self._adapters.loaded(name, path)

    async def _between_steps(self, change: Callable[[], Any]) -> Any:
        """``change`` on the step thread: never during a step."""
        return await asyncio.get_running_loop().run_in_executor(self._steps, change)

    def stats(self) -> dict[str, Any]:
        """Replica counters plus the engine's (``EngineStats.as_dict()``: compiles by source,
        steps, tokens computed vs useful, engine seconds, query cache), as JSON for
        ``GET /v1/stats``."""
        return {
            "requests": self._requests,
            "works": self._works,
            "batches": self._batches,
            "largest_batch": self._largest_batch,
            "compile_count": self._engine.compile_count,
            **self._engine.stats().as_dict(),
            "max_batch_size": self._settings.batching.max_batch_size,
            "batch_wait_timeout_s": self._settings.batching.batch_wait_timeout_s,
            "queued_works": self._queue.in_flight,
            "queued_tokens": round(self._queue.queued_work),
            "expected_wait_s": round(self._queue.expected_wait_s(), 3),
            "rejected_overloaded": self._shed["overloaded"],
            "dropped_expired": self._shed["expired"],
            "worker_niceness": worker_niceness(),
        }

    async def score_timed(self, work: ScoreWork) -> ScoredWork:
        """One request's answer (``scores``: a ScoreWork's float32 log-probabilities
        ``[n_items, n_labels]``) with the seconds of its engine step (the ingress's timing
        headers); refusals raise ScoringError."""
        self._requests += 1
        if self._adapters is not None:
            await self._adapters.follow(work.adapter)
        check_model_limits(work, self._engine.info)  # the engine trusts this check
        batching = self._settings.batching
        cold_calls = max(batching.max_batch_size, MIN_COMPLETIONS)  # before a work rate
        verdict = admit(self._queue, batching.max_queue_wait_s, cold_calls)
        if not verdict.admitted:
            self._shed["overloaded"] += 1
            message = verdict.refusal("scoring replica")
            excess = verdict.expected_wait_s - verdict.max_wait_s
            raise ScoringError(
                Reason.OVERLOADED, message, retry_after_s=verdict.retry_after_s,
                excess_wait_s=None if verdict.cold_calls else excess,
            )  # fmt: skip
        cost = work_cost(work, self._settings.model.multi_item)  # once: admission, merging
        ticket = self._queue.started(cost)
        result: Any = None
        try:
            result = await self._score_batched(work, cost)
        finally:
            served = isinstance(result, ScoredWork)
            self._queue.finished(ticket, served, not served or result.clean)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _score_many(self, works: list[ScoreWork], costs: list[int]) -> Answers:
        """The @serve.batch target: concurrent score_timed() calls (work, cost) as two lists.
        Works past their deadline are dropped unscored (nobody waits for them)."""
        now = time.time()
        alive = [work.deadline is None or work.deadline > now for work in works]
        self._shed["expired"] += alive.count(False)
        if all(alive):  # the common case: nothing to drop, no refusal built
            return await self._shared_step(list(zip(works, costs, strict=True)))
        message = "request deadline passed before scoring"
        expired = ScoringError(Reason.OVERLOADED, message, retry_after_s=1)
        live = [pair for pair, ok in zip(zip(works, costs, strict=True), alive, strict=True) if ok]
        scored = iter(await self._shared_step(live) if live else [])
        return [next(scored) if ok else expired for ok in alive]

    async def _shared_step(self, works: list[tuple[ScoreWork, int]]) -> Answers:
        """``_run_engine`` for ``works``, together with every batch that arrives while the
        engine is busy. Serve forms a batch ``batch_wait_timeout_s`` after its first request
        even while a step runs, so a burst arriving during a step would wait as several small
        batches, one engine call each; here one task runs every batch waiting when the engine
        frees (up to ``max_batch_size`` works) in one call, again while more wait, and hands
        each batch its own results."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append((works, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())  # no request's cancellation
        return await future

    async def _drain(self) -> None:
        batching = self._settings.batching
        waiting = [([work for work, _ in works], None) for works, _ in self._waiting]
        if batching.pack_wait_s and waits_for_company(waiting, batching.max_batch_size):
            await asyncio.sleep(batching.pack_wait_s)  # concurrent requests join this call
        while self._waiting:
            batching = self._settings.batching
            budget = call_budget(batching.max_call_s, self._queue.work_rate())
            taken = take_for_one_call(self._waiting, batching.max_batch_size, budget, itemgetter(1))
            called = [work for works, _ in taken for work, _ in works]
            self._batches += 1  # one engine call: the batch the engine sees
            self._works += len(called)
            self._largest_batch = max(self._largest_batch, len(called))
            try:
                results = await self._run_engine(called)
            except BaseException as error:  # cancelled (the replica stops): tell every waiter
                for _, future in [*taken, *self._waiting]:
                    if not future.done():
                        future.set_exception(error)
                self._waiting.clear()
                raise
            start = 0
            for works, future in taken:
                if not future.done():  # its caller may have gone
                    future.set_result(results[start : start + len(works)])
                start += len(works)

    async def _run_engine(self, works: list[ScoreWork]) -> Answers:
        """One engine call; when every work is refused, each alone (one bad work must not fail
        its neighbours). A work the engine fails on alone while it still scores a probe is a
        defect of the engine on that request: 500, not a retryable 503 (issue 43: the same
        body failed the same way on every retry)."""
        results = await self._run_engine_once(works)
        if len(works) > 1 and all(isinstance(r, ScoringError) for r in results):
            results = [(await self._run_engine_once([work]))[0] for work in works]
        if any(_engine_failed(r) for r in results) and await self._engine_scores_a_probe():
            results = [failed_on_this_request(r) if _engine_failed(r) else r for r in results]
        return results

    async def _engine_scores_a_probe(self) -> bool:
        """Whether the engine scores a one-token query with one empty item (a warm step)."""
        info = self._engine.info
        token = 2 if info.multi_item_scoring_delimiter == 1 else 1
        kind = info.model_kind
        labels = (0,) if kind.lm_head else info.head.label_ids  # type: ignore[union-attr]
        probe = EmbedWork(((token,),)) if kind.embeds else ScoreWork((token,), ((),), labels)
        (answer,) = await self._run_engine_once([probe])  # type: ignore[list-item]
        return isinstance(answer, ScoredWork)

    async def _run_engine_once(self, works: list[ScoreWork]) -> Answers:
        start, compiles = time.perf_counter(), _compile_marks(self._engine.stats())
        try:
            # A thread keeps the event loop (health checks, queueing) alive during the step.
            loop = asyncio.get_running_loop()
            arrays = await loop.run_in_executor(self._steps, self._engine.score_batch, works)
        except EngineUnavailable as error:
            self._failed_batches_in_a_row = UNHEALTHY_AFTER_FAILED_BATCHES  # replace me
            self._last_error = str(error)
            logger.error("scoring engine unavailable: %s", error)
            return [ScoringError(Reason.UNAVAILABLE, str(error))] * len(works)
        except ScoringError as error:  # the work, not the engine, is at fault
            return [error] * len(works)
        except Exception as error:
            self._failed_batches_in_a_row += 1
            self._last_error = repr(error)
            logger.exception("scoring batch of %d failed", len(works))
            # The engine failed: a retryable 503 unless it scores a probe (_run_engine);
            # enough in a row turn the health check red and Serve replaces this replica.
            return [engine_failed(repr(error))] * len(works)
        self._failed_batches_in_a_row = 0
        seconds, stats = time.perf_counter() - start, self._engine.stats()  # once after
        self._metrics.after_step(len(works), seconds, stats)
        if time.monotonic() - self._trimmed_at >= TRIM_INTERVAL_S:
            self._trimmed_at = time.monotonic()
            await asyncio.to_thread(release_free_heap)
        clean = compiles == _compile_marks(stats) and not compiles[0]
        answers = (answered(work, answer) for work, answer in zip(works, arrays, strict=True))
        return [ScoredWork(answer, seconds, clean) for answer in answers]


def _compile_marks(stats: EngineStats) -> tuple[int, ...]:
    """(background compiles pending, compiles by source): a step between two equal marks
    with none pending ran beside no compile and compiled nothing itself."""
    return (stats.background_pending, stats.background_compiles, stats.request_path_compiles)


def _engine_failed(result: ScoredWork | Exception) -> bool:
    """Whether ``result`` says the engine failed on the step (not that it refused the work)."""
    return isinstance(result, ScoringError) and result.engine_failure is not None
