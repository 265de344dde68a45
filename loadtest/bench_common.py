"""Pieces the engine benchmarks share: the shipped settings, the RFC-008 work, the matmul peak,
the transformers baseline. Imports nothing heavy at module level."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import LABELS, MODEL, ROOT, timed
from replicas.contract import ScoreWork

SERVE_CONFIG = ROOT / "serve_config.yaml"
GPU_CONFIG = ROOT / "serve_config.gpu.yaml"


def make_work(num_items: int, query_len: int, item_len: int, seed: int = 0) -> ScoreWork:
    """Random token ids in [100, 40000): a query and ``num_items`` items, 3 labels."""
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(100, 40000, n))  # noqa: E731
    return ScoreWork(ids(query_len), tuple(ids(item_len) for _ in range(num_items)), LABELS)


def shipped_settings(config: Path = SERVE_CONFIG) -> Any:
    """The replica settings of the shipped serve_config.yaml (its first application's args),
    without its warm-up (each case is warmed by untimed calls; so without
    ``limit_to_warmup`` either), disk cache or query cache (each case repeats one request,
    which the cache would answer warm; the HTTP benchmark measures the cache)."""
    import yaml

    from replicas.settings import ReplicaSettings

    (app, *_) = yaml.safe_load(config.read_text())["applications"]
    return ReplicaSettings.from_mapping(app["args"]).replace(
        warmup_shapes=(), limit_to_warmup=False, compilation_cache_dir=None, query_cache_bytes=0
    )


def timed_steady(engine: Any, work: ScoreWork, repeats: int) -> float:
    """Median seconds once the work's own signature is compiled: a shape that a compiled
    signature covers compiles in the background when it recurs, so two untimed calls."""
    engine.score_batch([work])
    engine.score_batch([work])
    engine.wait_for_background_compiles()
    return timed(lambda: engine.score_batch([work]), repeats)


def matmul_peak_flops(sizes: tuple[int, ...] = (512, 1024, 1536, 2048), repeats: int = 8) -> float:
    """Best observed float32 matmul FLOP/s of this machine through XLA, over a few sizes."""
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(lambda x, y: x @ y)
    best = 0.0
    for size in sizes:
        a = jnp.ones((size, size), jnp.float32)
        matmul(a, a).block_until_ready()
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, a).block_until_ready()
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


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


def hf_scorer(work: ScoreWork, model: Any | None = None) -> Callable[[], np.ndarray]:
    """transformers fp32 batched single-item scoring of the same GGUF weights.

    Rows are ``query + item``; returns a function computing ``[items, labels]`` log-probs.
    ``model``: a model from :func:`load_hf_model` (loaded here when omitted).
    """
    import torch

    if model is None:
        model = load_hf_model()
    rows = torch.tensor([work.query_ids + item for item in work.item_ids])
    labels = torch.tensor(work.label_ids)

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(rows, logits_to_keep=1).logits[:, -1]
            return torch.log_softmax(logits, -1)[:, labels].numpy()

    return score
