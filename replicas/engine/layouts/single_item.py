"""The single-item layout: each ``query + item`` row (``item + query`` for ``item_first``)
scored on its own, as in one-item-at-a-time scoring.

Rows are sorted by length and run as causal rows ``[R, L]`` (``dense.causal_step``): L
is the token bucket of the step's longest row, R a power of two with ``R * L`` within what a
full batch step of item streams takes (the stream step's tokens x the largest batch bucket),
so padding stays one length bucket per row and attention is each row's own triangle, never
rows x the longest row of the request.
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
    data_multiple,
    label_bucket,
    spread_row,
    step_capacity,
    unpack,
)
from replicas.engine.layouts.contract import single_item_pairs
from replicas.engine.layouts.dense import DenseDims, compile_dense
from replicas.engine.layouts.runner import DecoderSteps

Pair = tuple[int, int]  # (work, item)


def single_item_row(work: ScoreWork, item: int) -> tuple[int, ...]:
    ids = work.item_ids[item]
    return ids + work.query_ids if work.item_first else work.query_ids + ids


def rows_per_step(length: int, capacity: int) -> int:
    """The largest power of two R with R * length <= capacity (at least 1)."""
    fitting = max(capacity // max(length, 1), 1)
    return 1 << (fitting.bit_length() - 1)


def group_rows(
    works: Sequence[ScoreWork], pairs: Sequence[Pair], buckets: Sequence[int], capacity: int
) -> list[tuple[int, list[Pair]]]:
    """Rows sorted by length, grouped into steps: (length bucket, rows) each."""
    ordered = sorted(pairs, key=lambda p: len(single_item_row(works[p[0]], p[1])))
    steps: list[tuple[int, list[Pair]]] = []
    for pair in ordered:
        length = bucket_for(len(single_item_row(works[pair[0]], pair[1])), buckets, "token_buckets")
        if steps and len(steps[-1][1]) < rows_per_step(length, capacity):
            steps[-1] = (length, [*steps[-1][1], pair])
        else:
            steps.append((length, [pair]))
    return steps


class SingleItemLayout(DecoderSteps):
    kinds: ClassVar[dict[str, type]] = {"rows": DenseDims}

    def compile(self, kind: str, dims: Any) -> Any:
        return compile_dense(self._model, self._runner, dims, "causal")

    def select(self, works: Sequence[Any]) -> list[Pair]:
        """Every item of ScoreWork no multi-item layout takes, as (work, item) rows."""
        return single_item_pairs(self._runner.settings, works)

    def plan(self, works: Sequence[ScoreWork], pairs: Sequence[Pair]) -> list[tuple[str, Any]]:
        return [("rows", dims) for dims, _ in self._steps(works, pairs)]

    def score(self, works: Sequence[ScoreWork], pairs: Sequence[Pair], results: list) -> None:
        for exact, rows in self._steps(works, pairs):
            dims = self._runner.resolve("rows", exact)
            for start in range(0, len(rows), dims.rows):  # pieces if dims holds fewer rows
                unpack(*self._run(works, rows[start : start + dims.rows], dims), works, results)

    def _steps(
        self, works: Sequence[ScoreWork], pairs: Sequence[Pair]
    ) -> Iterator[tuple[DenseDims, list[Pair]]]:
        engine = self._runner.settings.engine
        # Rows take what a full batch step of item streams takes (R * L, no stream bucket).
        capacity = step_capacity(engine) * engine.batch_buckets[-1]
        for length, rows in group_rows(works, pairs, engine.token_buckets, capacity):
            count = 1 << (len(rows) - 1).bit_length()  # a power of two >= the rows
            count = data_multiple(count, self._runner.placement.groups)
            labels = label_bucket(max(len(works[w].label_ids) for w, _ in rows))
            yield DenseDims(count, length, labels), rows

    def _run(self, works: Sequence[ScoreWork], rows: list[Pair], dims: DenseDims) -> tuple:
        """The step's output ``[G * Rg, C]`` and the slots that read it."""
        tokens = np.zeros((dims.rows, dims.tokens), np.int32)
        lengths = np.ones((dims.rows,), np.int32)  # padding rows: one token, never read
        groups = self._runner.placement.groups
        index = ScoreIndex(groups, dims.rows, dims.tokens)
        slots = []
        for i, (work, item) in enumerate(rows):
            row, r = single_item_row(works[work], item), spread_row(i, dims.rows, groups)
            tokens[r, : len(row)] = row
            lengths[r] = len(row)
            slots.append(RowSlot(work, item, 1, index.add(r, len(row) - 1)))
        positions = np.broadcast_to(np.arange(dims.tokens, dtype=np.int32), tokens.shape).copy()
        labels = index.labels(works, slots, dims.labels)
        self._runner.count_tokens(dims.rows * dims.tokens, int(lengths[: len(rows)].sum()))
        args = (tokens, positions, lengths, index.rows, labels, index.count)
        return np.asarray(self._runner.run_device("rows", dims, args)), slots
