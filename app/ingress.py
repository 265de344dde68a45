"""ScoreIngress: the CPU Serve deployment in front of the scoring replicas.

HTTP (app.http's FastAPI app through ``@serve.ingress``): every workload's POST routes
(app.workloads: ``/v1/score``, ``/v1/rerank`` and its aliases, ``/v1/classify``,
``/v1/completions``, ``/v1/embeddings``, ``/v2/embed``), ``/tokenize``, ``/detokenize``,
``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; ``GET /tokenizer_info``,
``/v1/models``, ``/health``, ``/v1/stats``, ``/openapi.json``, ``/docs``.
Python: one handle method per workload, ``await handle.score.remote(query=..., items=...,
label_token_ids=...)`` (likewise ``rerank``, ``classify``, ``completions``, ``embeddings``,
``embed``), takes the HTTP body's fields and returns the same body as the route (and raises
ScoringError, whose ``body`` is the HTTP error); ``handle.score_work.remote(work)`` takes a
work a batch job prepared with app/'s code. Ray Data LLM
(``ray.data.llm.ServeDeploymentProcessorConfig``, docs/batch.md): ``score_stream``,
``rerank_stream``, ``classify_stream`` take one request dict (the row's ``request_kwargs``:
the method's fields) and yield one row: ``response`` (the route's body), ``error`` and
``error_message`` (a 400's reason and message).
Never imports jax; only token ids go to the replicas.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from app.access import load_api_keys
from app.adapters import AdapterAdmin, LiveNames
from app.http import build_api
from app.metrics import IngressMetrics
from app.refusals import RefusalWindow
from app.service import ScoringService
from app.workloads import WORKLOADS, Workload
from app.works import check_prepared
from cluster.niceness import warn_if_niced
from replicas.contract import EmbedWork, ModelInfo, PromptWork, ScoredWork, ScoreWork
from replicas.errors import Reason, ScoringError
from replicas.serving.setup import coerce_settings
from replicas.settings import ReplicaSettings

logger = logging.getLogger(__name__)


def _unwrap(error: BaseException) -> BaseException:
    """The user exception inside a RayTaskError (Ray makes it a subclass of both)."""
    if isinstance(error, RayTaskError):
        cause = error.as_instanceof_cause()
        return cause if not isinstance(cause, RayTaskError) else error
    return error


def _unavailable(error: BaseException) -> ScoringError:
    return ScoringError(Reason.UNAVAILABLE, f"scoring replica unavailable: {error}")


def compare_info(ingress: ModelInfo, replica: ModelInfo) -> str | None:
    """What the replica serves that the ingress would validate differently, if anything."""
    for name in ("vocab_size", "multi_item_scoring_delimiter", "limits", "head", "pooling"):
        mine, theirs = getattr(ingress, name), getattr(replica, name)
        if mine != theirs:
            return f"{name}: ingress has {mine!r}, replica has {theirs!r}"
    return None


# What Ray Data LLM's ServeDeploymentStage adds to each request (not a method's field).
PROCESSOR_FIELDS = ("request_id", "idx_in_batch")


def _plain(value: Any) -> Any:
    """A request field as Python values: the processor's rows pass through Arrow, whose lists
    come back as NumPy arrays."""
    tolist = getattr(value, "tolist", None)
    value = tolist() if callable(tolist) else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


async def _processor_row(
    method: Callable[..., Awaitable[dict[str, Any]]], request: Mapping[str, Any]
) -> dict[str, Any]:
    """One processor row: the body, or a 400's reason and message (a 503 or 500 raises, as
    the handle method does: ScoringError is a ValueError, which the processor's
    ``should_continue_on_error`` turns into the row's ``__inference_error__``)."""
    fields = {k: _plain(v) for k, v in request.items() if k not in PROCESSOR_FIELDS}
    try:
        body = await method(**fields)
    except ScoringError as error:
        if error.status_code != 400:
            raise
        return {"response": None, "error": error.reason.value, "error_message": error.message}
    return {"response": body, "error": None, "error_message": None}


def workload_methods(workloads: tuple[Workload, ...]) -> type:
    """A base class with one handle method per workload, ``<name>(**fields)`` -> the route's
    body, and ``<name>_stream(request)`` -> one Ray Data LLM processor row where the
    workload has a twin."""
    methods: dict[str, Any] = {}
    for workload in workloads:
        methods[workload.name] = _handle_method(workload)
        if workload.stream:
            methods[f"{workload.name}_stream"] = _stream_method(workload.name)
    return type("WorkloadMethods", (), methods)


def _handle_method(workload: Workload) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def method(self: ScoreIngress, **fields: Any) -> dict[str, Any]:
        return await self.answer(workload, fields)

    method.__name__ = method.__qualname__ = workload.name
    method.__doc__ = (
        f"The {workload.paths[0]} body for these fields (app.schema.{workload.schema}); "
        "raises ScoringError like a 400/503."
    )
    return method


def _stream_method(name: str) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    async def stream(self: ScoreIngress, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        yield await _processor_row(getattr(self, name), request)

    stream.__name__ = stream.__qualname__ = f"{name}_stream"
    stream.__doc__ = f"Ray Data LLM's ServeDeploymentProcessor contract for ``{name}``."
    return stream


@serve.deployment(name="ScoreIngress", max_ongoing_requests=256)
@serve.ingress()
class ScoreIngress(workload_methods(WORKLOADS)):  # type: ignore[misc]
    def __init__(
        self,
        replica: DeploymentHandle,
        settings: ReplicaSettings | Mapping[str, Any],
        adapter_registry: DeploymentHandle | None = None,
    ) -> None:
        self._settings = coerce_settings(settings)
        warn_if_niced("ingress", logger)
        self._keys = load_api_keys(self._settings.http)  # start-up error names the setting
        names = None  # LoRA on: the names it validates ``model`` against, kept current
        if adapter_registry is not None:
            names = LiveNames(name for name, _ in self._settings.adapters.lora_adapters)
        self._service = ScoringService.from_settings(self._settings, names)
        self._adapters = None
        if adapter_registry is not None and names is not None:
            base = self._service.info.name
            self._adapters = AdapterAdmin(base, names, replica, adapter_registry)
        self._replica = replica
        self._metrics = IngressMetrics()
        self._refusals = RefusalWindow()  # the replicas' last overload refusal, for <= 1 s

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this after ``__init__``: the FastAPI app of app.http (routes,
        generated OpenAPI and /docs) over this replica's service and handles."""
        return build_api(
            self._service,
            self._call_replica,
            self._check_replica,
            self._replica_stats,
            keys=self._keys,
            recorder=self._metrics.record,
            set_request_id=False,
            adapters=self._adapters,
        )

    async def score_work(self, work: ScoreWork | PromptWork | EmbedWork) -> Any:
        """A work already prepared with app/'s code (a batch job's CPU stage), checked again:
        the replica's answer (``[items, labels]`` log-probs, or one PromptLogprobs per
        prompt); raises ScoringError like a 400/503."""
        check_prepared(work, self._service.info)
        return (await self._call_replica(work)).scores

    async def answer(self, workload: Workload, payload: dict[str, Any]) -> dict[str, Any]:
        """``workload``'s body for ``payload`` (the HTTP body's fields); raises ScoringError
        like a 400/503. Every workload's handle method comes here (``workload_methods``)."""
        if self._adapters is not None:  # the adapter names current for the ``model`` named
            await self._adapters.know(payload)
        body, _ = await workload.respond(self._service, payload, self._call_replica)
        return body

    async def describe(self) -> ModelInfo:
        return self._service.info

    async def _call_replica(self, work: ScoreWork | PromptWork | EmbedWork) -> ScoredWork:
        """The replica call, bounded by the request's deadline. Admission is the replica's
        (``ScoringReplica.score_timed``): it alone sees the work every ingress sent; for up
        to a second after it refused, the ingress refuses what it would (app.refusals)."""
        refusal = self._refusals.refusal()
        if refusal is not None:
            raise refusal
        deadline_s = self._settings.batching.request_deadline_s
        work = dataclasses.replace(work, deadline=time.time() + deadline_s)
        try:
            return await asyncio.wait_for(self._replica_answer(work), deadline_s)
        except TimeoutError:
            message = f"no answer within the request deadline ({deadline_s} s)"
            raise ScoringError(Reason.OVERLOADED, message, None, 503, 1) from None

    async def _replica_answer(self, work: ScoreWork | PromptWork) -> ScoredWork:
        try:
            return await self._replica.score_timed.remote(work)
        except Exception as raw:
            error = _unwrap(raw)
            if isinstance(error, ScoringError):  # the replica's refusal, with its own status
                # (an adapter unloaded after the ingress checked the name: 404, semantics 21)
                self._refusals.refused(error, self._settings.batching.max_queue_wait_s)
                param = "model" if error.reason == Reason.MODEL_NOT_FOUND else None
                raise ScoringError(
                    error.reason, error.message, param, error.status_code, error.retry_after_s
                ) from None
            if isinstance(error, BackPressureError):
                raise ScoringError(
                    Reason.OVERLOADED, "scoring replicas are overloaded; retry later", None, 503, 1
                ) from None
            if isinstance(error, RayActorError | RayServeException):
                raise _unavailable(error) from None
            logger.exception("scoring replica failed")
            raise ScoringError(Reason.INTERNAL, "scoring failed", None, 500) from None

    async def _replica_stats(self) -> dict[str, Any]:
        """Counters of one scoring replica (requests, batches, compile_count)."""
        try:
            return await self._replica.stats.remote()
        except Exception as error:
            raise _unavailable(error) from None

    async def _check_replica(self) -> None:
        try:
            replica_info = await self._replica.describe.remote()
        except Exception as error:
            raise _unavailable(error) from None
        mismatch = compare_info(self._service.info, replica_info)
        if mismatch:
            raise ScoringError(Reason.UNAVAILABLE, f"ingress and replica disagree on {mismatch}")
