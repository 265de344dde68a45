"""The embedding layout (semantics 20): inputs end to end in item-stream rows, pooled per input.

Every input is an "item" of an item stream behind an empty prefix (no prefix key is
readable), so each attends causally to itself only, at positions 0..len-1, exactly as it
would alone: the stream attention that multi-item scoring and lone prompts already run
(``layers.attend_item_stream``), no attention path of its own. How inputs fill rows and
rows fill steps: ``embed_packing``.

The step pools on device in float32: ``lasttoken`` / ``cls`` gather one hidden state per
input, ``mean`` sums an input's pooled tokens (segment sums, so no other input's token
enters) and divides by their count. Dense layers and L2 normalization run on the host in
float32, per vector. A step's signature is ``EmbedDims`` (rows, stream tokens, window); the
pooled outputs per row are ``slots(tokens)``.

An encoder (``replicas.model.encoder``) reads the same rows bidirectionally within each
input, with token types (a cross-encoder's pair: 1 from ``EmbedWork.second_starts`` on), in
rows near its inputs' length; a cross-encoder's step returns its head's logits on each
pair's [CLS] token.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from replicas.contract import EmbedWork, ModelInfo, PoolingHead, ScoreHead
from replicas.embed_contract import SparseOutput, l2_normalized
from replicas.engine.layouts.common import data_buckets, lay_row, step_capacity
from replicas.engine.layouts.embed_packing import EmbedDims, EmbedPacking, Piece, slots
from replicas.engine.layouts.prefix_blocks import KV_AXES
from replicas.engine.layouts.runner import Runner
from replicas.engine.layouts.stream import window_for
from replicas.errors import Reason, ScoringError
from replicas.kinds import recognize
from replicas.model.causal_lm import ItemStreamSpec, Params
from replicas.model.heads import head_outputs
from replicas.model.protocol import ScoringModel

Array = jax.Array
EMPTY_PREFIX = 16  # width of the (never readable) prefix every row sits behind
QUERY_ONLY = -3  # an item id QUERY_ONLY - n: a token of input n that no token reads
ROWS, SLOTS = ("batch", "seq"), ("batch", None)
ARGUMENT_AXES = (KV_AXES, ROWS, ROWS, ROWS, SLOTS, ROWS, SLOTS, ROWS)  # embed_step's, after params


def embed_step(
    model: ScoringModel,
    window: int,
    pooling: PoolingHead,
    head: ScoreHead | None,  # a cross-encoder's, run on each pair's pooled token
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
    cross-encoder's head outputs ``[B, M, L]`` on each pair's [CLS] token; a late-interaction
    model's every token's hidden state ``[B, S, D]``; a sparse model's weights ``[B, M, V]``
    (``sparse_weights``)."""
    batch, _ = tokens.shape
    valid = jnp.zeros((batch, EMPTY_PREFIX), bool) | (tokens[:, :1] < 0)
    spec = ItemStreamSpec(prefix_valid=valid, item_ids=item_ids, window=window)
    hidden = model.stream_hidden(params, tokens, positions, spec, empty, empty, types)
    hidden = hidden.astype(jnp.float32)  # [B, S, D]
    if pooling.late is not None or pooling.hybrid is not None:
        return hidden
    if pooling.sparse is not None:
        return sparse_weights(model, pooling.sparse, params, hidden, segments, pick.shape[1])
    pooled = _pool(hidden, pooling.pooling, pick, segments, counts)  # [B, M, D]
    return pooled if head is None else head_outputs(head, params["head"], pooled)  # [B, M, L]


def sparse_weights(
    model: ScoringModel, sparse: SparseOutput, params: Params, hidden: Array, segments: Array,
    m: int,
) -> Array:  # fmt: skip
    """hidden [B, S, D] -> [B, M, V]: per slot, the max (or sum) over its tokens of
    ``log(1 + relu(logits))`` of the masked-LM head (``log1p_relu``: log1p once more)."""
    from replicas.model.mlm_head import mlm_logits

    weights = jnp.log1p(jax.nn.relu(mlm_logits(model.config, params, hidden)))  # [B, S, V]
    if sparse.activation == "log1p_relu":
        weights = jnp.log1p(weights)
    batch, _, vocab = weights.shape
    ids = jnp.where(segments < m, segments + m * jnp.arange(batch)[:, None], batch * m)
    flat, ids = weights.reshape(-1, vocab), ids.reshape(-1)
    if sparse.pooling == "sum":
        pooled = jax.ops.segment_sum(flat, ids, num_segments=batch * m)
    else:  # every weight is >= 0: an empty slot's -inf becomes 0
        pooled = jnp.maximum(jax.ops.segment_max(flat, ids, num_segments=batch * m), 0.0)
    return pooled.reshape(batch, m, vocab)


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


def top_weights(weights: np.ndarray, keep: int | None) -> tuple[np.ndarray, np.ndarray]:
    """weights [V] -> its non-zero (indices ascending, values); with ``keep``, only the
    largest ``keep`` (ties: the lower index first, as a stable sort gives)."""
    indices = np.flatnonzero(weights > 0)
    if keep is not None and indices.size > keep:
        order = np.argsort(-weights[indices], kind="stable")[:keep]
        indices = np.sort(indices[order])
    return indices.astype(np.int32), weights[indices].astype(np.float32)


def cross_encoder_pooling(head: ScoreHead | None) -> PoolingHead | None:
    """How the layout runs a cross-encoder: each pair's [CLS] token (ModernBERT's mean
    pooling: its tokens' mean) through the head, its logits returned as they are (no Dense,
    no normalization); None for other heads."""
    if not recognize(head, None).pairs:
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

    def __init__(self, model: ScoringModel, runner: Runner, dense: Sequence[Any] = ()) -> None:
        c = model.config
        head = c.pooling or cross_encoder_pooling(c.head)
        if head is None:
            raise ValueError("EmbedLayout needs a model with a PoolingHead or a cross-encoder")
        self._model, self._runner, self._dense = model, runner, tuple(dense)
        self._head: PoolingHead = head
        self._score_head = c.head if recognize(c.head, c.pooling).pairs else None
        engine = runner.settings.engine
        self._packing = EmbedPacking(
            step_capacity(engine), tuple(engine.item_token_buckets),
            data_buckets(engine.batch_buckets, runner.placement.groups), not model.decoder,
        )  # fmt: skip

    def compile(self, kind: str, dims: EmbedDims) -> Any:
        runner = self._runner
        step = jax.jit(
            partial(embed_step, self._model, dims.window, self._head, self._score_head),
            out_shardings=runner.placement.replicated,
        )
        arguments = zip(self._arguments(dims), ARGUMENT_AXES, strict=True)
        specs = tuple(runner.placement.spec(a.shape, a.dtype, axes) for a, axes in arguments)
        return runner.lower(step, specs)

    def _arguments(self, dims: EmbedDims) -> tuple[np.ndarray, ...]:
        """``embed_step``'s arguments after params, as empty host arrays (item ids -1, every
        token's slot M: none)."""
        b, s, m = dims.batch, dims.tokens, slots(dims.tokens)
        c = self._model.config
        kv = (c.num_layers, b, EMPTY_PREFIX, c.num_kv_heads, c.head_dim)
        return (
            np.zeros(kv, self._model.dtype),
            np.zeros((b, s), np.int32),  # tokens
            np.zeros((b, s), np.int32),  # positions
            np.full((b, s), -1, np.int32),  # item ids
            np.zeros((b, m), np.int32),  # pick
            np.full((b, s), m, np.int32),  # segments
            np.zeros((b, m), np.float32),  # counts
            np.zeros((b, s), np.int32),  # types
        )

    # -- planning -----------------------------------------------------------------------

    def _pieces(self, works: Sequence[EmbedWork], indices: Sequence[int]) -> list[Piece]:
        pieces = []
        for w in indices:
            work = works[w]
            for i, tokens in enumerate(work.inputs):
                skip = 0 if self._head.include_prompt else work.prompt_length(i)
                second, tail = work.second_start(i), work.query_only_tokens(i)
                pieces.append(Piece(w, i, tuple(tokens), skip, second, work.normalize, tail))
        return pieces

    def _steps(self, works: Sequence[EmbedWork], indices: Sequence[int]) -> list[tuple]:
        return self._packing.plan(self._pieces(works, indices))

    def select(self, works: Sequence[Any]) -> list[int]:
        """Every EmbedWork (an embedding model takes no other work)."""
        return [i for i, work in enumerate(works) if isinstance(work, EmbedWork)]

    def plan(self, works: Sequence[EmbedWork], indices: Sequence[int]) -> list[tuple[str, Any]]:
        return [("embed", dims) for dims, _ in self._steps(works, indices)]

    def warmup_keys(self) -> list[tuple[str, Any]]:
        """One row of each token bucket about four times the one before up to the step's
        capacity (its window the whole row, so it covers every smaller input), an encoder's
        steps of full rows (``EmbedPacking.full_row_steps``), and the fullest step (the
        largest batch bucket of full rows)."""
        engine, packing = self._runner.settings.engine, self._packing
        capacity, smallest = packing.capacity, packing.batch_sizes[0]
        keys, last = [], 0
        for tokens in engine.item_token_buckets:
            if tokens > capacity:
                break
            if tokens >= 4 * last or tokens == capacity:
                keys.append(("embed", EmbedDims(smallest, tokens, window_for(tokens, tokens))))
                last = tokens
        keys += [("embed", dims) for dims in packing.full_row_steps()]
        full = EmbedDims(packing.batch_sizes[-1], capacity, window_for(capacity, capacity))
        return list(dict.fromkeys([*keys, ("embed", full)]))

    # -- running ------------------------------------------------------------------------

    def score(self, works: Sequence[EmbedWork], indices: Sequence[int], results: list) -> None:
        """Fill ``results[w]`` (float32 ``[inputs, dimension]``) for every work in indices."""
        for exact, chunk in self._steps(works, indices):
            self._run(exact, chunk, results)

    def _run(self, exact: EmbedDims, chunk: list[list[Piece]], results: list) -> None:
        runner = self._runner
        dims = runner.resolve("embed", exact)
        args = self._arguments(dims)
        _, tokens, positions, item_ids, pick, segments, counts, types = args
        first = self._head.pooling == "cls"
        for r, row in enumerate(chunk):
            spans = lay_row((tokens, positions, item_ids), r, [piece.tokens for piece in row])
            for n, (piece, (start, end)) in enumerate(zip(row, spans, strict=True)):
                skip = min(piece.skip, end - start - 1)
                pick[r, n] = start + skip if first else end - 1
                segments[r, start + skip : end] = n
                counts[r, n] = end - start - skip
                types[r, start + piece.second : end] = 1
                item_ids[r, end - piece.query_only : end] = QUERY_ONLY - n  # read by none
        real = sum(len(p.tokens) for row in chunk for p in row)
        runner.count_tokens(dims.batch * dims.tokens, real)
        out = np.asarray(runner.run_device("embed", dims, args))  # [B, M, D] ([B, S, D])
        for r, row in enumerate(chunk):
            if self._head.late is not None:
                self._token_vectors(out[r], row, results)
            elif self._head.hybrid is not None:
                self._hybrid_vectors(out[r], row, results)
            elif self._head.sparse is not None:
                for n, piece in enumerate(row):
                    weights = top_weights(out[r, n], self._head.sparse.max_active_dims)
                    results[piece.work][piece.index] = weights
            else:
                normalize = np.asarray([piece.normalize for piece in row])
                vectors = finish(out[r, : len(row)], self._head, self._dense, normalize)
                for n, piece in enumerate(row):
                    results[piece.work][piece.index] = vectors[n]

    def _hybrid_vectors(self, hidden: np.ndarray, row: list[Piece], results: list) -> None:
        """hidden [S, D] of one row -> each piece's (dense [D], multi-vector [n - 1, C],
        lexical weights [n]), as BGE-M3 computes them (``Hybrid``)."""
        colbert, lexical = self._dense
        start = 0
        for piece in row:
            h = hidden[start : start + len(piece.tokens)]  # [n, D]
            dense = l2_normalized(h[:1])[0]
            vectors = l2_normalized(colbert(h[1:]))  # [n - 1, C]
            weights = np.maximum(lexical(h)[:, 0], 0.0).astype(np.float32)  # [n]
            results[piece.work][piece.index] = (dense, vectors, weights)
            start += len(piece.tokens)

    def _token_vectors(self, hidden: np.ndarray, row: list[Piece], results: list) -> None:
        """hidden [S, D] of one row -> each piece's token vectors [tokens, dimension]."""
        start = 0
        for piece in row:
            end = start + len(piece.tokens)
            every = np.ones(end - start, bool)
            results[piece.work][piece.index] = finish(
                hidden[start:end], self._head, self._dense, every
            )
            start = end


def check_embed_work(work: Any, info: ModelInfo) -> None:
    """Raise ScoringError (its ``reason`` the HTTP 400's) for an EmbedWork that must
    not run, or for other work on an embedding model (and an EmbedWork on any other)."""
    kind = info.model_kind
    if not isinstance(work, EmbedWork) or not kind.embeds:
        what = "an embedding model only embeds" if kind.embeds else "this model does not embed"
        what = "a cross-encoder scores pairs" if kind.pairs else what
        raise ScoringError(
            Reason.UNSUPPORTED_FOR_MODEL, f"{type(work).__name__}: {what} ({info.kind})"
        )
    if work.output != kind.output:
        raise ScoringError(
            Reason.UNSUPPORTED_FOR_MODEL,
            f"EmbedWork output {work.output!r}: a {info.kind} model answers {kind.output!r}",
        )
    if work.query_only and (
        len(work.query_only) != work.num_items
        or any(not 0 <= q < len(t) for q, t in zip(work.query_only, work.inputs, strict=True))
    ):
        message = "query_only: one count per input, each short of its input's tokens"
        raise ScoringError(Reason.INVALID_REQUEST, message)
    if any(not tokens for tokens in work.inputs):
        raise ScoringError(Reason.EMPTY_INPUT, "every input must hold at least one token")
    vocab = info.vocab_size
    if any(not 0 <= t < vocab for tokens in work.inputs for t in tokens):
        raise ScoringError(Reason.TOKEN_ID_EXCEEDS_VOCAB, f"token ids must be in [0, {vocab})")


def vector_width(info: ModelInfo) -> int:
    """An EmbedWork's answer width on this model: its vectors' dimension (a cross-encoder:
    its head's labels); 0 on a model that takes no EmbedWork."""
    pooling = info.pooling or cross_encoder_pooling(info.head)
    return pooling.dimension if pooling is not None else 0
