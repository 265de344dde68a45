"""The float32 floor (tests/support/fp32.py) holds when the summation order is changed on purpose.

The same SmolLM2-135M-Instruct rows (30 layers, real weights) run through steps of other
shapes: single-item rows, the multi-item prefix and item stream, other query and item-stream
buckets, several requests batched into one prefix step, and the fused one-pass step with
every request in one row. Each shape tiles XLA's sums differently, so each changes the
rounding on any CPU, which is what another CPU's kernels do to a comparison. Every path must
stay within the floor of the single-item reference; the worst ratio of each is printed
(docs/testing.md, "Comparing two float32 paths").
"""

from __future__ import annotations

from typing import Any

import pytest

from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import SMOLLM2_LAYERS, assert_fp32_close, fp32_ratio

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"
QUERIES = ("The capital of France is", "My favourite city, all things considered, is")
ITEMS = ("", " Paris", " the city of light", " Berlin, or maybe Rome")

# name -> settings: each runs the rows through steps of another shape than the reference.
PATHS: dict[str, dict[str, Any]] = {
    "multi-item, default buckets": {"multi_item_scoring_delimiter": 0},
    "multi-item, other buckets": {
        "multi_item_scoring_delimiter": 0,
        "token_buckets": (24, 40, 64, 256),
        "item_token_buckets": (48, 96, 512),
    },
    "multi-item, queries batched": {
        "multi_item_scoring_delimiter": 0,
        "batch_buckets": (1, 2),
        "query_cache_bytes": 0,
    },
    "fused, one row": {"multi_item_scoring_delimiter": 0, "fused_step_tokens": 128},
    "single-item, other buckets": {"token_buckets": (40, 64, 256)},
}


@pytest.fixture(scope="module")
def works(smollm2_loaded: Any) -> list[ScoreWork]:
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    tokenizer = load_tokenizer(resolve_model_source(MODEL))
    items = tuple(tuple(tokenizer.encode(i, add_special_tokens=False)) for i in ITEMS)
    return [ScoreWork(tuple(tokenizer.encode(q)), items, LABELS) for q in QUERIES]


def engine(smollm2_loaded: Any, **settings: Any) -> ScoringEngine:
    from cluster.mesh import build_mesh

    loaded = smollm2_loaded
    mesh = build_mesh((1, 1))
    return ScoringEngine(
        loaded.model, loaded.params, mesh, ReplicaSettings.from_keys(**settings), MODEL
    )


@pytest.fixture(scope="module")
def reference(smollm2_loaded: Any, works: list[ScoreWork]) -> list[Any]:
    """Single-item scoring, one request per call: each item its own row."""
    single = engine(smollm2_loaded)
    return [single.score_batch([work])[0] for work in works]


@pytest.mark.deep
@pytest.mark.parametrize("path", list(PATHS))
def test_other_step_shapes_stay_within_the_float32_floor(
    smollm2_loaded: Any, works: list[ScoreWork], reference: list[Any], path: str
) -> None:
    scores = engine(smollm2_loaded, **PATHS[path]).score_batch(works)  # both requests, one call
    worst = max(fp32_ratio(s, r, SMOLLM2_LAYERS) for s, r in zip(scores, reference, strict=True))
    print(f"\n[fp32 floor] {path}: worst {worst:.3f}x the floor of single-item")
    for got, want in zip(scores, reference, strict=True):
        assert_fp32_close(got, want, SMOLLM2_LAYERS, path)
