"""Pieces the engine benchmarks share: the shipped settings, the RFC-008 work, random-weight
checkpoints, engines over one loaded model and their calls, the matmul peak (the baselines
beside them: loadtest.peers).
Imports nothing heavy at module level."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import LABELS, ROOT, timed_together
from loadtest.peers import load_hf_model  # noqa: F401  (tests/conftest.py reads it here)
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


def config_settings(config: Path = SERVE_CONFIG, **changes: Any) -> Any:
    """The replica settings of ``config``'s first application (its args, as written, with
    ``changes``)."""
    import yaml

    from replicas.settings import ReplicaSettings

    (app, *_) = yaml.safe_load(config.read_text())["applications"]
    return ReplicaSettings.from_mapping({**app["args"], **changes})


def settings_for(model_dir: Path, work_dir: Path) -> Any:
    """The shipped serve_config.yaml's settings with only ``model`` changed (its compilation
    cache in ``work_dir``)."""
    return config_settings(model=str(model_dir), compilation_cache_dir=str(work_dir / "cache"))


def shipped_settings(config: Path = SERVE_CONFIG) -> Any:
    """The replica settings of the shipped serve_config.yaml (its first application's args),
    without its warm-up (each case is warmed by untimed calls; so without
    ``limit_to_warmup`` either), disk cache or query cache (each case repeats one request,
    which the cache would answer warm; the HTTP benchmark measures the cache)."""
    return config_settings(config).replace(
        warmup_shapes=(), limit_to_warmup=False, compilation_cache_dir=None, query_cache_bytes=0
    )


def compiled(engine: Any, works: Sequence[Any]) -> Callable[[], Any]:
    """``engine.score_batch(works)`` once its own signature is compiled: a shape that a
    compiled signature covers compiles in the background when it recurs, so two untimed
    calls first."""
    call = partial(engine.score_batch, list(works))
    call(), call()
    engine.wait_for_background_compiles()
    return call


def contenders(built: Mapping[str, Any], works: Sequence[Any]) -> dict[str, Callable[[], Any]]:
    """Each engine of ``built`` scoring ``works``, compiled first (:func:`compiled`)."""
    return {name: compiled(engine, works) for name, engine in built.items()}


def diff(answers: Mapping[str, Any], a: str, b: str) -> float | None:
    """The largest |difference| between two contenders' answers (an engine's list of arrays
    joined); None when one did not run."""
    if a not in answers or b not in answers:
        return None
    joined = [np.concatenate(v) if isinstance(v, list) else v for v in (answers[a], answers[b])]
    return float(np.abs(joined[0] - joined[1]).max())


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
    ones = {size: jnp.ones((size, size), jnp.float32) for size in sizes}
    calls = {str(n): lambda a=a: matmul(a, a).block_until_ready() for n, a in ones.items()}
    seconds = timed_together(calls, repeats)
    return max(2 * size**3 / seconds.best(str(size)) for size in sizes)
