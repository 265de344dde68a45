"""``--engine serve``: rows scored by a running scorejax Serve application through its
DeploymentHandle (DESIGN.md: calls from other Ray apps), so a batch job shares the replicas
with online traffic.

Each batch's rows are packed by query as for the local engine and each pack is sent as token
ids to the ingress's ``score`` method (the /v1/score code path), one call at a time per actor:
the job has at most as many calls in flight as it has actors (``--replicas``), so online
requests keep their place in the replicas' queues. A 503 (``overloaded``, ``unavailable``)
is sent again after its ``Retry-After`` (1 s if none), never dropped.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from app.errors import Reason, ScoreRequestError
from batch.packing import pack_works
from batch.rows import ScoreColumns
from batch.stages import LOGPROBS, logprob_column, report, row_works, with_columns
from replicas.contract import ScoreWork
from replicas.settings import ReplicaSettings

RETRIED = (Reason.OVERLOADED, Reason.UNAVAILABLE)


class ServeScore:
    """One DeploymentHandle to the app per actor; packs as ``EngineScore`` packs."""

    def __init__(
        self, app_name: str, settings: ReplicaSettings, columns: ScoreColumns, tally: Any
    ) -> None:
        from ray import serve

        self._handle = serve.get_app_handle(app_name)
        self._limits, self._columns, self._tally = settings.limits, columns, tally
        self._multi_item = settings.multi_item_scoring_delimiter is not None

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = row_works(batch, self._columns)
        packs = pack_works(works, self._limits, self._multi_item)
        answers = [self._score(pack.work) for pack in packs]
        return with_columns(batch, {LOGPROBS: logprob_column(works, packs, answers)})

    def _score(self, work: ScoreWork) -> np.ndarray:
        """``[items, labels]`` log-probabilities: the app answers ``exp(logprob)``
        (``apply_softmax`` false), whose log is the log-probability to float64 rounding."""
        while True:
            try:
                body = self._handle.score.remote(
                    query=list(work.query_ids),
                    items=[list(item) for item in work.item_ids],
                    label_token_ids=list(work.label_ids),
                    item_first=work.item_first,
                ).result()
            except ScoreRequestError as error:
                if error.status_code != 503 or error.reason not in RETRIED:
                    raise
                report(self._tally, {"retried_503": 1})
                time.sleep(error.retry_after_s or 1)  # the app's Retry-After
                continue
            with np.errstate(divide="ignore"):
                return np.log(np.asarray(body["scores"], np.float64))
