"""Pydantic models of the HTTP edge: the /v1/score request, its response and the error body.

Strict on purpose: ``"1"`` is not an int, ``true`` is not an int, ``1`` is not a bool, and
unknown fields are rejected. A JSON number is an integer when its value is whole (``2.0`` is
the integer 2, as JSON Schema and so the OpenAPI document read it; ``2.5`` is refused).
Inside the service everything is frozen dataclasses; these models exist only to parse input
and to describe the API (OpenAPI).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr

from replicas.kinds import KIND_NAMES


class Strict(BaseModel):
    """The edge's models: strict types, unknown fields refused, frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _whole_number(value: Any) -> Any:
    """A whole float as the integer it is (JSON Schema's ``integer``); anything else as is,
    for the strict int check to judge (``true``, ``"1"``, ``2.5`` stay refused)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, BeforeValidator(_whole_number)]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_whole_number)]
TopK = Annotated[int, Field(ge=0, le=20), BeforeValidator(_whole_number)]


class ScoreRequest(Strict):
    """POST /v1/score. Query and items are all text or all token ids (never mixed)."""

    query: StrictStr | list[WholeInt] = Field(
        description="Text (encoded with the tokenizer's special tokens) or token ids."
    )
    items: list[StrictStr | list[WholeInt]] = Field(
        description=(
            "Candidate items: all text (each encoded without special tokens) or all token-id "
            "lists, the same kind as the query. An empty list answers scores: []."
        )
    )
    label_token_ids: list[WholeInt] | None = Field(
        default=None,
        description=(
            "Token ids whose next-token probability is scored for every item. Required for "
            "a causal LM; omitted for a score-head model (each row: its num_labels outputs)."
        ),
    )
    apply_softmax: StrictBool = Field(
        default=False,
        description=(
            "true: softmax over the requested labels (rows sum to 1); "
            "false: exp(logprob), full-vocabulary probabilities. A score-head model: true "
            "gives softmax over its labels (sigmoid for one label), false raw logits."
        ),
    )
    item_first: StrictBool = Field(
        default=False, description="Score item + query instead of query + item."
    )
    model: StrictStr | None = Field(
        default=None, description="Served model name (see GET /v1/models); optional."
    )


class RerankDocument(Strict):
    text: StrictStr


class RelevantSpans(Strict):
    """Cohere v2's ``relevant_spans``: return each document's chunks that scored at least
    ``threshold`` (asking turns chunking on for the request)."""

    mode: Literal["enabled", "disabled"] = Field(description="enabled: spans in each result.")
    threshold: Annotated[float, Field(ge=-1.0, le=1.0)] | None = Field(
        default=None,
        description="The least score a span needs (default 0.1; a cosine runs from -1).",
    )
    max_spans: PositiveInt | None = Field(
        default=None, description="The most spans per document, best first (default: all)."
    )


class RerankRequest(Strict):
    """POST /v1/rerank (also /rerank, /v2/rerank): Cohere's and Jina's request shape."""

    query: StrictStr = Field(min_length=1, description="What the documents are ranked for.")
    documents: list[StrictStr | RerankDocument] = Field(
        description='Texts (or {"text": ...} objects) to rank; [] answers results: [].'
    )
    top_n: PositiveInt | None = Field(
        default=None, description="Return only the best top_n results (default: all)."
    )
    return_documents: StrictBool = Field(
        default=False, description="Echo each result's document text."
    )
    instruction: StrictStr | None = Field(
        default=None, description="The reranker's task instruction (default: the template's)."
    )
    max_tokens_per_doc: PositiveInt | None = Field(
        default=None, description="Cut each document to its first max_tokens_per_doc tokens."
    )
    max_chunks_per_doc: PositiveInt | None = Field(
        default=None,
        description=(
            "Cut a document longer than chunk_tokens into at most this many chunks, each "
            "scored as an item; the document ranks by its chunks (default: the server's, "
            "shipped 1 = chunking off)."
        ),
    )
    chunk_tokens: PositiveInt | None = Field(
        default=None, description="Document tokens per chunk (default: the server's, 512)."
    )
    chunk_overlap: Annotated[int, Field(ge=0), BeforeValidator(_whole_number)] | None = Field(
        default=None,
        description="Tokens a chunk repeats of the one before, below chunk_tokens (default 0).",
    )
    chunk_aggregation: Literal["max", "mean"] | None = Field(
        default=None, description="A document's score: its best chunk's or their mean."
    )
    relevant_spans: RelevantSpans | None = Field(
        default=None, description="Return the chunks scoring at least threshold per result."
    )
    priority: WholeInt | None = Field(
        default=None, description="Accepted for Cohere's SDK and ignored (requests run in order)."
    )
    model: StrictStr | None = Field(
        default=None, description="Served model name (see GET /v1/models); optional."
    )


class RelevantSpan(Strict):
    start: int = Field(description="The chunk's first codepoint in the document.")
    end: int = Field(description="Just past its last codepoint: document[start:end].")
    score: float = Field(description="The chunk's relevance.")


class RerankResult(Strict):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float = Field(description="P(yes) / (P(yes) + P(no)) after the document.")
    document: RerankDocument | None = Field(default=None, description="With return_documents.")
    relevant_spans: list[RelevantSpan] | None = Field(
        default=None,
        description="With relevant_spans enabled: [start, end) in codepoints, best first.",
    )


class RerankResponse(Strict):
    id: str
    model: str
    results: list[RerankResult] = Field(description="Best first; top_n of them.")
    meta: dict[str, Any]
    usage: dict[str, int]


class Usage(Strict):
    prompt_tokens: int = Field(
        description="Tokens the model reads, counted as single-item rows: "
        "sum over items of len(query) + len(item)."
    )
    completion_tokens: Literal[0] = 0
    total_tokens: int


class ScoreResponse(Strict):
    object: Literal["scoring"] = "scoring"
    model: str
    scores: list[list[float]] = Field(
        description="scores[i][j]: score of label_token_ids[j] after query + items[i]."
    )
    usage: Usage
    created: int = Field(description="Unix time in seconds.")


class ErrorResponse(Strict):
    object: Literal["error"] = "error"
    message: str
    type: str = Field(description="BadRequestError for every 400.")
    param: str | None = Field(description="The request field at fault, if one is.")
    code: int
    reason: str = Field(description="Machine-readable cause, e.g. token_id_exceeds_vocab.")


class RerankChunking(Strict):
    """/v1/rerank's chunking defaults: the config's ``max_chunks_per_doc`` (1: off),
    ``chunk_tokens``, ``chunk_overlap`` and ``chunk_aggregation``."""

    max_chunks_per_doc: int
    chunk_tokens: int
    chunk_overlap: int
    chunk_aggregation: Literal["max", "mean"]


class ModelCard(Strict):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "scorejax"
    vocab_size: int
    multi_item_scoring_delimiter: int | None
    max_items_per_request: int
    max_multi_item_seq_len: int
    warm_envelopes: list[dict[str, int]] = Field(
        description="With limit_to_warmup: a request fits one (query, longest item, labels)."
    )
    rerank_method: (
        Literal["yes_no", "query_likelihood", "head", "cosine", "maxsim", "sparse_dot", "hybrid"]
        | None
    ) = Field(description="How /v1/rerank scores documents (null: no rerank route).")
    scoring: Literal["label_tokens", "head", "cosine", "maxsim", "sparse_dot", "hybrid"] = Field(
        description=(
            "label_tokens: /v1/score takes label_token_ids; head: a score head; cosine: an "
            "embedding model's query-item cosine; maxsim: a late-interaction model's MaxSim; "
            "sparse_dot: a sparse model's dot product; hybrid: BGE-M3's weighted mean of its "
            "dense, sparse and multi-vector scores."
        )
    )
    num_labels: int | None = Field(description="A score head's outputs (null: no head).")
    id2label: dict[str, str] | None = Field(description="A score head's label names.")
    kind: Literal[KIND_NAMES] = Field(  # replicas.kinds
        description="What the model is, and so which routes it answers."
    )
    outputs: list[Literal["vector", "tokens", "sparse"]] = Field(
        default=[],
        description=(
            "What it embeds: vector (/v1/embeddings, /v2/embed), tokens (a vector per token, "
            "/pooling), sparse (vocabulary weights, /embed_sparse); []: none."
        ),
    )
    pooling: Literal["lasttoken", "mean", "cls", "tokens", "splade"] | None = Field(
        description=(
            "An embedding model's pooling (tokens: none, a vector per token; splade: the max "
            "of log(1 + relu) of its MLM logits; null: not an embedding model)."
        )
    )
    dimension: int | None = Field(description="An embedding model's vector size.")
    input_format: Literal["text", "chat_template"] | None = Field(
        default=None,
        description=(
            "How an embedding model's text becomes tokens, as sentence-transformers 6.2 "
            "prepares it: text (the prompt in front) or chat_template (rendered through the "
            "tokenizer's chat template, the prompt as a system message); null: not an "
            "embedding model."
        ),
    )
    max_input_tokens: int | None = Field(
        default=None,
        description=(
            "An embedding model's most tokens per input: longer ones are a 400 unless the "
            "request's truncate cuts them to it (END, START) or chunks them by it (CHUNK)."
        ),
    )
    rerank_chunking: RerankChunking | None = Field(
        default=None,
        description="/v1/rerank's chunking defaults, which a request's own fields override "
        "(null: no rerank route).",
    )
    is_matryoshka: bool | None = Field(
        default=None,
        description=(
            "An embedding model's vector may be cut (dimensions / output_dimension): its "
            "config.json or the server's config declares Matryoshka sizes; false: only the "
            "whole vector (a cut is a 400 dimensions_not_supported); null: not an embedding "
            "model."
        ),
    )
    matryoshka_dimensions: list[int] | None = Field(
        default=None,
        description=(
            "The sizes the vector may be cut to, the whole dimension among them (null with "
            "is_matryoshka: any of 1..dimension)."
        ),
    )
    parent: str | None = Field(
        default=None, description="A LoRA adapter's base model (vLLM's shape); absent: a base."
    )


class ModelList(Strict):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionRequest(Strict):
    """POST /v1/completions: OpenAI's legacy completions shape, served prefill-only
    (semantics 14): prompt log-probabilities and at most one greedy token."""

    prompt: StrictStr | list[StrictStr] | list[WholeInt] | list[list[WholeInt]] = Field(
        description="A text, texts, token ids, or token-id lists (a batch of prompts). Text "
        "is encoded with the tokenizer's special tokens; token ids are taken as they are."
    )
    model: StrictStr | None = Field(default=None, description="Served model name; optional.")
    echo: StrictBool = Field(
        default=False, description="Return the prompt's tokens with their log-probs."
    )
    logprobs: TopK | None = Field(default=None, description="Top alternatives per position (0-20).")
    max_tokens: WholeInt | None = Field(
        default=None, description="0 (default) or 1: the greedy next token. More is a 400."
    )
    temperature: float | None = Field(default=None, description="0 or absent with max_tokens 1.")
    top_p: float | None = Field(default=None, description="Accepted; no sampling happens.")
    seed: WholeInt | None = Field(default=None, description="Accepted; nothing is random.")
    stop: StrictStr | list[StrictStr] | None = Field(default=None, description="Accepted.")
    n: WholeInt | None = Field(default=None, description="1 or absent.")
    best_of: WholeInt | None = Field(default=None, description="1 or absent.")
    stream: StrictBool | None = Field(default=None, description="false or absent.")
    suffix: StrictStr | None = Field(default=None, description="Absent: no insertion.")
    user: StrictStr | None = Field(default=None, description="Accepted and ignored.")


# /v1/classify's [text, text_pair] (a JSON array of two texts; strict mode takes no tuple)
TextPair = Annotated[list[StrictStr], Field(min_length=2, max_length=2)]


class ClassifyRequest(Strict):
    """POST /v1/classify (vLLM's and SGLang's shape) on a score-head model."""

    input: StrictStr | list[StrictStr | TextPair] = Field(
        description="A text or texts, each encoded with the tokenizer's special tokens; on a "
        "cross-encoder an entry may be a pair [text, text_pair], scored as "
        "CrossEncoder.predict scores the pair (TEI's /predict shape)."
    )
    model: StrictStr | None = Field(default=None, description="Served model name; optional.")
    activation: StrictBool = Field(
        default=True,
        description="true: the config's activation (problem_type); false: raw logits.",
    )


class TokenizeRequest(Strict):
    """POST /tokenize (the shape lm-evaluation-harness's remote tokenizer sends)."""

    prompt: StrictStr
    add_special_tokens: StrictBool = True
    model: StrictStr | None = None


class DetokenizeRequest(Strict):
    """POST /detokenize."""

    tokens: list[WholeInt]
    model: StrictStr | None = None


class LoadLoraAdapterRequest(Strict):
    """POST /v1/load_lora_adapter (vLLM's shape): a PEFT adapter directory, by name."""

    lora_name: StrictStr = Field(min_length=1, description="The `model` requests will name.")
    lora_path: StrictStr = Field(
        min_length=1,
        description="adapter_config.json + adapter_model.safetensors, readable on every replica.",
    )


class UnloadLoraAdapterRequest(Strict):
    """POST /v1/unload_lora_adapter (vLLM's shape)."""

    lora_name: StrictStr = Field(min_length=1)
    lora_int_id: WholeInt | None = Field(default=None, description="vLLM's; accepted, unused.")
