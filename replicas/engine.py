"""The scoring engine: token-id work in, label log-probabilities out.

Groups work by layout and bucket, packs it into static shapes, runs one jitted step per
group on the mesh, and returns only ``[items, labels]`` float32 per request. Every bucket
compiles once (ahead of time, counted); a persistent cache makes restarts fast.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from cluster.mesh import build_mesh
from cluster.sharding import named_sharding, replicated
from replicas.contract import ModelInfo, ScoreWork, check_limits, packed_length
from replicas.model import CausalLM, Params
from replicas.packing import (
    Buckets,
    DenseBatch,
    PrefixBatch,
    bucket_for,
    pack_reference,
    pack_shared_prefix,
    pack_single_item,
    single_item_row,
    unpack,
)
from replicas.settings import ReplicaSettings, check_delimiter_in_vocab
from replicas.steps import dense_step, shared_prefix_step


class ScoringInputError(ValueError):
    """Work the ingress should have rejected; ``reason`` matches the HTTP 400 reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def configure_compilation_cache(directory: str | None) -> None:
    """Point jax's persistent compilation cache at ``directory`` (process-wide)."""
    if directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _chunks(values: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class ScoringEngine:
    """Owns model parameters on a mesh and the compiled steps for each bucket."""

    def __init__(
        self,
        model: CausalLM,
        params: Params,
        mesh: Mesh,
        settings: ReplicaSettings,
        name: str,
    ) -> None:
        vocab = model.config.vocab_size
        delimiter = settings.multi_item_scoring_delimiter
        check_delimiter_in_vocab(settings, vocab, name)
        self._model, self._params, self._mesh, self._settings = model, params, mesh, settings
        self._buckets = Buckets(
            tokens=settings.token_buckets,
            item_lengths=settings.item_length_buckets,
            items=settings.item_buckets,
            batch=settings.batch_buckets,
            rows=settings.row_buckets,
        )
        self._info = ModelInfo(name, vocab, delimiter, settings.limits)
        self._executables: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._dense = jax.jit(partial(dense_step, model), out_shardings=replicated(mesh))
        self._prefix = jax.jit(partial(shared_prefix_step, model), out_shardings=replicated(mesh))

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> ScoringEngine:
        """Load the configured model onto its mesh and warm the configured shapes."""
        from replicas.loading import load_model

        configure_compilation_cache(settings.compilation_cache_dir)
        mesh = build_mesh(settings.mesh_shape)
        loaded = load_model(settings.model, mesh, settings.dtype)
        engine = cls(loaded.model, loaded.params, mesh, settings, name=settings.model)
        engine.warmup()
        return engine

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def settings(self) -> ReplicaSettings:
        return self._settings

    @property
    def compile_count(self) -> int:
        """Executables compiled so far; a bucket never compiles twice."""
        return len(self._executables)

    # -- validation ---------------------------------------------------------------------

    def uses_multi_item(self, work: ScoreWork) -> bool:
        """Multi-item layouts serve query-first work; item_first goes through single-item."""
        return self._settings.multi_item and not work.item_first

    def validate(self, work: ScoreWork) -> None:
        """Raise ScoringInputError / ScoringLimitError for work that must not run."""
        vocab = self._info.vocab_size
        if not work.query_ids:
            raise ScoringInputError("empty_query", "query must contain at least one token")
        if not work.label_ids:
            raise ScoringInputError("empty_label_token_ids", "label_token_ids must not be empty")
        ids = itertools.chain(work.query_ids, work.label_ids, *work.item_ids)
        if any(not 0 <= token < vocab for token in ids):
            raise ScoringInputError("token_id_exceeds_vocab", f"token ids must be in [0, {vocab})")
        check_limits(work, self._info.limits, self.uses_multi_item(work))
        delimiter = self._settings.multi_item_scoring_delimiter
        if self.uses_multi_item(work) and any(
            delimiter in part for part in (work.query_ids, *work.item_ids)
        ):
            raise ScoringInputError(
                "delimiter_in_content", f"delimiter token {delimiter} inside query or item"
            )

    # -- scoring ------------------------------------------------------------------------

    def score_batch(self, works: Sequence[ScoreWork]) -> list[np.ndarray]:
        """One float32 ``[items, labels]`` log-prob array per work, in order."""
        for work in works:
            self.validate(work)
        results = [np.zeros((w.num_items, len(w.label_ids)), np.float32) for w in works]
        multi = [i for i, w in enumerate(works) if self.uses_multi_item(w) and w.num_items]
        pairs = [
            (i, j)
            for i, w in enumerate(works)
            if not self.uses_multi_item(w)
            for j in range(w.num_items)
        ]
        self._score_multi(works, multi, results)
        self._score_single(works, pairs, results)
        return results

    def _score_single(
        self, works: Sequence[ScoreWork], pairs: list[tuple[int, int]], results: list
    ) -> None:
        pairs = sorted(pairs, key=lambda p: len(single_item_row(works[p[0]], p[1])))
        for chunk in _chunks(pairs, self._buckets.rows[-1]):
            batch = pack_single_item(works, chunk, self._buckets)
            unpack(self._run_dense(batch), batch.slots, works, results)

    def _multi_signature(self, work: ScoreWork) -> tuple[int, ...]:
        b = self._buckets
        if self._settings.layout == "packed_reference":
            length = packed_length(len(work.query_ids), [len(i) for i in work.item_ids])
            return (bucket_for(length, b.tokens, "tokens"),)
        longest_item = max(len(i) for i in work.item_ids)
        return (
            bucket_for(len(work.query_ids), b.tokens, "tokens"),
            bucket_for(work.num_items, b.items, "items"),
            bucket_for(longest_item, b.item_lengths, "item_lengths"),
        )

    def _score_multi(self, works: Sequence[ScoreWork], indices: list[int], results: list) -> None:
        def signature(i: int) -> tuple[int, ...]:
            return self._multi_signature(works[i])

        for _, group in itertools.groupby(sorted(indices, key=signature), key=signature):
            for chunk in _chunks(list(group), self._buckets.batch[-1]):
                if self._settings.layout == "packed_reference":
                    delimiter = self._settings.multi_item_scoring_delimiter
                    dense = pack_reference(works, chunk, delimiter, self._buckets)
                    unpack(self._run_dense(dense), dense.slots, works, results)
                else:
                    prefix = pack_shared_prefix(works, chunk, self._buckets)
                    unpack(self._run_prefix(prefix), prefix.slots, works, results)

    # -- compiled steps -----------------------------------------------------------------

    def _run_dense(self, batch: DenseBatch) -> np.ndarray:
        arrays = (batch.tokens, batch.positions, batch.segments, batch.score_index, batch.labels)
        axes = (("batch", "seq"), ("batch", "seq"), None, None, None)
        return self._run("dense", self._dense, arrays, axes)

    def _run_prefix(self, batch: PrefixBatch) -> np.ndarray:
        arrays = (
            batch.query_tokens,
            batch.query_lengths,
            batch.item_tokens,
            batch.item_lengths,
            batch.labels,
        )
        axes = (("batch", "seq"), None, ("batch", None, "seq"), None, None)
        return self._run("prefix", self._prefix, arrays, axes)

    def _sharding(self, axes: tuple[str | None, ...] | None, shape: tuple[int, ...]) -> Any:
        """Token arrays split on the batch axis; masks' metadata replicated."""
        if axes is None:
            return replicated(self._mesh)
        return named_sharding(axes, shape, self._mesh)

    def _run(
        self,
        kind: str,
        step: Any,
        arrays: tuple[np.ndarray, ...],
        axes: tuple[tuple[str | None, ...] | None, ...],
    ) -> np.ndarray:
        shardings = [self._sharding(a, x.shape) for a, x in zip(axes, arrays, strict=True)]
        key = (kind, *((x.shape, x.dtype.str) for x in arrays))
        with self._lock:
            executable = self._executables.get(key)
            if executable is None:
                specs = [
                    jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                    for x, s in zip(arrays, shardings, strict=True)
                ]
                executable = step.lower(self._params, *specs).compile()
                self._executables[key] = executable
            placed = [jax.device_put(x, s) for x, s in zip(arrays, shardings, strict=True)]
            return np.asarray(executable(self._params, *placed))

    def warmup(self, shapes: Sequence[tuple[int, int, int, int]] | None = None) -> int:
        """Score synthetic work of each (query_tokens, items, item_tokens, labels) shape, once
        per ``warmup_batch_sizes`` entry, through the real packing path; returns new compiles.
        """
        before = self.compile_count
        token = 1 if self._settings.multi_item_scoring_delimiter != 1 else 2
        for query_len, num_items, item_len, num_labels in shapes or self._settings.warmup_shapes:
            work = ScoreWork(
                query_ids=(token,) * query_len,
                item_ids=((token,) * item_len,) * num_items,
                label_ids=tuple(range(num_labels)),
            )
            for batch_size in self._settings.warmup_batch_sizes:
                self.score_batch([work] * batch_size)
        return self.compile_count - before
