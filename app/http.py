"""Routing of the ingress's HTTP API, independent of Ray so it unit-tests without a cluster.

Every answer is JSON. Errors use the envelope of app.errors; schema errors are 400, not 422.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.access import check_access
from app.errors import Reason, ScoreRequestError, error_body
from app.service import Backend, ScoringService, Timings
from app.validation import parse_json

logger = logging.getLogger(__name__)
# One line per request. A child of Serve's "ray.serve" logger, so inside a Serve replica the
# lines land in the replica's log file (Serve sets that logger to INFO; the root stays at
# WARNING). The name is only a string: this module does not import Ray.
ACCESS_LOG = "ray.serve.scorejax.access"
access_log = logging.getLogger(ACCESS_LOG)

MAX_BODY_BYTES = 16 * 1024 * 1024
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]+")
HealthCheck = Callable[[], Awaitable[None]]
StatsSource = Callable[[], Awaitable[dict[str, Any]]]

RERANK_ROUTES = ("/v1/rerank", "/rerank", "/v2/rerank")
ROUTES: dict[str, str] = {
    "/v1/score": "POST",
    **dict.fromkeys(RERANK_ROUTES, "POST"),
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


@dataclass(frozen=True)
class Caller:
    """Who asks: the Authorization header and the request id (the client's x-request-id,
    else a fresh one); ``keys`` are the configured API keys (empty: no auth)."""

    authorization: str | None = None
    request_id: str | None = None
    keys: frozenset[str] = frozenset()


def request_id_for(client_id: str | None) -> str:
    """The client's x-request-id when it is a plain token (<= 128 of [A-Za-z0-9._:-], so
    it cannot forge log lines), else a fresh one."""
    if client_id and len(client_id) <= 128 and REQUEST_ID.fullmatch(client_id):
        return client_id
    return uuid.uuid4().hex


async def handle(
    service: ScoringService,
    method: str,
    path: str,
    body: Callable[[], Awaitable[bytes]],
    backend: Backend,
    health: HealthCheck,
    stats: StatsSource | None = None,
    caller: Caller = Caller(),
) -> HttpReply:
    """Answer one request; never raises. Logs one line per request (id, method, path,
    status, milliseconds) and never its content."""
    start = time.perf_counter()
    request_id = request_id_for(caller.request_id)
    try:
        check_access(path, caller.authorization, caller.keys)
        reply = await _route(service, method.upper(), path, body, backend, health, stats)
    except ScoreRequestError as error:
        reply = HttpReply(error.status_code, error.body, error.headers)
    except Exception:
        logger.exception("request %s: unexpected error answering %s %s", request_id, method, path)
        reply = HttpReply(500, error_body(Reason.INTERNAL, "internal error", None, 500))
    elapsed_ms = (time.perf_counter() - start) * 1e3
    reason = reply.body.get("reason", "") if reply.status != 200 else ""
    access_log.info(
        "request %s %s %s -> %d %s %.1f ms%s", request_id, method, path, reply.status, reason,
        elapsed_ms, _timing_note(reply.headers),
    )  # fmt: skip
    headers = {**reply.headers, "x-request-id": request_id, "x-total-time": f"{elapsed_ms:.0f}"}
    return HttpReply(reply.status, reply.body, headers)


def timing_headers(timings: Timings) -> dict[str, str]:
    """TEI's timing headers, in whole milliseconds (``x-total-time`` is added by ``handle``)."""
    parts = {
        "x-tokenization-time": timings.tokenization_s,
        "x-queue-time": timings.queue_s,
        "x-inference-time": timings.inference_s,
    }
    return {name: f"{seconds * 1e3:.0f}" for name, seconds in parts.items() if seconds is not None}


def _timing_note(headers: dict[str, str]) -> str:
    parts = [f"{name[2:-5]} {headers[name]} ms" for name in headers if name.endswith("-time")]
    return f" ({', '.join(parts)})" if parts else ""


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
        scored, timings = await service.score_timed(payload, backend)
        return HttpReply(200, scored, timing_headers(timings))
    if path in RERANK_ROUTES:
        ranked, timings = await service.rerank_timed(parse_json(await body()), backend)
        return HttpReply(200, ranked, timing_headers(timings))
    if path == "/v1/models":
        return HttpReply(200, service.models_body())
    if path == "/health":
        await health()
        return HttpReply(200, {"status": "ok", "model": service.info.name})
    if path == "/v1/stats":
        if stats is None:
            raise ScoreRequestError(Reason.NOT_FOUND, "no stats source", status_code=404)
        return HttpReply(200, await stats())
    return HttpReply(200, service.openapi())
