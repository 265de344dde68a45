"""The engine's shapes after warm-up: covering signatures, background compiles, the compile
record, the query cache and many items, on a tiny random-weight model."""

import jax
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.contract import ScoreWork, check_model_limits
from replicas.engine.group_engine import GroupEngine
from replicas.engine.layouts.dense import DenseDims
from replicas.engine.query_cache import QueryCache
from replicas.engine.scoring_engine import ScoringEngine
from replicas.errors import ScoringError
from replicas.model.causal_lm import CausalLM
from replicas.model.config import ModelConfig
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fp32 import assert_fp32_close

VOCAB = 300
SMALL = {
    "token_buckets": (16, 32, 64),
    "item_token_buckets": (16, 32, 64, 128),
    "batch_buckets": (1, 2),
    "max_multi_item_seq_len": 4096,
    "multi_item_scoring_delimiter": 0,
}


@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(
        family="qwen3",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        qk_norm=True,
    )
    model = CausalLM(config)
    return model, model.init_params(jax.random.PRNGKey(1)), build_mesh((1, 1))


def make_engine(tiny, **overrides):
    model, params, mesh = tiny
    return ScoringEngine(
        model, params, mesh, ReplicaSettings.from_keys(**{**SMALL, **overrides}), "tiny"
    )


def work(seed, query=10, item_lens=(3, 4, 2), labels=(5, 7)):
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(1, VOCAB, n))  # noqa: E731
    return ScoreWork(ids(query), tuple(ids(n) for n in item_lens), labels)


def test_uncompiled_signature_runs_on_a_covering_one_while_it_compiles_in_background(tiny):
    engine = make_engine(tiny, warmup_shapes=((30, 4, 12, 2),))  # items S=64, W=16
    engine.warmup()
    warm = engine.stats()
    (covered,) = engine.score_batch([work(1)])  # its own signature: T=16, S=16, W=4
    assert engine.stats().declined_one_off >= 1  # seen once: nothing compiles yet
    engine.score_batch([work(1)])  # it recurs: its own signature compiles behind it
    assert engine.stats().request_path_compiles == 0
    assert engine.wait_for_background_compiles(300)
    stats = engine.stats()
    assert stats.background_compiles >= 2  # its prefix and items steps
    assert stats.compile_count == warm.compile_count + stats.background_compiles
    (exact,) = engine.score_batch([work(1)])  # now on its own, exact signature
    assert_fp32_close(covered, exact)
    assert engine.stats().computed_tokens - stats.computed_tokens == 16 + 16


def test_nothing_covering_compiles_on_the_request_path_and_is_counted(tiny):
    engine = make_engine(tiny)
    engine.score_batch([work(2)])
    assert engine.stats().request_path_compiles == 2
    assert engine.stats().background_compiles == 0


def test_compile_record_makes_a_restart_compile_what_traffic_compiled_before(tiny, tmp_path):
    first = make_engine(tiny, compilation_cache_dir=str(tmp_path))
    first.score_batch([work(3), work(4, item_lens=(1,) * 40)])
    second = make_engine(tiny, compilation_cache_dir=str(tmp_path))
    assert second.warmup() == first.compile_count
    second.score_batch([work(3), work(4, item_lens=(1,) * 40)])
    assert second.stats().request_path_compiles == 0


def test_query_cache_hit_runs_only_the_items_and_equals_the_cold_scores_bit_for_bit(tiny):
    engine = make_engine(tiny, background_compile=False)
    cold_query = work(5, item_lens=(3, 1, 4))
    fresh_items = ScoreWork(cold_query.query_ids, work(6, item_lens=(2, 5)).item_ids, (5, 7))
    (cold,) = engine.score_batch([fresh_items])
    assert engine.stats().query_cache_misses == 1
    uncached = make_engine(tiny, background_compile=False, query_cache_bytes=0)
    engine.score_batch([cold_query])
    before = engine.stats()
    (warm,) = engine.score_batch([fresh_items])
    after = engine.stats()
    assert after.query_cache_hits == before.query_cache_hits + 1
    # only the item stream ran: no prefix tokens computed
    assert after.computed_tokens - before.computed_tokens == 16
    np.testing.assert_array_equal(cold, warm)
    np.testing.assert_array_equal(warm, uncached.score_batch([fresh_items])[0])
    assert uncached.stats().query_cache_entries == 0


def test_query_cache_is_lru_bounded_in_bytes_and_skips_entries_larger_than_its_budget():
    class Entry:
        def __init__(self, nbytes):
            self.nbytes = nbytes

    cache = QueryCache(capacity_bytes=100)
    assert cache.put("a", Entry(40)) and cache.put("b", Entry(40))
    assert cache.get("a") is not None  # a is now the most recently used
    assert cache.put("c", Entry(40))  # evicts b
    assert cache.get("b") is None and cache.get("c") is not None
    assert not cache.put("huge", Entry(101))
    assert cache.bytes == 80 and len(cache) == 2
    assert (cache.hits, cache.misses) == (2, 1)


def test_a_thousand_items_equal_the_same_items_scored_a_hundred_at_a_time(tiny):
    engine = make_engine(
        tiny, max_items_per_request=1000, item_tokens_per_step=128, background_compile=False
    )
    rng = np.random.default_rng(7)
    lens = tuple(int(n) for n in rng.integers(0, 6, 1000))
    big = work(8, query=12, item_lens=lens)
    (together,) = engine.score_batch([big])
    parts = [
        engine.score_batch([ScoreWork(big.query_ids, big.item_ids[i : i + 100], big.label_ids)])[0]
        for i in range(0, 1000, 100)
    ]
    assert together.shape == (1000, 2)
    assert_fp32_close(together, np.concatenate(parts))
    assert engine.stats().query_cache_hits >= 10  # the query ran once per call at most


def test_many_items_are_bounded_by_the_configured_limit_up_to_4096(tiny):
    with pytest.raises(SettingsError, match="max_items_per_request"):
        ReplicaSettings.from_keys(max_items_per_request=4097)
    engine = make_engine(tiny, max_items_per_request=10)
    with pytest.raises(ScoringError, match="max_items_per_request"):  # the replica's check
        check_model_limits(work(9, item_lens=(1,) * 11), engine.info)


def test_a_query_or_item_longer_than_one_step_holds_is_refused_by_name(tiny):
    engine = make_engine(tiny)  # longest row: min(64, 128) tokens; the replica checks it
    with pytest.raises(ScoringError, match="longest row") as error:
        check_model_limits(work(10, query=65, item_lens=(1,)), engine.info)
    assert error.value.reason == "sequence_too_long"
    with pytest.raises(ScoringError, match="longest row"):
        check_model_limits(work(11, query=4, item_lens=(65,)), engine.info)


def test_a_stale_or_foreign_compile_record_entry_is_skipped(tiny, tmp_path):
    record = make_engine(tiny, compilation_cache_dir=str(tmp_path))._compiler.record_path
    record.write_text(
        '[{"kind": "rows", "dims": [1, 1, 16, 4, 4, 9]}, {"kind": "gone", "dims": [1]},'
        ' {"kind": "prefix", "dims": [1, 16]}]'
    )
    engine = make_engine(tiny, compilation_cache_dir=str(tmp_path))
    assert engine.warmup() == 1  # only the prefix entry is still valid


def test_single_item_rows_run_in_pieces_on_a_covering_signature_with_fewer_rows(tiny):
    engine = make_engine(tiny, multi_item_scoring_delimiter=None, item_tokens_per_step=64)
    engine.ensure("rows", DenseDims(rows=1, tokens=64, labels=2))  # the only compiled step
    engine._compiler.counts["request_path"] = 0
    many = work(12, query=10, item_lens=(3, 4, 2, 5))  # 4 rows of <= 15 tokens: 4 x 16 exact
    (scores,) = engine.score_batch([many])
    engine.score_batch([many])  # it recurs: its own signature compiles behind it
    assert engine.stats().request_path_compiles == 0  # ran as 4 pieces of 1 x 64
    assert engine.wait_for_background_compiles(300)
    (exact,) = engine.score_batch([many])
    assert_fp32_close(scores, exact)


def test_traffic_signatures_are_bounded_and_a_restart_replays_only_the_kept_ones(tiny, tmp_path):
    settings = {"compilation_cache_dir": str(tmp_path), "max_traffic_signatures": 1}
    first = make_engine(tiny, background_compile=False, **settings)
    works = [
        work(20, item_lens=(3,)),
        work(21, query=40, item_lens=(50,)),
        work(22, item_lens=(1,) * 30),
    ]
    scores = [first.score_batch([w])[0] for w in works]
    items_steps = [key for key in first.executables() if key[0] == "items"]
    assert len(items_steps) == 1 and first.stats().evicted_signatures == 2
    second = make_engine(tiny, **settings)
    second.warmup()
    assert [key for key in second.executables() if key[0] == "items"] == items_steps
    for w, before in zip(works, scores, strict=True):  # evicted ones compile again, same scores
        assert_fp32_close(second.score_batch([w])[0], before)


class RecordingGroup:
    """A one-host stand-in for ``cluster.host_group.HostGroup``: runs the leader's side of
    each step and records the time limit it was given."""

    def __init__(self):
        self.limits = []

    def step(self, method, args, local, timeout_s=None):
        self.limits.append(timeout_s)
        return local(), []


def test_a_group_step_gets_host_compile_timeout_s_per_signature_it_compiles(tiny):
    settings = {"host_timeout_s": 60, "host_compile_timeout_s": 600}
    group = RecordingGroup()
    engine = make_engine(tiny, warmup_shapes=((30, 4, 12, 2),), **settings)
    engine.warmup()
    leader = GroupEngine(group, engine)
    leader.score_batch([work(5)])  # runs on the warm covering signature: compiles nothing
    leader.score_batch([work(6, query=60)])  # no warm step holds its query: compiled now
    compiled = engine.stats().request_path_compiles
    leader.score_batch([work(6, query=60)])  # compiled by the step before
    assert group.limits[0] == group.limits[2] == 60
    # Per planned signature: an item-stream step's own prefix step compiles with it.
    assert 1 <= (group.limits[1] - 60) / 600 <= compiled
