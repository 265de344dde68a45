"""``--engine serve``: rows scored by a running scorejax Serve application through its
DeploymentHandle (the handle calls of docs/architecture.md, "Two deployments"), so a batch job
shares the replicas with online traffic.

``ServeStage`` is the skeleton (the handle, the limits, ``call_all``). ``score``: each
batch's rows are packed by query as for the local engine and each pack is sent as token ids
to the ingress's ``score`` method (the /v1/score code path). ``rerank``, ``loglik``,
``classify`` and ``embed`` (batch.embed_stage): the CPU stage's works, packed as for the
local engine, go to the ingress's ``score_work`` method (checked again there, then the
replicas). Each actor keeps at most
``max_in_flight`` calls in flight (DeploymentHandle responses, collected in order), so the
job never adds more than ``replicas x max_in_flight`` calls to the replicas' queues and
online requests keep their place among them. A 503 (``overloaded``, ``unavailable``) is sent
again after its ``Retry-After`` (1 s if none), never dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from batch.packing import pack_works
from batch.score_stage import LOGPROBS, logprob_column, row_works
from batch.stages import report, with_columns
from batch.works import Work, read_works, row_answers
from replicas.contract import ScoreWork
from replicas.errors import Reason, ScoringError
from replicas.settings import ReplicaSettings

RETRIED = (Reason.OVERLOADED, Reason.UNAVAILABLE)


def call_all(
    send: Callable[[Any], Any], requests: Sequence[Any], max_in_flight: int, tally: Any
) -> list[Any]:
    """``send(request).result()`` of each request, in order, with at most ``max_in_flight``
    responses outstanding; a retryable 503 is sent again after its Retry-After."""
    results: list[Any] = [None] * len(requests)
    pending: deque[tuple[int, Any]] = deque()
    sent = 0
    while sent < len(requests) or pending:
        while sent < len(requests) and len(pending) < max_in_flight:
            pending.append((sent, send(requests[sent])))
            sent += 1
        index, response = pending.popleft()
        try:
            results[index] = response.result()
        except ScoringError as error:
            if error.status_code != 503 or error.reason not in RETRIED:
                raise
            report(tally, {"retried_503": 1})
            time.sleep(error.retry_after_s or 1)  # the app's Retry-After
            pending.appendleft((index, send(requests[index])))
    return results


class ServeStage:
    """The ``--engine serve`` stage skeleton: one DeploymentHandle to the app ``app_name``
    per actor, the request limits of ``settings``; ``payload`` as ``batch.stages.EngineStage``'s,
    at most ``max_in_flight`` calls outstanding, ``adapter`` the job's ``--model``."""

    def __init__(
        self,
        app_name: str,
        settings: ReplicaSettings,
        payload: Any,
        tally: Any,
        max_in_flight: int = 4,
        adapter: str | None = None,
    ) -> None:
        from ray import serve

        self._handle = serve.get_app_handle(app_name)
        self._limits, self._payload, self._tally = settings.limits, payload, tally
        self._multi_item = settings.model.multi_item_scoring_delimiter is not None
        self._max_in_flight, self._adapter = max_in_flight, adapter

    def send_all(self, send: Callable[[Any], Any], requests: Sequence[Any]) -> list[Any]:
        """``call_all`` with this stage's ``max_in_flight`` and tally."""
        return call_all(send, requests, self._max_in_flight, self._tally)


class ServeScore(ServeStage):
    """``score`` through the app's ``score`` method (payload: the ``ScoreColumns``); packs
    as ``EngineScore`` packs."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = row_works(batch, self._payload)
        packs = pack_works(works, self._limits, self._multi_item)
        answers = self._scores([pack.work for pack in packs], self._max_in_flight)
        return with_columns(batch, {LOGPROBS: logprob_column(works, packs, answers)})

    def _score(self, work: ScoreWork) -> np.ndarray:
        """One work's ``[items, labels]`` log-probabilities (sent again after a 503)."""
        return self._scores([work], 1)[0]

    def _scores(self, works: list[ScoreWork], max_in_flight: int) -> list[np.ndarray]:
        """The app answers ``exp(logprob)`` (``apply_softmax`` false), whose log is the
        log-probability to float64 rounding."""

        def send(work: ScoreWork) -> Any:
            return self._handle.score.remote(
                query=list(work.query_ids),
                items=[list(item) for item in work.item_ids],
                label_token_ids=list(work.label_ids),
                item_first=work.item_first,
                model=work.adapter,
            )

        bodies = call_all(send, works, max_in_flight, self._tally)
        with np.errstate(divide="ignore"):
            return [np.log(np.asarray(body["scores"], np.float64)) for body in bodies]


class ServeWorks(ServeStage):
    """``rerank`` / ``loglik`` / ``classify`` through the app: the CPU stage's works, packed
    as the local engine stage packs them, sent to the ingress's ``score_work``; the payload
    (the mode's ``Results``) gives the mode's columns (as ``batch.works.EngineWorks``)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = read_works(batch, self._adapter)
        answers = row_answers(works, self._limits, self._multi_item, self._call)
        return with_columns(batch, self._payload(batch, works, answers))

    def _call(self, works: list[Work]) -> list[Any]:
        return self.send_all(self._handle.score_work.remote, works)
