"""llama.cpp as a CPU peer: the same GGUF file, the same token ids, in this process.

llama-cpp-python is an optional extra (``pip install -e '.[llamacpp]'``; it builds llama.cpp
from source, a few minutes on 2 cores). :func:`scorer` returns None when it is not installed,
and the benchmarks print a note instead of its rows.

llama.cpp reads the Q4_1 weights as they are (its dot products quantize the activations to
8 bits), where scorejax and transformers dequantize them to float32 once: its log-probs
agree with theirs to the quantization of the activations, not to float32 rounding
(:data:`LOGPROB_TOLERANCE`).

Two ways to score a work, each a token row's last-position logits, a log-softmax over the
vocabulary and the labels' entries:

- ``rows``: every ``query + item`` on its own from an empty KV cache (what one request per
  item costs);
- ``shared``: the query evaluated once, then each item behind it, the query's keys and values
  kept in the KV cache across items (llama.cpp's own prefix reuse: the KV cache past the
  query is dropped before each item). An empty item reads the query's last logits.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest.harness import MODEL

# Largest |log-prob difference| accepted between llama.cpp and scorejax on the same rows
# (the labels' entries): llama.cpp's 8-bit activations against float32 ones.
LOGPROB_TOLERANCE = 0.25
NOT_INSTALLED = (
    "llama.cpp rows skipped: llama-cpp-python is not installed "
    "(pip install -e '.[llamacpp]', which builds it from source)"
)


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


class LlamaScorer:
    """llama.cpp in process on the packaged GGUF of ``model`` (no network)."""

    def __init__(self, model: str = MODEL, n_ctx: int = 2048, threads: int | None = None):
        from llama_cpp import Llama, llama_cpp

        from replicas.checkpoints.sources import resolve_model_source

        threads = threads or os.cpu_count() or 1
        self.path = resolve_model_source(model).gguf_path
        self._llm = Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self._lib = llama_cpp
        self._vocab = self._llm.n_vocab()

    def _eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Evaluate ``tokens`` after the KV cache's first ``n_tokens``; the last one's logits."""
        self._llm.eval(list(tokens))
        pointer = self._lib.llama_get_logits_ith(self._llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self._vocab,)).copy()

    def rows(self, query: Sequence[int], items: Sequence[Sequence[int]], labels: Sequence[int]):
        """``[items, labels]`` log-probs, each ``query + item`` from an empty KV cache."""
        out = []
        for item in items:
            self._llm.reset()
            out.append(log_softmax(self._eval([*query, *item]))[list(labels)])
        return np.asarray(out, np.float32)

    def shared(self, query: Sequence[int], items: Sequence[Sequence[int]], labels: Sequence[int]):
        """``[items, labels]`` log-probs, the query evaluated once and kept in the KV cache."""
        self._llm.reset()
        last = log_softmax(self._eval(query))[list(labels)]
        out = []
        for item in items:
            if item:
                self._llm.n_tokens = len(query)  # eval drops the KV cache past the query
                out.append(log_softmax(self._eval(item))[list(labels)])
            else:
                out.append(last)
        return np.asarray(out, np.float32)


def scorer(model: str = MODEL) -> Any | None:
    """A :class:`LlamaScorer`, or None (and the note printed) without llama-cpp-python."""
    if not available():
        print(NOT_INSTALLED)
        return None
    return LlamaScorer(model)
