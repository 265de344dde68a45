"""Host-side packing: shapes land in buckets, metadata comes from lengths."""

import numpy as np
import pytest

from replicas.contract import ScoreWork
from replicas.masks import DELIMITER, PAD, QUERY
from replicas.packing import (
    BucketOverflowError,
    Buckets,
    bucket_for,
    label_bucket,
    pack_reference,
    pack_shared_prefix,
    pack_single_item,
)

BUCKETS = Buckets(
    tokens=(8, 16), item_lengths=(1, 2, 4), items=(1, 2, 4), batch=(1, 2), rows=(2, 4)
)
WORK = ScoreWork(query_ids=(11, 12, 13), item_ids=((21, 22), (), (31,)), label_ids=(5, 6, 7))


def test_bucket_for_picks_the_smallest_fitting_bucket_and_refuses_overflow():
    assert bucket_for(0, (1, 8), "n") == 1
    assert bucket_for(8, (1, 8), "n") == 8
    with pytest.raises(BucketOverflowError, match="items"):
        bucket_for(9, (1, 8), "items")
    assert [label_bucket(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


def test_single_item_rows_join_query_and_item_and_score_the_last_token():
    batch = pack_single_item([WORK], [(0, 0), (0, 1), (0, 2)], BUCKETS)
    assert batch.tokens.shape == (4, 8)
    np.testing.assert_array_equal(batch.tokens[0, :5], [11, 12, 13, 21, 22])
    np.testing.assert_array_equal(batch.score_index[:3, 0], [4, 2, 3])
    np.testing.assert_array_equal(batch.segments[1], [QUERY] * 3 + [PAD] * 5)
    np.testing.assert_array_equal(batch.labels[0], [5, 6, 7, 0])


def test_item_first_rows_put_the_item_before_the_query():
    work = ScoreWork((11, 12), ((21, 22),), (5,), item_first=True)
    batch = pack_single_item([work], [(0, 0)], BUCKETS)
    np.testing.assert_array_equal(batch.tokens[0, :4], [21, 22, 11, 12])


def test_reference_row_is_rfc008_format_with_positions_continuing_from_the_query():
    batch = pack_reference([WORK], [0], delimiter=0, buckets=BUCKETS)
    # query <d> 21 22 <d> (empty) <d> 31 <d>
    np.testing.assert_array_equal(batch.tokens[0, :10], [11, 12, 13, 0, 21, 22, 0, 0, 31, 0])
    d = DELIMITER
    np.testing.assert_array_equal(batch.segments[0, :10], [0, 0, 0, d, 1, 1, d, d, 3, d])
    np.testing.assert_array_equal(batch.positions[0, 4:6], [3, 4])
    np.testing.assert_array_equal(batch.positions[0, 8], 3)
    # last token of each item; the last query token for the empty item
    np.testing.assert_array_equal(batch.score_index[0, :3], [5, 2, 8])


def test_shared_prefix_batch_holds_the_query_once_and_items_as_a_batch():
    batch = pack_shared_prefix([WORK], [0], BUCKETS)
    assert batch.query_tokens.shape == (1, 8)
    assert batch.item_tokens.shape == (1, 4, 2)
    np.testing.assert_array_equal(batch.query_lengths, [3])
    np.testing.assert_array_equal(batch.item_lengths[0], [2, 0, 1, 0])
    np.testing.assert_array_equal(batch.item_tokens[0, 0], [21, 22])
