"""loadtest.bench_batch's pure parts: shapes, the dataset, query groups, rates, its tables.

No Ray, no server, no jax compile: runs in about a second.
"""

from __future__ import annotations

import json

import pytest

from loadtest.bench_batch import dataset_rows, group_works
from loadtest.bench_batch_report import (
    Rate,
    Shape,
    parse_shapes,
    ratios,
    stat_rate,
    steady_items_per_s,
    tables,
)
from loadtest.bench_batch_serve import group_bodies, row_bodies


def test_shapes_parse_and_refuse_what_is_not_QxR() -> None:
    assert parse_shapes("200x10, 20x100") == (Shape(200, 10), Shape(20, 100))
    assert Shape(20, 100).rows == 2000 and Shape(20, 100).label == "20x100"
    for bad in ("200", "x10", "20x0", "ax3", ""):
        with pytest.raises(ValueError, match="--shapes"):
            parse_shapes(bad)


def test_rows_share_each_query_and_group_into_one_work_per_query() -> None:
    rows = dataset_rows(3, 4)
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    assert all(len(r["query"]) == 300 and len(r["item"]) == 10 for r in rows)
    works = group_works(rows)
    assert [len(w.item_ids) for w in works] == [4, 4, 4]
    assert [list(w.query_ids) for w in works] == [rows[i]["query"] for i in (0, 4, 8)]
    assert [list(i) for i in works[1].item_ids] == [r["item"] for r in rows[4:8]]
    # a query's rows split by another query's are two groups, as a client sees them
    split = [rows[0], rows[4], rows[1]]
    assert [len(w.item_ids) for w in group_works(split)] == [1, 1, 1]


def test_http_bodies_one_per_row_and_one_per_query_group() -> None:
    rows = dataset_rows(2, 3)
    per_row = [json.loads(b) for b in row_bodies(rows)]
    assert [b["items"] for b in per_row] == [[r["item"]] for r in rows]
    groups = [json.loads(b) for b in group_bodies(rows)]
    assert [b["query"] for b in groups] == [rows[0]["query"], rows[3]["query"]]
    assert [b["items"] for b in groups] == [
        [r["item"] for r in rows[:3]],
        [r["item"] for r in rows[3:]],
    ]
    assert groups[0]["label_token_ids"] == [7042, 4528, 11452]


def test_steady_rate_counts_only_what_arrives_after_the_first_result() -> None:
    assert steady_items_per_s([(10.0, 500), (12.0, 100), (14.0, 300)]) == 100.0
    assert steady_items_per_s([(10.0, 500)]) is None
    # arrivals within a fifth of the wall time (a burst at the end): no steady figure
    assert steady_items_per_s([(10.0, 500), (12.0, 100), (14.0, 300)], wall_s=20.0) == 100.0
    assert steady_items_per_s([(10.0, 500), (10.5, 100), (11.0, 300)], wall_s=20.0) is None
    assert Rate(20, 10.0).steady == 2.0  # no steady figure, no engine seconds: wall
    assert Rate(20, 10.0, engine_s=4.0).steady == 5.0
    assert Rate(20, 10.0, steady_items_per_s=3.0, engine_s=4.0).steady == 3.0


def test_stat_rate_is_the_growth_of_the_replica_counters() -> None:
    before = {"engine_seconds": 1.0, "steps": 3, "computed_tokens": 100, "useful_tokens": 80}
    after = {"engine_seconds": 5.0, "steps": 7, "computed_tokens": 600, "useful_tokens": 480}
    rate = stat_rate(40, 8.0, before, after, retried_503=2)
    assert (rate.engine_s, rate.steps, rate.cache_hits) == (4.0, 4, None)
    assert rate.padding == 500 / 400 and rate.items_per_s == 5.0 and rate.retried_503 == 2


def test_ratios_and_the_section_show_every_run_and_target() -> None:
    runs = {
        "e": Rate(100, 10.0, steady_items_per_s=10.0),
        "a sorted": Rate(200, 40.0, steady_items_per_s=9.0),
        "a shuffled": Rate(200, 50.0, steady_items_per_s=6.0),
        "a shuffled, cache warm": Rate(200, 30.0, steady_items_per_s=7.0, engine_s=21.0),
        "c": Rate(20, 10.0),
        "c'": Rate(200, 25.0),
    }
    values = ratios(runs)
    assert values["a/e"] == pytest.approx(0.9) and values["a/c'"] == pytest.approx(9 / 8)
    assert values["a/c"] == pytest.approx(4.5) and values["grouped/sorted"] == pytest.approx(10 / 9)
    assert values["shuffled slowdown"] == pytest.approx(1.5)
    assert values["shuffled slowdown (wall)"] == pytest.approx(5.0 / 4.0)
    assert values["a warm/e"] == pytest.approx(200 / 21.0 / 10.0)  # per engine second
    body = "\n".join(t.title + "\n" + t.markdown() for t in tables({"200x10": runs}))
    assert (
        "200x10 (queries x rows per query):" in body
        and "| 200x10 | 0.90 | 1.12 | 4.50 | 1.11 |  | 0.95 | 1.50 | 1.25 |  |" in body
    )
    assert "(b) `--engine serve`" not in body  # a run not measured has no line
