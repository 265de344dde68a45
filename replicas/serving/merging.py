"""Which waiting batches run in the next engine call (``ScoringReplica._drain``).

Batches that arrive while a step runs wait; when the engine frees, the oldest one runs with
every batch behind it that still fits the call: at most ``max_works`` works and, with
``max_tokens``, at most that many tokens to compute (the first batch always runs, whatever
its size). Merging makes small requests share passes; the token bound keeps a merged call
short, so a request admitted under overload waits for the work admission counted ahead of
it plus one bounded call, not for a call as large as everything that queued meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

W = TypeVar("W")  # a work
F = TypeVar("F")  # what its batch's caller waits on


def take_for_one_call(
    waiting: deque[tuple[Sequence[W], F]],
    max_works: int,
    max_tokens: int,
    tokens: Callable[[W], int],
) -> list[tuple[Sequence[W], F]]:
    """Pop the oldest batch and every next one that fits ``max_works`` works and (when
    ``max_tokens`` > 0) ``max_tokens`` tokens, in arrival order."""
    taken = [waiting.popleft()]
    works = len(taken[0][0])
    spent = sum(tokens(work) for work in taken[0][0])
    while waiting:
        batch = waiting[0][0]
        more = sum(tokens(work) for work in batch)
        if works + len(batch) > max_works or (max_tokens > 0 and spent + more > max_tokens):
            break
        works, spent = works + len(batch), spent + more
        taken.append(waiting.popleft())
    return taken
