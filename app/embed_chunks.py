"""Chunked embeddings of long inputs (``truncate: CHUNK``, semantics 20), as vLLM's chunked
processing defines them: an input longer than the model's limit is cut into consecutive
chunks of at most ``limit`` of its tokens (its ids as ``app.embed_inputs`` prepares them:
prompt, special tokens, chat template; the prompt's tokens stay in the first chunk), every
chunk embedded as an input of its own in the same packed steps, and the chunks' vectors (Dense
applied, not normalized) folded back into one: ``mean`` pooling their mean weighted by each
chunk's pooled tokens (the mean over the whole input's tokens, each chunk attending within
itself), ``cls`` the first chunk's, ``lasttoken`` the last chunk's; then L2-normalized when
the model normalizes. A request whose inputs all fit is the plain work; beside a long one,
an input within the limit is one chunk, its vector normalized here as the engine would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from replicas.embed_contract import EmbedWork, PoolingHead, l2_normalized


@dataclass(frozen=True)
class Chunking:
    """How an EmbedWork of chunks folds back into one vector per input: input i's chunks are
    ``work.inputs[starts[i]:starts[i + 1]]``, chunk j pools ``weights[j]`` tokens."""

    starts: tuple[int, ...]  # [inputs + 1]
    weights: tuple[int, ...]  # [chunks]
    pooling: str
    normalize: bool

    def fold(self, vectors: np.ndarray) -> np.ndarray:
        """The chunks' vectors ``[chunks, D]`` -> one vector per input ``[inputs, D]``."""
        vectors = np.asarray(vectors, np.float32)
        spans = zip(self.starts[:-1], self.starts[1:], strict=True)
        folded = [
            fold_chunks(vectors[lo:hi], self.weights[lo:hi], self.pooling) for lo, hi in spans
        ]
        out = np.stack(folded).astype(np.float32)
        return l2_normalized(out) if self.normalize else out


def fold_chunks(vectors: np.ndarray, weights: Sequence[int], pooling: str) -> np.ndarray:
    """One input's chunk vectors ``[n, D]`` (not normalized) -> its vector ``[D]``."""
    if len(vectors) == 1 or pooling == "cls":
        return vectors[0]
    if pooling == "lasttoken":
        return vectors[-1]
    w = np.asarray(weights, np.float64)[:, None]
    return (np.sum(vectors.astype(np.float64) * w, axis=0) / w.sum()).astype(np.float32)


def chunk_weights(lengths: Sequence[int], skip: int) -> list[int]:
    """The tokens each chunk pools: its length, less the prompt's in the first chunk (capped
    as the engine caps it: at least one token pooled)."""
    return [n - (min(skip, n - 1) if i == 0 else 0) for i, n in enumerate(lengths)]


def chunk_work(
    inputs: Sequence[tuple[int, ...]], skip: int, head: PoolingHead, limit: int
) -> tuple[EmbedWork, Chunking | None]:
    """``inputs`` (prompt of ``skip`` tokens) as an EmbedWork of chunks of at most ``limit``
    tokens, not normalized, and how to fold them; the plain work (and None) when every
    input fits."""
    if all(len(ids) <= limit for ids in inputs):
        return EmbedWork(tuple(inputs), (skip,) * len(inputs) if skip else ()), None
    chunks: list[tuple[int, ...]] = []
    prompts: list[int] = []
    weights: list[int] = []
    starts = [0]
    for ids in inputs:
        pieces = [tuple(ids[start : start + limit]) for start in range(0, len(ids), limit)]
        chunks += pieces
        prompts += [min(skip, len(pieces[0]) - 1)] + [0] * (len(pieces) - 1)
        weights += chunk_weights([len(piece) for piece in pieces], skip)
        starts.append(len(chunks))
    work = EmbedWork(tuple(chunks), tuple(prompts) if skip else (), normalize=False)
    return work, Chunking(tuple(starts), tuple(weights), head.pooling, head.normalize)
