"""The embedding routes' request schemas with the served embedding model's rules (app.openapi
assembles the document): what app.embeddings checks, stated in JSON Schema, so a body the
document allows is embedded (semantics 20)."""

from __future__ import annotations

from typing import Any

from app.embed_schema import CohereEmbedRequest, EmbeddingRequest
from app.embeddings import input_limit
from replicas.contract import ModelInfo, PoolingHead

_REF = "#/components/schemas/{model}"
TEXT = {"type": "string", "minLength": 1}  # "" is no input
NULL = {"type": "null"}


def _token_ids(info: ModelInfo) -> dict[str, Any]:
    """One input as token ids: at least one, each in ``[0, vocab_size)``."""
    token = {"type": "integer", "minimum": 0, "maximum": info.vocab_size - 1}
    return {"type": "array", "items": token, "minItems": 1}


def _within(low: int, high: int) -> dict[str, Any]:
    return {"anyOf": [{"type": "integer", "minimum": low, "maximum": high}, NULL]}


def _dimensions(pooling: PoolingHead) -> dict[str, Any]:
    """The Matryoshka sizes a cut may ask for (app.embeddings.check_dimensions): any of
    1..dimension, the declared ones, or (not Matryoshka) the whole dimension alone."""
    cuts = pooling.matryoshka
    if cuts == ():
        return _within(1, pooling.dimension)
    sizes = sorted({*(cuts or ()), pooling.dimension})
    return {"anyOf": [{"type": "integer", "enum": sizes}, NULL]}


def embedding_request_schema(info: ModelInfo, pooling: PoolingHead) -> dict[str, Any]:
    """EmbeddingRequest: one to ``max_items_per_request`` non-empty texts or token-id lists;
    ``dimensions`` one of the model's Matryoshka sizes; ``truncate_prompt_tokens`` within the
    model's input limit; ``prompt_name`` one of the model's prompts; a prompt
    (``prompt_name`` or ``instruction``, not both) only with text."""
    schema = EmbeddingRequest.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    most, ids = info.limits.max_items_per_request, _token_ids(info)
    props["input"]["anyOf"] = [
        TEXT,
        {"type": "array", "items": TEXT, "minItems": 1, "maxItems": most},
        ids,
        {"type": "array", "items": ids, "minItems": 1, "maxItems": most},
    ]
    props["dimensions"] |= _dimensions(pooling)
    props["truncate_prompt_tokens"] |= _within(1, input_limit(info))
    props["prompt_name"]["anyOf"] = [*({"const": name} for name, _ in pooling.prompts), NULL]
    prompted = {"type": "string"}
    text = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    schema["allOf"] = [
        {  # prompt_name or instruction, not both
            "not": {
                "properties": {"prompt_name": prompted, "instruction": prompted},
                "required": ["prompt_name", "instruction"],
            }
        },
        {  # prompts apply to text, not to token ids
            "if": {"properties": {"input": text}, "required": ["input"]},
            "else": {"properties": {"prompt_name": NULL, "instruction": NULL}},
        },
    ]
    return schema


def cohere_embed_request_schema(info: ModelInfo, pooling: PoolingHead) -> dict[str, Any]:
    """CohereEmbedRequest: one to ``max_items_per_request`` non-empty texts,
    ``output_dimension`` one of the model's Matryoshka sizes."""
    schema = CohereEmbedRequest.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    props["texts"] |= {"items": TEXT, "minItems": 1, "maxItems": info.limits.max_items_per_request}
    props["output_dimension"] |= _dimensions(pooling)
    return schema
