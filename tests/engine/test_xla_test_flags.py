"""The suite compiles XLA CPU steps at LLVM -O0 with XLA's elemental emitters in place of the
fusion emitters (tests/support/xla_flags.py, set by conftest.py), each about halving its compile
time; this holds that the flags change no result beyond float32 rounding:
the same works through every layout, scored in a process with the shipped XLA options and
in one with the test flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.support.fp32 import assert_fp32_close
from tests.support.xla_flags import (
    CACHE_DIR_ENV,
    TEST_XLA_FLAGS,
    production_env,
    with_test_xla_flags,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import json, jax, numpy as np
    from cluster.mesh import build_mesh
    from replicas.contract import ScoreWork
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.model.causal_lm import CausalLM
    from replicas.model.config import ModelConfig
    from replicas.settings import ReplicaSettings

    config = ModelConfig(
        family="qwen3", vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e4,
        tie_word_embeddings=True, qk_norm=True,
    )
    model = CausalLM(config)
    params = model.init_params(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    ids = lambda n: tuple(int(t) for t in rng.integers(1, 300, n))
    works = [
        ScoreWork(ids(20), tuple(ids(n) for n in (3, 7, 1, 0, 12)), (5, 9, 11)),
        ScoreWork(ids(5), (ids(4), ids(9)), (3,), item_first=True),
    ]
    out = {}
    for layout in ("shared_prefix", "packed_reference"):
        settings = ReplicaSettings.from_keys(
            token_buckets=(16, 32, 64), item_token_buckets=(16, 32, 64),
            max_multi_item_seq_len=128, background_compile=False,
            multi_item_scoring_delimiter=0, layout=layout,
        )
        engine = ScoringEngine(model, params, build_mesh((1, 1)), settings, "tiny")
        out[layout] = [scores.tolist() for scores in engine.score_batch(works)]
    print(json.dumps(out))
    """
)


def scores_with(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env | {"JAX_PLATFORMS": "cpu"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_session_compiles_with_the_test_flags_into_a_cache_of_its_own() -> None:
    assert set(TEST_XLA_FLAGS) <= set(os.environ["XLA_FLAGS"].split())
    assert Path(os.environ[CACHE_DIR_ENV]).is_dir()
    assert CACHE_DIR_ENV not in production_env(os.environ)


@pytest.mark.deep
def test_the_test_flags_change_scores_by_float32_rounding_at_most() -> None:
    shipped = production_env(os.environ)  # neither compiles from the run's cache
    tests = shipped | {"XLA_FLAGS": with_test_xla_flags(shipped["XLA_FLAGS"])}
    assert tests["XLA_FLAGS"] != shipped["XLA_FLAGS"]
    want, got = scores_with(shipped), scores_with(tests)
    assert want.keys() == got.keys() == {"shared_prefix", "packed_reference"}
    for layout, works in want.items():
        for got_scores, want_scores in zip(got[layout], works, strict=True):
            a, b = np.asarray(got_scores), np.asarray(want_scores)
            assert a.shape == b.shape and np.all(np.isfinite(a))
            assert_fp32_close(a, b, what=layout)
