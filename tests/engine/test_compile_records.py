"""The compile record belongs to the model that wrote it (one cache folder serves several
models one after another), a recorded step the engine cannot build never fails a start, and a
process that built an engine exits cleanly while background compiles run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax

from cluster.mesh import build_mesh
from replicas.contract import EmbedWork, PoolingHead, ScoreHead, ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.causal_lm import CausalLM
from replicas.model.config import ModelConfig
from replicas.settings import ReplicaSettings

SMALL = {
    "token_buckets": (16, 32, 64),
    "item_token_buckets": (16, 32, 64, 128),
    "batch_buckets": (1, 2),
    "background_compile": False,  # what runs is compiled and recorded at once
}
KINDS: dict[str, dict[str, Any]] = {  # ModelConfig fields of each kind of model
    "causal": {},
    "embed": {"pooling": PoolingHead("lasttoken", True, 32)},
    "head": {"head": ScoreHead("linear", 3, ("neg", "neu", "pos"))},
}
SCORE = ScoreWork((1, 2, 3), ((4,), (5, 6)), (7, 8))


def engine_of(kind: str, cache: Path, **changes: Any) -> ScoringEngine:
    """A tiny random model of ``kind``; every kind has the same name, as a config whose
    ``model`` path now holds another checkpoint."""
    config = ModelConfig(
        family="llama", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e4,
        tie_word_embeddings=False, **KINDS[kind],
    )  # fmt: skip
    model = CausalLM(config)
    delimiter = 0 if kind == "causal" else None
    settings = ReplicaSettings.from_keys(
        **{**SMALL, **changes},
        compilation_cache_dir=str(cache),
        multi_item_scoring_delimiter=delimiter,
    )
    params = model.init_params(jax.random.PRNGKey(0))
    return ScoringEngine(model, params, build_mesh((1, 1)), settings, "model")


def record_of(engine: ScoringEngine) -> Path:
    path = engine._compiler.record_path
    assert path is not None
    return path


def serve(kind: str, cache: Path) -> ScoringEngine:
    """Start (warm-up, the record's replay included) and score one work."""
    engine = engine_of(kind, cache)
    engine.warmup()
    if kind == "embed":
        (vectors,) = engine.score_batch([EmbedWork(((1, 2, 3), (4, 5)))])
        assert vectors.shape == (2, 32)
    elif kind == "head":
        (logits,) = engine.score_batch([ScoreWork((1, 2, 3), ((4,), (5, 6)), (0, 1, 2))])
        assert logits.shape == (2, 3)
    else:
        (scores,) = engine.score_batch([SCORE])
        assert scores.shape == (2, 2)
    return engine


def test_one_cache_folder_serves_several_models_one_after_another(tmp_path: Path) -> None:
    causal = serve("causal", tmp_path)
    steps = set(causal.executables())
    assert {kind for kind, _ in steps} == {"prefix", "items"}
    for kind in ("embed", "head"):  # each starts first time: no other model's steps replayed
        other = serve(kind, tmp_path)
        assert record_of(other) != record_of(causal)
        assert other.stats().compile_count > 0
    again = engine_of("causal", tmp_path)
    assert set(again._compiler.recorded()) == steps  # its own record, kept by the others
    assert again.warmup() == len(steps)
    assert set(again.executables()) == steps
    again.score_batch([SCORE])
    assert again.stats().request_path_compiles == 0  # the replay served it
    assert len(list(tmp_path.glob("scorejax-signatures-*.json"))) == 3


def test_a_recorded_step_the_engine_cannot_build_is_skipped(tmp_path: Path, caplog) -> None:
    causal = serve("causal", tmp_path)
    embed = serve("embed", tmp_path)
    (row, *_) = json.loads(record_of(embed).read_text())
    unbuildable = {**row, "dims": [-1] * len(row["dims"])}  # an edited record
    foreign = json.loads(record_of(causal).read_text())  # the causal model's label steps
    record_of(embed).write_text(json.dumps([*foreign, unbuildable]))
    embed = engine_of("embed", tmp_path)
    recorded = {kind for kind, _ in embed._compiler.recorded()}
    # An embedding engine builds only embedding steps: another kind's are not its to replay.
    assert "items" not in recorded and row["kind"] in recorded
    with caplog.at_level(logging.WARNING, "replicas.engine.compiler"):
        embed.warmup()
    assert f"skipping recorded signature {row['kind']}" in caplog.text  # never built
    (vectors,) = embed.score_batch([EmbedWork(((1, 2, 3),))])
    assert vectors.shape == (1, 32)


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from replicas.contract import ScoreWork
    from tests.engine.test_compile_records import engine_of

    engine = engine_of("causal", Path(sys.argv[1]), background_compile=True)
    compiler = engine._compiler
    started, build = threading.Event(), compiler._compile_fn

    def compile_fn(kind, dims):  # the worker's first compile is under way once it is set
        started.set()
        return build(kind, dims)

    compiler._compile_fn = compile_fn
    works = [ScoreWork(tuple(range(1, q)), ((4,), (5, 6)), (7,)) for q in (20, 40, 60)]
    for kind, dims in dict.fromkeys(key for work in works for key in engine.plan([work])):
        engine.compile_later(kind, dims)
    assert started.wait(120) and engine.stats().background_pending > 1
    print("exiting with", engine.stats().background_pending, "pending", flush=True)
    print("EXIT", file=sys.stderr, flush=True)  # what stderr holds after it is teardown's
    """
)


def test_a_process_exits_cleanly_while_background_compiles_run(tmp_path: Path) -> None:
    """Interpreter exit waits for the running compile (dropping queued ones) instead of
    tearing XLA down under it ("terminate called ...", "FATAL: exception not rethrown")."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "pending" in done.stdout
    assert done.stderr.split("EXIT\n")[-1] == ""  # nothing from teardown
