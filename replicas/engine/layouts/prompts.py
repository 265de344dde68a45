"""The prompt log-likelihood layout (semantics 14 and 15): every prompt token scored.

A request's prompts are grouped by shared prefix (``prompt_plan``); a group's prefix runs
once through the prefix step with the token head (``stream.prefix_step`` with ``top_k``: its
own tokens scored there) or is read from the query cache, matched by the longest cached
prefix at block granularity; each prompt's remaining tokens run as an item of an item stream
behind it (``stream.stream_step`` with ``top_k``), scored at every token. A cached prefix
keeps its keys/values, hidden states at block ends (a prompt sharing only its first blocks
reads the state there) and the log-probs and top-k of its own tokens, so echoing a cached
prefix computes nothing of it.

Each unit runs on the data block that holds its prefix, so no prefix moves between chips.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from replicas.contract import MAX_TOP_LOGPROBS, PromptLogprobs, PromptWork
from replicas.engine.layouts.common import (
    ScoreIndex,
    bucket_for,
    data_buckets,
    label_bucket,
    lay_row,
    step_capacity,
)
from replicas.engine.layouts.contract import prompt_works
from replicas.engine.layouts.prefix_blocks import (
    PrefixEntry,
    assemble,
    row_pieces,
    split_entries,
)
from replicas.engine.layouts.prompt_plan import (
    alone,
    block_floor,
    chunk_members,
    group_prompts,
    least_loaded,
    reuse_pays,
    split_lone,
)
from replicas.engine.layouts.prompt_units import (
    MAX_REMAINDER,
    CachedPrompt,
    Need,
    Unit,
    block_chunks,
    packed_units,
)
from replicas.engine.layouts.runner import DecoderSteps
from replicas.engine.layouts.stream import (
    PrefixDims,
    StreamDims,
    compile_prefix,
    compile_stream,
    window_for,
)
from replicas.engine.layouts.token_steps import PREFIX_BLOCK
from replicas.engine.prefix_index import PROMPT, CacheKey


class PromptLayout(DecoderSteps):
    """Packs, runs and unpacks PromptWork through prompt prefix and item-stream steps."""

    kinds: ClassVar[dict[str, type]] = {"prefix": PrefixDims, "items": StreamDims}

    # -- compiling ----------------------------------------------------------------------

    def compile(self, kind: str, dims: Any) -> Any:
        if kind == "prefix":
            return compile_prefix(self._model, self._runner, dims)
        return compile_stream(self._model, self._runner, dims)

    # -- planning -----------------------------------------------------------------------

    def select(self, works: Sequence[Any]) -> list[int]:
        return prompt_works(works)

    def plan(self, works: Sequence[PromptWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        units = self._units(works, indices, use_cache=False)
        keys = [("prefix", dims) for dims, _ in self._prefix_steps(units)]
        return keys + [("items", dims) for dims, _ in self._stream_steps(units)]

    def full_keys(self, shapes: Sequence[tuple[int, int, int, int]]) -> list[tuple[str, Any]]:
        """The fullest steps of prompts up to each shape's length (limit_to_warmup): the
        largest batch bucket, the longest prefix, a whole step of stream tokens, the widest
        item window and 20 alternatives; every request the limits admit runs on these or
        smaller signatures."""
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        batch = data_buckets(engine.batch_buckets, groups)[-1]
        capacity = step_capacity(engine)
        tokens = bucket_for(capacity, engine.item_token_buckets, "item_token_buckets")
        window = window_for(min(MAX_REMAINDER, capacity), tokens)
        top_k = label_bucket(MAX_TOP_LOGPROBS)
        keys: list[tuple[str, Any]] = []
        for prefix, _, after, _ in shapes:
            longest = max(block_floor(prefix + after - 1, PREFIX_BLOCK), engine.token_buckets[0])
            width = bucket_for(longest, engine.token_buckets, "token_buckets")
            keys.append(("prefix", PrefixDims(batch, width, top_k)))
            keys.append(("items", StreamDims(batch, width, tokens, window, 0, top_k)))
        return keys

    def _units(
        self, works: Sequence[PromptWork], indices: Sequence[int], use_cache: bool
    ) -> list[Unit]:
        engine = self._runner.settings.engine
        capacity = step_capacity(engine)
        limit = min(MAX_REMAINDER, capacity)
        use_cache = use_cache and engine.prefix_reuse
        load = [0] * self._runner.placement.groups
        units: list[Unit] = []
        for w in indices:
            work = works[w]
            top_k = label_bucket(max(work.top_k, 1))
            groups = (
                group_prompts(work.prompts, PREFIX_BLOCK, limit)
                if engine.prefix_reuse
                else alone(work.prompts, PREFIX_BLOCK)
            )
            keep = work.keep_lone_prefixes
            groups, lone = split_lone(work.prompts, groups, limit, keep_prefixes=keep)
            units += packed_units(w, work, lone, capacity, top_k, load)
            for group in groups:
                prompts = [work.prompts[i] for i in group.members]
                reused, source = self._lookup(prompts, group.prefix_length, top_k, use_cache)
                prefix: tuple[int, ...] = ()
                if source is None:
                    reused = group.prefix_length
                    prefix = tuple(prompts[0][:reused])
                block = source.entry.block if source is not None else least_loaded(load)
                items = [tuple(p[reused:]) for p in prompts]
                for start, end in chunk_members(items, capacity):
                    members = group.members[start:end]
                    chunk = tuple(items[start:end])
                    owner = () if engine.prefix_reuse else (w, *members)
                    units.append(
                        Unit(w, members, chunk, reused, block, top_k, source, prefix, owner)
                    )
                    load[block] += 1
        return units

    def _lookup(
        self, prompts: Sequence[Sequence[int]], prefix: int, top_k: int, use_cache: bool
    ) -> tuple[int, CachedPrompt | None]:
        """The cached prefix worth reading for a group (how many tokens), or (0, None)."""
        if not use_cache or prefix == 0 or self._runner.cache.capacity_bytes == 0:
            return 0, None
        reused, key, found = self._runner.cache.longest(
            PROMPT,
            prompts[0],
            prefix,
            lambda entry: entry.top_k >= top_k,  # type: ignore[attr-defined]
        )
        remainders_fit = all(len(p) - reused <= MAX_REMAINDER for p in prompts)
        if key is None or not remainders_fit or not reuse_pays(reused, prefix, len(prompts)):
            return 0, None
        self._runner.cache.touch(key)
        return reused, found  # type: ignore[return-value]

    # -- steps --------------------------------------------------------------------------

    def _prefix_steps(self, units: Sequence[Unit]) -> Iterator[tuple[PrefixDims, list[Need]]]:
        """Prefixes to compute, one per ``prefix_key``, in steps of one width."""
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        buckets = data_buckets(engine.batch_buckets, groups)
        wanted: dict[tuple[Any, ...], int] = {}
        for unit in units:
            if unit.source is None and unit.prefix:
                wanted[unit.prefix_key] = max(wanted.get(unit.prefix_key, 1), unit.top_k)
        by_width: dict[int, list[Need]] = {}
        for key, top_k in wanted.items():
            tokens, block, _ = key
            width = bucket_for(len(tokens), engine.token_buckets, "token_buckets")
            by_width.setdefault(width, []).append((block, tokens, top_k, key))
        per_block = buckets[-1] // groups
        for width, needs in sorted(by_width.items()):
            for chunk, fullest in block_chunks(needs, groups, per_block):
                batch = bucket_for(fullest * groups, buckets, "batch_buckets")
                top_k = max(need[2] for need in chunk)
                yield PrefixDims(batch, width, top_k), chunk

    def _stream_steps(self, units: Sequence[Unit]) -> Iterator[tuple[StreamDims, list[Unit]]]:
        """Units in steps of one prefix bucket, at most a batch bucket's rows per block."""
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        buckets = data_buckets(engine.batch_buckets, groups)
        smallest = engine.token_buckets[0]

        def width(unit: Unit) -> int:
            return bucket_for(max(unit.reused, smallest), engine.token_buckets, "token_buckets")

        by_width: dict[int, list[Unit]] = {}
        for unit in sorted(units, key=lambda u: (width(u), u.size)):
            by_width.setdefault(width(unit), []).append(unit)
        per_block = buckets[-1] // groups
        for prefix, group in by_width.items():
            for chunk, fullest in block_chunks(group, groups, per_block, lambda u: u.block):
                batch = bucket_for(fullest * groups, buckets, "batch_buckets")
                size = max(u.size for u in chunk)
                tokens = bucket_for(size, engine.item_token_buckets, "item_token_buckets")
                window = window_for(max(len(item) for u in chunk for item in u.items), tokens)
                # labels 0: the token head, every scored token with top_k alternatives
                top_k = max(u.top_k for u in chunk)
                yield StreamDims(batch, prefix, tokens, window, 0, top_k), chunk

    # -- scoring ------------------------------------------------------------------------

    def score(self, works: Sequence[PromptWork], indices: Sequence[int], results: list) -> None:
        """Fill ``results[w]`` with one PromptLogprobs per prompt of each work."""
        units = self._units(works, indices, use_cache=True)
        for w in indices:
            results[w] = [_empty(len(p), max(works[w].top_k, 1)) for p in works[w].prompts]
        computed: dict[tuple[Any, ...], CachedPrompt] = {}
        for exact, chunk in self._prefix_steps(units):
            computed |= self._run_prefixes(exact, chunk)
        units = [
            dataclasses.replace(unit, source=computed[unit.prefix_key])
            if unit.source is None and unit.prefix
            else unit
            for unit in units
        ]
        self._count_reuse(units)
        for unit in units:
            self._fill_cached(unit, works, results)
        for exact, chunk in self._stream_steps(units):
            self._run_stream(exact, chunk, works, results)

    def _count_reuse(self, units: Sequence[Unit]) -> None:
        seen: set[tuple[Any, ...]] = set()
        reused = computed = 0
        for unit in units:
            for item in unit.items:
                if unit.prefix and unit.prefix_key not in seen:
                    seen.add(unit.prefix_key)
                    computed += unit.reused
                else:
                    reused += unit.reused
                computed += len(item)
        self._runner.count_prompt_tokens(computed, reused)

    def _run_prefixes(
        self, exact: PrefixDims, chunk: Sequence[Need]
    ) -> dict[tuple[Any, ...], CachedPrompt]:
        runner, groups = self._runner, self._runner.placement.groups
        dims = runner.resolve("prefix", exact)
        slots = dims.batch // groups
        tokens = np.zeros((dims.batch, dims.tokens), np.int32)
        lengths = np.ones((dims.batch,), np.int32)
        index = ScoreIndex(groups, dims.batch, dims.tokens)
        targets = np.zeros(index.rows.shape, np.int32).reshape(-1)
        placed: list[tuple[int, tuple[int, ...], list[int], tuple[Any, ...]]] = []
        used = [0] * groups
        for block, prefix, _, key in chunk:
            b = block * slots + used[block]
            used[block] += 1
            tokens[b, : len(prefix)] = prefix
            lengths[b] = len(prefix)
            rows = [index.add(b, position) for position in range(len(prefix) - 1)]
            targets[rows] = prefix[1:]  # each position scores the token after it
            placed.append((b, prefix, rows, key))
        args = (tokens, lengths, index.rows, targets.reshape(index.rows.shape), index.count)
        keys, values, lasts, blocks, lp, best, ids = runner.run_device("prefix", dims, args)
        runner.count_tokens(dims.batch * dims.tokens, sum(len(p) for _, p, _, _ in placed))
        lp, best, ids = (np.asarray(a).reshape(-1, *a.shape[2:]) for a in (lp, best, ids))
        real = {b: len(prefix) for b, prefix, _, _ in placed}
        entries = split_entries(runner.placement.mesh, keys, values, lasts, real)
        states = row_pieces(blocks, 0, real.keys())
        out = {}
        for b, prefix, rows, key in placed:
            n = len(prefix)
            token_lp = np.full((n,), np.nan, np.float32)
            top_ids = np.full((n, dims.top_k), -1, np.int32)
            top_lp = np.full((n, dims.top_k), np.nan, np.float32)
            token_lp[1:], top_ids[1:], top_lp[1:] = lp[rows], ids[rows], best[rows]
            extra = token_lp.nbytes + top_ids.nbytes + top_lp.nbytes
            extra += int(blocks.nbytes // dims.batch)
            cached = CachedPrompt(prefix, entries[b], states[b], token_lp, top_ids, top_lp, extra)
            out[key] = cached
            if runner.settings.engine.prefix_reuse:  # the cache indexes its blocks
                runner.cache.put(CacheKey(PROMPT, cached.tokens), cached)
        return out

    def _fill_cached(self, unit: Unit, works: Sequence[PromptWork], results: list) -> None:
        """Rows 1..reused-1 of each member: the prefix's own tokens, from its entry."""
        if unit.source is None or unit.reused < 2:
            return
        k = max(works[unit.work].top_k, 1)
        source, r = unit.source, unit.reused
        for member in unit.members:
            out = results[unit.work][member]
            out.token_logprobs[1:r] = source.token_logprobs[1:r]
            out.top_ids[1:r] = source.top_ids[1:r, :k]
            out.top_logprobs[1:r] = source.top_logprobs[1:r, :k]

    def _run_stream(
        self, exact: StreamDims, chunk: Sequence[Unit], works: Sequence[PromptWork],
        results: list,
    ) -> None:  # fmt: skip
        runner, groups = self._runner, self._runner.placement.groups
        dims = runner.resolve("items", exact)
        slots = dims.batch // groups
        b, s = dims.batch, dims.tokens
        tokens = np.zeros((b, s), np.int32)
        positions = np.zeros((b, s), np.int32)
        item_ids = np.full((b, s), -1, np.int32)
        prefix_valid = np.zeros((b, dims.prefix), bool)
        entries: list[PrefixEntry | None] = [None] * b
        index = ScoreIndex(groups, b, s, rows_per_state=2)
        targets = np.zeros(index.rows.size, np.int32)
        wanted: list[tuple[int, int, int, int]] = []  # (flat row, work, member, j)
        used = [0] * groups
        for unit in chunk:
            u = unit.block * slots + used[unit.block]
            used[unit.block] += 1
            if unit.source is not None:
                entries[u] = unit.source.read(unit.reused, dims.prefix)
                prefix_valid[u, : unit.reused] = True
            tail = works[unit.work].scored_tail
            spans = lay_row((tokens, positions, item_ids), u, unit.items, unit.reused)
            for member, item, (cursor, _) in zip(unit.members, unit.items, spans, strict=True):
                # j: the prompt position a row scores, from ``first`` on (reused + len: next)
                length = unit.reused + len(item)
                first, last = (1, length) if tail is None else (length - tail, length - 1)
                if unit.reused and unit.reused >= first:
                    row = index.add_extra(u)
                    targets[row] = item[0]
                    wanted.append((row, unit.work, member, unit.reused))
                for k in range(max(first - unit.reused - 1, 0), last - unit.reused):
                    row = index.add(u, cursor + k)
                    targets[row] = item[k + 1] if k + 1 < len(item) else 0
                    wanted.append((row, unit.work, member, unit.reused + k + 1))
        prefixes = assemble(runner.placement.mesh, entries, self._model, dims.prefix)
        args = (*prefixes, prefix_valid, tokens, positions, item_ids, index.rows,
                targets.reshape(index.rows.shape), index.count)  # fmt: skip
        runner.count_tokens(b * s, sum(u.size for u in chunk))
        lp, best, ids = (np.asarray(a) for a in runner.run_device("items", dims, args))
        lp, best, ids = lp.reshape(-1), best.reshape(-1, dims.top_k), ids.reshape(-1, dims.top_k)
        for row, w, member, j in wanted:
            out, k = results[w][member], max(works[w].top_k, 1)
            if j < len(out.token_logprobs):
                out.token_logprobs[j] = lp[row]
            out.top_ids[j], out.top_logprobs[j] = ids[row, :k], best[row, :k]


def _empty(length: int, k: int) -> PromptLogprobs:
    return PromptLogprobs(
        np.full((length,), np.nan, np.float32),
        np.full((length + 1, k), -1, np.int32),
        np.full((length + 1, k), np.nan, np.float32),
    )
