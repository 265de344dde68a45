"""Pydantic models of the late-interaction and sparse routes' edge (semantics 20): vLLM's
/pooling (its ``token_embed`` task: every scored token's vector) and TEI's /embed_sparse.
Strict, unknown fields refused, as app.schema's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictStr

from app.schema import Strict

Role = Literal["query", "document"]
_ROLE = (
    "scorejax's extension: the texts' role, as sentence-transformers' encode_query / "
    "encode_document: its prompt, and on a late-interaction model a query's length and "
    "[MASK] expansion, a document's length and skiplist."
)


class PoolingRequest(Strict):
    """POST /pooling (vLLM's shape) on a late-interaction model."""

    input: StrictStr | list[StrictStr] = Field(description="A text or texts.")
    model: StrictStr | None = Field(default=None, description="Served model name; optional.")
    task: Literal["token_embed"] = Field(
        default="token_embed", description="token_embed: every scored token's vector."
    )
    input_type: Role = Field(default="document", description=_ROLE)
    encoding_format: Literal["float"] = Field(default="float", description="JSON numbers.")
    user: StrictStr | None = Field(default=None, description="Ignored (OpenAI's field).")


class EmbedSparseRequest(Strict):
    """POST /embed_sparse (TEI's shape) on a sparse model."""

    inputs: StrictStr | list[StrictStr] = Field(description="A text or texts.")
    model: StrictStr | None = Field(default=None, description="scorejax's: the model's name.")
    truncate: StrictBool = Field(
        default=False, description="Cut a text past the model's limit (else a 400)."
    )
    truncation_direction: Literal["Right"] = Field(
        default="Right", description="Right: the first tokens are kept (Left: not supported)."
    )
    prompt_name: StrictStr | None = Field(
        default=None, description="One of the model's prompts (its role's prompt if unset)."
    )
    input_type: Role = Field(default="document", description=_ROLE)
    return_tokens: StrictBool = Field(
        default=False,
        description="scorejax's extension: each weight also names its vocabulary token.",
    )
