"""Benchmark: batch scoring of the RFC-008 workload as a dataset (docs/batch.md).

Rows of a 300-token query, one 10-token item, 3 labels (token ids), ``--queries`` queries of
``--rows-per-query`` rows each, in query order ("sorted") and shuffled. Side by side in one
run on this machine, with the shipped serve_config.yaml's settings (no warm-up, as
``loadtest.bench_engine``): (e) the engine itself, each query's rows handed to it as one work
(the best packing, no Ray); (a) ``batch.score_dataset`` on a local Ray cluster, sorted and
shuffled input. Items/s of (a) count its whole wall time (actor start and model load
included: the job's cost); "steady" counts its engine seconds only. Writes its section of
docs/benchmarks.md.

    python -m loadtest.bench_batch [--queries 200] [--rows-per-query 10] [--batch-size 512]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from batch.pipeline import EngineOptions, score_dataset, settings_from_config
from batch.rows import ScoreColumns
from batch.summary import Summary, Tally
from loadtest.bench_common import LABELS, MODEL, machine_description, write_section
from replicas.contract import ScoreWork
from replicas.settings import ReplicaSettings

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
SECTION = "## Batch scoring (python -m batch), RFC-008 workload as a dataset"
QUERY_TOKENS, ITEM_TOKENS = 300, 10


def dataset_rows(queries: int, rows_per_query: int, seed: int = 0) -> list[dict[str, Any]]:
    """Token-id rows, grouped by query (sorted)."""
    rng = np.random.default_rng(seed)
    ids = lambda n: [int(t) for t in rng.integers(100, 40000, n)]  # noqa: E731
    out = []
    for q in range(queries):
        query = ids(QUERY_TOKENS)
        out += [
            {"id": f"{q}-{r}", "query": query, "item": ids(ITEM_TOKENS)}
            for r in range(rows_per_query)
        ]
    return out


def bench_settings() -> ReplicaSettings:
    """The shipped settings without the start-up warm-up (minutes of compiles on a CPU)."""
    return settings_from_config().replace(warmup_shapes=(), limit_to_warmup=False)


def engine_items_per_s(
    rows: list[dict[str, Any]], rows_per_query: int, settings: ReplicaSettings
) -> float:
    """The engine alone, each query's rows as one work, after one untimed work of each shape."""
    from replicas.engine.scoring_engine import ScoringEngine

    engine = ScoringEngine.from_settings(settings, warm=False)
    works = [
        ScoreWork(
            tuple(rows[at]["query"]),
            tuple(tuple(r["item"]) for r in rows[at : at + rows_per_query]),
            LABELS,
        )
        for at in range(0, len(rows), rows_per_query)
    ]
    engine.score_batch(works[:1])
    engine.wait_for_background_compiles()
    engine.score_batch(works[:1])
    start = time.perf_counter()
    for work in works[1:]:
        engine.score_batch([work])
    return (len(works) - 1) * rows_per_query / (time.perf_counter() - start)


def batch_run(rows: list[dict[str, Any]], settings: ReplicaSettings, batch_size: int) -> Summary:
    import ray
    import ray.data

    tally = ray.remote(Tally).options(num_cpus=0).remote()
    start = time.perf_counter()
    ds = score_dataset(
        ray.data.from_items(rows),
        settings,
        ScoreColumns(LABELS),
        EngineOptions(batch_size=batch_size),
        keep=(),
        tally=tally,
    )
    count = ds.count()
    wall = time.perf_counter() - start
    assert count == len(rows)
    return Summary.from_totals(ray.get(tally.totals.remote()), wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rows-per-query", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import ray

    settings = bench_settings()
    rows = dataset_rows(args.queries, args.rows_per_query)
    shuffled = random.Random(0).sample(rows, len(rows))
    engine = engine_items_per_s(rows, args.rows_per_query, settings)
    print(f"engine: {engine:.1f} items/s", flush=True)
    ray.init(num_cpus=2, log_to_driver=False)
    results = {}
    for name, order in (("sorted", rows), ("shuffled", shuffled)):
        results[name] = batch_run(order, settings, args.batch_size)
        print(f"batch {name}: {results[name].line()}", flush=True)
    ray.shutdown()
    table = report(args, engine, results)
    print(table)
    if not args.no_write:
        write_section(DOCS, SECTION, table)


def report(args: argparse.Namespace, engine: float, results: dict[str, Summary]) -> str:
    lines = [
        f"`python -m loadtest.bench_batch --queries {args.queries} --rows-per-query "
        f"{args.rows_per_query} --batch-size {args.batch_size}`; {MODEL}, float32, the shipped "
        "serve_config.yaml without warm-up; token-id rows (300-token query, one 10-token item, "
        "3 labels).",
        "",
        f"- machine: {machine_description()}; one run, side by side",
        "- engine: each query's rows as one work, in process, no Ray (the best packing)",
        "- batch: `batch.score_dataset` on a local Ray cluster (2 CPUs), one engine actor; wall "
        "time from the first read to the last row, actor start and model load included",
        "",
        "| run | rows | items/s (wall) | items/s (engine s) | wall s | engine s | engine steps "
        "| query cache hits | computed / useful tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| engine, grouped | {args.queries * args.rows_per_query} | | {engine:.1f} | | | | | |",
    ]
    for name, s in results.items():
        padding = s.computed_tokens / s.useful_tokens if s.useful_tokens else float("nan")
        engine_s = s.engine_ms / 1000
        steady = s.items / engine_s if engine_s else float("nan")
        lines.append(
            f"| batch, {name} | {s.rows} | {s.items_per_s:.1f} | {steady:.1f} | {s.wall_s:.1f} | "
            f"{engine_s:.1f} | {s.steps} | {s.query_cache_hits} | {padding:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
