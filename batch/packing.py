"""Rows that share a query -> one multi-item work behind one prefix (and back).

Inside what one engine call receives, rows whose works have the same query ids, labels and
``item_first`` are merged into one ScoreWork: their items end to end, in row order, cut into
further works where the merged work would break a limit (items per request, packed length,
tokens per request, warm envelopes: what a replica checks, and the engine stage before its
engine, ``EngineStage.call``). Items are isolated (semantics
3), so an item's scores do not depend on which rows it was packed with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from replicas.contract import ScoreWork, ScoringLimits, check_limits
from replicas.errors import ScoringError


@dataclass(frozen=True)
class Slot:
    """Where one row's items sit in a packed work: items ``[start, stop)`` of it."""

    row: int
    start: int
    stop: int


@dataclass(frozen=True)
class Pack:
    """One merged work and the rows it holds."""

    work: ScoreWork
    slots: tuple[Slot, ...]


def _key(work: ScoreWork) -> tuple:
    return (work.query_ids, work.label_ids, work.item_first, work.adapter)


def _merged(first: ScoreWork, items: list[tuple[int, ...]]) -> ScoreWork:
    return ScoreWork(
        first.query_ids, tuple(items), first.label_ids, first.item_first, adapter=first.adapter
    )


def _fits(work: ScoreWork, limits: ScoringLimits, multi_item: bool) -> bool:
    try:
        check_limits(work, limits, multi_item)
    except ScoringError:
        return False
    return True


def _pack_group(
    works: Sequence[tuple[int, ScoreWork]], limits: ScoringLimits, multi_item: bool
) -> list[Pack]:
    """One query's rows, in order, cut where the next row would break a limit (a row alone
    always fits: it passed the same checks on its own)."""
    packs: list[Pack] = []
    items: list[tuple[int, ...]] = []
    slots: list[Slot] = []
    first = works[0][1]
    for row, work in works:
        candidate = [*items, *work.item_ids]
        if items and not _fits(_merged(first, candidate), limits, multi_item):
            packs.append(Pack(_merged(first, items), tuple(slots)))
            items, slots, candidate = [], [], list(work.item_ids)
        slots.append(Slot(row, len(items), len(candidate)))
        items = candidate
    packs.append(Pack(_merged(first, items), tuple(slots)))
    return packs


def pack_works(
    works: Sequence[ScoreWork | None], limits: ScoringLimits, multi_item: bool
) -> list[Pack]:
    """Works that hold items, grouped by query (first-seen order) and cut by the limits;
    ``None`` (a refused row) and item-less works are left out."""
    groups: dict[tuple, list[tuple[int, ScoreWork]]] = {}
    for row, work in enumerate(works):
        if work is not None and work.num_items:
            groups.setdefault(_key(work), []).append((row, work))
    return [pack for group in groups.values() for pack in _pack_group(group, limits, multi_item)]


def unpack(packs: Sequence[Pack], answers: Sequence[np.ndarray], rows: int) -> list[np.ndarray]:
    """Each row's ``[its items, labels]`` log-probabilities (``[0, 0]`` for rows in no pack)."""
    out = [np.zeros((0, 0), np.float32) for _ in range(rows)]
    for pack, answer in zip(packs, answers, strict=True):
        for slot in pack.slots:
            out[slot.row] = np.asarray(answer)[slot.start : slot.stop]
    return out
