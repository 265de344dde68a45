"""Cross-encoders (the ``cross_encoder`` kind, app.kinds.cross_encoder: a
``BertForSequenceClassification``, e.g. saved by sentence-transformers' ``CrossEncoder``):
each (query, document) pair is one sequence, tokenized as ``CrossEncoder.predict``
tokenizes it (``[CLS] q [SEP] d [SEP]``, token types 0 then 1, ``longest_first``
truncation to the model's length), and the head's logits on its [CLS] token go through
the model's activation (sigmoid for one label, unless the directory saved another).

- ``/v1/rerank``: documents ranked by ``predict((query, document))`` (one label only).
- ``/v1/score`` (no ``label_token_ids``, text only): one row per item, ``predict((query,
  item))`` (``(item, query)`` with ``item_first``), softmaxed over the labels with
  ``apply_softmax`` and more than one label.
- ``/v1/classify``: each input a single text (``[CLS] text [SEP]``, all type 0), as
  ``CrossEncoder.predict(text)`` scores it: with ``activation`` (the default) one label is
  the head's output through the model's activation, more labels are softmaxed as on a
  score-head model (``problem_type``: sigmoid per label for multi-label, none for
  regression); without, the raw logits. An entry ``[text, text_pair]`` (TEI's /predict
  shape) is scored as ``CrossEncoder.predict((text, text_pair))``.

The pairs (texts) of a request go to the replica as one EmbedWork (``second_starts``: where
each pair's type-1 tokens start); the replica answers the logits ``[pairs, num_labels]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.chunks import NO_CHUNKING, ChunkOptions, Chunks, request_chunks
from app.classify import classify_envelope, head_of
from app.rerank import rerank_body
from app.schema import ClassifyRequest, RerankRequest, ScoreRequest
from app.scores import classify_probs
from app.timings import Backend, Timings, replica_answer
from app.validation import (
    check_item_count,
    check_model_name,
    check_unicode,
    validate_body,
    validate_request,
)
from replicas.answers import Vectors
from replicas.contract import EmbedWork, ModelInfo
from replicas.errors import Reason, ScoringError

_NO_LIMIT = 1 << 40  # tokenizers without a limit say int(1e30)


@dataclass(frozen=True)
class Pairs:
    """A cross-encoder request, validated and tokenized."""

    route: str
    request: ScoreRequest | RerankRequest
    work: EmbedWork  # adapter: the LoRA adapter the request named (None: the base)
    model: str  # the name it is answered under
    chunks: Chunks | None = None  # /v1/rerank: the documents' chunks (app.chunks)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.work.inputs)

    def body(self, logits: np.ndarray, info: ModelInfo, created: int) -> dict[str, Any]:
        """The route's response body for the replica's logits ``[pairs, num_labels]``."""
        scores = activated(logits, head_of(info).activation)
        if isinstance(self.request, RerankRequest):
            return rerank_body(
                self.request, scores[:, 0], self.prompt_tokens, self.model, self.chunks
            )
        if self.request.apply_softmax and scores.shape[1] > 1:
            scores = softmax(scores)
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": 0}
        usage["total_tokens"] = self.prompt_tokens
        rows = [[float(x) for x in row] for row in scores]
        return {"object": "scoring", "model": self.model, "scores": rows, "usage": usage,
                "created": created}  # fmt: skip


@dataclass(frozen=True)
class Texts:
    """A /v1/classify request on a cross-encoder, validated and tokenized: one sequence per
    input."""

    request: ClassifyRequest
    work: EmbedWork

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.work.inputs)

    def body(self, logits: np.ndarray, info: ModelInfo, created: int) -> dict[str, Any]:
        """/v1/classify's body (app.classify) for the logits ``[inputs, num_labels]``."""
        head = head_of(info)
        values = logits if len(logits) else None
        if values is not None and self.request.activation:
            values = (
                activated(values, head.activation)
                if head.num_labels == 1
                else classify_probs(values, head.problem_type)
            )
        return classify_envelope(self.request, values, self.prompt_tokens, info, created)


async def cross_encoded(
    tokenizer: Any,
    info: ModelInfo,
    payload: Any,
    route: str,
    backend: Backend,
    clock: Callable[[], float],
    chunking: ChunkOptions = NO_CHUNKING,
) -> tuple[dict[str, Any], Timings]:
    """The body of ``route`` (/v1/score, /v1/rerank, /v1/classify) on a cross-encoder, and
    where its time went."""
    start = time.perf_counter()
    prepared: Pairs | Texts
    if route == "/v1/classify":
        prepared = prepare_texts(tokenizer, info, payload)
    else:
        prepared = prepare_pairs(tokenizer, info, payload, route, chunking)
    timings = Timings(tokenization_s=time.perf_counter() - start)
    labels = head_of(info).num_labels
    logits = np.zeros((0, labels), np.float32)
    if prepared.work.num_items:
        answer, timings = await replica_answer(prepared.work, backend, timings)
        logits = np.asarray(Vectors.checked(answer, prepared.work.num_items, labels))
    return prepared.body(logits, info, int(clock())), timings


def activated(logits: np.ndarray, activation: str | None) -> np.ndarray:
    """float32 ``[pairs, labels]`` through the model's activation, as torch computes it."""
    x = np.asarray(logits, np.float32)
    if activation == "sigmoid":
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)
    return x


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _truncation(tokenizer: Any, info: ModelInfo) -> dict[str, Any]:
    """``longest_first`` to the most tokens of a pair: the tokenizer's ``model_max_length``,
    within the model's position embeddings."""
    limits = (getattr(tokenizer, "model_max_length", None), head_of(info).max_length)
    sane = [int(n) for n in limits if isinstance(n, int | float) and 0 < n < _NO_LIMIT]
    limit = min(sane, default=0)
    return {"truncation": "longest_first", "max_length": limit} if limit else {}


def encode_texts(tokenizer: Any, info: ModelInfo, texts: list[str]) -> EmbedWork:
    """Each text alone as CrossEncoder.predict(text) tokenizes it (every token type 0)."""
    encoded = tokenizer(texts, add_special_tokens=True, **_truncation(tokenizer, info))
    return EmbedWork(tuple(tuple(int(t) for t in ids) for ids in encoded["input_ids"]))


def encode_pairs(tokenizer: Any, info: ModelInfo, pairs: list[tuple[str, str]]) -> EmbedWork:
    """Each pair as CrossEncoder.predict tokenizes it, with where its type-1 tokens start."""
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    options = _truncation(tokenizer, info)
    encoded = tokenizer(firsts, seconds, add_special_tokens=True, **options)
    inputs = tuple(tuple(int(t) for t in ids) for ids in encoded["input_ids"])
    types = encoded.get("token_type_ids") or [()] * len(inputs)  # RoBERTa's: none, all 0
    starts = tuple(
        list(row).index(1) if 1 in row else len(ids) for row, ids in zip(types, inputs, strict=True)
    )
    return EmbedWork(inputs, second_starts=starts)


def _check_texts(query: Any, items: list[Any], route: str) -> None:
    if not isinstance(query, str) or not all(isinstance(item, str) for item in items):
        raise ScoringError(
            Reason.INVALID_REQUEST,
            f"{route}: a cross_encoder model scores text pairs; token ids are not taken",
            "query",
        )
    for name, text in (("query", query), *(("items", item) for item in items)):
        check_unicode(text, name)


def prepare_pairs(
    tokenizer: Any,
    info: ModelInfo,
    payload: Any,
    route: str,
    chunking: ChunkOptions = NO_CHUNKING,
) -> Pairs:
    """A /v1/rerank or /v1/score body on a cross-encoder: every rule, then its pairs (a
    rerank's documents chunked by ``chunking`` and the request, app.chunks)."""
    chunks = None
    if route == "/v1/rerank":
        request: ScoreRequest | RerankRequest = validate_body(payload, RerankRequest)
        query, first = request.query, False
        if request.instruction is not None:
            raise ScoringError(
                Reason.INVALID_REQUEST,
                "instruction: a cross_encoder model scores the (query, document) pair as "
                "given and takes no instruction; omit it",
                "instruction",
            )
        check_item_count(len(request.documents), info)
        chunks = request_chunks(tokenizer, request, chunking, info)
        texts = list(chunks.texts)
    else:
        request = validate_request(payload)
        texts, query, first = list(request.items), request.query, request.item_first
        if request.label_token_ids is not None:
            raise ScoringError(
                Reason.INVALID_REQUEST,
                "label_token_ids: a cross_encoder model answers its head's outputs; omit it",
                "label_token_ids",
            )
    adapter = check_model_name(request.model, info)
    check_item_count(len(texts), info)
    labels = head_of(info).num_labels
    if route == "/v1/rerank" and labels != 1:
        raise ScoringError(
            Reason.INVALID_REQUEST,
            f"/v1/rerank: a cross_encoder of {labels} labels has no relevance "
            "to rank by; /v1/score answers its outputs",
        )
    _check_texts(query, texts, route)
    pairs = [(text, query) if first else (query, text) for text in texts]
    work = encode_pairs(tokenizer, info, pairs) if pairs else EmbedWork(())
    return Pairs(route, request, replace(work, adapter=adapter), request.model or info.name, chunks)


def prepare_texts(tokenizer: Any, info: ModelInfo, payload: Any) -> Texts:
    """A /v1/classify body on a cross-encoder: every rule, then its texts' tokens."""
    request = validate_body(payload, ClassifyRequest)
    adapter = check_model_name(request.model, info)
    entries = [request.input] if isinstance(request.input, str) else list(request.input)
    check_item_count(len(entries), info)
    for entry in entries:
        for text in (entry,) if isinstance(entry, str) else entry:
            check_unicode(text, "input")
    return Texts(request, replace(encode_entries(tokenizer, info, entries), adapter=adapter))


def encode_entries(tokenizer: Any, info: ModelInfo, entries: list[Any]) -> EmbedWork:
    """/v1/classify's inputs in order: a text as ``predict(text)``, a pair as
    ``predict((text, text_pair))`` tokenize them (a text has no type-1 tokens)."""
    singles = [i for i, e in enumerate(entries) if isinstance(e, str)]
    pairs = [i for i, e in enumerate(entries) if not isinstance(e, str)]
    texts = encode_texts(tokenizer, info, [entries[i] for i in singles]) if singles else None
    both = encode_pairs(tokenizer, info, [tuple(entries[i]) for i in pairs]) if pairs else None
    inputs: list[tuple[int, ...]] = [()] * len(entries)
    starts = [0] * len(entries)
    for i, ids in zip(singles, texts.inputs if texts else (), strict=True):
        inputs[i], starts[i] = ids, len(ids)
    for j, i in enumerate(pairs):
        assert both is not None
        inputs[i], starts[i] = both.inputs[j], both.second_starts[j]
    return EmbedWork(tuple(inputs), second_starts=tuple(starts))
