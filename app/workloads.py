"""The workloads the ingress serves, each defined once: its routes, its request model, the
model kinds that serve it, the function that answers a body (validate -> work -> replica ->
body), and whether Ray Data LLM's processor gets a twin.

Everything else is derived from ``WORKLOADS``: app.http declares one POST route per path,
app.openapi documents each route with its request schema and leaves out the routes the
served model's kind refuses, and app.ingress gives ``ScoreIngress`` one DeploymentHandle
method per workload (``handle.<name>.remote(**fields)``, the HTTP body's fields, the same
answer) and ``<name>_stream`` where ``stream``. Adding a workload is a module with its
``answer`` (and its request model in app.schema), an entry here and its tests
(docs/architecture.md, "Adding a workload").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.kinds import Answer, answers_of, kinds_serving
from app.openapi import (
    RESPONSES,
    classify_request_schema,
    completion_request_schema,
    embed_schema,
    rerank_request_schema,
    score_request_schema,
)
from app.schema import RerankResponse, ScoreResponse
from app.timings import Backend, Timings
from replicas.contract import ModelInfo
from replicas.kinds import KIND_NAMES

# The request schema as the served model states it (model card, shortest text query), or
# None for the request model's own.
Document = Callable[[ModelInfo, int], dict[str, Any] | None]


@dataclass(frozen=True)
class Workload:
    """One route family, defined once."""

    name: str
    """The DeploymentHandle method, the route's endpoint name and operation id prefix."""
    paths: tuple[str, ...]
    """The POST routes that answer it (the first is the one its documents name)."""
    schema: str
    """Its request model in app.schema (the OpenAPI component its routes take)."""
    document: Document
    """That model's JSON schema with the served model's rules (app.openapi)."""
    summary: str
    """One line for the OpenAPI document."""
    counted: Callable[[dict[str, Any], Any], int]
    """How many items (documents, inputs, prompts) an answered body scored, for metrics."""
    answer: Answer | None = None
    """The answer every kind gives (a workload that does not depend on the model's kind);
    None: each kind's own (app.kinds), and the kinds without one refuse it."""
    responses: dict[int | str, dict[str, Any]] = field(default_factory=dict)
    """OpenAPI responses beside the error envelopes (app.openapi.RESPONSES)."""
    stream: bool = False
    """A ``<name>_stream`` handle method for Ray Data LLM's ServeDeploymentProcessor."""
    operation: str = ""
    """The prefix of its routes' OpenAPI operation ids (``<operation>_v1_rerank``); empty:
    FastAPI's own (``score_v1_score_post``)."""

    @property
    def kinds(self) -> tuple[str, ...]:
        """The model kinds that serve it (those whose ingress half answers it, app.kinds);
        the others answer every body with a 400, so its routes are left out of their OpenAPI
        document."""
        return KIND_NAMES if self.answer is not None else kinds_serving(self.name)

    async def respond(self, service: Any, payload: Any, backend: Backend) -> tuple[Any, Timings]:
        """The response body for a decoded request body, and its timings: ``answer``, or
        the served kind's (app.service.ScoringService.answer)."""
        if self.answer is not None:
            return await self.answer(service, payload, backend)
        return await service.answer(self, payload, backend)

    def operation_id(self, path: str) -> str | None:
        return f"{self.operation}{path.replace('/', '_')}" if self.operation else None

    def served_by(self, info: ModelInfo) -> bool:
        return self.answer is not None or self.name in answers_of(info).answers


def prompt_tokens(body: dict[str, Any]) -> int:
    """The tokens an answered body reports (0 where it reports none, Cohere's embed)."""
    return body.get("usage", {}).get("prompt_tokens", 0) if isinstance(body, dict) else 0


def _vectors(body: dict[str, Any], payload: Any) -> int:
    return len(body["data"]) if "data" in body else len(body["texts"])


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="score",
        paths=("/v1/score",),
        schema="ScoreRequest",
        document=score_request_schema,
        summary="Score label tokens after query + item for every item",
        counted=lambda body, payload: len(body["scores"]),
        responses={200: {"model": ScoreResponse, "description": "One row per item"}},
        stream=True,
    ),
    Workload(
        name="rerank",
        paths=("/v1/rerank", "/rerank", "/v2/rerank"),
        schema="RerankRequest",
        document=rerank_request_schema,
        summary="Rank documents for a query (Cohere/Jina shape)",
        counted=lambda body, payload: len(payload["documents"]),
        responses={
            200: {"model": RerankResponse, "description": "Results, best first"},
            404: {"model": RESPONSES[400]["model"], "description": "No rerank template"},
        },
        stream=True,
        operation="rerank",
    ),
    Workload(
        name="embeddings",
        paths=("/v1/embeddings", "/embeddings"),
        schema="EmbeddingRequest",
        document=embed_schema("EmbeddingRequest"),
        summary="Embed texts (OpenAI shape)",
        counted=_vectors,
        responses={200: {"description": "One vector per input"}},
        operation="embed",
    ),
    Workload(
        name="embed",
        paths=("/v2/embed",),
        schema="CohereEmbedRequest",
        document=embed_schema("CohereEmbedRequest"),
        summary="Embed texts (Cohere v2 shape)",
        counted=_vectors,
        responses={200: {"description": "One vector per input"}},
        operation="embed",
    ),
    Workload(
        name="pooling",
        paths=("/pooling",),
        schema="PoolingRequest",
        document=lambda info, text_min_length=0: None,
        summary="Every scored token's vector of a late-interaction model (vLLM's shape)",
        counted=lambda body, payload: len(body["data"]),
        responses={200: {"description": "One list of token vectors per input"}},
        operation="pooling",
    ),
    Workload(
        name="embed_sparse",
        paths=("/embed_sparse",),
        schema="EmbedSparseRequest",
        document=lambda info, text_min_length=0: None,
        summary="Sparse vectors of a sparse model (TEI's shape)",
        counted=lambda body, payload: len(body),
        responses={200: {"description": "One list of {index, value} per input"}},
        operation="embed_sparse",
    ),
    Workload(
        name="classify",
        paths=("/v1/classify",),
        schema="ClassifyRequest",
        document=classify_request_schema,
        summary="Classify texts with a score-head model or cross-encoder (vLLM/SGLang shape)",
        counted=lambda body, payload: len(body["data"]),
        responses={200: {"description": "One entry per input"}},
        stream=True,
    ),
    Workload(
        name="completions",
        paths=("/v1/completions",),
        schema="CompletionRequest",
        document=completion_request_schema,
        summary="Prompt log-probabilities (OpenAI completions shape, prefill-only)",
        counted=lambda body, payload: len(body["choices"]),
        responses={200: {"description": "One choice per prompt"}},
    ),
)

WORKLOAD_NAMED: dict[str, Workload] = {workload.name: workload for workload in WORKLOADS}
