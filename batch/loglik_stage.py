"""``python -m batch loglik``: lm-eval's loglikelihood of each (context, continuation) row,
as /v1/completions with ``echo`` gives it (semantics 14).

``LoglikPrepare`` (CPU): the context is encoded with the tokenizer's special tokens, the
continuation without, joined as token ids (token-id columns pass through); the prompt is
prepared by the route's own ``Completions`` (``echo: true, max_tokens: 0, logprobs: 1``), so
a row gets the route's checks and 400 reasons. The engine stage merges a batch's rows into
prompt works; prompts that share their context's whole blocks compute it once (semantics
15). ``loglik_columns``: ``logprob``, the continuation's summed log-probability;
``is_greedy``, every continuation token is the most likely one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batch.rows import plain
from batch.works import PrepareWorks, Work
from replicas.contract import PromptLogprobs, PromptWork
from replicas.errors import Reason, ScoringError

CONTINUATION = "_sj_continuation"  # how many of the prompt's last tokens are the continuation


@dataclass(frozen=True)
class LoglikColumns:
    context: str = "context"
    continuation: str = "continuation"
    id: str = "id"


@dataclass(frozen=True)
class LoglikRow:
    work: PromptWork  # one prompt: context + continuation
    continuation: int  # its last this many tokens


def continuation_answer(
    work: PromptWork, continuation: int, answer: PromptLogprobs
) -> tuple[float, bool]:
    """(summed log-prob of the continuation's tokens, whether each is the greedy token)."""
    (prompt,) = work.prompts
    start = len(prompt) - continuation
    logprob = float(np.sum(np.asarray(answer.token_logprobs[start:], np.float64)))
    greedy = all(int(answer.top_ids[j, 0]) == prompt[j] for j in range(start, len(prompt)))
    return logprob, greedy


class LoglikPrepare(PrepareWorks):
    """The route's Completions per CPU actor."""

    def _ids(self, value: Any, special: bool) -> list[int]:
        value = plain(value)
        if isinstance(value, list):
            return value
        if not isinstance(value, str):
            raise ScoringError(Reason.INVALID_REQUEST, "a text or a list of token ids")
        tokenizer = self._service.served_tokenizer().tokenizer
        return [int(t) for t in tokenizer(value, add_special_tokens=special)["input_ids"]]

    def prepare(self, row: dict[str, Any]) -> LoglikRow | ScoringError:
        """The row's one-prompt work, prepared as /v1/completions prepares it, or its 400."""
        try:
            context = self._ids(row.get(self._columns.context), special=True)
            continuation = self._ids(row.get(self._columns.continuation), special=False)
            if not continuation:
                raise ScoringError(Reason.EMPTY_PROMPT, "the continuation has no tokens")
            payload = {"prompt": context + continuation, "echo": True, "max_tokens": 0}
            prompts = self._service.served_tokenizer().prepare(payload | {"logprobs": 1})
        except ScoringError as error:
            return error
        return LoglikRow(prompts.work, len(continuation))

    def extra(self, prepared: list[Any]) -> dict[str, pa.Array]:
        counts = [p.continuation if isinstance(p, LoglikRow) else None for p in prepared]
        return {CONTINUATION: pa.array(counts, pa.int32())}


def loglik_columns(
    batch: pa.Table, works: list[Work | None], answers: list[Any]
) -> dict[str, pa.Array]:
    """``logprob`` and ``is_greedy`` of each scored row (null: refused)."""
    counts = batch.column(CONTINUATION).to_pylist()
    found = [
        None if answer is None else continuation_answer(work, count, answer[0])  # type: ignore[arg-type]
        for work, count, answer in zip(works, counts, answers, strict=True)
    ]
    return {
        "logprob": pa.array([f[0] if f else None for f in found], pa.float64()),
        "is_greedy": pa.array([f[1] if f else None for f in found], pa.bool_()),
    }
