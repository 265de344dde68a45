"""Score heads (semantics 18) against transformers fp32: the four head classes loaded from
tiny ``save_pretrained`` safetensors directories, scored by the engine multi-item (shared
prefix) and per item (``item_first`` rows), compared with transformers' outputs of the same
conversations in left- and right-padded batches."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.head_helpers import hf_head_outputs, save_tiny_head

TOLERANCE = 1e-4
SETTINGS = {
    "token_buckets": (16, 32),
    "item_token_buckets": (16, 32),
    "max_multi_item_seq_len": 256,
    "background_compile": False,
    "multi_item_scoring_delimiter": 0,
}
QUERY_LEN, ITEM_LENS = 11, (4, 0, 7, 1, 5)


@pytest.fixture(scope="module")
def mesh():
    return build_mesh((1, 1))


def _work(vocab: int, num_labels: int, item_first: bool = False) -> ScoreWork:
    rng = np.random.default_rng(7)
    query = tuple(int(t) for t in rng.integers(1, vocab, QUERY_LEN))
    items = tuple(tuple(int(t) for t in rng.integers(1, vocab, n)) for n in ITEM_LENS)
    return ScoreWork(query, items, tuple(range(num_labels)), item_first)


# every class, with 1, 2 and 3 labels (qwen3-seqcls-1 serves in tests/serve/test_serve_heads.py)
@pytest.mark.parametrize(
    "variant",
    ["llama-seqcls-1", "qwen2-seqcls-2", "qwen3-seqcls-3", "qwen2-reward", "gemma2-seqcls-1"],
)
def test_head_outputs_equal_transformers_multi_and_single_item(variant, mesh, tmp_path):
    directory = save_tiny_head(variant, tmp_path)
    loaded = load_model(directory, mesh)
    head = loaded.config.head
    assert head is not None and "lm_head" not in loaded.params
    engine = ScoringEngine(
        loaded.model, loaded.params, mesh, ReplicaSettings.from_keys(**SETTINGS), variant
    )
    multi = _work(loaded.config.vocab_size, head.num_labels)
    single = _work(loaded.config.vocab_size, head.num_labels, item_first=True)
    # one call: the multi-item work shares its query, the item_first work runs per row
    shared, first = engine.score_batch([multi, single])
    rows = [list(multi.query_ids + item) for item in multi.item_ids]
    rows_first = [list(item + multi.query_ids) for item in multi.item_ids]
    for left in (False, True):
        reference = hf_head_outputs(directory, rows, left)
        assert reference.shape == (len(ITEM_LENS), head.num_labels)
        assert np.abs(shared - reference).max() <= TOLERANCE
        assert np.abs(first - hf_head_outputs(directory, rows_first, left)).max() <= TOLERANCE
    assert np.abs(reference).max() > 0.1  # outputs are not trivially zero


def test_many_items_chunked_and_a_cached_query_keep_head_outputs_exact(mesh, tmp_path):
    """40 responses over several steps behind one prompt, then again with the prompt in the
    query cache: every reward equals transformers' for its conversation alone."""
    directory = save_tiny_head("qwen2-reward", tmp_path)
    loaded = load_model(directory, mesh)
    settings = ReplicaSettings.from_keys(**{**SETTINGS, "item_tokens_per_step": 32})
    engine = ScoringEngine(loaded.model, loaded.params, mesh, settings, "reward")
    rng = np.random.default_rng(3)
    query = tuple(int(t) for t in rng.integers(1, 256, 24))
    items = tuple(tuple(int(t) for t in rng.integers(1, 256, n)) for n in rng.integers(1, 6, 40))
    work = ScoreWork(query, items, (0,))
    assert sum(map(len, items)) > 3 * 32  # more item tokens than three steps hold
    (cold,) = engine.score_batch([work])
    hits = engine.stats().query_cache_hits
    (warm,) = engine.score_batch([work])
    assert engine.stats().query_cache_hits == hits + 1
    assert_fp32_close(warm, cold)
    reference = hf_head_outputs(directory, [list(query + item) for item in items], left=True)
    assert np.abs(cold - reference).max() <= TOLERANCE
