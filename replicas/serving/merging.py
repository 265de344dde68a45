"""Which waiting batches run in the next engine call (``ScoringReplica._drain``).

Batches that arrive while a step runs wait; when the engine frees, the oldest one runs with
every batch behind it that still fits the call: at most ``max_works`` works and, with
``max_units``, at most that much work (admission's cost units: tokens to compute plus a
call's fixed cost; the first batch always runs, whatever its size). Merging makes small
requests share passes; the bound keeps a merged call short, so a request admitted under
overload waits for the work admission counted ahead of it plus one bounded call, not for a
call as large as everything that queued meanwhile. The bound is set in seconds
(``max_call_s``) and turned into units by the replica's recent work rate (``call_budget``):
the same seconds are ~3x the tokens on a model a third as costly per token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

W = TypeVar("W")  # a work
F = TypeVar("F")  # what its batch's caller waits on


NO_MERGING = 1e-9  # a positive bound no batch fits


def call_budget(max_call_s: float, work_rate: float | None) -> float:
    """The work units one merged call may hold: ``max_call_s`` seconds at ``work_rate``
    units per second; 0 (unbounded) when ``max_call_s`` is 0; with no rate yet, too few for
    any batch to join the first."""
    if max_call_s <= 0:
        return 0.0
    return max_call_s * work_rate if work_rate else NO_MERGING


def take_for_one_call(
    waiting: deque[tuple[Sequence[W], F]],
    max_works: int,
    max_units: float,
    cost: Callable[[W], float],
) -> list[tuple[Sequence[W], F]]:
    """Pop the oldest batch and every next one that fits ``max_works`` works and (when
    ``max_units`` > 0) ``max_units`` of work, in arrival order."""
    taken = [waiting.popleft()]
    works = len(taken[0][0])
    spent = sum(cost(work) for work in taken[0][0])
    while waiting:
        batch = waiting[0][0]
        more = sum(cost(work) for work in batch)
        if works + len(batch) > max_works or (max_units > 0 and spent + more > max_units):
            break
        works, spent = works + len(batch), spent + more
        taken.append(waiting.popleft())
    return taken
