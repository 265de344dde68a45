"""The embedding layout (semantics 20): inputs end to end in item-stream rows, pooled per input.

Every input is an "item" of an item stream behind an empty prefix (no prefix key is
readable), so each attends causally to itself only, at positions 0..len-1, exactly as it
would alone: the stream attention that multi-item scoring and lone prompts already run
(``layers.attend_item_stream``), no attention path of its own. Rows are filled first-fit
with the inputs sorted longest first (little padding on mixed lengths), up to the step's
capacity; a step holds up to the largest batch bucket of rows.

The step pools on device in float32: ``lasttoken`` / ``cls`` gather one hidden state per
input, ``mean`` sums an input's pooled tokens (segment sums, so no other input's token
enters) and divides by their count. Dense layers and L2 normalization run on the host in
float32, per vector. A step's signature is ``EmbedDims`` (rows, stream tokens, window); the
pooled outputs per row are ``slots(tokens)``.

An encoder (``replicas.model.encoder``) reads the same rows bidirectionally within each
input, with token types (a cross-encoder's pair: 1 from ``EmbedWork.second_starts`` on); a
cross-encoder's step returns its head's logits on each pair's [CLS] token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from replicas.contract import (
    EmbedWork,
    ModelInfo,
    PoolingHead,
    PromptWork,
    ScoreHead,
    check_embed_limits,
)
from replicas.embed_contract import l2_normalized
from replicas.engine.layouts.common import BucketDims, bucket_for, data_buckets, step_capacity
from replicas.engine.layouts.prefix_blocks import KV_AXES
from replicas.engine.layouts.runner import Runner
from replicas.engine.layouts.stream import window_for
from replicas.errors import Reason, ScoringError
from replicas.model.causal_lm import CausalLM, ItemStreamSpec, Params
from replicas.model.heads import head_outputs

Array = jax.Array
EMPTY_PREFIX = 16  # width of the (never readable) prefix every row sits behind
MIN_SLOTS = 16
# An encoder's shortest row limit (``EmbedLayout._row_limit``): its attention reads the whole
# row (``attend_row``), 256 keys a token costing a tenth of a layer's matmuls at BERT-base's
# width, while shorter rows would add steps.
ENCODER_ROW = 256


def slots(tokens: int) -> int:
    """Inputs one row of ``tokens`` stream tokens may hold (pooled outputs per row)."""
    return max(MIN_SLOTS, tokens // 4)


def embed_window(longest: int, tokens: int) -> int:
    """The item window of a step of ``tokens``: the longest input's (``window_for``), at
    least a quarter of the row, so a row length has at most three windows to compile."""
    return max(window_for(longest, tokens), min(tokens, window_for(tokens // 4, tokens)))


@dataclass(frozen=True, order=True)
class EmbedDims(BucketDims):
    """One embedding step: ``batch`` rows of ``tokens`` stream tokens, inputs <= ``window``."""

    batch: int
    tokens: int
    window: int

    @property
    def cost(self) -> int:
        return self.batch * self.tokens * 64 + self.window


@dataclass(frozen=True)
class Piece:
    """One input of one work: ``(work, index)`` and where its pooling starts."""

    work: int
    index: int
    tokens: tuple[int, ...]
    skip: int  # leading tokens left out of the pooling (the prompt without include_prompt)
    second: int = 0  # a cross-encoder pair's first token of type 1 (its length: none)
    normalize: bool = True  # its work's EmbedWork.normalize


def embed_step(
    model: CausalLM,
    window: int,
    pooling: str,
    params: Params,
    empty: Array,  # [layers, B, EMPTY_PREFIX, K, Dh] zeros (an argument: not constant-folded)
    tokens: Array,  # [B, S]
    positions: Array,  # [B, S]
    item_ids: Array,  # [B, S] -1 padding
    pick: Array,  # [B, M] the stream index of each slot's token (lasttoken, cls)
    segments: Array,  # [B, S] the slot a token is pooled into (mean), M: none
    counts: Array,  # [B, M] float32 pooled tokens per slot (mean)
    types: Array,  # [B, S] token types (an encoder reads them; a decoder does not)
) -> Array:
    """Pooled float32 vectors ``[B, M, D]`` (unused slots: zeros or garbage, never read); a
    cross-encoder's head outputs ``[B, M, L]`` on each pair's [CLS] token."""
    batch, _ = tokens.shape
    spec = ItemStreamSpec(
        prefix_valid=jnp.zeros((batch, EMPTY_PREFIX), bool) | (tokens[:, :1] < 0),
        item_ids=item_ids,
        window=window,
    )
    typed = {"token_types": types} if model.config.encoder else {}
    hidden = model.stream_hidden(params, tokens, positions, spec, empty, empty, **typed)
    hidden = hidden.astype(jnp.float32)  # [B, S, D]
    pooled = _pool(hidden, pooling, pick, segments, counts)  # [B, M, D]
    if model.config.head is not None:  # a cross-encoder: its head on the pooled pair
        return head_outputs(model.config.head, params["head"], pooled)  # [B, M, L]
    return pooled


def _pool(hidden: Array, pooling: str, pick: Array, segments: Array, counts: Array) -> Array:
    """hidden [B, S, D] -> [B, M, D]: each slot's picked token, or its tokens' mean."""
    if pooling != "mean":
        return jnp.take_along_axis(hidden, pick[..., None], axis=1)
    batch, m = pick.shape
    ids = jnp.where(segments < m, segments + m * jnp.arange(batch)[:, None], batch * m)
    sums = jax.ops.segment_sum(
        hidden.reshape(-1, hidden.shape[-1]), ids.reshape(-1), num_segments=batch * m
    )
    return sums.reshape(batch, m, -1) / jnp.maximum(counts, 1.0)[..., None]


def cross_encoder_pooling(head: ScoreHead | None) -> PoolingHead | None:
    """How the layout runs a cross-encoder: each pair's [CLS] token (ModernBERT's mean
    pooling: its tokens' mean) through the head, its
    logits returned as they are (no Dense, no normalization); None for other heads."""
    if head is None or head.kind != "cross_encoder":
        return None
    return PoolingHead(pooling=head.pooling, normalize=False, dimension=head.num_labels)


def finish(
    vectors: np.ndarray, head: PoolingHead, dense: Sequence[Any], normalize: np.ndarray
) -> np.ndarray:
    """Dense layers then L2 normalization (as torch's ``normalize``), float32, per row;
    ``normalize [N]`` bool: rows whose work asks for it (``EmbedWork.normalize``)."""
    out = np.asarray(vectors, np.float32)
    for layer in dense:
        out = np.asarray(layer(out), np.float32)
    if head.normalize:
        out = np.where(normalize[:, None], l2_normalized(out), out)
    return out.astype(np.float32)


class EmbedLayout:
    """Packs EmbedWork into item-stream rows, runs ``embed_step`` and unpacks the vectors."""

    kinds: ClassVar[dict[str, type]] = {"embed": EmbedDims}

    def __init__(self, model: CausalLM, runner: Runner, dense: Sequence[Any] = ()) -> None:
        head = model.config.pooling or cross_encoder_pooling(model.config.head)
        if head is None:
            raise ValueError("EmbedLayout needs a model with a PoolingHead or a cross-encoder")
        self._model, self._runner, self._dense = model, runner, tuple(dense)
        self._head: PoolingHead = head

    def compile(self, kind: str, dims: EmbedDims) -> Any:
        runner = self._runner
        step = jax.jit(
            partial(embed_step, self._model, dims.window, self._head.pooling),
            out_shardings=runner.placement.replicated,
        )
        b, s, m = dims.batch, dims.tokens, slots(dims.tokens)
        rows = ("batch", "seq")
        c = self._model.config
        kv = (c.num_layers, b, EMPTY_PREFIX, c.num_kv_heads, c.head_dim)
        specs = (
            runner.placement.spec(kv, self._model.dtype, KV_AXES),
            runner.placement.spec((b, s), np.int32, rows),
            runner.placement.spec((b, s), np.int32, rows),
            runner.placement.spec((b, s), np.int32, rows),
            runner.placement.spec((b, m), np.int32, ("batch", None)),
            runner.placement.spec((b, s), np.int32, rows),
            runner.placement.spec((b, m), np.float32, ("batch", None)),
            runner.placement.spec((b, s), np.int32, rows),
        )
        return runner.lower(step, specs)

    # -- planning -----------------------------------------------------------------------

    def _capacity(self) -> int:
        return step_capacity(self._runner.settings.engine)

    def _rows(self, works: Sequence[EmbedWork], indices: Sequence[int]) -> list[list[Piece]]:
        """Every input of ``works[indices]``, longest first, first-fit into rows."""
        include = self._head.include_prompt
        pieces = [
            Piece(
                w,
                i,
                tuple(tokens),
                0 if include else works[w].prompt_length(i),
                works[w].second_start(i),
                works[w].normalize,
            )
            for w in indices
            for i, tokens in enumerate(works[w].inputs)
        ]
        pieces.sort(key=lambda p: -len(p.tokens))
        buckets = self._runner.settings.engine.item_token_buckets
        rows: list[list[Piece]] = []
        used: list[int] = []
        limits: list[int] = []  # each row's most tokens, set by its first (longest) input
        for piece in pieces:
            length = len(piece.tokens)
            for r, row in enumerate(rows):
                total = used[r] + length
                if total > limits[r]:
                    continue
                if len(row) < slots(bucket_for(total, buckets, "item_token_buckets")):
                    row.append(piece)
                    used[r] = total
                    break
            else:
                rows.append([piece])
                used.append(length)
                limits.append(self._row_limit(length))
        return rows

    def _encoder_full_rows(self, most: int) -> list[EmbedDims]:
        """An encoder's steps of full rows (``_row_limit``: ``ENCODER_ROW`` doubled up to the
        capacity), as many rows as ``_rows_per_step`` gives them: the signatures most of its
        steps run."""
        capacity, buckets = self._capacity(), self._runner.settings.engine.item_token_buckets
        dims, limit = [], ENCODER_ROW
        while limit < capacity:
            tokens, batch = bucket_for(limit, buckets, "item_token_buckets"), most
            while 2 * batch * tokens <= capacity:
                batch *= 2
            dims.append(EmbedDims(batch, tokens, tokens))
            limit *= 2
        return dims

    def _row_limit(self, longest: int) -> int:
        """The most tokens of a row whose longest input has ``longest``: the step's capacity
        for a decoder (its items attend within their window wherever they sit); for an
        encoder about its input's window, at least ``ENCODER_ROW`` (its attention reads the
        whole row, so a row of short inputs stays short)."""
        capacity = self._capacity()
        if not self._model.config.encoder:
            return capacity
        return min(capacity, max(ENCODER_ROW, window_for(longest, capacity)))

    def _steps(self, rows: list[list[Piece]]) -> list[tuple[EmbedDims, list[list[Piece]]]]:
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        sizes = data_buckets(engine.batch_buckets, groups)
        steps, start = [], 0
        while start < len(rows):
            count, full = self._rows_per_step(rows, start, sizes[-1])
            chunk = rows[start : start + count]
            tokens = full or self._row_bucket(chunk)
            longest = max(len(p.tokens) for row in chunk for p in row)
            batch = count if full else bucket_for(len(chunk), sizes, "batch")
            window = tokens if self._model.config.encoder else embed_window(longest, tokens)
            steps.append((EmbedDims(batch, tokens, window), chunk))
            start += count
        return steps

    def _row_bucket(self, chunk: list[list[Piece]]) -> int:
        longest_row = max(sum(len(p.tokens) for p in row) for row in chunk)
        buckets = self._runner.settings.engine.item_token_buckets
        return bucket_for(longest_row, buckets, "item_token_buckets")

    def _rows_per_step(self, rows: list[list[Piece]], start: int, most: int) -> tuple[int, int]:
        """Rows of the step from ``rows[start]``, and 0 or the row length they are padded to:
        the largest batch bucket ``most``; an encoder's rows of one limit (``_row_limit``)
        doubled from there while there are that many and they fill at most the step's
        capacity, padded to their limit's bucket (the signatures ``_encoder_full_rows``
        warms), so a step of short rows still reads the layer weights once for about a
        full step's tokens (a CPU's one row a step, ``batch_buckets: [1]``, too)."""
        count = most
        if not self._model.config.encoder:
            return count, 0
        limit = self._row_limit(len(rows[start][0].tokens))  # its first input is its longest
        buckets = self._runner.settings.engine.item_token_buckets
        full = bucket_for(limit, buckets, "item_token_buckets")
        same = start
        while same < len(rows) and self._row_limit(len(rows[same][0].tokens)) == limit:
            same += 1
        while start + 2 * count <= same and 2 * count * full <= self._capacity():
            count *= 2
        return count, (full if count > most else 0)

    def select(self, works: Sequence[Any]) -> list[int]:
        """Every EmbedWork (an embedding model takes no other work)."""
        return [i for i, work in enumerate(works) if isinstance(work, EmbedWork)]

    def plan(self, works: Sequence[EmbedWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        return [("embed", dims) for dims, _ in self._steps(self._rows(works, indices))]

    def warmup_keys(self) -> list[tuple[str, Any]]:
        """One row of each token bucket about four times the one before up to the step's
        capacity (its window the whole row, so it covers every smaller input), an encoder's
        steps of full rows (``_encoder_full_rows``), and the fullest step (the largest batch
        bucket of full rows)."""
        engine, groups = self._runner.settings.engine, self._runner.placement.groups
        capacity = self._capacity()
        smallest = data_buckets(engine.batch_buckets, groups)[0]
        keys, last = [], 0
        for tokens in engine.item_token_buckets:
            if tokens > capacity:
                break
            if tokens >= 4 * last or tokens == capacity:
                keys.append(("embed", EmbedDims(smallest, tokens, window_for(tokens, tokens))))
                last = tokens
        largest = data_buckets(engine.batch_buckets, groups)[-1]
        if self._model.config.encoder:
            keys += [("embed", dims) for dims in self._encoder_full_rows(largest)]
        full = EmbedDims(largest, capacity, window_for(capacity, capacity))
        return list(dict.fromkeys([*keys, ("embed", full)]))

    # -- running ------------------------------------------------------------------------

    def score(self, works: Sequence[EmbedWork], indices: Sequence[int], results: list) -> None:
        """Fill ``results[w]`` (float32 ``[inputs, dimension]``) for every work in indices."""
        for exact, chunk in self._steps(self._rows(works, indices)):
            self._run(exact, chunk, results)

    def _run(self, exact: EmbedDims, chunk: list[list[Piece]], results: list) -> None:
        runner = self._runner
        dims = runner.resolve("embed", exact)
        b, s = dims.batch, dims.tokens
        m = slots(s)
        tokens = np.zeros((b, s), np.int32)
        positions = np.zeros((b, s), np.int32)
        item_ids = np.full((b, s), -1, np.int32)
        pick = np.zeros((b, m), np.int32)
        segments = np.full((b, s), m, np.int32)
        counts = np.zeros((b, m), np.float32)
        types = np.zeros((b, s), np.int32)
        first = self._head.pooling == "cls"
        for r, row in enumerate(chunk):
            cursor = 0
            for n, piece in enumerate(row):
                length = len(piece.tokens)
                end = cursor + length
                tokens[r, cursor:end] = piece.tokens
                positions[r, cursor:end] = np.arange(length)
                item_ids[r, cursor:end] = n
                skip = min(piece.skip, length - 1)
                pick[r, n] = cursor + skip if first else end - 1
                segments[r, cursor + skip : end] = n
                counts[r, n] = length - skip
                types[r, cursor + piece.second : end] = 1
                cursor = end
        real = sum(len(p.tokens) for row in chunk for p in row)
        runner.count_tokens(b * s, real)
        c = self._model.config
        kv = (c.num_layers, b, EMPTY_PREFIX, c.num_kv_heads, c.head_dim)
        args = (
            np.zeros(kv, self._model.dtype),
            tokens,
            positions,
            item_ids,
            pick,
            segments,
            counts,
            types,
        )
        pooled = np.asarray(runner.run_device("embed", dims, args))  # [B, M, D]
        for r, row in enumerate(chunk):
            normalize = np.asarray([piece.normalize for piece in row])
            vectors = finish(pooled[r, : len(row)], self._head, self._dense, normalize)
            for n, piece in enumerate(row):
                results[piece.work][piece.index] = vectors[n]


def check_embed_work(work: Any, info: ModelInfo) -> None:
    """Raise ScoringError (its ``reason`` the HTTP 400's) for an EmbedWork that must
    not run, or for other work on an embedding model (and an EmbedWork on any other)."""
    pooling = info.pooling or cross_encoder_pooling(info.head)
    if not isinstance(work, EmbedWork) or pooling is None:
        what = "an embedding model only embeds" if pooling else "this model does not embed"
        what = "a cross-encoder scores pairs" if info.kind == "cross_encoder" else what
        raise ScoringError(
            Reason.UNSUPPORTED_FOR_MODEL, f"{type(work).__name__}: {what} ({info.kind})"
        )
    if any(not tokens for tokens in work.inputs):
        raise ScoringError(Reason.EMPTY_INPUT, "every input must hold at least one token")
    vocab = info.vocab_size
    if any(not 0 <= t < vocab for tokens in work.inputs for t in tokens):
        raise ScoringError(Reason.TOKEN_ID_EXCEEDS_VOCAB, f"token ids must be in [0, {vocab})")
    limit = pooling.max_seq_length or (info.head.max_length if info.head else None)
    check_embed_limits(work, info.limits, limit)


def empty_result(work: Any, info: ModelInfo) -> Any:
    """What ``ScoringEngine.score_batch`` fills for ``work``."""
    if isinstance(work, PromptWork):
        return []
    if isinstance(work, EmbedWork):
        pooling = info.pooling or cross_encoder_pooling(info.head)
        assert pooling is not None
        return np.zeros((work.num_items, pooling.dimension), np.float32)
    return np.zeros((work.num_items, len(work.label_ids)), np.float32)
