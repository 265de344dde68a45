"""The shared-prefix layout (default multi-item): the query once, items as a flat stream.

A request's query runs once through ``prefix_step`` (or comes from the query cache) and its
items run behind it as an item stream (``stream.stream_step``). Items beyond what one step
holds (``item_tokens_per_step``) run in further steps behind the same prefix, computed once.
A work small enough for ``fused_step_tokens`` whose query is not cached runs fused instead,
query and items in one pass (``fused.FusedLayout``), unless its query recurs (``Recurrence``):
then it runs here once, its query is cached, and later works with it run only their items.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from replicas.contract import ScoreWork
from replicas.engine.layouts.common import (
    bucket_for,
    data_buckets,
    step_capacity,
    unpack,
)
from replicas.engine.layouts.contract import multi_item_works
from replicas.engine.layouts.dense import DenseDims
from replicas.engine.layouts.fused import FusedLayout
from replicas.engine.layouts.prefix_blocks import (
    PrefixEntry,
    assemble,
    moves_between_blocks,
    split_entries,
)
from replicas.engine.layouts.prefix_extension import ExtendDims, PrefixExtender
from replicas.engine.layouts.runner import DecoderSteps, Runner
from replicas.engine.layouts.stream import (
    PrefixDims,
    StreamDims,
    StreamUnit,
    compile_prefix,
    compile_stream,
    exact_dims,
    pack_stream,
)
from replicas.engine.prefix_index import QUERY, CacheKey
from replicas.model.protocol import DecoderModel


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


# A recurring query this long is worth caching: every later work with it saves its tokens
# (1.43 ms each on the shipped CPU, docs/engine.md) for one extra pass now (0.041 s, about 29
# tokens' worth), so it pays from its first reuse on.
CACHE_WORTHY_QUERY_TOKENS = 32
RECENT_FUSED_QUERIES = 4096  # queries remembered for recurrence (hashes: a few hundred KiB)


class Recurrence:
    """Which small works' queries recur: seen fused in a recent call, or shared by several
    works of this call. A recurring query long enough to pay (``min_tokens``) goes through
    the prefix step once and into the query cache instead of being fused again, but only in
    a call whose small works one prefix step holds (``per_call``: one on the shipped CPU, so
    a lone request): a burst keeps sharing fused rows, where a cached query's work would
    take an item step of its own (measured: 12 recurring 60-word queries, 11 steps and 2.4 s
    against 5 and 1.5 s fused)."""

    def __init__(self, per_call: int, min_tokens: int = CACHE_WORTHY_QUERY_TOKENS) -> None:
        self._per_call = per_call
        self._min_tokens = min_tokens
        self._seen: OrderedDict[int, None] = OrderedDict()  # query hashes, oldest first

    def recurring(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> set[int]:
        """The indices whose query is worth caching now."""
        if len({works[i].query_ids for i in indices}) > self._per_call:
            return set()
        long = [i for i in indices if len(works[i].query_ids) >= self._min_tokens]
        in_call = Counter(works[i].query_ids for i in long)
        return {
            i
            for i in long
            if in_call[works[i].query_ids] > 1 or hash(works[i].query_ids) in self._seen
        }

    def remember(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> None:
        """Queries just run fused: a later work with one of them recurs."""
        for i in indices:
            key = hash(works[i].query_ids)
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > RECENT_FUSED_QUERIES:
            self._seen.popitem(last=False)


class SharedPrefixLayout(DecoderSteps):
    """Packs, runs and unpacks multi-item work through prefix + item-stream steps."""

    kinds: ClassVar[dict[str, type]] = {
        "prefix": PrefixDims,
        "items": StreamDims,
        "extend": ExtendDims,
        "fused": DenseDims,
    }

    def __init__(self, model: DecoderModel, runner: Runner) -> None:
        super().__init__(model, runner)
        self._turn = -1  # whose turn to hold a query many blocks read (see _homes)
        self._extender = PrefixExtender(model, runner)
        self.fused = FusedLayout(model, runner)  # small works; warm-up reads its warm_keys
        groups, engine = runner.placement.groups, runner.settings.engine
        self._recurrence = Recurrence(data_buckets(engine.batch_buckets, groups)[-1])

    # -- compiling ----------------------------------------------------------------------

    def compile(self, kind: str, dims: Any) -> Any:
        if kind == "extend":
            return self._extender.compile(dims)
        if kind == "fused":
            return self.fused.compile(kind, dims)
        if kind == "prefix":
            return compile_prefix(self._model, self._runner, dims)
        return compile_stream(self._model, self._runner, dims)

    # -- scoring ------------------------------------------------------------------------

    def select(self, works: Sequence[Any]) -> list[int]:
        return multi_item_works(self._runner.settings, works)

    def plan(self, works: Sequence[ScoreWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        fused, streamed = self._split(works, indices, use_cache=False)
        keys = self.fused.plan(works, fused) if fused else []
        return keys + [("items", dims) for dims, _ in self._steps(works, streamed)]

    def _split(
        self, works: Sequence[ScoreWork], indices: Sequence[int], use_cache: bool
    ) -> tuple[list[int], list[int]]:
        """Works that run fused (small, and with ``use_cache`` their query neither cached nor
        recurring: a cached query's items take one pass behind it, a recurring one is worth
        caching) and the rest."""
        small = [i for i in indices if self.fused.fits(works[i])]
        if use_cache and self._runner.cache.capacity_bytes:
            small = [i for i in small if not self._cached(works[i])]
            recurring = self._recurrence.recurring(works, small)
            small = [i for i in small if i not in recurring]
        fused = set(small)
        return small, [i for i in indices if i not in fused]

    def _cached(self, work: ScoreWork) -> bool:
        buckets = self._runner.settings.engine.token_buckets
        width = bucket_for(len(work.query_ids), buckets, "token_buckets")
        return self._runner.cache.peek(CacheKey(QUERY, work.query_ids, width)) is not None

    def score(self, works: Sequence[ScoreWork], indices: Sequence[int], results: list) -> None:
        fused, indices = self._split(works, indices, use_cache=True)
        if fused:
            self.fused.score(works, fused, results)
            self._recurrence.remember(works, fused)
        local: dict[tuple[Any, int], PrefixCopies] = {}  # this call's prefixes
        runner, groups = self._runner, self._runner.placement.groups
        for exact, units in self._steps(works, indices):
            dims = runner.resolve("items", exact)
            # (query, the data block its row lands on: stream.pack_stream's spread_row)
            needs = [(works[u.runs[0][0]].query_ids, i % groups) for i, u in enumerate(units)]
            entries = self._fill_prefixes(needs, dims.prefix, local)
            units = [
                dataclasses.replace(u, prefix=entries[need])
                for u, need in zip(units, needs, strict=True)
            ]
            batch = pack_stream(units, works, dims, groups)
            prefixes = assemble(runner.placement.mesh, batch.prefixes, self._model, dims.prefix)
            runner.count_tokens(dims.batch * dims.tokens, batch.useful_tokens)
            outputs = runner.run_device("items", dims, batch.arguments(prefixes))
            unpack(np.asarray(outputs), batch.slots, works, results)

    def _steps(
        self, works: Sequence[ScoreWork], indices: Sequence[int]
    ) -> Iterator[tuple[StreamDims, list[StreamUnit]]]:
        """Units grouped by query bucket, up to the largest batch bucket per step."""
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        buckets = data_buckets(engine.batch_buckets, groups)
        capacity, per_step = step_capacity(engine), buckets[-1]
        # Spread a request over several rows only while the call has fewer requests than
        # data shards: many requests fill the axis with a row each, and every extra row of
        # one request adds its window padding and the prefix it reads.
        spread = -(-groups // max(len(indices), 1))
        units = [u for i in indices for u in chunk_items(works[i], i, capacity, spread)]

        def query_bucket(unit: StreamUnit) -> int:
            query = works[unit.runs[0][0]].query_ids
            return bucket_for(len(query), engine.token_buckets, "token_buckets")

        ordered = sorted(units, key=lambda u: (query_bucket(u), u.size))
        for bucket, group in itertools.groupby(ordered, key=query_bucket):
            group_units = list(group)
            for start in range(0, len(group_units), per_step):
                step_units = group_units[start : start + per_step]
                dims = exact_dims(step_units, works, bucket, buckets, engine.item_token_buckets)
                yield dims, step_units

    def _fill_prefixes(
        self,
        needs: Sequence[tuple[tuple[int, ...], int]],
        width: int,
        local: dict[tuple[Any, int], PrefixCopies],
    ) -> dict[tuple[tuple[int, ...], int], PrefixEntry]:
        """The entry each ``(query, data block)`` reads at ``width``: this call's, cached
        (moved from another block when it can be), or computed on that block, the missing
        ones batched into as few prefix steps as the batch buckets allow."""
        movable = moves_between_blocks(self._runner.placement.mesh)
        blocks_of: dict[tuple[int, ...], list[int]] = {}
        for query, block in needs:
            blocks_of.setdefault(query, []).append(block)
        found: dict[tuple[tuple[int, ...], int], PrefixEntry] = {}
        missing: dict[int, list[tuple[int, ...]]] = {}
        for query, blocks in blocks_of.items():
            key = (query, width)
            copies = local.get(key) or self._runner.cache.get(CacheKey(QUERY, query, width))
            if copies is not None:
                local[key] = copies
            for home in self._homes(sorted(set(blocks)), copies, movable):
                missing.setdefault(home, []).append(query)
        extensions = []
        for home, queries in missing.items():
            for query in list(queries):
                extension = self._extender.plan(query, home, width, movable)
                if extension is not None:
                    queries.remove(query)
                    extensions.append(extension)
        computed = itertools.chain(
            self._compute_prefixes(missing, width), self._extender.run(extensions, width)
        )
        for query, entry in computed:
            key = (query, width)
            local[key] = (local.get(key) or PrefixCopies({})).with_entry(entry)
            self._runner.cache.put(CacheKey(QUERY, query, width), local[key])
        for query, block in needs:
            entry = local[(query, width)].on(block, movable)
            if entry is None:  # _homes computes every block's copy that cannot be moved
                raise RuntimeError(f"no prefix entry for data block {block}")
            found[(query, block)] = entry
        return found

    def _homes(self, blocks: list[int], copies: PrefixCopies | None, movable: bool) -> list[int]:
        """The blocks to compute ``query`` on: none when a copy serves every block that reads
        it; with moves, one (the reading blocks take turns being the home of a query many
        read, so the cache fills every block alike); without, each reading block lacking one."""
        if movable:
            if copies is not None and copies.entries:
                return []
            self._turn += 1
            return [blocks[self._turn % len(blocks)]]
        return [b for b in blocks if copies is None or b not in copies.entries]

    def _compute_prefixes(
        self, missing: dict[int, list[tuple[int, ...]]], width: int
    ) -> Iterator[tuple[tuple[int, ...], PrefixEntry]]:
        """Each block's missing queries, computed in slots of that block."""
        groups = self._runner.placement.groups
        buckets = data_buckets(self._runner.settings.engine.batch_buckets, groups)
        per_step = buckets[-1] // groups
        pending = {block: list(queries) for block, queries in missing.items()}
        while any(pending.values()):
            chunk = {block: queries[:per_step] for block, queries in pending.items()}
            pending = {block: queries[per_step:] for block, queries in pending.items()}
            fullest = max(len(queries) for queries in chunk.values())
            exact = PrefixDims(bucket_for(fullest * groups, buckets, "batch_buckets"), width)
            dims = self._runner.resolve("prefix", exact)
            slots = dims.batch // groups
            tokens = np.zeros((dims.batch, width), np.int32)  # [B, T]
            lengths = np.ones((dims.batch,), np.int32)  # padding queries: one token
            placed = []
            for block, queries in chunk.items():
                for i, query in enumerate(queries):
                    b = block * slots + i
                    tokens[b, : len(query)] = query
                    lengths[b] = len(query)
                    placed.append((b, query))
            outputs = self._runner.run_device("prefix", dims, (tokens, lengths))
            real = {b: len(query) for b, query in placed}
            self._runner.count_tokens(dims.batch * width, sum(real.values()))
            entries = split_entries(self._runner.placement.mesh, *outputs, real)
            for b, query in placed:
                yield query, entries[b]


@dataclass(frozen=True)
class PrefixCopies:
    """A query's prefix entries by data block: what the query cache holds per query."""

    entries: dict[int, PrefixEntry]

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries.values())

    def on(self, block: int, movable: bool) -> PrefixEntry | None:
        """The copy on ``block``, else (when entries can move between blocks) any copy."""
        if block in self.entries:
            return self.entries[block]
        return next(iter(self.entries.values()), None) if movable else None

    def with_entry(self, entry: PrefixEntry) -> PrefixCopies:
        return PrefixCopies({**self.entries, entry.block: entry})
