"""The packed reference layout: RFC-008's ``query<d>item1<d>...itemN<d>`` as one dense row.

A dense mask built from segment ids (``masks.segment_mask``: shared prefix + block diagonal,
delimiters never read) over the whole row; O(T^2) attention, kept as the reference the
shared-prefix layout is tested against. Work whose packed row is longer than the largest
token bucket is split into several rows, each repeating the query (still exact).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import numpy as np

from replicas.contract import ScoreWork, packed_length
from replicas.engine.layouts.common import (
    RowSlot,
    ScoreIndex,
    bucket_for,
    data_buckets,
    label_bucket,
    labels_by_row,
    spread_row,
    unpack,
)
from replicas.engine.layouts.contract import multi_item_works
from replicas.engine.layouts.dense import DenseDims, compile_dense
from replicas.engine.layouts.runner import Runner
from replicas.model.masks import DELIMITER, PAD, QUERY
from replicas.model.protocol import DecoderModel

Array = jax.Array


@dataclass(frozen=True)
class PackedRow:
    """Items [first, first + count) of works[work] packed behind its query."""

    work: int
    first: int
    count: int


def split_rows(work: ScoreWork, index: int, max_length: int) -> list[PackedRow]:
    """Consecutive items per row so that every packed row fits ``max_length``."""
    rows, first = [], 0
    query = len(work.query_ids)
    for n in range(1, work.num_items + 1):
        lengths = [len(i) for i in work.item_ids[first:n]]
        if n - 1 > first and packed_length(query, lengths) > max_length:
            rows.append(PackedRow(index, first, n - 1 - first))
            first = n - 1
    rows.append(PackedRow(index, first, work.num_items - first))
    return rows


def _packed(work: ScoreWork, row: PackedRow, delimiter: int) -> tuple[list[int], ...]:
    """tokens, positions, segments and score indices of ``query<d>item<d>...``."""
    q = len(work.query_ids)
    tokens, positions, segments = list(work.query_ids), list(range(q)), [QUERY] * q
    scored = []
    for i in range(row.first, row.first + row.count):
        item = work.item_ids[i]
        tokens += [delimiter, *item]
        positions += [q, *range(q, q + len(item))]
        segments += [DELIMITER] + [i + 1] * len(item)
        scored.append(len(tokens) - 1 if item else q - 1)
    tokens.append(delimiter)
    positions.append(q)
    segments.append(DELIMITER)
    return tokens, positions, segments, scored


class PackedReferenceLayout:
    kinds: ClassVar[dict[str, type]] = {"dense": DenseDims}

    def __init__(self, model: DecoderModel, runner: Runner) -> None:
        self._model = model
        self._runner = runner

    def compile(self, kind: str, dims: Any) -> Any:
        return compile_dense(self._model, self._runner, dims)

    def select(self, works: Sequence[Any]) -> list[int]:
        """Query-first ScoreWork with items (``contract.multi_item_works``)."""
        return multi_item_works(self._runner.settings, works)

    def plan(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        """The exact signatures ``score`` would run (warm-up compiles these)."""
        return [("dense", dims) for dims, _, _ in self._steps(works, indices)]

    def score(self, works: Sequence[ScoreWork], indices: Sequence[int], results: list) -> None:
        for exact, rows, packed in self._steps(works, indices):
            dims = self._runner.resolve("dense", exact)
            for start in range(0, len(rows), dims.rows):  # pieces if dims holds fewer rows
                end = start + dims.rows
                self._run_step(works, rows[start:end], packed[start:end], dims, results)

    def _steps(
        self, works: Sequence[ScoreWork], indices: Sequence[int]
    ) -> Iterator[tuple[DenseDims, list[PackedRow], list[tuple[list[int], ...]]]]:
        engine = self._runner.settings.engine
        delimiter = self._runner.settings.model.multi_item_scoring_delimiter
        rows = [r for i in indices for r in split_rows(works[i], i, engine.token_buckets[-1])]
        buckets = data_buckets(engine.batch_buckets, self._runner.placement.groups)
        for start in range(0, len(rows), buckets[-1]):
            step_rows = rows[start : start + buckets[-1]]
            packed = [_packed(works[r.work], r, delimiter) for r in step_rows]
            dims = DenseDims(
                bucket_for(len(step_rows), buckets, "batch_buckets"),
                bucket_for(max(len(p[0]) for p in packed), engine.token_buckets, "token_buckets"),
                label_bucket(max(len(works[r.work].label_ids) for r in step_rows)),
            )
            yield dims, step_rows, packed

    def _run_step(
        self,
        works: Sequence[ScoreWork],
        rows: list[PackedRow],
        packed: list[tuple[list[int], ...]],
        dims: DenseDims,
        results: list,
    ) -> None:
        tokens = np.zeros((dims.rows, dims.tokens), np.int32)
        positions = np.zeros_like(tokens)
        segments = np.full_like(tokens, PAD)
        groups = self._runner.placement.groups
        index = ScoreIndex(groups, dims.rows, dims.tokens)
        slots = []
        for i, (row, (tok, pos, seg, scored)) in enumerate(zip(rows, packed, strict=True)):
            r = spread_row(i, dims.rows, groups)
            tokens[r, : len(tok)], positions[r, : len(pos)], segments[r, : len(seg)] = tok, pos, seg
            slots.append(RowSlot(row.work, row.first, row.count, index.first_row(r)))
            for position in scored:
                index.add(r, position)
        labels = labels_by_row(works, slots, (index.flat_rows, dims.labels))
        labels = labels.reshape(*index.rows.shape, dims.labels)
        useful = sum(len(p[0]) for p in packed)
        self._runner.count_tokens(dims.rows * dims.tokens, useful)
        args = (tokens, positions, segments, index.rows, labels, index.count)
        outputs = np.asarray(self._runner.run_device("dense", dims, args))
        unpack(outputs.reshape(-1, outputs.shape[-1]), slots, works, results)
