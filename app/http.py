"""The ingress's HTTP API as a FastAPI app, independent of Ray so it unit-tests without a cluster.

``build_api`` declares the routes; FastAPI routes them and generates ``/openapi.json`` and
``/docs`` from the pydantic models of app.schema, tightened with the served model's rules
(app.openapi). Bodies are read by app.bodies (a JSON media type, a size bound) and checked
by app.validation, not by FastAPI's parser, so a schema error is a 400 envelope naming the
field, never a 422, and ``NaN`` or ``1.0`` as a token id is refused as the strict validator
refuses it. Every answer is JSON and goes through one frame (``_Frame``): request id, API
key check, error envelope, ``x-total-time``, one access-log line, and one metrics record.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.access import check_access
from app.adapters import AdapterAdmin
from app.bodies import json_body
from app.openapi import RESPONSES, request_body, served_openapi
from app.schema import ErrorResponse, ModelCard, ModelList
from app.service import ScoringService
from app.timings import Backend, Timings
from app.workloads import WORKLOADS, Workload, prompt_tokens
from replicas.errors import Reason, ScoringError, error_body

logger = logging.getLogger(__name__)
# One line per request. A child of Serve's "ray.serve" logger, so inside a Serve replica the
# lines land in the replica's log file (Serve sets that logger to INFO; the root stays at
# WARNING). The name is only a string: this module does not import Ray.
ACCESS_LOG = "ray.serve.scorejax.access"
access_log = logging.getLogger(ACCESS_LOG)

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]+")
HealthCheck = Callable[[], Awaitable[None]]
StatsSource = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Outcome:
    """One answered request, for metrics: ``route`` is the matched route's path (or
    ``unmatched``), ``reason`` the error envelope's reason ("" for a 200); ``timings``,
    ``items`` and ``tokens`` only for scored requests."""

    route: str
    method: str
    status: int
    reason: str
    total_s: float
    timings: Timings | None = None
    items: int | None = None
    tokens: int | None = None


Recorder = Callable[[Outcome], None]


def relative_path(path: str, root_path: str) -> str:
    """The path below the application's route prefix (Serve puts the prefix in root_path)."""
    if root_path and root_path != "/" and path.startswith(root_path):
        path = path[len(root_path) :]
    path = "/" + path.lstrip("/")
    return path.rstrip("/") or "/"


def request_id_for(client_id: str | None) -> str:
    """The client's x-request-id when it is a plain token (<= 128 of [A-Za-z0-9._:-], so
    it cannot forge log lines), else a fresh one."""
    if client_id and len(client_id) <= 128 and REQUEST_ID.fullmatch(client_id):
        return client_id
    return uuid.uuid4().hex


def timing_headers(timings: Timings) -> dict[str, str]:
    """TEI's timing headers, in whole milliseconds (``x-total-time`` is added by the frame)."""
    parts = {
        "x-tokenization-time": timings.tokenization_s,
        "x-queue-time": timings.queue_s,
        "x-inference-time": timings.inference_s,
    }
    return {name: f"{seconds * 1e3:.0f}" for name, seconds in parts.items() if seconds is not None}


def error_response(error: ScoringError, request: Request) -> JSONResponse:
    """The envelope of ``error``; notes its reason on the request for the frame."""
    request.state.reason = str(error.reason)
    return JSONResponse(error.body, status_code=error.status_code, headers=error.headers)


def build_api(
    service: ScoringService,
    backend: Backend,
    health: HealthCheck,
    stats: StatsSource | None = None,
    keys: frozenset[str] = frozenset(),
    recorder: Recorder | None = None,
    set_request_id: bool = True,
    adapters: AdapterAdmin | None = None,
    workloads: Sequence[Workload] = WORKLOADS,
) -> FastAPI:
    """The ASGI app of the ingress. ``set_request_id=False`` inside Serve, whose proxy
    passes its request id in (the client's, else its own) and sets it on the response.
    The scoring routes are ``workloads`` (app.workloads' registry), one POST route per path."""
    api = FastAPI(
        title="scorejax",
        version="0.1.0",
        summary="SGLang-compatible /v1/score and a Cohere/Jina-shaped /v1/rerank",
        redoc_url=None,
    )
    api.openapi = lambda: served_openapi(api, service, workloads)  # type: ignore[method-assign]
    api.add_exception_handler(ScoringError, _scoring_error)
    api.add_exception_handler(HTTPException, _routing_error)
    api.add_middleware(_Frame, keys=keys, recorder=recorder, set_request_id=set_request_id)
    api.include_router(_routes(service, backend, health, stats, adapters, workloads))
    api.include_router(_adapter_routes(adapters))
    if adapters is not None:  # the other ingress replicas' loads and unloads, followed
        api.router.on_startup.append(adapters.start_following)
    return api


def _adapter_routes(adapters: AdapterAdmin | None) -> APIRouter:
    """vLLM's routes that load and unload LoRA adapters at run time (behind the API keys).
    With ``max_loras: 0`` they are not in the OpenAPI document and answer a 404 that names
    the setting: a route this configuration cannot serve is not offered."""
    router = APIRouter(include_in_schema=adapters is not None)

    def admin() -> AdapterAdmin:
        if adapters is None:
            message = "max_loras: 0, this server loads no LoRA adapters (set max_loras > 0)"
            raise ScoringError(Reason.NOT_FOUND, message, status_code=404)
        return adapters

    @router.post(
        "/v1/load_lora_adapter",
        summary="Load a LoRA adapter at run time (vLLM shape); requests name it as `model`",
        openapi_extra=request_body("LoadLoraAdapterRequest"),
        responses=RESPONSES,
    )
    async def load_lora_adapter(request: Request) -> Response:
        payload = await json_body(request)
        return JSONResponse(await admin().load(payload))

    @router.post(
        "/v1/unload_lora_adapter",
        summary="Unload a LoRA adapter (vLLM shape)",
        openapi_extra=request_body("UnloadLoraAdapterRequest"),
        responses=RESPONSES | {404: {"model": RESPONSES[400]["model"], "description": "Unknown"}},
    )
    async def unload_lora_adapter(request: Request) -> Response:
        payload = await json_body(request)
        return JSONResponse(await admin().unload(payload))

    return router


def _routes(
    service: ScoringService,
    backend: Backend,
    health: HealthCheck,
    stats: StatsSource | None,
    adapters: AdapterAdmin | None,
    workloads: Sequence[Workload],
) -> APIRouter:
    router = APIRouter()
    known = adapters.know if adapters is not None else _known_already
    listed = adapters.current if adapters is not None else _listed_already

    async def payload_of(request: Request) -> Any:
        """The body, with the adapter names current for the ``model`` it names."""
        payload = await json_body(request)
        await known(payload)
        return payload

    for workload in workloads:
        _workload_routes(router, workload, service, backend, payload_of)

    @router.post(
        "/tokenize",
        summary="Text -> token ids with the served tokenizer",
        openapi_extra=request_body("TokenizeRequest"),
        responses=RESPONSES,
    )
    async def tokenize(request: Request) -> Response:
        payload = await json_body(request)
        return JSONResponse(service.served_tokenizer().tokenize(payload))

    @router.post(
        "/detokenize",
        summary="Token ids -> text with the served tokenizer",
        openapi_extra=request_body("DetokenizeRequest"),
        responses=RESPONSES,
    )
    async def detokenize(request: Request) -> Response:
        payload = await json_body(request)
        return JSONResponse(service.served_tokenizer().detokenize(payload))

    @router.get("/tokenizer_info", summary="The served tokenizer's special tokens and template")
    async def tokenizer_info() -> Response:
        return JSONResponse(service.served_tokenizer().tokenizer_info())

    @router.get("/v1/models", summary="The served model", responses={200: {"model": ModelList}})
    async def models() -> Response:
        await listed()  # read-your-writes: the adapters loaded or unloaded anywhere
        return JSONResponse(service.models_body())

    @router.get(
        "/v1/models/{model:path}",
        summary="One served model or LoRA adapter by id (OpenAI's models.retrieve)",
        responses={200: {"model": ModelCard}, 404: {"model": ErrorResponse}},
    )
    async def model(model: str) -> Response:
        await listed()
        return JSONResponse(service.model_card(model))

    @router.get("/health", summary="200 once the replicas answer and agree with the ingress")
    async def healthy() -> Response:
        await health()
        return JSONResponse({"status": "ok", "model": service.info.name})

    @router.get("/v1/stats", summary="Counters of one scoring replica")
    async def counters() -> Response:
        if stats is None:
            raise ScoringError(Reason.NOT_FOUND, "no stats source", status_code=404)
        return JSONResponse(await stats())

    return router


def _workload_routes(
    router: APIRouter,
    workload: Workload,
    service: ScoringService,
    backend: Backend,
    payload_of: Callable[[Request], Awaitable[Any]],
) -> None:
    """One POST route per path of ``workload``: the body's answer, with its timing headers."""

    async def answered(request: Request) -> Response:
        payload = await payload_of(request)
        body, timings = await workload.respond(service, payload, backend)
        request.state.timings = timings
        request.state.items = workload.counted(body, payload)
        request.state.tokens = prompt_tokens(body)
        return JSONResponse(body, headers=timing_headers(timings))

    for path in workload.paths:
        router.add_api_route(
            path,
            answered,
            methods=["POST"],
            name=workload.name,
            summary=workload.summary,
            openapi_extra=request_body(workload.schema),
            responses=RESPONSES | workload.responses,
            operation_id=workload.operation_id(path),
        )


async def _listed_already() -> None:
    """No adapters load at run time: the model list never changes."""


async def _known_already(payload: Any) -> None:
    """No adapters load at run time: the names the service has are all there are."""


async def _scoring_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ScoringError)
    return error_response(error, request)


async def _routing_error(request: Request, error: Exception) -> Response:
    """Starlette's 404 and 405 as envelopes (405 keeps its ``Allow`` header)."""
    assert isinstance(error, HTTPException)
    path = relative_path(request.url.path, request.scope.get("root_path", ""))
    headers = dict(error.headers or {})
    if error.status_code == 405:
        allowed = headers.get("Allow", "")
        message = f"{path} accepts {allowed}"
        body = error_body(Reason.METHOD_NOT_ALLOWED, message, None, 405)
        request.state.reason = str(Reason.METHOD_NOT_ALLOWED)
        return JSONResponse(body, status_code=405, headers=headers)
    status = error.status_code
    reason = Reason.NOT_FOUND if status == 404 else Reason.INVALID_REQUEST
    message = f"no route {path}" if status == 404 else str(error.detail)
    return error_response(ScoringError(reason, message, None, status), request)


class _Frame:
    """The middleware every request passes: id, keys, envelope, total time, log, metrics.
    Never raises before the answer starts: an unexpected error is a 500 envelope (and logged
    with its traceback). Plain ASGI (Starlette's ``BaseHTTPMiddleware`` runs the app in a task
    of its own behind memory streams: 1 ms a request inside a Serve replica,
    docs/benchmarks.md); the answer's status line is where the frame adds its headers, logs
    and records."""

    def __init__(
        self, app: ASGIApp, keys: frozenset[str], recorder: Recorder | None, set_request_id: bool
    ) -> None:
        self.app, self.keys, self.recorder = app, keys, recorder
        self.set_request_id = set_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request = Request(scope)
        request_id = request_id_for(request.headers.get("x-request-id"))
        path = relative_path(scope["path"], scope.get("root_path", ""))
        started = False

        async def framed(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self._finish(message, request, request_id, path, time.perf_counter() - start)
            await send(message)

        try:
            check_access(path, request.headers.get("authorization"), self.keys)
            await self.app(scope, receive, framed)
        except ScoringError as error:  # the frame's own (keys); the routes' reach their handler
            await error_response(error, request)(scope, receive, framed)
        except Exception:
            logger.exception("request %s: unexpected error answering %s", request_id, path)
            if started:
                raise
            request.state.reason = str(Reason.INTERNAL)
            body = error_body(Reason.INTERNAL, "internal error", None, 500)
            await JSONResponse(body, 500)(scope, receive, framed)

    def _finish(
        self, start: Message, request: Request, request_id: str, path: str, elapsed_s: float
    ) -> None:
        """The answer's status line: its log line, ``x-total-time`` (and ``x-request-id``)
        added to its headers, its metrics record."""
        status = start["status"]
        reason = getattr(request.state, "reason", "") if status != 200 else ""
        headers = MutableHeaders(scope=start)
        access_log.info(
            "request %s %s %s -> %d %s %.1f ms%s", request_id, request.method, path, status,
            reason, elapsed_s * 1e3, _timing_note(headers),
        )  # fmt: skip
        headers["x-total-time"] = f"{elapsed_s * 1e3:.0f}"
        if self.set_request_id:
            headers["x-request-id"] = request_id
        if self.recorder is not None:
            self.recorder(_outcome(request, path, status, reason, elapsed_s))


def _outcome(request: Request, path: str, status: int, reason: str, total_s: float) -> Outcome:
    """``route``: the matched route's template, else the path; "unmatched" for a 404 (so a
    scan of random paths cannot grow the metrics' label sets)."""
    route = getattr(request.scope.get("route"), "path", None)
    state = request.state
    return Outcome(
        route=route or (path if status != 404 else "unmatched"),
        method=request.method,
        status=status,
        reason=reason,
        total_s=total_s,
        timings=getattr(state, "timings", None),
        items=getattr(state, "items", None),
        tokens=getattr(state, "tokens", None),
    )


def _timing_note(headers: Any) -> str:
    names = ("x-tokenization-time", "x-queue-time", "x-inference-time")
    parts = [f"{name[2:-5]} {headers[name]} ms" for name in names if name in headers]
    return f" ({', '.join(parts)})" if parts else ""
