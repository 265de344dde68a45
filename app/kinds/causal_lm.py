"""A causal LM's answers (replicas.kinds.CAUSAL_LM): /v1/score by the label tokens'
next-token log-probabilities, /v1/rerank by its template's method (app.rerank),
/v1/completions by prompt log-probabilities; /v1/classify is refused ``no_score_head``
after the body's own rules. Its decoder answers are shared with the score-head kind."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.kinds.kind import Answer, KindAnswers
from app.rerank import reranker_for, work_relevance
from app.schema import ClassifyRequest
from app.scores import to_scores
from app.served import Answered, Served, prompted, scored, tokenized
from app.timings import Backend
from app.validation import check_model_name, validate_body
from replicas.contract import PromptWork
from replicas.errors import Reason, ScoringError


def label_scores(to_rows: Any) -> Answer:
    """/v1/score on a decoder: its rows through ``to_rows`` (label log-probs or a head's)."""

    async def score(served: Served, payload: Any, backend: Backend) -> Answered:
        prepared, timings = tokenized(served.prepare, payload)
        scores: list[list[float]] = []
        if prepared.work.num_items:
            logprobs, timings = await scored(prepared.work, backend, timings)
            scores = to_rows(logprobs, prepared.request.apply_softmax)
        tokens = prepared.tokenized.prompt_tokens
        body = {
            "object": "scoring",
            "model": prepared.work.adapter or served.info.name,  # the adapter a request named
            "scores": scores,
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
            "created": int(served.clock()),
        }
        return body, timings

    return score


async def template_rerank(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/rerank by the model's template and method (app.rerank)."""
    if served.reranker is None:
        raise ScoringError(
            Reason.NOT_FOUND,
            f"model {served.info.name!r} has no rerank template (setting rerank_template)",
            status_code=404,
        )
    reranker = served.reranker
    prepared, timings = tokenized(reranker.prepare, payload, served.info, served.chunking)
    relevance = np.zeros((0,), np.float64)
    work = prepared.work
    if work.num_items:
        call = prompted if isinstance(work, PromptWork) else scored
        answers, timings = await call(work, backend, timings)  # type: ignore[arg-type]
        relevance = work_relevance(work, answers)
    model = work.adapter or served.info.name
    return served.reranker.body(prepared, relevance, model), timings


async def complete(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/completions (app.completions)."""
    completions = served.served_tokenizer()
    prompts, timings = tokenized(completions.prepare, payload)
    answers, timings = await prompted(prompts.work, backend, timings)
    return completions.body(prompts, answers, int(served.clock())), timings


async def no_score_head(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/classify: the body's rules, then ``no_score_head``."""
    request = validate_body(payload, ClassifyRequest)
    check_model_name(request.model, served.info)
    raise ScoringError(
        Reason.NO_SCORE_HEAD,
        f"/v1/classify: model {served.info.name!r} has no score head (a causal LM is scored "
        "through /v1/score with label_token_ids)",
    )


KIND = KindAnswers(
    name="causal_lm",
    answers={
        "score": label_scores(to_scores),
        "rerank": template_rerank,
        "completions": complete,
    },
    refusals={"classify": no_score_head},
    reranker=lambda http, tokenizer, info: reranker_for(http, tokenizer),
)
