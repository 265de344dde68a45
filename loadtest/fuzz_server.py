"""An in-process scorejax ingress for fuzzing: the real routing, validation and tokenizer.

``in_process_app`` is the FastAPI app of ``app.http.build_api``, as ScoreIngress serves it
inside Serve, with a ``CheckingBackend`` in place of the scoring replicas. The backend
re-checks every rule a replica relies on (ids inside the vocabulary, no delimiter in the
content, the shared limits) and raises on a breach, so a request that slips past the
ingress's validation is answered 500 and counted as a 5xx by the fuzz runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI

from app.http import build_api
from app.service import ScoringService
from replicas.contract import (
    EmbedWork,
    ModelInfo,
    PromptLogprobs,
    PromptWork,
    ScoreWork,
    check_embed_limits,
    check_limits,
)


class UnsoundWork(AssertionError):
    """A work no replica should ever receive: the ingress let a bad request through."""


def check_sound(work: ScoreWork | PromptWork | EmbedWork, info: ModelInfo) -> None:
    """Every precondition the engine assumes of a work; raises UnsoundWork on a breach."""
    embeds = isinstance(work, EmbedWork)
    if embeds != (info.pooling is not None):
        raise UnsoundWork("embeddings asked of another kind, or other work of an embedder")
    if isinstance(work, PromptWork) and info.head is not None:
        raise UnsoundWork("token log-probs asked of a score-head model")
    scores = isinstance(work, ScoreWork)
    if scores and info.head is not None and work.label_ids != info.head.label_ids:
        raise UnsoundWork("a score-head model's work must ask for every head output")
    if scores:
        content, sequences = (work.query_ids, *work.item_ids), (work.query_ids, work.label_ids)
    else:
        content = sequences = work.inputs if embeds else work.prompts
    if not sequences or any(not ids for ids in sequences):
        raise UnsoundWork("empty query, input or prompt, or no labels")
    if any(not 0 <= token < info.vocab_size for ids in (*sequences, *content) for token in ids):
        raise UnsoundWork("token id outside the vocabulary")
    delimiter = info.multi_item_scoring_delimiter
    if scores and delimiter is not None and any(delimiter in ids for ids in content):
        raise UnsoundWork("delimiter inside the content")
    if isinstance(work, PromptWork) and not 0 <= work.top_k <= 20:
        raise UnsoundWork("top_k outside 0..20")
    try:
        if embeds:
            check_embed_limits(work, info.limits, info.pooling.max_seq_length)
        else:  # prompts: always the packed rows' limits
            check_limits(work, info.limits, multi_item=delimiter is not None or not scores)
    except ValueError as error:
        raise UnsoundWork(f"limit broken: {error}") from None


def fake_prompt_answer(prompt: tuple[int, ...], top_k: int) -> PromptLogprobs:
    """-0.1 per token; the alternatives are token ids 1..k at -1, -2, ..."""
    k = max(top_k, 1)
    logprobs = np.full((len(prompt),), -0.1, np.float32)
    logprobs[0] = np.nan
    ids = np.tile(np.arange(1, k + 1, dtype=np.int32), (len(prompt) + 1, 1))
    best = -np.tile(np.arange(1, k + 1, dtype=np.float32), (len(prompt) + 1, 1))
    ids[0], best[0] = -1, np.nan
    return PromptLogprobs(logprobs, ids, best)


@dataclass
class CheckingBackend:
    """Stands in for the replicas: checks each work, answers with the fake engine's
    arithmetic (logprob = -(label % 7) - 0.1 * (len(query) + len(item))), counts calls."""

    info: ModelInfo
    calls: int = 0

    async def __call__(self, work: ScoreWork | PromptWork) -> Any:
        check_sound(work, self.info)
        self.calls += 1
        if isinstance(work, PromptWork):
            return [fake_prompt_answer(prompt, work.top_k) for prompt in work.prompts]
        if isinstance(work, EmbedWork):  # unit vectors that depend on the input's length
            assert self.info.pooling is not None
            size = self.info.pooling.dimension
            lengths = np.asarray([len(ids) for ids in work.inputs], np.float32)
            vectors = np.cos(np.outer(lengths, np.arange(1, size + 1, dtype=np.float32)))
            return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
        lengths = np.asarray([len(work.query_ids) + len(item) for item in work.item_ids])
        labels = np.asarray(work.label_ids, dtype=np.int64) % 7
        return (-labels[None, :] - 0.1 * lengths[:, None]).astype(np.float32)


def in_process_app(
    service: ScoringService, backend: CheckingBackend, keys: frozenset[str] = frozenset()
) -> FastAPI:
    async def health() -> None:
        return None

    async def stats() -> dict[str, Any]:
        return {"requests": backend.calls, "compile_count": 0}

    return build_api(service, backend, health, stats, keys)
