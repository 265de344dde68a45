"""GET /openapi.json: an OpenAPI 3.1 document built from the pydantic models of the edge."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.schema import ErrorResponse, ModelList, ScoreRequest, ScoreResponse

_REF = "#/components/schemas/{model}"


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _json(name: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=name)}}},
    }


def openapi_document(title: str = "scorejax", version: str = "0.1.0") -> dict[str, Any]:
    error = _json("ErrorResponse", "Error envelope (OpenAI/SGLang) with a machine reason")
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/score": {
                "post": {
                    "summary": "Score label tokens after query + item for every item",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": _REF.format(model="ScoreRequest")}
                            }
                        },
                    },
                    "responses": {
                        "200": _json("ScoreResponse", "Scores, one row per item"),
                        "400": error,
                        "503": error,
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "responses": {"200": _json("ModelList", "One entry: the served model")},
                }
            },
            "/health": {
                "get": {
                    "summary": "200 once the replicas answer and agree with the ingress",
                    "responses": {"200": {"description": "healthy"}, "503": error},
                }
            },
            "/v1/stats": {
                "get": {
                    "summary": "Counters of one scoring replica: requests, batches, compile_count",
                    "responses": {"200": {"description": "replica counters"}, "503": error},
                }
            },
        },
        "components": {"schemas": _schemas(ScoreRequest, ScoreResponse, ErrorResponse, ModelList)},
    }
