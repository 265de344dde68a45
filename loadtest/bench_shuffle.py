"""Which Ray Data operator groups a dataset's rows by query (docs/batch.md, issue 46).

Token-id rows like loadtest.bench_batch's (a 300-token query, a 10-token item, a 64-bit group
key; ``--rows`` rows of ``--queries`` queries, in random order) through, each ``--repeat``
times, the best kept: a keyed hash repartition (what batch.grouping runs; with and without
``sort``), ``groupby(key).map_groups`` (the same shuffle, sorted, one call per group), a
sort-based ``sort(key)``, and no shuffle at all; each consumed block by block.

    python -m loadtest.bench_shuffle [--rows 50000] [--queries 2000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

KEY = "_sj_group"


def table(rows: int, queries: int) -> Any:
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


def timed(build: Callable[[], Any]) -> float:
    start = time.perf_counter()
    for _ in build().iter_batches(batch_size=None, batch_format="pyarrow"):
        pass
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    import ray
    import ray.data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512, help="rows per block: n/this")
    args = parser.parse_args(argv)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=512 * 1024**2,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        rows = table(args.rows, args.queries)
        blocks = max(1, -(-args.rows // args.batch_size))
        print(f"{args.rows} rows, {rows.nbytes / 2**20:.0f} MiB, {blocks} blocks", flush=True)
        for name, build in ways(rows, blocks).items():
            best = min(timed(build) for _ in range(args.repeat))
            print(f"{name}: {best:.2f} s", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
