"""Routing of the ingress's HTTP API, independent of Ray so it unit-tests without a cluster.

Every answer is JSON. Errors use the envelope of app.errors; schema errors are 400, not 422.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.errors import Reason, ScoreRequestError, error_body
from app.openapi import openapi_document
from app.service import Backend, ScoringService
from app.validation import parse_json

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
HealthCheck = Callable[[], Awaitable[None]]
StatsSource = Callable[[], Awaitable[dict[str, Any]]]

ROUTES: dict[str, str] = {
    "/v1/score": "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/openapi.json": "GET",
    "/v1/stats": "GET",
}


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


async def read_limited(chunks: AsyncIterator[bytes], limit: int = MAX_BODY_BYTES) -> bytes:
    """Read a request body, refusing (400) bodies larger than ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise ScoreRequestError(
                Reason.INVALID_REQUEST, f"request body is larger than {limit} bytes"
            )
        parts.append(chunk)
    return b"".join(parts)


def relative_path(path: str, root_path: str) -> str:
    """The path below the application's route prefix (Serve puts the prefix in root_path)."""
    if root_path and root_path != "/" and path.startswith(root_path):
        path = path[len(root_path) :]
    path = "/" + path.lstrip("/")
    return path.rstrip("/") or "/"


async def handle(
    service: ScoringService,
    method: str,
    path: str,
    body: Callable[[], Awaitable[bytes]],
    backend: Backend,
    health: HealthCheck,
    stats: StatsSource | None = None,
) -> HttpReply:
    """Answer one request; never raises."""
    try:
        return await _route(service, method.upper(), path, body, backend, health, stats)
    except ScoreRequestError as error:
        return HttpReply(error.status_code, error.body, error.headers)
    except Exception:
        logger.exception("unexpected error answering %s %s", method, path)
        return HttpReply(500, error_body(Reason.INTERNAL, "internal error", None, 500))


async def _route(
    service: ScoringService,
    method: str,
    path: str,
    body: Callable[[], Awaitable[bytes]],
    backend: Backend,
    health: HealthCheck,
    stats: StatsSource | None,
) -> HttpReply:
    allowed = ROUTES.get(path)
    if allowed is None:
        raise ScoreRequestError(Reason.NOT_FOUND, f"no route {path}", status_code=404)
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        return HttpReply(
            405,
            error_body(Reason.METHOD_NOT_ALLOWED, f"{path} accepts {allowed}", None, 405),
            {"Allow": allowed},
        )
    if path == "/v1/score":
        payload = parse_json(await body())
        return HttpReply(200, await service.score(payload, backend))
    if path == "/v1/models":
        return HttpReply(200, service.models_body())
    if path == "/health":
        await health()
        return HttpReply(200, {"status": "ok", "model": service.info.name})
    if path == "/v1/stats":
        if stats is None:
            raise ScoreRequestError(Reason.NOT_FOUND, "no stats source", status_code=404)
        return HttpReply(200, await stats())
    return HttpReply(200, openapi_document())
