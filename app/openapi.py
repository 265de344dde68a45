"""GET /openapi.json: the OpenAPI 3.1 document FastAPI generates from the routes of app.http
and the pydantic models of the edge, with the served model's rules added to ScoreRequest.

The ScoreRequest schema starts from the pydantic model (fields, types, required fields,
``additionalProperties: false``) and then states every rule of app.validation that JSON
Schema can express, from the served model's ModelInfo: at least one label, token ids in
``[0, vocab_size)``, the delimiter absent from the query and the items, all text or all token
ids, at most ``max_items_per_request`` items, the longest query and item any request can
have, and the served model name. A body the document accepts is scored (200) unless it breaks
a rule JSON Schema cannot state (listed in the request's description); a body it rejects
is always a 400. ``tests/unit/test_app_fuzz.py`` checks both directions with schemathesis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from app.embed_openapi import cohere_embed_request_schema, embedding_request_schema
from app.embed_schema import CohereEmbedRequest, EmbeddingRequest
from app.retrieval_schema import EmbedSparseRequest, PoolingRequest
from app.schema import (
    ClassifyRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    LoadLoraAdapterRequest,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
    UnloadLoraAdapterRequest,
)
from replicas.contract import ModelInfo

if TYPE_CHECKING:
    from app.served import Served

_REF = "#/components/schemas/{model}"

NOT_EXPRESSIBLE = (
    "Rules JSON Schema cannot state, answered with a 400 and their reason: a text query that "
    "tokenizes to nothing (empty_query), text whose tokens include the multi-item delimiter "
    "(delimiter_in_content), text that is not valid Unicode (lone surrogates), the packed "
    "length query + items + delimiters (or query + item with item_first) over "
    "max_multi_item_seq_len (sequence_too_long), with limit_to_warmup a query, item or label "
    "count that no warm-up envelope admits together (sequence_too_long, too_many_labels), "
    "more computed tokens than max_request_tokens (too_many_tokens), a rerank whose documents' "
    "chunks (their token counts) exceed max_items_per_request (too_many_chunks), and a "
    "rerank chunk_overlap not below its chunk_tokens (invalid_chunking). A whole number "
    "written with a fraction or exponent (2.0, 2e0) is the integer it equals, as JSON Schema "
    "reads it. Bodies over 16 MiB are refused."
)


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Error envelope (OpenAI/SGLang) with a reason"},
    401: {"model": ErrorResponse, "description": "API keys are configured and none matched"},
    503: {"model": ErrorResponse, "description": "Overloaded or no replica; see Retry-After"},
}


def request_body(model: str) -> dict[str, Any]:
    """A route's ``openapi_extra``: a required JSON body of the schema ``model`` (read and
    checked by app.validation, so FastAPI documents it but does not parse it)."""
    schema = {"$ref": _REF.format(model=model)}
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def _warm_row(info: ModelInfo) -> int:
    """The longest query + item row a warm-up envelope admits (no bound without them)."""
    envelopes = info.limits.envelopes
    return max((e.query_tokens + e.item_tokens for e in envelopes), default=1 << 62)


def longest_query(info: ModelInfo) -> int:
    """The most query tokens any request can have (items=[], whichever path serves it)."""
    limits = info.limits
    longest = min(limits.max_multi_item_seq_len, limits.max_row_tokens)  # per-item rows
    if info.multi_item_scoring_delimiter is not None:  # query<d>: one more token packed
        longest = max(longest, min(limits.max_multi_item_seq_len - 1, limits.max_row_tokens))
    return min(longest, _warm_row(info))


def longest_item(info: ModelInfo) -> int:
    """The most tokens one item can have (behind a one-token query, whichever path)."""
    limits = info.limits
    longest = min(limits.max_multi_item_seq_len, limits.max_row_tokens) - 1
    if info.multi_item_scoring_delimiter is not None:  # q<d>item<d>: packed length l + 3
        longest = max(longest, min(limits.max_multi_item_seq_len - 3, limits.max_row_tokens))
    return max(min(longest, _warm_row(info) - 1), 0)


def _text(min_length: int) -> dict[str, Any]:
    """A text; ``min_length`` 1 where "" has no tokens (no BOS), 0: any."""
    return {"type": "string", "minLength": min_length} if min_length else {"type": "string"}


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
    text, item_text = _text(text_query_min_length), _text(0)
    if info is not None:
        query_ids["maxItems"] = longest_query(info)
        item_ids["maxItems"] = longest_item(info)
        props["items"]["maxItems"] = info.limits.max_items_per_request
        props["model"] = model_name_schema(info)
        if info.model_kind.vectors:  # cosine scores: every text and token list embedded
            text["minLength"] = item_text["minLength"] = item_ids["minItems"] = 1
    props["query"]["anyOf"] = [text, query_ids]
    props["items"]["items"]["anyOf"] = [item_text, item_ids]
    _label_rules(schema, info)
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
    if info is not None and info.model_kind.pairs:
        _text_pairs_only(schema)
    return schema


CROSS_ENCODER_SCORE = (
    "POST /v1/score on a cross_encoder model: a text query and text items (token ids are a "
    "400 invalid_request), each (query, item) pair scored by the model's head, truncated "
    "longest-first to the model's length; no label_token_ids. Text that is not valid Unicode "
    "(lone surrogates) is a 400; bodies over 16 MiB are refused."
)


def _text_pairs_only(schema: dict[str, Any]) -> None:
    """A cross-encoder's ScoreRequest (app.cross_encoder): text only, any text ("" too: the
    pair still has its special tokens), no token-id branch."""
    props = schema["properties"]
    props["query"] = {"type": "string", "description": "Text, paired with each item."}
    props["items"]["items"] = {"type": "string"}
    props["items"]["description"] = "Texts, each paired with the query; [] answers scores: []."
    props["apply_softmax"]["description"] = (
        "The head's outputs through the model's activation (CrossEncoder.predict); true with "
        "more than one label: softmaxed over them."
    )
    del schema["oneOf"]
    schema["description"] = CROSS_ENCODER_SCORE


def _label_rules(schema: dict[str, Any], info: ModelInfo | None) -> None:
    """label_token_ids: required, >= 1 in-vocabulary ids for a causal LM; absent for a
    score-head model (semantics 18)."""
    props = schema["properties"]
    if info is not None and not info.model_kind.lm_head:
        del props["label_token_ids"]
        return
    labels: dict[str, Any] = {"type": "array", "minItems": 1}
    labels["description"] = props["label_token_ids"]["description"]
    if info is not None and info.limits.envelopes:
        labels["maxItems"] = max(e.labels for e in info.limits.envelopes)
    labels["items"] = _token_id(info, content=False)
    props["label_token_ids"] = labels
    schema["required"] = sorted({*schema.get("required", ()), "label_token_ids"})


class Documented(Protocol):
    """What the document needs of a workload (app.workloads.Workload)."""

    paths: tuple[str, ...]
    schema: str
    document: Callable[[ModelInfo, int], dict[str, Any] | None]

    def served_by(self, info: ModelInfo) -> bool: ...


def served_openapi(
    api: FastAPI, service: Served, workloads: Sequence[Documented]
) -> dict[str, Any]:
    """The document FastAPI generates from ``api``'s routes and their response models, with
    each workload's request schema as the served model states it (``Workload.document``)
    and without the routes of the workloads its kind refuses. Built once per app."""
    if api.openapi_schema is None:
        document = get_openapi(
            title=api.title, version=api.version, summary=api.summary, routes=api.routes
        )
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(
            _schemas(
                RerankRequest,
                CompletionRequest,
                TokenizeRequest,
                DetokenizeRequest,
                ClassifyRequest,
                EmbeddingRequest,
                CohereEmbedRequest,
                PoolingRequest,
                EmbedSparseRequest,
                LoadLoraAdapterRequest,
                UnloadLoraAdapterRequest,
            )
        )
        info, text_min_length = service.info, service.text_query_min_length
        for workload in workloads:  # None: the request model as pydantic states it
            stated = workload.document(info, text_min_length)
            schemas[workload.schema] = schemas[workload.schema] if stated is None else stated
        schemas["DetokenizeRequest"]["properties"]["tokens"]["items"] = _token_id(info, False)
        for name in REQUESTS_NAMING_THE_MODEL:
            schemas[name]["properties"]["model"] = model_name_schema(info)
        for workload in workloads:
            for path in () if workload.served_by(info) else workload.paths:
                document["paths"].pop(path, None)
        api.openapi_schema = document
    return api.openapi_schema


def rerank_request_schema(info: ModelInfo, text_min_length: int = 0) -> dict[str, Any] | None:
    """On an embedding model (cosine rerank, every document embedded) RerankRequest without
    empty documents; on a cross-encoder without ``instruction`` (it scores the pair as
    given: app.cross_encoder refuses one); None (pydantic's schema) on the others."""
    if not info.model_kind.embeds:
        return None
    schema = RerankRequest.model_json_schema(ref_template=_REF)
    schema.pop("$defs", None)  # app.schema's shared definitions, already in the document
    if info.model_kind.pairs:
        del schema["properties"]["instruction"]
        return schema
    schema["properties"]["documents"]["items"] = NON_EMPTY_DOCUMENT
    return schema


def embed_schema(name: str) -> Callable[[ModelInfo, int], dict[str, Any] | None]:
    """The ``Workload.document`` of an embedding request model: its rules on an embedding
    model (app.embed_openapi), None (pydantic's schema) on the others, whose document
    leaves the route out."""
    rules = {"EmbeddingRequest": embedding_request_schema}.get(name, cohere_embed_request_schema)

    def document(info: ModelInfo, text_min_length: int = 0) -> dict[str, Any] | None:
        return rules(info, info.pooling) if info.model_kind.vectors else None  # type: ignore[arg-type]

    return document


NON_EMPTY_TEXT = {"type": "string", "minLength": 1}
NON_EMPTY_DOCUMENT = {
    "anyOf": [
        NON_EMPTY_TEXT,
        {
            "type": "object",
            "properties": {"text": NON_EMPTY_TEXT},
            "required": ["text"],
            "additionalProperties": False,
        },
    ]
}
REQUESTS_NAMING_THE_MODEL = (
    "ScoreRequest",
    "RerankRequest",
    "ClassifyRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "CohereEmbedRequest",
    "PoolingRequest",
    "EmbedSparseRequest",
    "TokenizeRequest",
    "DetokenizeRequest",
)


def model_name_schema(info: ModelInfo) -> dict[str, Any]:
    """``model`` as app.validation.check_model_name checks it: the base model's name or a
    LoRA adapter's, or null. With adapters loaded at run time the names change, so any
    string, and one served neither way is a 404 ``model_not_found``."""
    if isinstance(info.adapters, tuple):
        names = [{"const": name} for name in (info.name, *info.adapters)]
        return {"anyOf": [*names, {"type": "null"}], "default": None}
    description = (
        f"{info.name!r}, a LoRA adapter loaded now (GET /v1/models lists them), or null; "
        "any other name is a 404 model_not_found."
    )
    return {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
            "description": description}  # fmt: skip


def completion_request_schema(info: ModelInfo, text_min_length: int = 0) -> dict[str, Any]:
    """CompletionRequest with the route's rules (app.completions): one to
    ``max_items_per_request`` prompts, each text (non-empty where "" has no tokens) or
    non-empty in-vocabulary token ids; ``max_tokens`` 0 or 1 with ``temperature`` 0 or
    absent at 1; ``n`` and ``best_of`` 1; no ``stream``, no ``suffix``."""
    schema = CompletionRequest.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    most = info.limits.max_items_per_request
    text = _text(text_min_length)
    ids = {"type": "array", "items": _token_id(info, False), "minItems": 1}
    props["prompt"]["anyOf"] = [
        text,
        {"type": "array", "items": text, "minItems": 1, "maxItems": most},
        ids,
        {"type": "array", "items": ids, "minItems": 1, "maxItems": most},
    ]
    props["max_tokens"]["anyOf"] = [{"enum": [0, 1]}, {"type": "null"}]
    for name in ("n", "best_of"):
        props[name]["anyOf"] = [{"const": 1}, {"type": "null"}]
    props["stream"]["anyOf"] = [{"const": False}, {"type": "null"}]
    props["suffix"] = {"type": "null", "default": None, "description": "Absent: no insertion."}
    one_token = {"properties": {"max_tokens": {"const": 1}}, "required": ["max_tokens"]}
    greedy = {"properties": {"temperature": {"anyOf": [{"const": 0}, {"type": "null"}]}}}
    schema["allOf"] = [{"if": one_token, "then": greedy}]
    return schema


def classify_request_schema(info: ModelInfo, text_min_length: int = 0) -> dict[str, Any]:
    """ClassifyRequest with the route's rules: at most ``max_items_per_request`` inputs, the
    served model name, (where the tokenizer turns "" into no tokens) no empty text, and pairs
    [text, text_pair] on a cross-encoder only."""
    schema = ClassifyRequest.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    text = _text(text_min_length)
    entry: dict[str, Any] = text
    if info.model_kind.pairs:  # [text, text_pair]
        pair = {"type": "array", "items": text, "minItems": 2, "maxItems": 2}
        entry = {"anyOf": [text, pair]}
    texts = {"type": "array", "items": entry, "maxItems": info.limits.max_items_per_request}
    props["input"]["anyOf"] = [text, texts]
    props["model"] = model_name_schema(info)
    return schema
