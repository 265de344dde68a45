"""A POST's body is JSON (app/bodies.py): a ``Content-Type`` that is not JSON is a 400
``unsupported_media_type`` on every POST route, before the body is read, and never reaches
a replica (vLLM's test_request_wrong_content_type); JSON types with parameters, structured
``+json`` types and no ``Content-Type`` at all are read as JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from app.bodies import is_json_media_type
from app.http import build_api
from replicas.contract import ScoreWork
from tests.support.fake_engine import fake_logprobs
from tests.support.http_support import ask
from tests.unit.test_app_http import SERVICE

BODY = json.dumps({"query": "ab", "items": ["c"], "label_token_ids": [3]}).encode()


async def _no_replica(work: Any) -> Any:
    raise AssertionError("no work may reach a replica")


async def _health() -> None:
    return None


def _post_routes(router: Any) -> list[str]:
    """Every POST route's path, also inside included routers (FastAPI >= 0.16x keeps them
    as ``_IncludedRouter``s of the ``original_router``)."""
    paths = []
    for route in router.routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            paths += _post_routes(inner)
        elif "POST" in (getattr(route, "methods", None) or ()):
            paths.append(route.path)
    return paths


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",  # what curl -d sends unless told otherwise
        "multipart/form-data; boundary=x",
        "application/xml",
        "text/json",
        "application/jsonx",
    ],
)
def test_a_post_whose_content_type_is_not_json_is_a_400_on_every_route(content_type: str) -> None:
    api = build_api(SERVICE, _no_replica, _health)
    paths = _post_routes(api)
    assert {"/v1/score", "/v1/rerank", "/v2/embed", "/tokenize", "/v1/load_lora_adapter"} <= set(
        paths
    )
    for path in paths:
        reply = ask(api, "POST", path, BODY, {"content-type": content_type})
        assert reply.status == 400, (path, reply.body)
        assert reply.body["reason"] == "unsupported_media_type", (path, reply.body)
        assert "application/json" in reply.body["message"]


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "application/json; charset=utf-8", "Application/JSON",
     "application/vnd.api+json", ""],
)  # fmt: skip
def test_json_or_no_content_type_is_read_as_json(content_type: str | None) -> None:
    works: list[ScoreWork] = []

    async def backend(work: ScoreWork) -> np.ndarray:
        works.append(work)
        return fake_logprobs(work)

    headers = {} if content_type is None else {"content-type": content_type}
    reply = ask(build_api(SERVICE, backend, _health), "POST", "/v1/score", BODY, headers)
    assert reply.status == 200, reply.body
    assert len(works) == 1


def test_is_json_media_type() -> None:
    assert all(map(is_json_media_type, (None, " ", "application/json;charset=UTF-8")))
    assert is_json_media_type("application/problem+json")
    assert not any(map(is_json_media_type, ("json", "application/", "*/*", "text/plain")))
