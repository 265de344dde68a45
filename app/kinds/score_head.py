"""A decoder with a score head's answers (replicas.kinds.SCORE_HEAD): /v1/score answers the
head's outputs per item, /v1/classify one row per input (app.classify), /v1/rerank by the
head (``rerank_method: head``, a one-label head); /v1/completions is refused
``no_lm_head``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from app.classify import classify_body, prepare_classify
from app.kinds.causal_lm import label_scores, template_rerank
from app.kinds.kind import KindAnswers
from app.rerank import head_reranker
from app.scores import head_scores
from app.served import Answered, Served, scored, tokenized
from app.timings import Backend
from replicas.errors import Reason, ScoringError


async def classify(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/classify: every input one row, scored concurrently (the replica packs them into
    its steps)."""
    prepared, timings = tokenized(prepare_classify, payload, served.info, served.tokenizer)
    answers = await asyncio.gather(*(scored(work, backend, timings) for work in prepared.works))
    if answers:
        timings = answers[-1][1]
    outputs = np.concatenate([logits for logits, _ in answers]) if answers else None
    return classify_body(prepared, outputs, served.info, int(served.clock())), timings


async def no_lm_head(served: Served, payload: Any, backend: Backend) -> Answered:
    """/v1/completions reads token log-probabilities, which a score head has not."""
    served.served_tokenizer()  # 404 first where no tokenizer routes were built
    raise ScoringError(
        Reason.NO_LM_HEAD,
        f"/v1/completions: model {served.info.name!r} has a score head, not a language-model "
        "head; use /v1/score or /v1/classify",
    )


KIND = KindAnswers(
    name="score_head",
    answers={"score": label_scores(head_scores), "rerank": template_rerank, "classify": classify},
    refusals={"completions": no_lm_head},
    reranker=lambda http, tokenizer, info: head_reranker(http, tokenizer, info.head),
)
