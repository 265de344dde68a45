"""The baselines the benchmarks run beside scorejax, one function each; each but Infinity's
(its own venv, timed there) returns a call for harness.timed_together to time:

- transformers: :func:`load_hf_model`, :func:`hf_scorer` (batched ``query + item`` rows),
  :func:`hf_rows` (a forward per row), :func:`hf_padded` (the rows in one padded forward),
  :func:`hf_rewards` (a score head's batched rows);
- sentence-transformers: :func:`st_encode` (``encode``), :func:`cross_encoder`
  (``CrossEncoder.predict``), :func:`retrieval_library` (a ColBERT's ``encode_query`` +
  ``encode_document`` + ``similarity``, a SPLADE's ``encode_document``);
- llama.cpp: :func:`llama_cpp` (:class:`LlamaScorer`, None without llama-cpp-python);
- Infinity: :func:`infinity` (loadtest/infinity_runner.py in Infinity's own venv).

llama-cpp-python is an optional extra (``pip install -e '.[llamacpp]'``; it builds llama.cpp
from source). llama.cpp reads the Q4_1 weights as they are (its dot products quantize the
activations to 8 bits), where scorejax and transformers dequantize them to float32 once: its
log-probs agree with theirs to the quantization of the activations
(:data:`LOGPROB_TOLERANCE`). Its two ways to score a work: ``rows``, every ``query + item``
from an empty KV cache; ``shared``, the query once, then each item behind it (the KV cache
past the query dropped before each item; an empty item reads the query's last logits).
Imports nothing heavy at module level.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import LABELS, MODEL
from replicas.contract import ScoreWork

# Largest |log-prob difference| accepted between llama.cpp and scorejax on the same rows
# (the labels' entries): llama.cpp's 8-bit activations against float32 ones.
LOGPROB_TOLERANCE = 0.25
NOT_INSTALLED = (
    "llama.cpp rows skipped: llama-cpp-python is not installed "
    "(pip install -e '.[llamacpp]', which builds it from source)"
)
INFINITY = Path(".venv-infinity/bin/python")
RUNNER = Path(__file__).with_name("infinity_runner.py")
WARM = 8  # texts of the untimed first call of a sentence-transformers baseline


def load_hf_model(name: str = MODEL) -> Any:
    """transformers fp32 causal LM of ``name``'s local weights; torch uses every core."""
    import torch
    from transformers import AutoModelForCausalLM

    from replicas.checkpoints.sources import resolve_model_source

    torch.set_num_threads(os.cpu_count() or 1)
    source = resolve_model_source(name)
    return AutoModelForCausalLM.from_pretrained(
        str(source.directory), dtype=torch.float32, **source.transformers_kwargs()
    ).eval()


def hf_scorer(
    works: ScoreWork | Sequence[ScoreWork], model: Any | None = None
) -> Callable[[], np.ndarray]:
    """transformers batched single-item scoring of the same weights on the model's device:
    rows are ``query + item`` of every work; the call computes ``[items, labels]`` log-probs.
    ``model``: :func:`load_hf_model`'s or a random checkpoint's (SmolLM2 when omitted)."""
    import torch

    works = [works] if isinstance(works, ScoreWork) else list(works)
    model = load_hf_model() if model is None else model
    rows = [w.query_ids + item for w in works for item in w.item_ids]
    tokens = torch.tensor(rows, device=model.device)
    labels = torch.tensor(works[0].label_ids, device=model.device)

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(tokens, logits_to_keep=1).logits[:, -1].float()
            return torch.log_softmax(logits, -1)[:, labels].cpu().numpy()

    return score


def hf_rows(model: Any, work: ScoreWork) -> Callable[[], np.ndarray]:
    """transformers, a forward per ``query + item`` row (rows of any lengths):
    ``[items, labels]`` log-probs."""
    import torch

    rows = [torch.tensor([list(work.query_ids) + list(item)]) for item in work.item_ids]

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = [model(row, logits_to_keep=1).logits[0, -1] for row in rows]
            return torch.log_softmax(torch.stack(logits), -1)[:, list(work.label_ids)].numpy()

    return score


def hf_padded(model: Any, work: ScoreWork) -> Callable[[], None]:
    """transformers, every ``query + item`` row in one right-padded forward (its last real
    positions' logits)."""
    import torch

    rows = [list(work.query_ids) + list(item) for item in work.item_ids]
    width = max(map(len, rows))
    padded = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    last = torch.tensor([len(row) - 1 for row in rows])

    def score() -> None:
        with torch.inference_mode():
            model(padded, attention_mask=mask).logits[torch.arange(len(rows)), last]

    return score


def hf_rewards(model: Any, work: ScoreWork) -> Callable[[], np.ndarray]:
    """transformers' batched score-head rows (``query + item``, equal lengths): ``[N, 1]``."""
    import torch

    rows = torch.tensor([work.query_ids + item for item in work.item_ids])

    def score() -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=rows).logits.float().numpy()

    return score


def st_encode(model_dir: Path, texts: list[str], batch_size: int = 32) -> Callable[[], Any]:
    """sentence-transformers' ``encode`` of ``texts`` (length-sorted batches of
    ``batch_size``), after one untimed call of a few texts."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    model.encode(texts[:WARM], convert_to_numpy=True)
    return lambda: model.encode(texts, batch_size=batch_size, convert_to_numpy=True)


def cross_encoder(model_dir: Path, pairs: list[tuple[str, str]]) -> Callable[[], np.ndarray]:
    """sentence-transformers' ``CrossEncoder.predict`` of ``pairs`` (batches of 32), after one
    untimed call of a few pairs."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu", local_files_only=True)
    model.predict(pairs[:WARM])
    return lambda: np.asarray(model.predict(pairs, batch_size=32))


def retrieval_library(
    kind: str, model_dir: Path, query: str, texts: list[str], batch_size: int
) -> tuple[Any, Callable[[], Any]]:
    """A ColBERT (``kind`` "late": the scores, the query's and the documents' vectors) or a
    SPLADE ("sparse": the documents' sparse vectors) in sentence-transformers, after one
    untimed call of a few documents: the model and the call."""
    from sentence_transformers import MultiVectorEncoder, SparseEncoder

    model = (MultiVectorEncoder if kind == "late" else SparseEncoder)(
        str(model_dir), device="cpu", local_files_only=True
    )

    def call(docs: list[str]) -> Any:
        if kind != "late":
            return model.encode_document(docs, batch_size=batch_size)
        queries = model.encode_query([query], batch_size=batch_size)
        vectors = model.encode_document(docs, batch_size=batch_size)
        return np.asarray(model.similarity(queries, vectors))[0], queries, vectors

    call(texts[:WARM])
    return model, lambda: call(texts)


def infinity(job: dict[str, Any], python: str, work_dir: Path) -> dict[str, Any] | None:
    """Infinity's answer to ``job`` (loadtest/infinity_runner.py: its seconds, outputs and
    version), None without its venv (``make bench-infinity``)."""
    if not python or not Path(python).exists():
        return None
    job_path, out_path = work_dir / "infinity-job.json", work_dir / "infinity-out.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    subprocess.run([python, str(RUNNER), str(job_path), str(out_path)], check=True, env=env)
    return json.loads(out_path.read_text())


def llama_available() -> bool:
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
        self._llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx,
                          n_threads=threads, n_threads_batch=threads, verbose=False)  # fmt: skip
        self._lib, self._vocab = llama_cpp, self._llm.n_vocab()

    def _eval(self, tokens: Sequence[int], labels: Sequence[int]) -> np.ndarray:
        """Evaluate ``tokens`` after the KV cache's first ``n_tokens``; the last one's
        log-probs of ``labels``."""
        self._llm.eval(list(tokens))
        pointer = self._lib.llama_get_logits_ith(self._llm.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self._vocab,)).copy()
        return log_softmax(logits)[list(labels)]

    def rows(
        self, query: Sequence[int], items: Sequence[Sequence[int]], labels: Sequence[int] = LABELS
    ) -> np.ndarray:
        """``[items, labels]`` log-probs, each ``query + item`` from an empty KV cache."""
        out = []
        for item in items:
            self._llm.reset()
            out.append(self._eval([*query, *item], labels))
        return np.asarray(out, np.float32)

    def shared(
        self, query: Sequence[int], items: Sequence[Sequence[int]], labels: Sequence[int] = LABELS
    ) -> np.ndarray:
        """``[items, labels]`` log-probs, the query evaluated once and kept in the KV cache."""
        self._llm.reset()
        last, out = self._eval(query, labels), []
        for item in items:
            self._llm.n_tokens = len(query)  # eval drops the KV cache past the query
            out.append(self._eval(item, labels) if item else last)
        return np.asarray(out, np.float32)


def llama_cpp(model: str = MODEL) -> LlamaScorer | None:
    """A :class:`LlamaScorer`, or None (and the note printed) without llama-cpp-python."""
    if not llama_available():
        print(NOT_INSTALLED)
        return None
    return LlamaScorer(model)
