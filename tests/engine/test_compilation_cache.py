"""compilation_cache_dir makes jax persist compiled steps, so a restart skips compiling."""

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys, jax
    from cluster.mesh import build_mesh
    from replicas.model.config import ModelConfig
    from replicas.contract import ScoreWork
    from replicas.engine.scoring_engine import ScoringEngine, configure_compilation_cache
    from replicas.model.causal_lm import CausalLM
    from replicas.settings import ReplicaSettings

    settings = ReplicaSettings.from_keys(
        compilation_cache_dir=sys.argv[1], multi_item_scoring_delimiter=0
    )
    configure_compilation_cache(settings.engine.compilation_cache_dir)
    config = ModelConfig(
        family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e4,
        tie_word_embeddings=True,
    )
    model = CausalLM(config)
    engine = ScoringEngine(
        model, model.init_params(jax.random.PRNGKey(0)), build_mesh((1, 1)), settings, "t"
    )
    print(engine.score_batch([ScoreWork((1, 2, 3), ((4,), (5, 6)), (7,))])[0].tolist())
    """
)


def run(cache: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_compiled_steps_are_written_to_the_cache_and_reused(tmp_path: Path):
    cache = tmp_path / "jax-cache"
    first = run(cache)
    entries = sorted(p.name for p in cache.iterdir())
    assert entries, "no compiled executable was persisted"
    assert run(cache) == first
    assert sorted(p.name for p in cache.iterdir()) == entries  # hit: nothing new written
