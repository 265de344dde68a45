"""What the ingress serves, without Ray and without a kind: the model (``ModelInfo``), its
tokenizer, the helpers its routes were built with, and the checked replica calls every
kind's answers make (``app/kinds``). ``app.service.ScoringService`` builds one from the
settings and dispatches each workload to the served kind's answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.chunks import NO_CHUNKING, ChunkOptions
from app.completions import Completions
from app.embed_types import NO_CALIBRATION, Calibration
from app.embeddings import Embedder
from app.rerank import Reranker
from app.schema import ScoreRequest
from app.timings import Backend, Timings, replica_answer
from app.tokenization import TextTokenizer, Tokenized, encode_text, pass_tokens
from app.validation import (
    check_item_count,
    check_model_name,
    check_text_encodable,
    check_token_inputs,
    check_work,
    is_text_request,
    score_labels,
    validate_request,
)
from replicas.answers import LabelScores, PromptScores
from replicas.contract import ModelInfo, PromptWork, ScoreWork
from replicas.errors import Reason, ScoringError

T = TypeVar("T")
# What a kind answers a workload with: the response body and where its time went.
Answered = tuple[dict[str, Any], Timings]


@dataclass(frozen=True)
class Prepared:
    """A /v1/score request that passed every rule, ready for a replica."""

    request: ScoreRequest
    work: ScoreWork
    tokenized: Tokenized


@dataclass(frozen=True)
class Served:
    info: ModelInfo
    tokenizer: TextTokenizer
    clock: Callable[[], float] = field(default=time.time)
    reranker: Reranker | None = None  # /v1/rerank by a template; None: the model has none
    completions: Completions | None = None  # /v1/completions and the tokenizer routes
    chunking: ChunkOptions = NO_CHUNKING  # /v1/rerank's chunking defaults (app.chunks)
    calibration: Calibration = NO_CALIBRATION  # int8/uint8 embedding ranges (app.embed_types)

    @property
    def embedder(self) -> Embedder:
        return Embedder(self.info, self.tokenizer, self.calibration)

    def prepare(self, payload: Any) -> Prepared:
        """A /v1/score body on a decoder: every rule, in a fixed order; raises ScoringError
        on the first."""
        request = validate_request(payload)
        adapter = check_model_name(request.model, self.info)
        labels = score_labels(request.label_token_ids, self.info)
        text = is_text_request(request)
        check_item_count(len(request.items), self.info)
        if text:
            check_text_encodable(request)
            tokenized = encode_text(self.tokenizer, request.query, request.items)  # type: ignore[arg-type]
        else:
            check_token_inputs(request, self.info.vocab_size)
            tokenized = pass_tokens(request.query, request.items)  # type: ignore[arg-type]
        work = ScoreWork(
            query_ids=tokenized.query_ids,
            item_ids=tokenized.item_ids,
            label_ids=labels,
            item_first=request.item_first,
            adapter=adapter,
        )
        check_work(work, self.info)
        return Prepared(request, work, tokenized)

    def served_tokenizer(self) -> Completions:
        """The completions and tokenizer routes' helper (404 when none was built)."""
        if self.completions is None:
            raise ScoringError(
                Reason.NOT_FOUND, "this server has no tokenizer routes", status_code=404
            )
        return self.completions

    @property
    def text_query_min_length(self) -> int:
        """1 when "" encodes to no tokens (no BOS), so an empty text query is empty_query."""
        return 0 if len(self.tokenizer("", add_special_tokens=True)["input_ids"]) else 1


async def scored(
    work: ScoreWork, backend: Backend, timings: Timings
) -> tuple[LabelScores, Timings]:
    """The replica's rows ``[n_items, n_labels]``, checked, and timings."""
    answer, timings = await replica_answer(work, backend, timings)
    return LabelScores.checked(answer, work.num_items, len(work.label_ids)), timings


async def prompted(
    work: PromptWork, backend: Backend, timings: Timings
) -> tuple[PromptScores, Timings]:
    """The replica's PromptLogprobs, one per prompt, checked, and timings."""
    answer, timings = await replica_answer(work, backend, timings)
    return PromptScores.checked(answer, work.num_items), timings


def tokenized(prepare: Callable[..., T], *args: Any) -> tuple[T, Timings]:
    """``prepare(*args)`` (a request's rules and tokenization), and the seconds it took."""
    start = time.perf_counter()
    prepared = prepare(*args)
    return prepared, Timings(tokenization_s=time.perf_counter() - start)
