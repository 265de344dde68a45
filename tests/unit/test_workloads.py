"""The workload registry (app.workloads) is where routes, OpenAPI and handle methods come
from: each is derived from ``WORKLOADS``, and a workload added there appears in all three."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from app.completions import Completions
from app.http import build_api
from app.ingress import workload_methods
from app.kinds import INGRESS_HALVES
from app.openapi import served_openapi
from app.service import ScoringService, Timings
from app.workloads import WORKLOADS, Workload
from replicas.contract import ModelInfo, PoolingHead, ScoreHead
from replicas.embed_contract import Hybrid, LateInteraction, SparseOutput
from replicas.errors import ScoringError
from replicas.kinds import KINDS as MODEL_KINDS
from tests.support.http_support import ask
from tests.unit.test_app_http import SERVICE

KINDS = tuple(kind.name for kind in MODEL_KINDS)
# Route -> the kinds it refuses with a reason of its own (their refusals, app.kinds).
OWN_REASON = {
    workload.paths[0]: tuple(k for k in KINDS if workload.name in INGRESS_HALVES[k].refusals)
    for workload in WORKLOADS
}


async def _health() -> None:
    return None


async def _backend(work: Any) -> np.ndarray:
    raise AssertionError("no work is scored here")


def test_every_workload_path_is_a_post_route() -> None:
    api = build_api(SERVICE, _backend, _health)
    for workload in WORKLOADS:
        for path in workload.paths:  # a body that is not JSON: the route's 400, not a 404
            reply = ask(api, "POST", path, b"{")
            assert (reply.status, reply.body["reason"]) == (400, "invalid_json"), path
    assert ask(api, "POST", "/v1/nowhere", b"{").status == 404
    names = [workload.name for workload in WORKLOADS]
    assert len(names) == len(set(names))
    paths = [path for workload in WORKLOADS for path in workload.paths]
    assert len(paths) == len(set(paths))


SCORE_HEAD = ScoreHead("linear", 2, ("neg", "pos"))
CROSS_ENCODER = ScoreHead("cross_encoder", 1, ("LABEL_0",), activation="sigmoid", max_length=64)


def _info_of(kind: str) -> ModelInfo:
    if kind == "embedding":
        pooling = PoolingHead(pooling="mean", dimension=8, normalize=True)
        return dataclasses.replace(SERVICE.info, pooling=pooling)
    if kind == "late_interaction":
        late = PoolingHead("tokens", True, 8, late=LateInteraction(query_length=8))
        return dataclasses.replace(SERVICE.info, pooling=late)
    if kind == "sparse":
        sparse = PoolingHead("splade", False, SERVICE.info.vocab_size, sparse=SparseOutput())
        return dataclasses.replace(SERVICE.info, pooling=sparse)
    if kind == "hybrid":
        hybrid = PoolingHead("cls", True, 8, hybrid=Hybrid(colbert_dimension=8))
        return dataclasses.replace(SERVICE.info, pooling=hybrid)
    if kind in ("cross_encoder", "score_head"):
        head = CROSS_ENCODER if kind == "cross_encoder" else SCORE_HEAD
        return dataclasses.replace(SERVICE.info, head=head)
    return SERVICE.info


@pytest.mark.parametrize("kind", KINDS)
def test_the_document_offers_exactly_the_workloads_the_model_kind_serves(kind: str) -> None:
    info = _info_of(kind)
    assert info.kind == kind
    service = dataclasses.replace(SERVICE, info=info)
    api = build_api(service, _backend, _health)
    document = served_openapi(api, service, WORKLOADS)
    for workload in WORKLOADS:
        for path in workload.paths:
            offered = path in document["paths"]
            assert offered == (kind in workload.kinds), (kind, path)
            if offered:
                body = document["paths"][path]["post"]["requestBody"]["content"]
                ref = body["application/json"]["schema"]["$ref"]
                assert ref.endswith(f"/{workload.schema}")
                assert workload.schema in document["components"]["schemas"]


def test_a_cross_encoders_document_takes_text_only_where_its_routes_do() -> None:
    """/v1/score and /v1/rerank on a cross-encoder refuse token ids (app.cross_encoder), so
    its document offers none: text query and items, no label_token_ids, no token-id branch."""
    service = dataclasses.replace(SERVICE, info=_info_of("cross_encoder"))
    schemas = served_openapi(build_api(service, _backend, _health), service, WORKLOADS)
    schemas = schemas["components"]["schemas"]
    score = schemas["ScoreRequest"]
    assert score["properties"]["query"]["type"] == "string"
    assert score["properties"]["items"]["items"] == {"type": "string"}
    assert "label_token_ids" not in score["properties"] and "oneOf" not in score
    assert "cross_encoder" in score["description"]
    for name, fields in (("ScoreRequest", ("query", "items")),
                         ("RerankRequest", ("query", "documents"))):  # fmt: skip
        for field_name in fields:  # no integers (token ids) anywhere in the text fields
            stated = json.dumps(schemas[name]["properties"][field_name])
            assert '"integer"' not in stated, (name, field_name, stated)
    assert "instruction" not in schemas["RerankRequest"]["properties"]  # refused: a 400
    causal = served_openapi(build_api(SERVICE, _backend, _health), SERVICE, WORKLOADS)
    query = causal["components"]["schemas"]["ScoreRequest"]["properties"]["query"]
    assert '"integer"' in json.dumps(query)  # the other kinds keep their token ids
    assert "instruction" in causal["components"]["schemas"]["RerankRequest"]["properties"]


def test_a_new_workload_gets_its_route_document_and_handle_methods() -> None:
    async def echo(service: ScoringService, payload: Any, backend: Any) -> Any:
        return {"echo": payload, "usage": {"prompt_tokens": 3}}, Timings(0.0)

    extra = Workload(
        name="echo",
        paths=("/v1/echo",),
        schema="ScoreRequest",
        document=lambda info, shortest: None,
        summary="Echo the body",
        answer=echo,
        counted=lambda body, payload: 1,
        stream=True,
    )
    api = build_api(SERVICE, _backend, _health, workloads=(*WORKLOADS, extra))
    reply = ask(api, "POST", "/v1/echo", json.dumps({"query": "q"}).encode())
    assert reply.status == 200 and reply.body["echo"] == {"query": "q"}
    assert "/v1/echo" in served_openapi(api, SERVICE, (*WORKLOADS, extra))["paths"]
    methods = workload_methods((*WORKLOADS, extra))
    for workload in (*WORKLOADS, extra):
        assert callable(getattr(methods, workload.name))
        assert hasattr(methods, f"{workload.name}_stream") == workload.stream

    class Ingress(methods):  # type: ignore[misc, valid-type]
        _service = SERVICE
        _call_replica = staticmethod(_backend)

        async def answer(self, workload: Workload, payload: dict[str, Any]) -> dict[str, Any]:
            body, _ = await workload.respond(self._service, payload, self._call_replica)
            return body

    assert asyncio.run(Ingress().echo(query="q")) == {  # type: ignore[attr-defined]
        "echo": {"query": "q"},
        "usage": {"prompt_tokens": 3},
    }

    async def first_row() -> Any:
        rows = Ingress().echo_stream({"query": "q", "request_id": 1})  # type: ignore[attr-defined]
        return [row async for row in rows]

    assert asyncio.run(first_row()) == [
        {"response": {"echo": {"query": "q"}, "usage": {"prompt_tokens": 3}}, "error": None,
         "error_message": None}
    ]  # fmt: skip


ONE_BODY = {  # a body each workload would take on a kind it serves
    "classify": {"input": "a"},
    "completions": {"prompt": "x", "echo": True, "max_tokens": 0},
    "embeddings": {"input": ["a"]},
    "embed": {"texts": ["a"], "input_type": "search_query"},
    "pooling": {"input": ["a"]},
    "embed_sparse": {"inputs": ["a"]},
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_a_workload_is_not_offered_to_is_refused_with_a_400(kind: str) -> None:
    """app.kinds states once per kind which routes it serves: the document leaves the route out
    for the others (above), and the service answers each of them a 400, with the route's
    own reason for a kind in OWN_REASON, else unsupported_for_model naming route and kind."""
    info = _info_of(kind)
    assert info.kind == kind
    completions = Completions(SERVICE.tokenizer, info)  # the routes past the 404
    service = dataclasses.replace(SERVICE, info=info, completions=completions)
    refused = [w for w in WORKLOADS if kind not in w.kinds]
    assert {w.name for w in refused} <= set(ONE_BODY)
    for workload in refused:
        route = workload.paths[0]
        with pytest.raises(ScoringError) as error:
            asyncio.run(workload.respond(service, ONE_BODY[workload.name], _backend))
        own = {"/v1/classify": "no_score_head", "/v1/completions": "no_lm_head"}
        expected = own[route] if kind in OWN_REASON.get(route, ()) else "unsupported_for_model"
        assert (error.value.status_code, error.value.reason.value) == (400, expected), route
        if expected == "unsupported_for_model":
            assert route in error.value.message and kind in error.value.message
            served = error.value.message.split(f"{route} serves ")[1]  # the kinds it serves
            assert not set(OWN_REASON.get(route, ())) & set(served.split()), served
