"""Pieces the engine benchmarks share: the shipped settings, the RFC-008 work, random-weight
checkpoints, engines over one loaded model, the matmul peak, the transformers baseline.
Imports nothing heavy at module level."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import LABELS, MODEL, ROOT, timed
from replicas.contract import ScoreWork

SERVE_CONFIG = ROOT / "serve_config.yaml"
GPU_CONFIG = ROOT / "serve_config.gpu.yaml"


def make_work(
    num_items: int, query_len: int, item_len: int, seed: int = 0, labels: Sequence[int] = LABELS
) -> ScoreWork:
    """Random token ids in [100, 40000): a query and ``num_items`` items; ``labels``."""
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(100, 40000, n))  # noqa: E731
    query = ids(query_len)  # first: the same draws as ever
    return ScoreWork(query, tuple(ids(item_len) for _ in range(num_items)), tuple(labels))


def config_settings(config: Path = SERVE_CONFIG) -> Any:
    """The replica settings of ``config``'s first application (its args), as written."""
    import yaml

    from replicas.settings import ReplicaSettings

    (app, *_) = yaml.safe_load(config.read_text())["applications"]
    return ReplicaSettings.from_mapping(app["args"])


def shipped_settings(config: Path = SERVE_CONFIG) -> Any:
    """The replica settings of the shipped serve_config.yaml (its first application's args),
    without its warm-up (each case is warmed by untimed calls; so without
    ``limit_to_warmup`` either), disk cache or query cache (each case repeats one request,
    which the cache would answer warm; the HTTP benchmark measures the cache)."""
    return config_settings(config).replace(
        warmup_shapes=(), limit_to_warmup=False, compilation_cache_dir=None, query_cache_bytes=0
    )


def timed_steady(engine: Any, works: Sequence[ScoreWork], repeats: int, warm: int = 1) -> float:
    """Median seconds of ``score_batch(works)`` once its own signature is compiled: a shape
    that a compiled signature covers compiles in the background when it recurs, so two
    untimed calls first (and ``warm`` more)."""
    engine.score_batch(works)
    engine.score_batch(works)
    engine.wait_for_background_compiles()
    return timed(lambda: engine.score_batch(works), repeats, warm)


def random_checkpoint(
    directory: Path, values: Mapping[str, Any], dtype: str = "float32", device: str = "cpu"
) -> Any:
    """A seeded random-weight transformers model of config.json ``values`` (its
    ``architectures`` picks a causal LM or a one-label score head), saved into ``directory``
    as ``dtype`` safetensors; returns it in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from replicas.model.catalog import hf_config

    torch.manual_seed(0)
    config = hf_config(values)
    head = config.architectures[0].endswith("ForSequenceClassification")
    model = (AutoModelForSequenceClassification if head else AutoModelForCausalLM).from_config(
        config, dtype=torch.float32
    )
    if head:  # transformers' init leaves score at N(0, 0.02): a wider spread
        with torch.no_grad():
            model.score.weight.normal_(0.0, config.hidden_size**-0.5)
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model.to(device)


def build_engines(
    settings: Any, variants: Mapping[str, Any], name: str, directory: Path | None = None
) -> tuple[dict[str, Any], Any]:
    """One model loaded as ``settings`` say (from ``directory`` when given) and a
    ScoringEngine over it per settings variant; and the loaded model."""
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.engine.scoring_engine import ScoringEngine

    mesh = build_mesh(settings.placement.mesh_shape)
    loaded = load_model(directory or settings.model.name, mesh, settings.model.dtype)
    built = {
        key: ScoringEngine(loaded.model, loaded.params, mesh, variant, name)
        for key, variant in variants.items()
    }
    return built, loaded


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def hf_scorer(
    works: ScoreWork | Sequence[ScoreWork], model: Any | None = None
) -> Callable[[], np.ndarray]:
    """transformers batched single-item scoring of the same weights on the torch device.

    Rows are ``query + item`` of every work; returns a function computing
    ``[items, labels]`` log-probs. ``model``: a model from :func:`load_hf_model` or
    :func:`random_checkpoint` (SmolLM2 loaded here when omitted).
    """
    import torch

    works = [works] if isinstance(works, ScoreWork) else list(works)
    model = load_hf_model() if model is None else model
    device = model.device
    rows = [w.query_ids + item for w in works for item in w.item_ids]
    tokens = torch.tensor(rows, device=device)
    labels = torch.tensor(works[0].label_ids, device=device)

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(tokens, logits_to_keep=1).logits[:, -1].float()
            return torch.log_softmax(logits, -1)[:, labels].cpu().numpy()

    return score
