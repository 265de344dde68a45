"""Grouping inside the job (batch/grouping.py, issue 46): each row's group key, the calls cut
between groups, and an engine stage that gets every row of a query in one call whatever the
row order. Plain functions and a recording stage: no Ray, no engine (the jobs with grouping
on run in tests/batch/test_batch.py, tests/batch/test_batch_nodes.py and
tests/batch/test_batch_serve_modes.py).
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from batch.grouping import GROUP, GroupBy, InCalls, add_group_key, call_ranges, group_keys
from batch.score_stage import ITEM_IDS, QUERY_IDS
from batch.works import work_columns
from replicas.contract import PromptWork, ScoreWork


@pytest.mark.parametrize(
    ("sizes", "call_rows", "calls"),
    [
        ([3, 2, 4], 5, [(0, 5), (5, 9)]),  # whole groups; the third does not fit the first call
        ([3, 2, 4], 9, [(0, 9)]),
        ([2, 7, 1], 3, [(0, 2), (2, 5), (5, 8), (8, 10)]),  # 7 rows: calls of 3, 3, then 1 + 1
        ([6], 3, [(0, 3), (3, 6)]),
        ([1, 1, 1], 2, [(0, 2), (2, 3)]),
        ([], 4, []),
    ],
)
def test_calls_hold_whole_groups_and_split_only_a_group_larger_than_a_call(
    sizes: list[int], call_rows: int, calls: list[tuple[int, int]]
) -> None:
    keys = np.repeat(np.arange(len(sizes)), sizes)
    assert call_ranges(keys, call_rows) == calls
    assert all(b - a <= call_rows for a, b in calls)


def score_table(queries: list[list[int] | None]) -> pa.Table:
    query_ids = pa.array(queries, pa.list_(pa.int32()))
    items = pa.array(
        [None if q is None else [[7]] for q in queries], pa.list_(pa.list_(pa.int32()))
    )
    return pa.table({"id": list(range(len(queries))), QUERY_IDS: query_ids, ITEM_IDS: items})


def test_score_rows_of_one_query_share_a_key_and_a_refused_row_gets_zero() -> None:
    table = score_table([[1, 2, 3], [4, 5], [1, 2, 3], None, [1, 2]])
    keys = group_keys(table.slice(1), GroupBy("score"))  # a sliced table: offsets respected
    assert keys[1] == group_keys(table, GroupBy("score"))[0]
    assert keys[0] != keys[1] and keys[3] not in (keys[1], 0) and keys[2] == 0
    assert (
        group_keys(table, GroupBy("score")).tolist() == group_keys(table, GroupBy("score")).tolist()
    )


def test_work_keys_by_query_and_labels_by_context_blocks_and_by_length() -> None:
    works = [
        ScoreWork((1, 2), ((3,),), (5, 6)),
        ScoreWork((1, 2), ((4,),), (5, 6)),
        ScoreWork((1, 2), ((4,),), (5,)),  # other labels: another work
        PromptWork((tuple(range(40)),), 1, None, False, 3),
        None,
    ]
    table = pa.table(work_columns(works))
    keys = group_keys(table, GroupBy("query", (16, 64)))
    assert keys[0] == keys[1] != keys[2] and keys[4] == 0
    assert keys[3] == 64, "a prompt work (query_likelihood) by its length's token bucket"
    assert group_keys(table, GroupBy("length", (16, 64))).tolist()[:4] == [16, 16, 16, 64]
    # loglik: two prompts with the same 32-token context blocks, other continuations
    prompts = [(*range(35), 90, 91), (*range(35), 92), (*range(30), 93)]
    table = pa.table(
        work_columns([PromptWork((p,), 1, None, False, len(p)) for p in prompts])
        | {"tail": pa.array([2, 1, 1], pa.int32())}
    )
    keys = group_keys(table, GroupBy("context", (16, 64), "tail"))
    assert keys[0] == keys[1] != keys[2]


class Recording:
    """A stage that records the ids of each call it gets and adds a column."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.calls.append(batch.column("id").to_pylist())
        return batch.append_column("seen", pa.array([True] * batch.num_rows))


def test_every_row_of_a_query_reaches_one_call_whatever_the_order() -> None:
    sizes = [3, 5, 1, 4, 2]
    queries = [[q + 1] * (q + 2) for q, n in enumerate(sizes) for _ in range(n)]
    order = list(range(len(queries)))
    random.Random(0).shuffle(order)
    table = add_group_key(score_table([queries[i] for i in order]), GroupBy("score"))
    table = table.set_column(0, "id", pa.array(order))
    stage = Recording()
    out = InCalls.around(stage, call_rows=6)(table)
    assert sorted(out.column("id").to_pylist()) == list(range(len(queries)))
    assert GROUP not in out.column_names and all(out.column("seen").to_pylist())
    call_of = {row: n for n, call in enumerate(stage.calls) for row in call}
    for q, _ in enumerate(sizes):
        rows = [i for i, query in enumerate(queries) if query == [q + 1] * (q + 2)]
        assert len({call_of[r] for r in rows}) == 1, f"query {q}: one call"
    assert all(len(call) <= 6 for call in stage.calls)


def test_embed_rows_key_by_their_token_bucket_and_fill_calls_of_one_length() -> None:
    """``embed`` (issue 44): each row's key is its ids' token bucket (a refused row: 0), so a
    shuffled dataset's calls hold rows of one length, packed into full steps."""
    from batch.embed_stage import IDS

    lengths = [3, 40, 12, 60, 5, 33, 16, 64]
    ids = [list(range(n)) for n in lengths]
    order = list(range(len(ids)))
    random.Random(1).shuffle(order)
    table = pa.table({"id": pa.array(order), IDS: pa.array([ids[i] for i in order] + [None][:0])})
    by = GroupBy("length", (16, 64), ids_column=IDS)
    assert group_keys(table, by).tolist() == [16 if lengths[i] <= 16 else 64 for i in order]
    refused = pa.table({IDS: pa.array([None, [1, 2]], pa.list_(pa.int32()))})
    assert group_keys(refused, by).tolist() == [0, 16]
    stage = Recording()
    InCalls.around(stage, call_rows=4)(add_group_key(table, by))
    for call in stage.calls:
        assert len({lengths[i] <= 16 for i in call}) == 1, "one token bucket a call"
