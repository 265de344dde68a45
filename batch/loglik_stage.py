"""``python -m batch loglik``: lm-eval's loglikelihood of each (context, continuation) row,
as /v1/completions with ``echo`` gives it (semantics 14).

The context is encoded with the tokenizer's special tokens, the continuation without, joined as
token ids (token-id columns pass through); the prompt is prepared by the route's own
``Completions`` (``echo: true, max_tokens: 0, logprobs: 1``), so a row gets the route's checks
and 400 reasons. Rows of one engine call are merged into prompt works; prompts that share
their context's whole blocks compute it once (semantics 15). ``logprob``: the continuation's
summed log-probability; ``is_greedy``: every continuation token is the most likely one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.errors import Reason, ScoreRequestError
from batch.rerank_stage import pack_prompts
from batch.rows import plain
from batch.stages import ServiceStage
from replicas.contract import PromptLogprobs, PromptWork


@dataclass(frozen=True)
class LoglikColumns:
    context: str = "context"
    continuation: str = "continuation"
    id: str = "id"


@dataclass(frozen=True)
class LoglikRow:
    work: PromptWork  # one prompt: context + continuation
    continuation: int  # its last this many tokens


def continuation_answer(row: LoglikRow, answer: PromptLogprobs) -> tuple[float, bool]:
    """(summed log-prob of the continuation's tokens, whether each is the greedy token)."""
    (prompt,) = row.work.prompts
    start = len(prompt) - row.continuation
    logprob = float(np.sum(np.asarray(answer.token_logprobs[start:], np.float64)))
    greedy = all(int(answer.top_ids[j, 0]) == prompt[j] for j in range(start, len(prompt)))
    return logprob, greedy


class LoglikScore(ServiceStage):
    """An engine and the route's Completions per actor."""

    def _ids(self, value: Any, special: bool) -> list[int]:
        value = plain(value)
        if isinstance(value, list):
            return value
        if not isinstance(value, str):
            raise ScoreRequestError(Reason.INVALID_REQUEST, "a text or a list of token ids")
        tokenizer = self._service.served_tokenizer().tokenizer
        return [int(t) for t in tokenizer(value, add_special_tokens=special)["input_ids"]]

    def prepare(self, row: dict[str, Any]) -> LoglikRow | ScoreRequestError:
        """The row's one-prompt work, prepared as /v1/completions prepares it, or its 400."""
        try:
            context = self._ids(row.get(self._columns.context), special=True)
            continuation = self._ids(row.get(self._columns.continuation), special=False)
            if not continuation:
                raise ScoreRequestError(Reason.EMPTY_PROMPT, "the continuation has no tokens")
            payload = {"prompt": context + continuation, "echo": True, "max_tokens": 0}
            prompts = self._service.served_tokenizer().prepare(payload | {"logprobs": 1})
        except ScoreRequestError as error:
            return error
        return LoglikRow(prompts.work, len(continuation))

    def __call__(self, batch: pa.Table) -> pa.Table:
        prepared = [self.prepare(row) for row in batch.to_pylist()]
        rows = [p if isinstance(p, LoglikRow) else None for p in prepared]
        packs = pack_prompts([r.work if r else None for r in rows], self._engine.info.limits)
        answers = self._engine.score_batch([work for work, _ in packs])
        found: list[tuple[float, bool] | None] = [None] * len(rows)
        for (_, members), answer in zip(packs, answers, strict=True):
            for at, member in enumerate(members):
                found[member] = continuation_answer(rows[member], answer[at])  # type: ignore[arg-type]
        return self.finish(
            batch,
            prepared,
            sum(f is not None for f in found),
            {
                "logprob": pa.array([f[0] if f else None for f in found], pa.float64()),
                "is_greedy": pa.array([f[1] if f else None for f in found], pa.bool_()),
            },
        )
