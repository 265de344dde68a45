"""The scoring engine on a tiny random-weight model: parity between layouts, isolation,
determinism, batch independence, static shapes and limits."""

import dataclasses

import jax
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.contract import ScoreWork, check_model_limits
from replicas.engine.scoring_engine import ScoringEngine
from replicas.engine_contract import EngineStats
from replicas.errors import ScoringError
from replicas.model.causal_lm import CausalLM
from replicas.model.config import ModelConfig
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import FakeEngine
from tests.support.fp32 import assert_fp32_close, assert_fp32_close_ragged

VOCAB = 300
DELIMITER = 0
SMALL = {
    "token_buckets": (16, 32, 64, 128, 256, 512),
    "item_token_buckets": (16, 32, 64, 128, 512),
    "max_multi_item_seq_len": 512,
    "background_compile": False,  # tests/engine/test_engine_compiles.py covers background compiles
}


@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(
        family="llama",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    model = CausalLM(config)
    return model, model.init_params(jax.random.PRNGKey(0)), build_mesh((1, 1))


def make_engine(tiny, **overrides):
    model, params, mesh = tiny
    return ScoringEngine(
        model, params, mesh, ReplicaSettings.from_keys(**{**SMALL, **overrides}), "tiny"
    )


@pytest.fixture(scope="module")
def engines(tiny):
    return {
        "single": make_engine(tiny),
        "shared_prefix": make_engine(tiny, multi_item_scoring_delimiter=DELIMITER),
        "packed_reference": make_engine(
            tiny, multi_item_scoring_delimiter=DELIMITER, layout="packed_reference"
        ),
        "fused": make_engine(tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=128),
    }


def ids(rng, n):
    return tuple(int(t) for t in rng.integers(1, VOCAB, n))


def work(seed=0, query=13, item_lens=(3, 0, 7, 1), labels=(5, 7, 9), item_first=False):
    rng = np.random.default_rng(seed)
    items = tuple(ids(rng, n) for n in item_lens)
    return ScoreWork(ids(rng, query), items, labels, item_first)


@pytest.mark.parametrize("layout", ["shared_prefix", "packed_reference", "fused"])
def test_multi_item_equals_single_item(engines, layout):
    works = [work(0), work(1, query=40, item_lens=(5,) * 9, labels=(3,)), work(2, query=1)]
    single = engines["single"].score_batch(works)
    multi = engines[layout].score_batch(works)
    assert_fp32_close_ragged(multi, single, what=layout)
    assert [m.shape for m in multi] == [(4, 3), (9, 1), (4, 3)]


def test_layouts_agree_with_each_other_at_128_items_and_many_labels(engines):
    rng = np.random.default_rng(3)
    big = ScoreWork(
        ids(rng, 20), tuple(ids(rng, int(n)) for n in rng.integers(0, 4, 128)), tuple(range(1, 40))
    )
    prefix = engines["shared_prefix"].score_batch([big])
    reference = engines["packed_reference"].score_batch([big])
    assert prefix[0].shape == (128, 39)
    assert_fp32_close_ragged(prefix, reference)
    assert_fp32_close_ragged(prefix, engines["single"].score_batch([big]))


@pytest.mark.parametrize("layout", ["shared_prefix", "packed_reference", "fused"])
def test_changing_one_item_leaves_the_others_bit_identical(engines, layout):
    engine = engines[layout]
    base = work(4, item_lens=(3, 5, 2, 6))
    same_len = ScoreWork(base.query_ids, ((7, 8, 9), *base.item_ids[1:]), base.label_ids)
    other_len = ScoreWork(base.query_ids, ((7,), *base.item_ids[1:]), base.label_ids)
    (a,), (b,), (c,) = (engine.score_batch([w]) for w in (base, same_len, other_len))
    assert not np.array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1:], b[1:])
    if layout == "shared_prefix":
        np.testing.assert_array_equal(a[1:], c[1:])
    else:  # other items move inside the packed (fused) row: same math, other summation order
        assert_fp32_close(c[1:], a[1:])


def test_empty_items_score_the_next_token_after_the_query(engines):
    query_only = work(5, item_lens=(0,))
    for engine in engines.values():
        (scores,) = engine.score_batch([query_only])
        (reference,) = engines["single"].score_batch([query_only])
        assert_fp32_close(scores, reference)


def test_many_empty_items_behind_a_one_token_query_fit_their_score_rows(tiny, engines):
    """Issue 43's schemathesis body: ``query=[1]``, 1023 empty items and one label. The work
    is 1 token but 1023 score rows; a fused row of 128 tokens holds 128 score rows, so it
    runs unfused, and every item scores the next token after the query alone (semantics 4)."""
    empties = ScoreWork((1,), ((),) * 1023, (5,))
    (alone,) = engines["single"].score_batch([ScoreWork((1,), ((),), (5,))])
    want = np.repeat(alone, 1023, axis=0)
    long = {"multi_item_scoring_delimiter": DELIMITER, "max_multi_item_seq_len": 2048}
    long |= {"max_items_per_request": 1024}
    for fused in (0, 128):
        engine = make_engine(tiny, **long, fused_step_tokens=fused)
        (scores,) = engine.score_batch([empties])
        assert scores.shape == (1023, 1)
        assert_fp32_close(scores, want, what=f"fused_step_tokens={fused}")
    # Beside small works in one call: the fused row takes them, the empties run apart.
    small = work(50, query=9, item_lens=(0, 1, 2))
    mixed = engine.score_batch([small, empties, small])
    assert [m.shape for m in mixed] == [(3, 3), (1023, 1), (3, 3)]
    assert_fp32_close(mixed[1], want)


def test_no_items_give_an_empty_result_without_running(engines):
    engine = engines["shared_prefix"]
    before = engine.compile_count
    (scores,) = engine.score_batch([ScoreWork((1, 2), (), (3,))])
    assert scores.shape == (0, 1)
    assert engine.compile_count == before


def test_item_first_is_served_per_item_in_multi_item_mode(engines):
    flipped = work(6, item_first=True)
    np.testing.assert_array_equal(
        engines["shared_prefix"].score_batch([flipped])[0],
        engines["single"].score_batch([flipped])[0],
    )
    assert not np.allclose(
        engines["single"].score_batch([flipped])[0],
        engines["single"].score_batch([work(6)])[0],
    )


def test_identical_runs_are_bit_identical(engines):
    for engine in engines.values():
        first, second = engine.score_batch([work(7)]), engine.score_batch([work(7)])
        np.testing.assert_array_equal(first[0], second[0])


def test_the_engine_and_the_fake_answer_stats_of_one_type_with_the_same_fields(engines):
    engine = engines["shared_prefix"]
    engine.score_batch([work(7)])
    real = engine.stats()
    fake = FakeEngine(ReplicaSettings.from_keys(**SMALL), engine.info).stats()
    assert type(real) is type(fake) is EngineStats
    assert dataclasses.fields(real) == dataclasses.fields(fake)
    assert list(real.as_dict()) == list(fake.as_dict())  # GET /v1/stats: the same keys
    assert real.steps > 0 and real.compile_count > 0 and fake.steps == 0


def test_scores_do_not_depend_on_the_other_requests_in_the_step(engines):
    target = work(8, query=20)
    others = [work(9, query=25, item_lens=(4, 4)), work(10, query=18, labels=(1, 2))]
    for engine in engines.values():
        alone = engine.score_batch([target])[0]
        shared = engine.score_batch([others[0], target, others[1]])[1]
        assert_fp32_close(shared, alone)


def test_small_works_run_fused_in_one_pass_and_concurrent_ones_share_it(engines):
    engine, reference = engines["fused"], engines["shared_prefix"]
    small = [work(30 + s, query=9, item_lens=(0, 1, 2)) for s in range(12)]  # 12 tokens each
    before = engine.stats().steps
    together = engine.score_batch(small)
    assert engine.stats().steps == before + 2  # 144 tokens: two rows of <= 128
    assert engine.last_signatures[0][0] == "fused"
    assert_fp32_close_ragged(together, reference.score_batch(small))
    for alone, scores in zip(small, together, strict=True):
        assert_fp32_close(engine.score_batch([alone])[0], scores)
    # A work beyond fused_step_tokens runs as before: its prefix, then its items.
    engine.score_batch([work(43, query=100, item_lens=(20, 20))])
    assert [kind for kind, _ in engine.last_signatures] == ["prefix", "items"]


def test_a_cached_query_runs_its_items_behind_the_cache_not_fused(tiny):
    engine = make_engine(tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=64)
    large = work(44, query=20, item_lens=(30, 30))  # 80 tokens: prefix, then items; cached
    small = ScoreWork(large.query_ids, ((5, 6, 7),), large.label_ids)  # 23 tokens
    engine.score_batch([large])
    hits = engine.stats().query_cache_hits
    (cached,) = engine.score_batch([small])
    assert [kind for kind, _ in engine.last_signatures] == ["items"]
    assert engine.stats().query_cache_hits == hits + 1
    other = make_engine(tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=64)
    (fused,) = other.score_batch([small])
    assert [kind for kind, _ in other.last_signatures] == ["fused"]
    assert_fp32_close(cached, fused)


def test_a_recurring_query_is_fused_once_then_cached_and_its_items_run_behind_it(tiny):
    engine = make_engine(tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=64)
    first = work(46, query=32, item_lens=(3, 4))  # 39 tokens: fits, and its query is long
    again = ScoreWork(first.query_ids, ((8, 9), (10,)), first.label_ids)
    short = work(47, query=31, item_lens=(3, 4))  # a query too short to be worth caching
    kinds = []
    answers = []
    for each in (first, again, again, short, short):
        answers.append(engine.score_batch([each])[0])
        kinds.append([kind for kind, _ in engine.last_signatures])
    assert kinds == [["fused"], ["prefix", "items"], ["items"], ["fused"], ["fused"]]
    assert engine.stats().query_cache_entries == 1
    np.testing.assert_array_equal(answers[1], answers[2])  # the cached query, bit for bit
    (fused_again,) = make_engine(
        tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=64
    ).score_batch([again])
    assert_fp32_close(answers[1], fused_again)
    # Two works of one call sharing a long query: its prefix once, cached for the next call.
    pair = [ScoreWork((*short.query_ids, 3), item, short.label_ids) for item in (((4,),), ((5,),))]
    engine.score_batch(pair)
    assert [kind for kind, _ in engine.last_signatures] == ["prefix", "items"]
    # Where a prefix step holds one query (the shipped CPU's batch_buckets), two recurring
    # queries in one call keep sharing a fused row; each alone is cached.
    one = make_engine(
        tiny, multi_item_scoring_delimiter=DELIMITER, fused_step_tokens=128, batch_buckets=(1,)
    )
    seen = [work(48 + s, query=33, item_lens=(2,)) for s in range(2)]
    expected = (["fused"], ["fused"], ["prefix", "items"], ["items"])
    for call, kinds in zip((seen, seen, seen[:1], seen[:1]), expected, strict=True):
        one.score_batch(call)
        assert [kind for kind, _ in one.last_signatures] == kinds


def test_warmup_compiles_fused_rows_up_to_the_budget_in_steps_of_two(tiny):
    engine = make_engine(
        tiny,
        multi_item_scoring_delimiter=DELIMITER,
        fused_step_tokens=128,
        warmup_shapes=((20, 3, 6, 3),),
    )
    fused = [dims for kind, dims in engine.warmup_keys() if kind == "fused"]
    assert sorted((d.rows, d.tokens, d.labels) for d in fused) == [
        (1, 16, 4), (1, 32, 4), (1, 64, 4), (1, 128, 4)
    ]  # fmt: skip
    engine.warmup()
    compiled = engine.compile_count
    engine.score_batch([work(45, query=17, item_lens=(5, 6, 7))])  # 35 tokens: on (1, 64)
    assert engine.compile_count == compiled


def test_same_bucket_never_compiles_twice(tiny):
    engine = make_engine(tiny, multi_item_scoring_delimiter=DELIMITER)
    engine.score_batch([work(11, query=20, item_lens=(3, 5, 2))])
    compiled = engine.compile_count  # prefix T=32, items (B=1, T=32, S=16, W=8, C=4)
    # other item count (3 -> 4) and lengths inside the same buckets: item count is no axis
    engine.score_batch([work(12, query=30, item_lens=(8, 1, 6, 1))])
    assert engine.compile_count == compiled
    engine.score_batch([work(13, query=40, item_lens=(3,))])  # T 32 -> 64: prefix + items
    assert engine.compile_count == compiled + 2


def test_warmup_compiles_the_configured_shapes_so_traffic_does_not(tiny):
    engine = make_engine(
        tiny, multi_item_scoring_delimiter=DELIMITER, warmup_shapes=((20, 3, 6, 3),)
    )
    assert engine.warmup() == 3  # prefix + items, and the item_first (single-item) step
    engine.score_batch([work(14, query=17, item_lens=(5, 6, 7))])
    engine.score_batch([work(14, query=17, item_lens=(5, 6, 7), item_first=True)])
    assert engine.compile_count == 3


def test_warmup_batch_sizes_compile_the_batch_buckets_concurrent_traffic_reaches(tiny):
    engine = make_engine(
        tiny,
        multi_item_scoring_delimiter=DELIMITER,
        warmup_shapes=((20, 3, 6, 3),),
        batch_buckets=(1, 4),
        warmup_batch_sizes=(1, 4),
    )
    assert engine.warmup() == 6  # prefix, items and rows at B=1 and B=4
    three = [work(s, query=17, item_lens=(5, 6, 7)) for s in (20, 21, 22)]
    engine.score_batch(three)  # three requests in one step: batch bucket 4
    assert engine.compile_count == 6


def test_the_queries_of_a_step_run_in_one_batched_prefix_step(tiny):
    engine = make_engine(
        tiny, multi_item_scoring_delimiter=DELIMITER, batch_buckets=(1, 4), query_cache_bytes=0
    )
    three = [work(s, query=9 + s, item_lens=(5, 6, 7)) for s in (0, 1, 2)]  # 3 query lengths
    together = engine.score_batch(three)
    assert engine.stats().steps == 2  # one prefix step of 3 queries, one item-stream step
    for alone, scores in zip(three, together, strict=True):
        (expected,) = engine.score_batch([alone])
        assert_fp32_close(scores, expected)


def test_limits_raise_clear_errors(tiny):
    """The replica refuses over-limit work (``check_model_limits`` on its engine's info, in
    ``ScoringReplica.score_timed``); the engine trusts it."""
    engine = make_engine(
        tiny,
        multi_item_scoring_delimiter=DELIMITER,
        max_items_per_request=4,
        max_multi_item_seq_len=40,
    )
    with pytest.raises(ScoringError, match="max_items_per_request") as too_many:
        check_model_limits(work(15, item_lens=(1,) * 5), engine.info)
    assert too_many.value.reason == "too_many_items"
    with pytest.raises(ScoringError, match="max_multi_item_seq_len"):
        check_model_limits(work(16, query=30, item_lens=(4, 4)), engine.info)  # 30+1+2*5: 41


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (ScoreWork((), ((1,),), (1,)), "empty_query"),
        (ScoreWork((1,), ((1,),), ()), "empty_label_token_ids"),
        (ScoreWork((1,), ((1,),), (VOCAB,)), "token_id_exceeds_vocab"),
        (ScoreWork((1, VOCAB + 5), ((1,),), (1,)), "token_id_exceeds_vocab"),
        (ScoreWork((1, DELIMITER), ((1,),), (1,)), "delimiter_in_content"),
        (ScoreWork((1,), ((2, DELIMITER),), (1,)), "delimiter_in_content"),
    ],
)
def test_bad_work_is_refused_before_anything_runs(engines, bad, reason):
    engine = engines["shared_prefix"]
    before = engine.compile_count
    with pytest.raises(ScoringError) as error:
        engine.score_batch([work(17), bad])
    assert error.value.reason == reason
    assert engine.compile_count == before


def test_delimiter_outside_the_vocabulary_fails_naming_the_setting(tiny):
    with pytest.raises(SettingsError, match="multi_item_scoring_delimiter"):
        make_engine(tiny, multi_item_scoring_delimiter=VOCAB)
