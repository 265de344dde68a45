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
from typing import Protocol, TypeVar

W = TypeVar("W")  # a work
F = TypeVar("F")  # what its batch's caller waits on


NO_MERGING = 1e-9  # a positive bound no batch fits


class Packing(Protocol):
    """A work that says whether it shares rows and steps with other requests' works."""

    @property
    def packs_across_requests(self) -> bool: ...


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


def waits_for_company(waiting: Sequence[tuple[Sequence[Packing], F]], max_works: int) -> bool:
    """Whether an idle engine's first call should wait ``pack_wait_s`` before it is taken:
    some waiting work packs with other requests' (``packs_across_requests``) and fewer than
    ``max_works`` works wait. Four concurrent requests of 16 texts to a MiniLM-shaped
    embedder ran as 2.0 engine calls a round without the wait and 1.2 with 10 ms, 0.94 s ->
    0.83 s a round (docs/benchmarks.md, "A served encoder at real lengths")."""
    works = [work for batch, _ in waiting for work in batch]
    packable = any(work.packs_across_requests for work in works)
    return packable and len(works) < max_works
