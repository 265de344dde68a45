"""Ask the ingress's FastAPI app (app.http.build_api) over in-process HTTP, without Ray."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.testclient import TestClient


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    headers: Mapping[str, str]


def ask(
    api: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request; the body must be strict JSON (every answer of the ingress is)."""
    client = TestClient(api, raise_server_exceptions=False)
    response = client.request(method, path, content=body, headers=dict(headers or {}))
    decoded = json.loads(response.content, parse_constant=_no_constants)
    return Reply(response.status_code, decoded, response.headers)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} in an answer: not strict JSON")


def engine_api(settings: Any, warm: bool = True) -> tuple[Any, Any]:
    """The ingress's app for ``settings`` over a real engine in this process (no Ray): the
    app and the engine, each work scored alone."""
    from app.http import build_api
    from app.service import ScoringService
    from replicas.engine.scoring_engine import ScoringEngine

    engine = ScoringEngine.from_settings(settings, warm=warm)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    async def health() -> None:
        return None

    return build_api(ScoringService.from_settings(settings), backend, health), engine
