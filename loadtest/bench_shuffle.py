"""Which Ray Data operator groups a dataset's rows by query (docs/batch.md, issue 46).

Token-id rows like loadtest.bench_batch's (a 300-token query, a 10-token item, a 64-bit group
key; ``--rows`` rows of ``--queries`` queries, in random order) through, each ``--repeat``
times, the best kept: a keyed hash repartition (what batch.grouping runs; with and without
``sort``), ``groupby(key).map_groups`` (the same shuffle, sorted, one call per group), a
sort-based ``sort(key)``, and no shuffle at all; each consumed block by block.

    python -m loadtest run shuffle [--rows 50000] [--queries 2000] [--repeat 2]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from loadtest.harness import TOOL_RESULTS, Option, Result, Run, Workload, col, table, timed_together

KEY = "_sj_group"


def table_of(rows: int, queries: int) -> Any:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    query_ids = rng.integers(100, 40000, (queries, 300)).astype(np.int32)
    which = rng.integers(0, queries, rows)
    items = rng.integers(100, 40000, (rows, 10)).astype(np.int32)
    return pa.table(
        {
            "id": np.arange(rows),
            "query": pa.array(list(query_ids[which])),
            "item": pa.array(list(items)),
            KEY: which.astype(np.int64) * 7919 + 13,
        }
    )


def same(batch: Any) -> Any:
    return batch


def ways(rows: Any, blocks: int) -> dict[str, Callable[[], Any]]:
    import ray.data

    def source() -> Any:
        parts = [rows.slice(at, 1000) for at in range(0, rows.num_rows, 1000)]
        return ray.data.from_arrow(parts).map_batches(same, batch_format="pyarrow")

    whole = {"batch_format": "pyarrow", "batch_size": None}
    return {
        "repartition(keys)": lambda: (
            source().repartition(blocks, keys=[KEY]).map_batches(same, **whole)
        ),
        "repartition(keys, sort)": lambda: (
            source().repartition(blocks, keys=[KEY], sort=True).map_batches(same, **whole)
        ),
        "groupby.map_groups": lambda: (
            source().groupby(KEY, num_partitions=blocks).map_groups(same, batch_format="pyarrow")
        ),
        "sort(key)": lambda: source().sort(KEY).map_batches(same, **whole),
        "no shuffle": lambda: source().map_batches(same, **whole),
    }


def consumed(build: Callable[[], Any]) -> Callable[[], None]:
    """A call that builds the dataset and consumes it block by block."""
    return lambda: [None for _ in build().iter_batches(batch_size=None, batch_format="pyarrow")]


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    import ray.data

    from loadtest.bench_batch_serve import local_cluster

    with local_cluster(2):
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows = table_of(o.rows, o.queries)
        blocks = max(1, -(-o.rows // o.batch_size))
        note = (
            f"{o.rows} rows, {rows.nbytes / 2**20:.0f} MiB, {blocks} blocks; best of "
            f"{o.repeat} rounds, every operator once a round in turn"
        )
        calls = {name: consumed(build) for name, build in ways(rows, blocks).items()}
        seconds = timed_together(calls, o.repeat, warm=0)
    best = [(name, seconds.best(name)) for name in calls]
    run.say(f"best seconds: {best}")
    cells = table([col("operator", left=True), col("best s", ".2f")], best)
    return [run.result("Grouping rows by query in Ray Data", [cells], notes=(note,))]


WORKLOAD = Workload(
    options=(
        Option("--rows", 50000), Option("--queries", 2000), Option("--repeat", 2),
        Option("--batch-size", 512, "rows per block: n/this"),
    ),
    measure=measure,
    out=TOOL_RESULTS,
)  # fmt: skip
