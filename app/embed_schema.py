"""Pydantic models of the embedding routes' edge (semantics 20): OpenAI's /v1/embeddings and
Cohere's v2 /v2/embed requests. Strict, unknown fields refused, as app.schema's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictStr

from app.schema import Strict, WholeInt

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
_TYPES = (
    "float: float32 numbers; int8/uint8: each dimension quantized to 256 levels of its "
    "calibrated range ([-1, 1] unless the config names a calibration set); binary/ubinary: "
    "the sign bits packed 8 per byte (int8/uint8); base64: the float32 little-endian bytes. "
    "As sentence-transformers' quantize_embeddings, after the Matryoshka cut."
)
# Cohere v2's input types; any other is a 400 naming input_type
InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
Truncate = Literal["NONE", "START", "END", "CHUNK"]
_TRUNCATE = (
    "An input past the model's limit: END keeps its first tokens; START drops its first "
    "tokens (at a token boundary) until it fits, prompt and special tokens kept; CHUNK "
    "(scorejax's) embeds it as chunks of at most the limit in the same pass, their vectors "
    "folded into one (mean pooling: weighted by their tokens) before normalization; NONE: a "
    "400."
)


class EmbeddingRequest(Strict):
    """POST /v1/embeddings (OpenAI's shape; also /embeddings)."""

    input: StrictStr | list[StrictStr] | list[WholeInt] | list[list[WholeInt]] = Field(
        description=(
            "A text, texts, one input as token ids, or inputs as token-id lists. Text is "
            "encoded with the tokenizer's special tokens after its prompt (if any)."
        )
    )
    model: StrictStr | None = Field(default=None, description="Served model name; optional.")
    dimensions: WholeInt | None = Field(
        default=None,
        description="Matryoshka: keep the first d components, then L2-normalize (1..dimension).",
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="float: JSON numbers; base64: little-endian float32 bytes."
    )
    prompt_name: StrictStr | None = Field(
        default=None, description="One of the model's prompts (its default prompt if unset)."
    )
    instruction: StrictStr | None = Field(
        default=None, description="A prompt text put in front of every text input."
    )
    truncate_prompt_tokens: WholeInt | None = Field(
        default=None,
        description="Keep each input's first k tokens; unset, a longer input is a 400.",
    )
    truncate: Truncate | None = Field(
        default=None,
        description=(
            "scorejax's extension, as /v2/embed's truncate (unset: NONE; with "
            "truncate_prompt_tokens no input is past the limit). " + _TRUNCATE
        ),
    )
    user: StrictStr | None = Field(default=None, description="Ignored (OpenAI's field).")
    embedding_types: list[EmbeddingType] | None = Field(
        default=None,
        min_length=1,
        description=(
            "scorejax's extension (Cohere v2's embedding_types): each item also carries "
            "embeddings: {type: value}. " + _TYPES
        ),
    )


class CohereEmbedRequest(Strict):
    """POST /v2/embed (Cohere's v2 shape): texts only, any of Cohere's embedding types."""

    texts: list[StrictStr] = Field(description="Texts to embed.")
    model: StrictStr | None = Field(default=None, description="Served model name; optional.")
    input_type: InputType | None = Field(
        default=None,
        description=(
            "One of Cohere's input types: search_query / search_document / classification / "
            "clustering / image: the model's prompt of that purpose (query, document or "
            "passage, or the name itself), none if it has none."
        ),
    )
    embedding_types: list[EmbeddingType] = Field(
        default=["float"], min_length=1, description="The types to answer, each once. " + _TYPES
    )
    output_dimension: WholeInt | None = Field(
        default=None, description="Matryoshka: as /v1/embeddings' dimensions."
    )
    truncate: Truncate | None = Field(default=None, description="Unset: END. " + _TRUNCATE)
