"""The single-item layout: each ``query + item`` row (``item + query`` for ``item_first``)
scored on its own, as in one-item-at-a-time scoring.

Rows run end to end in the item-stream step behind an empty prefix: a row is one "item" of
the stream, attends causally to itself only and sits at positions 0..len-1. Rows are packed
by total tokens (``item_tokens_per_step`` per unit), so padding is one stream bucket per step,
never rows x longest row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, ClassVar

import jax
import numpy as np

from replicas.contract import ScoreWork
from replicas.layouts.common import step_capacity, unpack
from replicas.layouts.runner import Runner
from replicas.layouts.stream import (
    PrefixEntry,
    StreamDims,
    StreamUnit,
    batch_arguments,
    exact_dims,
    pack_stream,
    stream_specs,
    stream_step,
)
from replicas.model import CausalLM

EMPTY_PREFIX = 1  # prefix width of the single-item step; nothing in it is visible


def single_item_row(work: ScoreWork, item: int) -> tuple[int, ...]:
    ids = work.item_ids[item]
    return ids + work.query_ids if work.item_first else work.query_ids + ids


def _runs(pairs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int, int], ...]:
    """(work, item) pairs -> runs of consecutive items of one work."""
    runs: list[list[int]] = []
    for work, item in pairs:
        if runs and runs[-1][0] == work and runs[-1][1] + runs[-1][2] == item:
            runs[-1][2] += 1
        else:
            runs.append([work, item, 1])
    return tuple((w, i, n) for w, i, n in runs)


def pack_rows(
    works: Sequence[ScoreWork], pairs: Sequence[tuple[int, int]], tokens_per_step: int
) -> list[StreamUnit]:
    """Rows sorted by length, end to end in units of at most ``tokens_per_step`` tokens."""
    ordered = sorted(pairs, key=lambda p: len(single_item_row(works[p[0]], p[1])))
    units, chunk, size = [], [], 0
    for pair in ordered:
        length = len(single_item_row(works[pair[0]], pair[1]))
        if chunk and size + length > tokens_per_step:
            units.append(chunk)
            chunk, size = [], 0
        chunk.append(pair)
        size += length
    if chunk:
        units.append(chunk)
    return [
        StreamUnit(_runs(c), tuple(single_item_row(works[w], i) for w, i in c), offset=0)
        for c in units
    ]


class SingleItemLayout:
    kinds: ClassVar[dict[str, type]] = {"rows": StreamDims}

    def __init__(self, model: CausalLM, runner: Runner) -> None:
        self._model = model
        self._runner = runner
        c = model.config
        kv = np.zeros((c.num_layers, 1, EMPTY_PREFIX, c.num_kv_heads, c.head_dim), model.dtype)
        last = np.zeros((1, c.hidden_size), model.dtype)
        put = partial(jax.device_put, device=runner.replicated)
        self._empty = PrefixEntry(put(kv), put(kv), put(last), length=0)

    def compile(self, kind: str, dims: Any) -> Any:
        step = jax.jit(partial(stream_step, self._model, dims.window))
        return self._runner.lower(step, stream_specs(self._model, self._runner.spec, dims))

    def plan(
        self, works: Sequence[ScoreWork], pairs: Sequence[tuple[int, int]]
    ) -> list[tuple[str, Any]]:
        """The exact signatures ``score`` would run (warm-up compiles these)."""
        return [("rows", dims) for dims, _ in self._steps(works, pairs)]

    def score(
        self, works: Sequence[ScoreWork], pairs: Sequence[tuple[int, int]], results: list
    ) -> None:
        for exact, units in self._steps(works, pairs):
            dims = self._runner.resolve("rows", exact)
            batch = pack_stream(units, works, dims)
            self._runner.count_tokens(dims.batch * dims.tokens, batch.useful_tokens)
            outputs = self._runner.run("rows", dims, batch_arguments(batch))
            unpack(outputs, batch.slots, works, results)

    def _steps(
        self, works: Sequence[ScoreWork], pairs: Sequence[tuple[int, int]]
    ) -> Iterator[tuple[StreamDims, list[StreamUnit]]]:
        settings = self._runner.settings
        units = [
            StreamUnit(u.runs, u.items, u.offset, self._empty)
            for u in pack_rows(works, pairs, step_capacity(settings))
        ]
        per_step = settings.batch_buckets[-1]
        for start in range(0, len(units), per_step):
            step_units = units[start : start + per_step]
            dims = exact_dims(
                step_units, works, EMPTY_PREFIX, settings.batch_buckets, settings.item_token_buckets
            )
            yield dims, step_units
