"""A cross-encoder's answers (replicas.kinds.CROSS_ENCODER, app.cross_encoder): /v1/score
and /v1/rerank score each (query, document) pair with the head, /v1/classify each text or
pair."""

from __future__ import annotations

from typing import Any

from app.cross_encoder import cross_encoded
from app.kinds.kind import Answer, KindAnswers
from app.served import Answered, Served
from app.timings import Backend


def pairs_on(route: str) -> Answer:
    async def answer(served: Served, payload: Any, backend: Backend) -> Answered:
        info, clock, chunking = served.info, served.clock, served.chunking
        return await cross_encoded(served.tokenizer, info, payload, route, backend, clock, chunking)

    return answer


KIND = KindAnswers(
    name="cross_encoder",
    answers={
        "score": pairs_on("/v1/score"),
        "rerank": pairs_on("/v1/rerank"),
        "classify": pairs_on("/v1/classify"),
    },
)
