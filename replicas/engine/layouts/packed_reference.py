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
    lay_row,
    spread_row,
    unpack,
)
from replicas.engine.layouts.contract import multi_item_works
from replicas.engine.layouts.dense import DenseDims, compile_dense
from replicas.engine.layouts.runner import DecoderSteps
from replicas.model.masks import DELIMITER, PAD, QUERY

Array = jax.Array


@dataclass(frozen=True)
class PackedRow:
    """Items [first, first + count) of works[work] packed behind its query."""

    work: int
    first: int
    count: int

    def items(self, works: Sequence[ScoreWork]) -> tuple[tuple[int, ...], ...]:
        return works[self.work].item_ids[self.first : self.first + self.count]


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


class PackedReferenceLayout(DecoderSteps):
    kinds: ClassVar[dict[str, type]] = {"dense": DenseDims}

    def compile(self, kind: str, dims: Any) -> Any:
        return compile_dense(self._model, self._runner, dims)

    def select(self, works: Sequence[Any]) -> list[int]:
        return multi_item_works(self._runner.settings, works)

    def plan(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        return [("dense", dims) for dims, _ in self._steps(works, indices)]

    def score(self, works: Sequence[ScoreWork], indices: Sequence[int], results: list) -> None:
        for exact, rows in self._steps(works, indices):
            dims = self._runner.resolve("dense", exact)
            for start in range(0, len(rows), dims.rows):  # pieces if dims holds fewer rows
                self._run_step(works, rows[start : start + dims.rows], dims, results)

    def _steps(
        self, works: Sequence[ScoreWork], indices: Sequence[int]
    ) -> Iterator[tuple[DenseDims, list[PackedRow]]]:
        engine = self._runner.settings.engine
        rows = [r for i in indices for r in split_rows(works[i], i, engine.token_buckets[-1])]
        buckets = data_buckets(engine.batch_buckets, self._runner.placement.groups)
        for start in range(0, len(rows), buckets[-1]):
            step_rows = rows[start : start + buckets[-1]]
            shapes = [
                (len(works[r.work].query_ids), [*map(len, r.items(works))]) for r in step_rows
            ]
            longest = max(packed_length(*shape) for shape in shapes)  # query<d>item<d>...
            dims = DenseDims(
                bucket_for(len(step_rows), buckets, "batch_buckets"),
                bucket_for(longest, engine.token_buckets, "token_buckets"),
                label_bucket(max(len(works[r.work].label_ids) for r in step_rows)),
            )
            yield dims, step_rows

    def _run_step(
        self, works: Sequence[ScoreWork], rows: list[PackedRow], dims: DenseDims, results: list
    ) -> None:
        d = (self._runner.settings.model.multi_item_scoring_delimiter,)
        tokens = np.zeros((dims.rows, dims.tokens), np.int32)
        positions = np.zeros_like(tokens)
        segments = np.full_like(tokens, PAD)
        groups = self._runner.placement.groups
        index = ScoreIndex(groups, dims.rows, dims.tokens)
        slots, useful = [], 0
        for i, row in enumerate(rows):  # query<d>item<d>...: every <d> and item at len(query)
            r, work, items = spread_row(i, dims.rows, groups), works[row.work], row.items(works)
            q, numbers = len(work.query_ids), range(row.first + 1, row.first + row.count + 1)
            pieces = [work.query_ids, *[p for item in items for p in (d, item)], d]
            ids = [QUERY, *[s for n in numbers for s in (DELIMITER, n)], DELIMITER]
            offsets = [0, *[q] * (len(pieces) - 1)]
            spans = lay_row((tokens, positions, segments), r, pieces, offsets, ids)
            slots.append(RowSlot(row.work, row.first, row.count, index.first_row(r)))
            for item, (_, end) in zip(items, spans[2::2], strict=True):  # items: pieces 2, 4, ..
                index.add(r, end - 1 if item else q - 1)
            useful += spans[-1][1]
        labels = index.labels(works, slots, dims.labels)
        self._runner.count_tokens(dims.rows * dims.tokens, useful)
        args = (tokens, positions, segments, index.rows, labels, index.count)
        outputs = np.asarray(self._runner.run_device("dense", dims, args))
        unpack(outputs, slots, works, results)
