"""Embeddings at the ingress (semantics 20): /v1/embeddings (OpenAI), /v2/embed (Cohere v2),
and the cosine scores /v1/score and /v1/rerank give on an embedding model.

Text is encoded as sentence-transformers 6.2 encodes it (``app.embed_inputs``): the prompt's
text in front of the input's, with the tokenizer's special tokens, or, for a model whose
``modality_config`` has ``message``, rendered through the chat template with the prompt as a
system message. A text far longer than the model takes is cut before it is tokenized whole.
The replica answers pooled float32 vectors (Dense and Normalize applied);
the Matryoshka cut (first d components, then L2-normalized), cosines and base64 run here in
NumPy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from app.embed_chunks import Chunking, chunk_work
from app.embed_inputs import encode_inputs
from app.embed_schema import CohereEmbedRequest, EmbeddingRequest
from app.embed_truncate import cut_starts
from app.embed_types import (
    NO_CALIBRATION,
    Calibration,
    base64_of,
    matryoshka,
    typed_embeddings,
)
from app.tokenization import TextTokenizer
from app.validation import (
    check_item_count,
    check_model_name,
    check_token_ids,
    check_unicode,
    validate_body,
)
from replicas.contract import (
    EmbedWork,
    ModelInfo,
    PoolingHead,
    check_embed_limits,
)
from replicas.errors import Reason, ScoringError

# Cohere's input_type -> the prompt names tried, in order (EmbeddingGemma's task prompts
# are capitalized: "Classification", "Clustering")
INPUT_TYPES = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
    "classification": ("classification", "Classification"),
    "clustering": ("clustering", "Clustering"),
}


def input_type_prompt(head: PoolingHead, input_type: str | None) -> str | None:
    """The model's prompt for Cohere's ``input_type``: the first of its names the model
    has; None when it has none (or no input_type is given)."""
    if input_type is None:
        return None
    names = INPUT_TYPES.get(input_type, (input_type,))
    return next((head.prompt(n) for n in names if head.prompt(n) is not None), None)


@dataclass(frozen=True)
class EmbedPrepared:
    """A validated embedding request: its work, Matryoshka ``dimensions`` (None: whole
    vectors), whether the answer is base64, the tokens it holds, and the embedding types
    asked for (app.embed_types; /v1/embeddings: none unless its extension field asks)."""

    work: EmbedWork
    dimensions: int | None
    base64: bool
    prompt_tokens: int
    types: tuple[str, ...] = ()
    chunking: Chunking | None = None  # truncate: CHUNK with an input past the limit

    def fold(self, vectors: np.ndarray) -> np.ndarray:
        """The replica's vectors -> one per input (the chunks of each folded into one)."""
        return self.chunking.fold(vectors) if self.chunking is not None else vectors


def pooling_of(info: ModelInfo) -> PoolingHead:
    """The served pooling (only the embedding kind's answers call this, app.kinds)."""
    return cast(PoolingHead, info.pooling)


def input_limit(info: ModelInfo) -> int:
    """The most tokens one input may hold: the model's max_seq_length within a step's row."""
    pooling = info.pooling
    longest = info.limits.max_row_tokens
    return min(longest, pooling.max_seq_length or longest) if pooling else longest


def _check_text(texts: Sequence[str]) -> None:
    for text in texts:
        if not text:
            raise ScoringError(Reason.EMPTY_INPUT, "input: empty strings are not embedded", "input")
        check_unicode(text, "input")


def check_dimensions(dimensions: int | None, pooling: PoolingHead, param: str) -> None:
    """A Matryoshka cut the model takes: within 1..its dimension (else ``invalid_dimensions``)
    and one of its Matryoshka sizes (``PoolingHead.matryoshka``, else
    ``dimensions_not_supported``: a model not trained for a cut embeds poorly cut, so it is
    refused rather than truncated, as vLLM and SGLang refuse it). The whole dimension cuts
    nothing and is always taken."""
    if dimensions is None:
        return
    if not 1 <= dimensions <= pooling.dimension:
        raise ScoringError(
            Reason.INVALID_DIMENSIONS,
            f"{param}: {dimensions} is outside 1..{pooling.dimension} (the model's dimension)",
            param,
        )
    cuts = pooling.matryoshka
    if dimensions == pooling.dimension or cuts == () or (cuts and dimensions in cuts):
        return
    if cuts is None:
        message = (
            f"{param}: {dimensions}: this model was not trained for Matryoshka cuts (its "
            "config.json declares no matryoshka_dimensions or is_matryoshka, nor does the "
            f"server's config), so a cut vector would embed poorly; ask for all "
            f"{pooling.dimension} dimensions (or none)"
        )
    else:
        sizes = ", ".join(str(d) for d in sorted({*cuts, pooling.dimension}))
        message = f"{param}: {dimensions} is not one of the model's Matryoshka sizes ({sizes})"
    raise ScoringError(Reason.DIMENSIONS_NOT_SUPPORTED, message, param)


def _check_work(work: EmbedWork, info: ModelInfo) -> None:
    if any(not ids for ids in work.inputs):  # a text of characters the tokenizer drops
        message = "input: a text that tokenizes to no tokens is not embedded"
        raise ScoringError(Reason.EMPTY_INPUT, message, "input")
    try:
        check_embed_limits(work, info.limits, info.pooling.max_seq_length if info.pooling else None)
    except ScoringError as error:
        raise ScoringError(error.reason, error.message, "input") from None


@dataclass(frozen=True)
class Embedder:
    """Prepares embedding works and answers their bodies for one served model."""

    info: ModelInfo
    tokenizer: TextTokenizer
    calibration: Calibration = NO_CALIBRATION  # int8/uint8 ranges (app.embed_types)

    def text_work(
        self, texts: Sequence[str], prompt: str | None, keep: int | None = None
    ) -> EmbedWork:
        """An EmbedWork of ``texts``, each behind ``prompt`` as sentence-transformers puts it
        there (``app.embed_inputs``), checked against the limits."""
        head = pooling_of(self.info)
        limit = input_limit(self.info)
        prepared = encode_inputs(self.tokenizer, texts, prompt, head, limit, keep)
        skip, inputs = prepared.skip, prepared.inputs
        work = EmbedWork(inputs, (skip,) * len(inputs) if skip else ())
        _check_work(work, self.info)
        return work

    def chunked_work(
        self, texts: Sequence[str] | None, prompt: str | None, ids: Sequence[tuple[int, ...]] = ()
    ) -> tuple[EmbedWork, Chunking | None]:
        """``texts`` (else the token-id inputs ``ids``) with every input past the limit cut
        into chunks (``app.embed_chunks``), checked against the limits: chunks count as
        inputs. Text is tokenized up to the most tokens a request may hold."""
        head, limit = pooling_of(self.info), input_limit(self.info)
        skip, inputs = 0, tuple(ids)
        if texts is not None:
            limits = self.info.limits
            most = limits.max_items_per_request * limit
            most = min(most, limits.max_request_tokens or most)
            encoded = encode_inputs(self.tokenizer, texts, prompt, head, most, None)
            skip, inputs = encoded.skip, encoded.inputs
        work, chunking = chunk_work(inputs, skip, head, limit)
        most_items = self.info.limits.max_items_per_request
        if chunking is not None and work.num_items > most_items:
            raise ScoringError(
                Reason.TOO_MANY_ITEMS,
                f"input: {work.num_items} chunks of at most {limit} tokens exceed "
                f"max_items_per_request={most_items} (truncate: CHUNK counts each chunk)",
                "input",
            )
        _check_work(work, self.info)
        return work, chunking

    def _text_work(
        self, texts: Sequence[str], prompt: str | None, truncate: str | None, keep: int | None
    ) -> tuple[EmbedWork, Chunking | None]:
        """``texts``' work as ``truncate`` (or ``keep``) handles inputs past the limit."""
        if truncate == "CHUNK":
            return self.chunked_work(texts, prompt)
        limit = input_limit(self.info)
        if truncate == "START":
            texts = cut_starts(self.tokenizer, texts, limit, self._length(prompt))
        keep = limit if truncate == "END" else keep
        return self.text_work(texts, prompt, keep), None

    def _length(self, prompt: str | None) -> Callable[[str], int]:
        """A text -> its input's tokens behind ``prompt`` (more than the limit: overflows)."""
        head, limit = pooling_of(self.info), input_limit(self.info)

        def length(text: str) -> int:
            encoded = encode_inputs(self.tokenizer, [text], prompt, head, limit, None)
            return len(encoded.inputs[0])

        return length

    def _prompt(self, name: str | None, instruction: str | None) -> str | None:
        head = pooling_of(self.info)
        if name is not None and instruction is not None:
            raise ScoringError(
                Reason.INVALID_REQUEST,
                "prompt_name and instruction: give one, not both",
                "prompt_name",
            )
        if instruction is not None:
            return instruction
        name = name if name is not None else head.default_prompt_name
        if name is None:
            return None
        prompt = head.prompt(name)
        if prompt is None:
            known = ", ".join(n for n, _ in head.prompts) or "none"
            raise ScoringError(
                Reason.UNKNOWN_PROMPT,
                f"prompt_name: {name!r} is not a prompt of this model (its prompts: {known})",
                "prompt_name",
            )
        return prompt

    def prepare(self, payload: Any) -> EmbedPrepared:
        """/v1/embeddings: validate, then tokenize."""
        request = validate_body(payload, EmbeddingRequest)
        adapter = check_model_name(request.model, self.info)
        head = pooling_of(self.info)
        check_dimensions(request.dimensions, head, "dimensions")
        keep = request.truncate_prompt_tokens
        limit = input_limit(self.info)
        if keep is not None and not 1 <= keep <= limit:
            raise ScoringError(
                Reason.INVALID_REQUEST,
                f"truncate_prompt_tokens: {keep} is outside 1..{limit} (the model's limit)",
                "truncate_prompt_tokens",
            )
        # truncate_prompt_tokens (1..limit) leaves no input past the limit: truncate then
        # has nothing to do
        truncate = None if keep is not None else request.truncate
        raw = [request.input] if isinstance(request.input, str) else request.input
        if not raw:
            raise ScoringError(Reason.EMPTY_INPUT, "input: the list is empty", "input")
        check_item_count(len(raw) if not isinstance(raw[0], int) else 1, self.info)
        if isinstance(raw[0], str):
            texts = [str(text) for text in raw]
            _check_text(texts)
            prompt = self._prompt(request.prompt_name, request.instruction)
            work, chunking = self._text_work(texts, prompt, truncate, keep)
        else:
            if request.prompt_name is not None or request.instruction is not None:
                raise ScoringError(
                    Reason.INVALID_REQUEST,
                    "prompt_name / instruction: prompts apply to text, not to token ids",
                    "input",
                )
            lists = [raw] if isinstance(raw[0], int) else raw
            work, chunking = self._ids_work(lists, truncate, keep)
        tokens = sum(len(ids) for ids in work.inputs)
        work = dataclasses.replace(work, adapter=adapter)
        as_base64 = request.encoding_format == "base64"
        types = tuple(request.embedding_types or ())
        return EmbedPrepared(work, request.dimensions, as_base64, tokens, types, chunking)

    def _ids_work(
        self, lists: Sequence[Sequence[int]], truncate: str | None, keep: int | None
    ) -> tuple[EmbedWork, Chunking | None]:
        """Token-id inputs as ``truncate`` (or ``keep``) handles those past the limit."""
        inputs = []
        for ids in lists:
            if not ids:
                raise ScoringError(Reason.EMPTY_INPUT, "input: an empty token list", "input")
            check_token_ids(ids, self.info.vocab_size, "input")
            inputs.append(tuple(ids))
        if truncate == "CHUNK":
            return self.chunked_work(None, None, inputs)
        limit = input_limit(self.info)
        keep = limit if truncate in ("END", "START") else keep
        if keep is not None:  # START keeps the last tokens of token ids
            inputs = [ids[-keep:] if truncate == "START" else ids[:keep] for ids in inputs]
        work = EmbedWork(tuple(inputs))
        _check_work(work, self.info)
        return work, None

    def prepare_cohere(self, payload: Any) -> tuple[EmbedPrepared, list[str]]:
        """/v2/embed: its texts behind the prompt ``input_type`` names."""
        request = validate_body(payload, CohereEmbedRequest)
        adapter = check_model_name(request.model, self.info)
        head = pooling_of(self.info)
        check_dimensions(request.output_dimension, head, "output_dimension")
        if not request.texts:
            raise ScoringError(Reason.EMPTY_INPUT, "texts: the list is empty", "texts")
        check_item_count(len(request.texts), self.info)
        _check_text(request.texts)
        prompt = input_type_prompt(head, request.input_type)
        truncate = request.truncate or "END"  # Cohere's default
        work, chunking = self._text_work(list(request.texts), prompt, truncate, None)
        work = dataclasses.replace(work, adapter=adapter)
        tokens = sum(len(ids) for ids in work.inputs)
        types = tuple(request.embedding_types)
        prepared = EmbedPrepared(work, request.output_dimension, False, tokens, types, chunking)
        return prepared, list(request.texts)


def cosines(query: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Cosine of ``query [D]`` with each row of ``items [N, D]`` (float64)."""
    q = np.asarray(query, np.float64)
    m = np.asarray(items, np.float64).reshape(-1, q.shape[-1])
    norms = np.maximum(np.linalg.norm(m, axis=-1) * np.linalg.norm(q), 1e-300)
    return (m @ q) / norms


def openai_body(
    prepared: EmbedPrepared,
    vectors: np.ndarray,
    model: str,
    calibration: Calibration = NO_CALIBRATION,
) -> dict[str, Any]:
    """OpenAI's list; with ``embedding_types`` (scorejax's extension) each item also carries
    ``embeddings: {type: value}`` as /v2/embed gives them."""
    out = matryoshka(vectors, prepared.dimensions)
    # each vector as JSON numbers, or as base64 of its little-endian float32 bytes
    encode = base64_of if prepared.base64 else lambda v: np.asarray(v, np.float32).tolist()
    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(out)]
    if prepared.types:
        typed = typed_embeddings(out, prepared.types, calibration, prepared.dimensions)
        for i, item in enumerate(data):
            item["embeddings"] = {kind: values[i] for kind, values in typed.items()}
    tokens = prepared.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def cohere_body(
    prepared: EmbedPrepared,
    vectors: np.ndarray,
    texts: list[str],
    request_id: str,
    calibration: Calibration = NO_CALIBRATION,
) -> dict[str, Any]:
    """Cohere v2's embeddings_by_type: ``embeddings: {type: [a value per text]}``; ``meta``
    counts the tokens embedded (``billed_units`` and ``tokens``, as /v1/rerank's)."""
    out = matryoshka(vectors, prepared.dimensions)
    return {
        "id": request_id,
        "embeddings": typed_embeddings(out, prepared.types, calibration, prepared.dimensions),
        "texts": texts,
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": prepared.prompt_tokens},
            "tokens": {"input_tokens": prepared.prompt_tokens},
        },
        "response_type": "embeddings_by_type",
    }
