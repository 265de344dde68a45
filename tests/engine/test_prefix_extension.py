"""Longest cached prefix for /v1/score and /v1/rerank queries (semantics 15): a query whose
first whole blocks start a cached query reads their keys/values and computes only the rest;
its scores equal computing it whole (fp32). Tiny random-weight model, one device; the data
axis is tests/engine/test_data_axis.py's."""

import numpy as np
import pytest

from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.model_helpers import tiny_random_lm

VOCAB = 300
SETTINGS = {
    "token_buckets": (16, 32, 64, 128),
    "item_token_buckets": (16, 32, 64, 128),
    "max_multi_item_seq_len": 512,
    "multi_item_scoring_delimiter": 0,
}


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_lm("qwen3", layers=3, vocab=VOCAB, seed=1)


def engine_for(tiny, **overrides) -> ScoringEngine:
    model, params, mesh = tiny
    return ScoringEngine(
        model, params, mesh, ReplicaSettings.from_keys(**SETTINGS | overrides), "tiny"
    )


def ids(rng, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(1, VOCAB, n))


def work(rng, query: tuple[int, ...]) -> ScoreWork:
    return ScoreWork(query, (ids(rng, 3), (), ids(rng, 7)), (5, 9, 11))


def test_a_query_sharing_a_cached_querys_blocks_computes_only_the_rest(tiny) -> None:
    rng = np.random.default_rng(0)
    engine, cold = engine_for(tiny), engine_for(tiny, query_cache_bytes=0)
    system = ids(rng, 50)  # a shared system prompt: 3 whole blocks
    first = work(rng, system + ids(rng, 12))
    engine.score_batch([first])
    second = work(rng, system + ids(rng, 20))  # the extension step is not compiled yet:
    engine.score_batch([second])  # computed whole, its extension compiles in the background
    assert engine.stats().reused_prefix_tokens == 0
    engine.wait_for_background_compiles()
    third = work(rng, system + ids(rng, 21))  # same extension shape: reads 48 tokens
    [warm] = engine.score_batch([third])
    assert [kind for kind, _ in engine.last_signatures] == ["extend", "items"]
    assert engine.stats().reused_prefix_tokens == 48
    assert engine.stats().computed_prompt_tokens == len(third.query_ids) - 48
    [plain] = cold.score_batch([third])
    print(f"\n[extension] max |warm - cold|: {np.abs(warm - plain).max():.2g}")
    assert_fp32_close(warm, plain)
    # The extended query is cached whole: the same query again is an exact hit.
    hits = engine.stats().query_cache_hits
    [again] = engine.score_batch([ScoreWork(third.query_ids, third.item_ids, third.label_ids)])
    assert engine.stats().query_cache_hits == hits + 1
    np.testing.assert_array_equal(again, warm)


def test_no_extension_where_it_would_not_compute_fewer_tokens(tiny) -> None:
    rng = np.random.default_rng(1)
    engine = engine_for(tiny)
    system = ids(rng, 20)  # one whole block shared
    engine.score_batch([work(rng, system + ids(rng, 40))])
    engine.score_batch([work(rng, system + ids(rng, 40))])
    engine.wait_for_background_compiles()
    # The rest (44 tokens) pads to 64, the query's own width: nothing to gain.
    engine.score_batch([work(rng, system + ids(rng, 40))])
    assert engine.stats().reused_prefix_tokens == 0
