"""A query extended from a cached query's first blocks (semantics 15).

A /v1/score or /v1/rerank query whose first whole blocks (``PREFIX_BLOCK`` tokens each) start
a cached query (a shared system prompt, a rerank template) is not computed from scratch: the
cached keys/values of those ``r`` tokens are read, and only the query's remaining tokens run,
as one item of an item stream behind them (``extend_step``). Their own keys/values, appended
to the ``r`` read ones, make the query's entry, which is then cached like any other.

An extension runs only where a compiled step covers it and computes fewer tokens than the
query's own prefix step would; otherwise the query is computed whole and the extension's
signature compiles in the background.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.engine.layouts.common import BucketDims, bucket_for, data_buckets, lay_row
from replicas.engine.layouts.prefix_blocks import (
    KV_AXES,
    LAST_AXES,
    PrefixEntry,
    assemble,
    fit_width,
    row_pieces,
)
from replicas.engine.layouts.runner import DecoderSteps
from replicas.engine.prefix_index import PREFIX_BLOCK, QUERY
from replicas.model.causal_lm import ItemStreamSpec, Params
from replicas.model.protocol import DecoderModel

Array = jax.Array


@dataclass(frozen=True, order=True)
class ExtendDims(BucketDims):
    """An extension step: ``batch`` queries reading ``prefix`` cached tokens (padded) and
    computing ``tokens`` more (padded)."""

    batch: int
    prefix: int
    tokens: int

    @property
    def cost(self) -> int:
        return self.batch * self.tokens * (self.tokens + self.prefix)


def extend_step(
    model: DecoderModel,
    params: Params,
    prefix_keys: Array,  # [layers, B, T, K, Dh]
    prefix_values: Array,  # [layers, B, T, K, Dh]
    prefix_valid: Array,  # [B, T]
    tokens: Array,  # [B, S]: each query's remaining tokens
    positions: Array,  # [B, S]: r + k
    item_ids: Array,  # [B, S]: 0, -1 padding
    lengths: Array,  # [B] remaining tokens, >= 1
) -> tuple[Array, Array, Array]:
    """The remaining tokens' keys, values ``[layers, B, S, K, Dh]`` and each query's last
    hidden state ``[B, D]``."""
    spec = ItemStreamSpec(prefix_valid=prefix_valid, item_ids=item_ids, window=tokens.shape[1])
    hidden, keys, values = model.stream_hidden_and_kv(
        params, tokens, positions, spec, prefix_keys, prefix_values
    )
    return keys, values, hidden[jnp.arange(tokens.shape[0]), lengths - 1]


@dataclass(frozen=True)
class Extension:
    """One query to extend: the cached entry read (its first ``reused`` tokens)."""

    query: tuple[int, ...]
    base: PrefixEntry
    reused: int
    home: int


class PrefixExtender(DecoderSteps):
    """Finds, batches and runs extensions for the shared-prefix layout."""

    def compile(self, dims: ExtendDims) -> Any:
        runner, c = self._runner, self._model.config
        kv_in = (c.num_layers, dims.batch, dims.prefix, c.num_kv_heads, c.head_dim)
        kv_out = (c.num_layers, dims.batch, dims.tokens, c.num_kv_heads, c.head_dim)
        rows, spec = ("batch", "seq"), runner.placement.spec
        kv = spec(kv_in, self._model.dtype, KV_AXES)
        specs = (
            kv,
            kv,
            spec((dims.batch, dims.prefix), np.bool_, rows),
            *(spec((dims.batch, dims.tokens), np.int32, rows) for _ in range(3)),
            spec((dims.batch,), np.int32, ("batch",)),
        )
        kv = runner.placement.sharding(KV_AXES, kv_out)
        out = (kv, kv, runner.placement.sharding(LAST_AXES, (dims.batch, c.hidden_size)))
        step = jax.jit(partial(extend_step, self._model), out_shardings=out)
        return runner.lower(step, specs)

    def plan(
        self, query: tuple[int, ...], home: int, width: int, movable: bool
    ) -> Extension | None:
        """An extension worth running for ``query`` on block ``home`` (computed at
        ``width`` otherwise), or None."""
        if len(query) <= PREFIX_BLOCK or not self._runner.settings.engine.prefix_reuse:
            return None
        reused, _, copies = self._runner.cache.longest(QUERY, query, len(query) - 1)
        if copies is None:
            return None
        base = copies.on(home, movable)  # type: ignore[attr-defined]
        if base is None:
            return None
        exact = self._dims(1, reused, len(query) - reused)
        chosen = self._runner.compiled("extend", exact)
        if chosen is None:
            self._runner.compile_later("extend", exact)
            return None
        if chosen.tokens >= width:  # no fewer tokens than computing the query whole
            return None
        return Extension(query, base, reused, home)

    def run(
        self, extensions: Sequence[Extension], width: int
    ) -> Iterator[tuple[tuple[int, ...], PrefixEntry]]:
        """Each extension's full entry at ``width``, in steps of one row per data block."""
        pending = list(extensions)
        while pending:
            step, rest, used = [], [], set()
            for extension in pending:
                (rest if extension.home in used else step).append(extension)
                used.add(extension.home)
            pending = rest
            yield from self._run_step(step, width)

    def _dims(self, rows: int, reused: int, remaining: int) -> ExtendDims:
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        batch = bucket_for(rows, data_buckets(engine.batch_buckets, groups), "batch_buckets")
        prefix = bucket_for(reused, engine.token_buckets, "token_buckets")
        tokens = bucket_for(remaining, engine.token_buckets, "token_buckets")
        return ExtendDims(batch, prefix, tokens)

    def _run_step(
        self, step: Sequence[Extension], width: int
    ) -> Iterator[tuple[tuple[int, ...], PrefixEntry]]:
        runner, groups = self._runner, self._runner.placement.groups
        reused = max(e.reused for e in step)
        remaining = max(len(e.query) - e.reused for e in step)
        dims = runner.resolve("extend", self._dims(groups, reused, remaining))
        slots = dims.batch // groups
        rows: dict[int, Extension] = {e.home * slots: e for e in step}
        entries: list[PrefixEntry | None] = [None] * dims.batch
        valid = np.zeros((dims.batch, dims.prefix), bool)
        tokens = np.zeros((dims.batch, dims.tokens), np.int32)
        positions = np.zeros((dims.batch, dims.tokens), np.int32)
        item_ids = np.full((dims.batch, dims.tokens), -1, np.int32)
        lengths = np.ones((dims.batch,), np.int32)
        for b, e in rows.items():
            entries[b] = _read(e.base, e.reused, dims.prefix)
            valid[b, : e.reused] = True
            rest = e.query[e.reused :]
            lay_row((tokens, positions, item_ids), b, [rest], e.reused)
            lengths[b] = len(rest)
        keys_in, values_in, _ = assemble(runner.placement.mesh, entries, self._model, dims.prefix)
        args = (keys_in, values_in, valid, tokens, positions, item_ids, lengths)
        keys, values, lasts = runner.run_device("extend", dims, args)
        runner.count_tokens(dims.batch * dims.tokens, int(sum(lengths[b] for b in rows)))
        for e in rows.values():
            runner.count_prompt_tokens(len(e.query) - e.reused, e.reused)
        yield from self._entries(rows, (keys_in, values_in), (keys, values, lasts), width)

    def _entries(
        self, rows: dict[int, Extension], read: tuple, computed: tuple, width: int
    ) -> Iterator[tuple[tuple[int, ...], PrefixEntry]]:
        """Each row's entry: its read keys/values up to ``reused``, then its computed ones."""
        keys_in, values_in = read
        keys, values, lasts = computed
        pieces = [row_pieces(array, 1, rows) for array in (keys_in, values_in, keys, values)]
        last_pieces = row_pieces(lasts, 0, rows)
        c = self._model.config
        per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * keys.dtype.itemsize
        nbytes = per_token * width + c.hidden_size * lasts.dtype.itemsize
        for b, e in rows.items():
            remaining = len(e.query) - e.reused
            joined = []
            for read_part, new_part in ((pieces[0][b], pieces[2][b]), (pieces[1][b], pieces[3][b])):
                joined.append(
                    {
                        device: fit_width(
                            jnp.concatenate(
                                [read_part[device][:, :, : e.reused], part[:, :, :remaining]],
                                axis=2,
                            ),
                            width,
                        )
                        for device, part in new_part.items()
                    }
                )
            block = e.home
            yield e.query, PrefixEntry(*joined, last_pieces[b], len(e.query), width, block, nbytes)


def _read(base: PrefixEntry, reused: int, width: int) -> PrefixEntry:
    """``base`` as a stream row reading its first ``reused`` tokens at ``width`` sees it."""
    keys = {d: fit_width(a, width) for d, a in base.keys.items()}
    values = {d: fit_width(a, width) for d, a in base.values.items()}
    return PrefixEntry(keys, values, base.last, reused, width, base.block, base.nbytes)
