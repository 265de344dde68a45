"""Host-side packing: shapes land in buckets, metadata comes from lengths."""

import numpy as np
import pytest

from replicas.contract import ScoreWork
from replicas.engine.layouts.common import (
    BucketOverflowError,
    bucket_for,
    label_bucket,
    score_capacity,
    score_chunk,
    step_capacity,
)
from replicas.engine.layouts.packed_reference import split_rows
from replicas.engine.layouts.shared_prefix import chunk_items
from replicas.engine.layouts.single_item import group_rows, rows_per_step, single_item_row
from replicas.engine.layouts.stream import (
    PrefixEntry,
    StreamDims,
    StreamUnit,
    exact_dims,
    pack_stream,
    window_for,
)
from replicas.settings import ReplicaSettings, bucket_ladder

WORK = ScoreWork(query_ids=(11, 12, 13), item_ids=((21, 22), (), (31,)), label_ids=(5, 6, 7))
PREFIX = PrefixEntry(keys={}, values={}, last={}, length=3, width=4, block=0, nbytes=0)


def test_bucket_for_picks_the_smallest_fitting_bucket_and_refuses_overflow():
    assert bucket_for(0, (1, 8), "n") == 1
    assert bucket_for(8, (1, 8), "n") == 8
    with pytest.raises(BucketOverflowError, match="items"):
        bucket_for(9, (1, 8), "items")
    assert [label_bucket(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


def test_bucket_ladder_is_geometric_aligned_and_pads_little():
    ladder = bucket_ladder(16, 8192)
    assert ladder[:8] == (16, 32, 48, 64, 80, 96, 112, 128) and ladder[-1] == 8192
    assert all(b % 16 == 0 for b in ladder)
    worst = max(bucket_for(n, ladder, "t") / n for n in range(129, 8193))
    assert worst <= 1.17


def test_item_stream_runs_items_end_to_end_with_positions_after_the_query():
    (unit,) = chunk_items(WORK, 0, tokens_per_step=64)
    dims = StreamDims(batch=2, prefix=4, tokens=8, window=4, labels=4)
    unit = unit.__class__(unit.runs, unit.items, unit.offset, PREFIX)
    batch = pack_stream([unit], [WORK], dims, groups=1)
    np.testing.assert_array_equal(batch.tokens, [[21, 22, 31, 0, 0, 0, 0, 0], [0] * 8])
    np.testing.assert_array_equal(batch.positions[0], [3, 4, 3, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.item_ids[0], [0, 0, 2, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(batch.prefix_valid, [[1, 1, 1, 0], [0, 0, 0, 0]])
    # Score rows: item 0 at stream 1, empty item 1 at the prefix's last hidden state
    # (after the B * S stream states, slot 0), item 2 at stream 2.
    np.testing.assert_array_equal(batch.rows[0, :3], [1, 2 * 8 + 0, 2])
    # One group of 2 rows x 8 stream states: 16 score rows, one LM-head chunk of 16.
    assert batch.count == 3 and batch.rows.shape == (1, 16)
    np.testing.assert_array_equal(batch.labels[0, :3], [[5, 6, 7, 0]] * 3)
    assert batch.useful_tokens == 3 and len(batch.prefixes) == 2


def test_a_data_axis_gives_each_shard_its_own_rows_and_score_indices():
    (first,) = chunk_items(WORK, 0, tokens_per_step=64)
    second = StreamUnit(((1, 0, 1),), ((41,),), 3, PREFIX)
    dims = StreamDims(batch=2, prefix=4, tokens=8, window=4, labels=4)
    first = first.__class__(first.runs, first.items, first.offset, PREFIX)
    batch = pack_stream([first, second], [WORK, WORK], dims, groups=2)
    # One row per group; each group scores its own 8 stream states plus its one prefix last.
    np.testing.assert_array_equal(batch.tokens, [[21, 22, 31, 0, 0, 0, 0, 0], [41] + [0] * 7])
    np.testing.assert_array_equal(batch.rows[0, :3], [1, 8 + 0, 2])
    np.testing.assert_array_equal(batch.rows[1, :1], [0])
    # Each group's 8 stream states: 8 score rows (one chunk); the fuller group holds 3.
    assert batch.rows.shape == (2, 8) and batch.count == 3
    assert [slot.first_row for slot in batch.slots] == [0, 8]  # flat rows: g * Rg + r


def test_a_request_spreads_over_at_least_the_data_axis_behind_one_query():
    work = ScoreWork((1, 2), tuple((5,) * 3 for _ in range(10)), (1,))
    assert len(chunk_items(work, 0, tokens_per_step=64)) == 1  # no data axis: one row
    spread = chunk_items(work, 0, tokens_per_step=64, spread=4)
    assert len(spread) >= 4 and [i for u in spread for i in u.items] == list(work.item_ids)
    assert len(chunk_items(ScoreWork((1,), ((5,),) * 3, (1,)), 0, 64, spread=4)) == 3


def test_exact_dims_bucket_every_axis_and_window_covers_the_longest_item():
    units = chunk_items(ScoreWork((1,) * 5, ((2,) * 9, (3,)), (1, 2, 3)), 0, 64)
    dims = exact_dims(units, [ScoreWork((1,), (), (1, 2, 3))], 16, (1, 4), (8, 16, 32))
    assert dims == StreamDims(batch=1, prefix=16, tokens=16, window=16, labels=4)
    assert [window_for(n, 64) for n in (0, 1, 4, 5, 9, 200)] == [4, 4, 4, 8, 16, 64]


def test_many_items_are_chunked_behind_the_same_query_in_order():
    work = ScoreWork((1, 2), tuple((5,) * 3 for _ in range(10)), (1,))
    units = chunk_items(work, 7, tokens_per_step=8)
    assert [u.runs for u in units] == [((7, 0, 2),), ((7, 2, 2),), ((7, 4, 2),), ((7, 6, 2),),
                                       ((7, 8, 2),)]  # fmt: skip
    assert all(u.offset == 2 for u in units)
    long_item = ScoreWork((1,), ((5,) * 20, (6,)), (1,))
    assert [len(u.items) for u in chunk_items(long_item, 0, 8)] == [1, 1]


def test_chunks_fill_the_largest_bucket_within_the_step_budget():
    settings = ReplicaSettings.from_keys(
        item_token_buckets=(16, 48, 100, 4096), item_tokens_per_step=64
    )
    assert step_capacity(settings.engine) == 48


def test_single_item_rows_are_grouped_by_length_into_power_of_two_steps():
    works = [
        ScoreWork((1, 2, 3), ((4,), (5, 6, 7)), (1,)),
        ScoreWork((8,), ((9, 9),), (2,), item_first=True),
    ]
    assert single_item_row(works[1], 0) == (9, 9, 8)
    assert [rows_per_step(n, 64) for n in (16, 20, 33, 64, 100)] == [4, 2, 1, 1, 1]
    steps = group_rows(works, [(0, 0), (0, 1), (1, 0)], buckets=(4, 8), capacity=16)
    # sorted by length: (9 9 8), (1 2 3 4) fit two rows of 4; (1 2 3 5 6 7) needs 8
    assert steps == [(4, [(1, 0), (0, 0)]), (8, [(0, 1)])]


def test_packed_reference_rows_split_when_longer_than_the_largest_bucket():
    work = ScoreWork((1, 2), tuple((3,) * 4 for _ in range(5)), (1,))
    # query + <d> + 5 * (item + <d>) = 2 + 1 + 25 = 28 > 16: rows of 2 items (2 + 1 + 10 = 13)
    rows = split_rows(work, 0, max_length=16)
    assert [(r.first, r.count) for r in rows] == [(0, 2), (2, 2), (4, 1)]


def test_a_step_holding_fewer_than_32_score_rows_takes_them_as_one_chunk():
    assert [score_chunk(n) for n in (1, 2, 5, 16, 17, 32, 33, 64)] == [1, 2, 8, 16, 32, 32, 32, 32]
    assert [score_capacity(n) for n in (1, 5, 16, 17, 32, 33, 64)] == [1, 8, 16, 32, 32, 64, 64]
