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
from tests.head_helpers import HEAD_VARIANTS, hf_head_outputs, save_tiny_head

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


@pytest.mark.parametrize("variant", sorted(HEAD_VARIANTS))
def test_head_outputs_equal_transformers_multi_and_single_item(variant, mesh, tmp_path):
    directory = save_tiny_head(variant, tmp_path)
    loaded = load_model(directory, mesh)
    head = loaded.config.head
    assert head is not None and "lm_head" not in loaded.params
    engine = ScoringEngine(loaded.model, loaded.params, mesh, ReplicaSettings(**SETTINGS), variant)
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
