"""GET /openapi.json: an OpenAPI 3.1 document built from the pydantic models of the edge.

The ScoreRequest schema starts from the pydantic model (fields, types, required fields,
``additionalProperties: false``) and then states every rule of app.validation that JSON
Schema can express, from the served model's ModelInfo: at least one label, token ids in
``[0, vocab_size)``, the delimiter absent from the query and the items, all text or all token
ids, at most ``max_items_per_request`` items, the longest query and item any request can
have, and the served model name. A body the document accepts is scored (200) unless it breaks
a rule JSON Schema cannot state (listed in the request's description); a body it rejects
is always a 400. ``tests/test_app_fuzz.py`` checks both directions with schemathesis.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.schema import (
    ErrorResponse,
    ModelList,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from replicas.contract import ModelInfo

_REF = "#/components/schemas/{model}"

NOT_EXPRESSIBLE = (
    "Rules JSON Schema cannot state, answered with a 400 and their reason: a text query that "
    "tokenizes to nothing (empty_query), text whose tokens include the multi-item delimiter "
    "(delimiter_in_content), text that is not valid Unicode (lone surrogates), the packed "
    "length query + items + delimiters (or query + item with item_first) over "
    "max_multi_item_seq_len (sequence_too_long), and JSON numbers with a fraction or exponent "
    "(1.0 is not a token id). Bodies over 16 MiB are refused."
)


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


def _post(
    summary: str,
    request: str,
    ok: dict[str, Any],
    error: dict[str, Any],
    unauthorized: dict[str, Any],
    not_found: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A POST operation taking the JSON schema ``request``."""
    body = {"application/json": {"schema": {"$ref": _REF.format(model=request)}}}
    responses = {"200": ok, "400": error, "401": unauthorized, "503": error}
    if not_found:
        responses["404"] = not_found
    operation = {"summary": summary, "requestBody": {"required": True, "content": body}}
    return {"post": operation | {"responses": responses}}


def longest_query(info: ModelInfo) -> int:
    """The most query tokens any request can have (items=[], whichever path serves it)."""
    limits = info.limits
    longest = min(limits.max_multi_item_seq_len, limits.max_row_tokens)  # per-item rows
    if info.multi_item_scoring_delimiter is not None:  # query<d>: one more token packed
        longest = max(longest, min(limits.max_multi_item_seq_len - 1, limits.max_row_tokens))
    return longest


def longest_item(info: ModelInfo) -> int:
    """The most tokens one item can have (behind a one-token query, whichever path)."""
    limits = info.limits
    longest = min(limits.max_multi_item_seq_len, limits.max_row_tokens) - 1
    if info.multi_item_scoring_delimiter is not None:  # q<d>item<d>: packed length l + 3
        longest = max(longest, min(limits.max_multi_item_seq_len - 3, limits.max_row_tokens))
    return max(longest, 0)


def _token_id(info: ModelInfo | None, content: bool) -> dict[str, Any]:
    """One token id: >= 0, < vocab_size, and not the delimiter in a query or an item."""
    schema: dict[str, Any] = {"type": "integer", "minimum": 0}
    if info is not None:
        schema["maximum"] = info.vocab_size - 1
        if content and info.multi_item_scoring_delimiter is not None:
            schema["not"] = {"const": info.multi_item_scoring_delimiter}
    return schema


def score_request_schema(
    info: ModelInfo | None = None, text_query_min_length: int = 0
) -> dict[str, Any]:
    """The ScoreRequest schema with the served model's rules; ``text_query_min_length`` is 1
    when the tokenizer turns "" into no tokens (no BOS), so "" is ``empty_query``."""
    schema = ScoreRequest.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    token_ids: dict[str, Any] = {"type": "array", "items": _token_id(info, content=True)}
    query_ids = {**token_ids, "minItems": 1}
    item_ids = dict(token_ids)
    text: dict[str, Any] = {"type": "string"}
    if text_query_min_length:
        text["minLength"] = text_query_min_length
    if info is not None:
        query_ids["maxItems"] = longest_query(info)
        item_ids["maxItems"] = longest_item(info)
        props["items"]["maxItems"] = info.limits.max_items_per_request
        props["model"]["anyOf"] = [{"const": info.name}, {"type": "null"}]
    props["query"]["anyOf"] = [text, query_ids]
    props["items"]["items"]["anyOf"] = [{"type": "string"}, item_ids]
    props["label_token_ids"]["minItems"] = 1
    props["label_token_ids"]["items"] = _token_id(info, content=False)
    # All text or all token ids (mixed_input_types): the query's kind decides the items'.
    schema["oneOf"] = [
        {
            "title": "text",
            "properties": {"query": {"type": "string"}, "items": {"items": {"type": "string"}}},
        },
        {
            "title": "token ids",
            "properties": {"query": {"type": "array"}, "items": {"items": {"type": "array"}}},
        },
    ]
    schema["description"] = f"{schema['description']} {NOT_EXPRESSIBLE}"
    return schema


def openapi_document(
    info: ModelInfo | None = None,
    text_query_min_length: int = 0,
    title: str = "scorejax",
    version: str = "0.1.0",
) -> dict[str, Any]:
    """The document for the served model (``info``); without one, only model-free rules."""
    error = _json("ErrorResponse", "Error envelope (OpenAI/SGLang) with a machine reason")
    unauthorized = _json("ErrorResponse", "API keys are configured and none matched")
    schemas = _schemas(
        ScoreRequest, ScoreResponse, RerankRequest, RerankResponse, ErrorResponse, ModelList
    )
    schemas["ScoreRequest"] = score_request_schema(info, text_query_min_length)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/score": _post(
                "Score label tokens after query + item for every item",
                "ScoreRequest",
                _json("ScoreResponse", "Scores, one row per item"),
                error,
                unauthorized,
            ),
            **{
                path: _post(
                    "Rank documents for a query (Cohere/Jina shape)",
                    "RerankRequest",
                    _json("RerankResponse", "Results, best first"),
                    error,
                    unauthorized,
                    not_found=error,
                )
                for path in ("/v1/rerank", "/rerank", "/v2/rerank")
            },
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "responses": {
                        "200": _json("ModelList", "One entry: the served model"),
                        "401": unauthorized,
                    },
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
                    "responses": {
                        "200": {"description": "replica counters"},
                        "401": unauthorized,
                        "503": error,
                    },
                }
            },
        },
        "components": {"schemas": schemas},
    }
