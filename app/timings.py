"""How the ingress calls a replica and where a request's time went: the ``Backend`` a
route awaits, ``Timings`` (TEI-style response headers) and ``replica_answer``, which reads
the seconds a replica reports. Shared by app.service and the modules of its routes
(app.cross_encoder) without importing the service."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from replicas.contract import EmbedWork, PromptWork, ScoredWork, ScoreWork

# A replica's answer: the log-probabilities, or ScoredWork (they and the engine step's seconds).
# (A PromptWork's answer: a list of PromptLogprobs, or ScoredWork holding one.)
Backend = Callable[[ScoreWork | PromptWork | EmbedWork], Awaitable[Any]]


@dataclass(frozen=True)
class Timings:
    """Where a scored request's time went, in seconds (TEI-style response headers).
    ``queue_s``: from handing the work to the replicas until its engine step ran (admission,
    Serve's queues, batching, transport); ``inference_s``: the engine step(s). None: the
    replica did not say (a bare array), or no replica was called (no items)."""

    tokenization_s: float
    queue_s: float | None = None
    inference_s: float | None = None


async def replica_answer(work: Any, backend: Backend, timings: Timings) -> tuple[Any, Timings]:
    """``backend(work)``'s payload (a ScoredWork's scores), and ``timings`` with the queue
    and engine seconds it reports."""
    called = time.perf_counter()
    answer = await backend(work)
    if isinstance(answer, ScoredWork):
        waited = time.perf_counter() - called - answer.inference_s
        timings = Timings(timings.tokenization_s, max(waited, 0.0), answer.inference_s)
        answer = answer.scores
    return answer, timings
