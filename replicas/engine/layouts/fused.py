"""The fused layout: a small multi-item work whole in one pass, query and items together.

The shared-prefix layout runs a work's query through a prefix step, then its items through
an item-stream step: two passes over the weights. For a small work that second pass is most
of its cost (on a CPU a pass reads every weight once, whatever its token count), so a work
whose query and items together fit ``fused_step_tokens`` runs fused instead: its query, then
its items end to end, in one token row, concurrent small works back to back in the same row
(one row per data shard). Each token reads only its own work's query and its own item
(``masks.work_segment_mask``); item token k sits at position ``len(query) + k``; so the
scores are those of the shared-prefix layout (semantics 3), to float32 rounding. A fused work
leaves nothing in the query cache: recomputing a query this short costs less than the second
pass a cached one would still need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from replicas.contract import ScoreWork
from replicas.engine.layouts.common import (
    RowSlot,
    ScoreIndex,
    bucket_for,
    label_bucket,
    lay_row,
    unpack,
)
from replicas.engine.layouts.contract import multi_item_works
from replicas.engine.layouts.dense import DenseDims, compile_dense
from replicas.engine.layouts.runner import DecoderSteps
from replicas.model.masks import PAD, QUERY


def fused_length(work: ScoreWork) -> int:
    """Tokens a work takes in a fused row: its query once, then every item."""
    return len(work.query_ids) + sum(len(item) for item in work.item_ids)


def fused_slots(work: ScoreWork) -> int:
    """Room a work takes in a fused row: its tokens, and one place for each empty item. A
    row holds as many score rows as tokens, and an empty item adds a score row (it reads the
    query's last state) but no token: ``query=[1]`` with 1023 empty items is 1 token and 1023
    score rows, so it takes 1024 places, not 1."""
    return len(work.query_ids) + sum(max(len(item), 1) for item in work.item_ids)


class FusedLayout(DecoderSteps):
    """Packs small works into fused rows, runs and unpacks them."""

    kinds: ClassVar[dict[str, type]] = {"fused": DenseDims}

    @property
    def capacity(self) -> int:
        """Tokens a fused row holds: the largest token bucket within ``fused_step_tokens``
        (0: fused steps are off)."""
        engine = self._runner.settings.engine
        fitting = [b for b in engine.token_buckets if b <= engine.fused_step_tokens]
        return fitting[-1] if fitting else 0

    def fits(self, work: ScoreWork) -> bool:
        return 0 < fused_slots(work) <= self.capacity

    def compile(self, kind: str, dims: Any) -> Any:
        return compile_dense(self._model, self._runner, dims, "fused")

    def warm_keys(self, labels: int) -> list[tuple[str, Any]]:
        """Fused signatures warm-up compiles: rows up to ``capacity`` in steps of two
        (a shorter row runs on the next one up, at most twice padded, until its own compiles
        in the background), for ``labels`` labels."""
        buckets = [b for b in self._runner.settings.engine.token_buckets if b <= self.capacity]
        widths = [b for b in buckets if b & (b - 1) == 0 or b == buckets[-1]]
        rows = self._runner.placement.groups
        return [("fused", DenseDims(rows, width, label_bucket(labels))) for width in widths]

    def select(self, works: Sequence[Any]) -> list[int]:
        """Query-first ScoreWork small enough to fuse (the shared-prefix layout takes those
        whose query is neither cached nor recurring out of its own selection)."""
        return [i for i in multi_item_works(self._runner.settings, works) if self.fits(works[i])]

    def plan(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        return [("fused", dims) for dims, _ in self._steps(works, indices)]

    def score(self, works: Sequence[ScoreWork], indices: Sequence[int], results: list) -> None:
        for exact, rows in self._steps(works, indices):
            self._run(works, rows, self._runner.resolve("fused", exact), results)

    def _steps(
        self, works: Sequence[ScoreWork], indices: Sequence[int]
    ) -> Iterator[tuple[DenseDims, list[list[int]]]]:
        """Works in arrival order, each into the emptiest of the step's rows (one per data
        shard) while it fits ``capacity``; else a new step."""
        groups, budget = self._runner.placement.groups, self.capacity
        rows: list[list[int]] = [[] for _ in range(groups)]
        fill = [0] * groups
        for i in indices:
            size = fused_slots(works[i])
            row = fill.index(min(fill))
            if fill[row] + size > budget:
                yield self._dims(works, rows, fill), rows
                rows, fill, row = [[] for _ in range(groups)], [0] * groups, 0
            rows[row].append(i)
            fill[row] += size
        if any(rows):
            yield self._dims(works, rows, fill), rows

    def _dims(self, works: Sequence[ScoreWork], rows: list[list[int]], fill: list[int]) -> Any:
        labels = max(len(works[i].label_ids) for row in rows for i in row)
        width = bucket_for(max(fill), self._runner.settings.engine.token_buckets, "token_buckets")
        return DenseDims(len(rows), width, label_bucket(labels))

    def _run(
        self, works: Sequence[ScoreWork], rows: list[list[int]], dims: DenseDims, results: list
    ) -> None:
        shape = (dims.rows, dims.tokens)
        tokens, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
        segments, owners = np.full(shape, PAD, np.int32), np.full(shape, -1, np.int32)
        index = ScoreIndex(self._runner.placement.groups, dims.rows, dims.tokens)
        slots = []
        for r, row in enumerate(rows):
            end = 0  # works back to back: the query, then its items (segments 1..)
            for i in row:
                work, n = works[i], works[i].num_items
                slots.append(RowSlot(i, 0, n, index.first_row(r)))
                pieces, ids = (work.query_ids, *work.item_ids), (QUERY, *range(1, n + 1))
                offsets = (0, *[len(work.query_ids)] * n)
                spans = lay_row((tokens, positions, segments), r, pieces, offsets, ids, end)
                (start, query_end), end = spans[0], spans[-1][1]
                owners[r, start:end] = i
                for item, (_, last) in zip(work.item_ids, spans[1:], strict=True):
                    index.add(r, last - 1 if item else query_end - 1)  # empty: the query's last
        labels = index.labels(works, slots, dims.labels)
        useful = sum(fused_length(works[i]) for row in rows for i in row)
        self._runner.count_tokens(dims.rows * dims.tokens, useful)
        args = (tokens, positions, segments, owners, index.rows, labels, index.count)
        outputs = np.asarray(self._runner.run_device("fused", dims, args))
        unpack(outputs, slots, works, results)
