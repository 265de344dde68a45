"""The shared-prefix layout (default multi-item): the query once, items as a flat stream.

A request's query runs once through ``prefix_step`` (or comes from the query cache) and its
items run behind it as an item stream (``stream.stream_step``). Items beyond what one step
holds (``item_tokens_per_step``) run in further steps behind the same prefix, computed once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import jax
import numpy as np

from replicas.contract import ScoreWork
from replicas.engine.layouts.common import (
    BucketDims,
    bucket_for,
    data_buckets,
    step_capacity,
    unpack,
)
from replicas.engine.layouts.runner import Runner
from replicas.engine.layouts.stream import (
    PrefixEntry,
    StreamDims,
    StreamUnit,
    batch_arguments,
    exact_dims,
    pack_stream,
    prefix_step,
    stream_specs,
    stream_step,
)
from replicas.model.causal_lm import CausalLM


@dataclass(frozen=True, order=True)
class PrefixDims(BucketDims):
    """The compiled shape of a prefix step: ``batch`` queries of ``tokens`` (padded) tokens.
    Only the same width covers (the item stream reads the prefix at its own width)."""

    batch: int
    tokens: int

    @property
    def cost(self) -> int:
        return self.batch * self.tokens

    def covers(self, other: BucketDims) -> bool:
        return super().covers(other) and self.tokens == other.tokens  # type: ignore[attr-defined]


def chunk_items(
    work: ScoreWork, index: int, tokens_per_step: int, spread: int = 1
) -> list[StreamUnit]:
    """Consecutive items of one work, each unit at most ``tokens_per_step`` slots (a longer
    single item gets a unit of its own), in at least ``spread`` units when it has as many
    items: with a data axis, one request's items fill every data shard's rows."""
    slots = sum(max(len(item), 1) for item in work.item_ids)
    units = max(-(-slots // tokens_per_step), min(spread, work.num_items))
    limit = tokens_per_step if units <= 1 or spread <= 1 else -(-slots // units)
    chunks: list[StreamUnit] = []
    start, size = 0, 0
    for n, item in enumerate(work.item_ids):
        cost = max(len(item), 1)
        if n > start and size + cost > limit:
            chunks.append(_unit(work, index, start, n))
            start, size = n, 0
        size += cost
    chunks.append(_unit(work, index, start, work.num_items))
    return chunks


def _unit(work: ScoreWork, index: int, start: int, end: int) -> StreamUnit:
    items = work.item_ids[start:end]
    return StreamUnit(((index, start, end - start),), items, offset=len(work.query_ids))


class SharedPrefixLayout:
    """Packs, runs and unpacks multi-item work through prefix + item-stream steps."""

    kinds: ClassVar[dict[str, type]] = {"prefix": PrefixDims, "items": StreamDims}

    def __init__(self, model: CausalLM, runner: Runner) -> None:
        self._model = model
        self._runner = runner

    # -- compiling ----------------------------------------------------------------------

    def compile(self, kind: str, dims: Any) -> Any:
        runner = self._runner
        if kind == "prefix":  # queries split over data; each entry whole on every device
            step = jax.jit(partial(prefix_step, self._model), out_shardings=runner.replicated)
            shape = (dims.batch, dims.tokens)
            specs = (
                runner.spec(shape, np.int32, ("batch", "seq")),
                runner.spec((dims.batch,), np.int32, ("batch",)),
            )
            return runner.lower(step, specs)
        runner.ensure("prefix", PrefixDims(dims.batch, dims.prefix))
        step = jax.jit(  # scores gathered once, readable by every host of a group
            partial(stream_step, self._model, dims.window), out_shardings=runner.replicated
        )
        return runner.lower(step, stream_specs(self._model, runner.spec, dims, runner.groups))

    # -- scoring ------------------------------------------------------------------------

    def plan(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        """The exact signatures ``score`` would run (warm-up compiles these)."""
        return [("items", dims) for dims, _ in self._steps(works, indices)]

    def score(self, works: Sequence[ScoreWork], indices: Sequence[int], results: list) -> None:
        prefixes: dict[tuple[Any, int], PrefixEntry] = {}
        for exact, units in self._steps(works, indices):
            dims = self._runner.resolve("items", exact)
            queries = [works[u.runs[0][0]].query_ids for u in units]
            self._fill_prefixes(queries, dims.prefix, prefixes)
            units = [
                dataclasses.replace(u, prefix=prefixes[(query, dims.prefix)])
                for u, query in zip(units, queries, strict=True)
            ]
            batch = pack_stream(units, works, dims, self._runner.groups)
            self._runner.count_tokens(dims.batch * dims.tokens, batch.useful_tokens)
            outputs = self._runner.run("items", dims, batch_arguments(batch))  # [G, Rg, C]
            unpack(outputs.reshape(-1, outputs.shape[-1]), batch.slots, works, results)

    def _steps(
        self, works: Sequence[ScoreWork], indices: Sequence[int]
    ) -> Iterator[tuple[StreamDims, list[StreamUnit]]]:
        """Units grouped by query bucket, up to the largest batch bucket per step."""
        settings, groups = self._runner.settings, self._runner.groups
        buckets = data_buckets(settings.batch_buckets, groups)
        capacity, per_step = step_capacity(settings), buckets[-1]
        # Spread a request over several rows only while the call has fewer requests than
        # data shards: many requests fill the axis with a row each, and every extra row of
        # one request adds its window padding and the prefix it reads.
        spread = -(-groups // max(len(indices), 1))
        units = [u for i in indices for u in chunk_items(works[i], i, capacity, spread)]

        def query_bucket(unit: StreamUnit) -> int:
            query = works[unit.runs[0][0]].query_ids
            return bucket_for(len(query), settings.token_buckets, "token_buckets")

        ordered = sorted(units, key=lambda u: (query_bucket(u), u.size))
        for bucket, group in itertools.groupby(ordered, key=query_bucket):
            group_units = list(group)
            for start in range(0, len(group_units), per_step):
                step_units = group_units[start : start + per_step]
                dims = exact_dims(step_units, works, bucket, buckets, settings.item_token_buckets)
                yield dims, step_units

    def _fill_prefixes(
        self,
        queries: Sequence[tuple[int, ...]],
        width: int,
        local: dict[tuple[Any, int], PrefixEntry],
    ) -> None:
        """Put every query's prefix at ``width`` into ``local``: this call's, cached, or
        computed, the missing ones batched into as few prefix steps as the batch buckets
        allow."""
        missing = []
        for query in dict.fromkeys(queries):
            key = (query, width)
            entry = local.get(key) or self._runner.cache.get(key)
            if entry is None:
                missing.append(query)
            else:
                local[key] = entry
        per_step = data_buckets(self._runner.settings.batch_buckets, self._runner.groups)[-1]
        for start in range(0, len(missing), per_step):
            chunk = missing[start : start + per_step]
            for query, entry in zip(chunk, self._compute_prefixes(chunk, width), strict=False):
                local[(query, width)] = entry
                self._runner.cache.put((query, width), entry)

    def _compute_prefixes(
        self, queries: Sequence[tuple[int, ...]], width: int
    ) -> list[PrefixEntry]:
        buckets = data_buckets(self._runner.settings.batch_buckets, self._runner.groups)
        exact = PrefixDims(bucket_for(len(queries), buckets, "batch_buckets"), width)
        dims = self._runner.resolve("prefix", exact)
        tokens = np.zeros((dims.batch, width), np.int32)  # [B, T]
        lengths = np.ones((dims.batch,), np.int32)  # padding queries: one token
        for b, query in enumerate(queries):
            tokens[b, : len(query)] = query
            lengths[b] = len(query)
        keys, values, lasts = self._runner.run_device("prefix", dims, (tokens, lengths))
        self._runner.count_tokens(dims.batch * width, sum(len(q) for q in queries))
        return [
            PrefixEntry(k, v, last, len(query))
            for k, v, last, query in zip(keys, values, lasts, queries, strict=False)
        ]
