"""Benchmark: batch scoring of the RFC-008 workload as a dataset (docs/batch.md, issue 34).

Rows of a 300-token query, one 10-token item, 3 labels (token ids); each ``--shapes`` entry
``QxR`` is Q queries of R rows, in query order ("sorted") and shuffled. Side by side in one
run on this machine, with the shipped serve_config.yaml's settings and model:

- local part (no server): (e) the engine itself, each query's rows handed to it as one work
  (the best packing, in process); (d) transformers scoring batched ``query + item`` rows of
  the first ``--http-rows`` rows; (a) ``batch.score_dataset`` (``--engine local``) on a local
  Ray cluster, sorted and shuffled (wall: the job's whole time, actor start, model load and
  compiles included; steady: after its first result);
- served part: the shipped app deployed on a private Ray cluster this process starts (port
  8000 when free), then (b) ``batch.score_dataset(..., EngineOptions(engine="serve"))`` from
  the same cluster, (c) one /v1/score request per row of the first ``--http-rows`` rows at
  concurrency 4 (503s retried after Retry-After), (c') one request per query group of the
  first ``--group-rows`` rows (0: all); (c) and (c') draw queries of their own (the same
  shapes, other random ids), so the app's query cache holds none of them; the cluster is
  stopped after.

Each part prints its figures as it ends; a part not started by ``--deadline-s`` is skipped
(noted).

    python -m loadtest run batch [--shapes 200x10,20x100] [--only local|serve]
        [--http-rows 200] [--group-rows 0] [--batch-size 512] [--deadline-s 7200]
        [--large 2000x25]

(a) runs three ways: sorted input with ``--no-group``, shuffled input grouped in the job (the
default), shuffled with ``--no-group``. ``--large``: one more job, shuffled and grouped, of
the tiny random model (loadtest.bench_batch_large): the shuffle's cost at size, the object
store's peak and spill.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from loadtest.bench_batch_report import (
    NOTES,
    Rate,
    Shape,
    parse_shapes,
    stat_rate,
    steady_items_per_s,
    tables,
)
from loadtest.bench_batch_serve import (
    AS_SERVED,
    group_bodies,
    http_rate,
    local_cluster,
    row_bodies,
    serve_batch_rate,
    served_app,
    timed_job,
    warm,
)
from loadtest.client import Deadline, DeadlineExceeded
from loadtest.harness import LABELS, Option, Result, Run, Workload, timed_once, timed_together
from replicas.contract import ScoreWork
from replicas.settings import ReplicaSettings

QUERY_TOKENS, ITEM_TOKENS = 300, 10
Rows = list[dict[str, Any]]


def dataset_rows(queries: int, rows_per_query: int, seed: int = 0) -> Rows:
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


def group_works(rows: Rows) -> list[ScoreWork]:
    """One work per run of rows with the same query (rows sorted by query)."""
    works: list[ScoreWork] = []
    for row in rows:
        query = tuple(row["query"])
        if works and works[-1].query_ids == query:
            last = works[-1]
            works[-1] = ScoreWork(query, (*last.item_ids, tuple(row["item"])), LABELS)
        else:
            works.append(ScoreWork(query, (tuple(row["item"]),), LABELS))
    return works


def bench_settings() -> ReplicaSettings:
    """The shipped settings without the start-up warm-up (minutes of compiles on a CPU) and
    without the persistent compilation cache, so (e) and the first (a) jobs pay their own
    compiles ((a) jobs get an empty cache each, which only the cache-warm run reads)."""
    from batch.pipeline import settings_from_config

    return settings_from_config().replace(
        warmup_shapes=(),
        limit_to_warmup=False,
        compilation_cache_dir=None,  # every job compiles alike (and loads no recorded ones)
    )


def engine_rate(rows: Rows, settings: ReplicaSettings) -> Rate:
    """(e): the engine alone, each query's rows as one work, after one untimed work."""
    from replicas.engine.scoring_engine import ScoringEngine

    engine = ScoringEngine.from_settings(settings, warm=False)
    works = group_works(rows)
    engine.score_batch(works[:1])
    engine.wait_for_background_compiles()
    engine.score_batch(works[:1])
    each = lambda: [engine.score_batch([work]) for work in works[1:]]  # noqa: E731
    timings = timed_together({"e": each}, 1, warm=0, counters=lambda: engine.stats().as_dict())
    items, wall = sum(len(work.item_ids) for work in works[1:]), timings["e"]
    zero = dict.fromkeys(timings.moved, 0)
    return stat_rate(items, wall, zero, timings.moved, steady_items_per_s=items / wall)


def transformers_rate(rows: Rows, model: Any) -> Rate:
    """(d): transformers' batched ``query + item`` rows, one batch per query, after one
    untimed batch."""
    from loadtest.peers import hf_scorer

    scorers = [hf_scorer(work, model) for work in group_works(rows)]
    scorers[0]()
    return Rate(len(rows), timed_once(lambda: [score() for score in scorers])[0])


def batch_rate(rows: Rows, settings: ReplicaSettings, batch_size: int, group: bool) -> Rate:
    """(a): ``batch.score_dataset`` with engine actors in the job, wall and steady;
    ``group``: rows grouped by query in the job (the default) or not (``--no-group``)."""
    from batch.pipeline import EngineOptions

    options = EngineOptions(batch_size=batch_size, group=group)
    s, marks, wall = timed_job(rows, settings, options)
    return Rate(
        s.items,
        wall,
        steady_items_per_s=steady_items_per_s(marks, wall),
        engine_s=s.engine_ms / 1000,
        steps=s.steps,
        cache_hits=s.query_cache_hits,
        computed_tokens=s.computed_tokens,
        useful_tokens=s.useful_tokens,
    )


class Batch:
    """One bench run: the datasets, the results so far, the clock and the deadline."""

    def __init__(self, args: argparse.Namespace, run: Run) -> None:
        self.args, self.shapes, self.run = args, args.shapes_, run
        self.sorted = {s.label: dataset_rows(s.queries, s.rows_per_query) for s in self.shapes}
        self.shuffled = {k: random.Random(0).sample(v, len(v)) for k, v in self.sorted.items()}
        self.results: dict[str, dict[str, Rate]] = {s.label: {} for s in self.shapes}
        self.notes: list[str] = []
        self.deadline = Deadline.after(args.deadline_s)

    def part(self, shape: Shape, name: str, measure: Callable[[], Rate]) -> None:
        """Measure one run unless the deadline has passed; print it as it ends."""
        try:
            self.deadline.check()
        except DeadlineExceeded:
            self.notes.append(f"{shape.label} {name}: skipped, --deadline-s spent")
            return
        began = time.perf_counter()
        try:
            rate = measure()
        except Exception as error:  # one failed run is noted; the others still measure
            traceback.print_exc()
            self.notes.append(f"{shape.label} {name}: failed ({type(error).__name__}: {error})")
            return
        self.results[shape.label][name] = rate
        self.run.say(
            f"{shape.label} {name}: {rate.items} items, {rate.items_per_s:.1f} items/s wall, "
            f"{rate.steady:.1f} steady ({time.perf_counter() - began:.0f} s)"
        )

    def guarded(self, name: str, part: Callable[[], None]) -> None:
        """Run one part; a failure (the app never ready, say) is noted and the table of the
        runs measured so far is still written."""
        try:
            part()
        except Exception as error:
            traceback.print_exc()
            self.notes.append(f"the {name} part stopped ({type(error).__name__}: {error})")

    def local(self) -> None:
        """(e), (d), then (a) on a local Ray cluster, which is shut down after."""
        from loadtest.peers import load_hf_model

        settings = bench_settings()
        for shape in self.shapes:
            self.part(shape, "e", lambda s=shape: engine_rate(self.sorted[s.label], settings))
        model = load_hf_model()
        for shape in self.shapes:
            head = self.sorted[shape.label][: self.args.http_rows]
            self.part(shape, "d", lambda h=head, m=model: transformers_rate(h, m))
        del model
        with local_cluster(2, **AS_SERVED):
            size = self.args.batch_size
            # The targets' runs first, then the large run, then shuffled with --no-group (the
            # slowest, for comparison): a --deadline-s cut drops the least needed.
            # Each input order's first job compiles into an empty compilation cache of its own;
            # "a shuffled, cache warm" runs the shuffled job again on that cache, as a user's
            # next job with the shipped compilation_cache_dir starts with every signature warm.
            runs = [
                ("a sorted", self.sorted, False),
                ("a shuffled", self.shuffled, True),
                ("a shuffled, cache warm", self.shuffled, True),
            ]
            for shape in self.shapes:
                caches: dict[int, str] = {}  # id of the rows -> their jobs' cache folder
                for name, rows, group in runs:
                    if id(rows) not in caches:
                        caches[id(rows)] = tempfile.mkdtemp(prefix="bench-batch-cache-")
                    cached = settings.replace(compilation_cache_dir=caches[id(rows)])
                    job = lambda r=rows[shape.label], c=cached, g=group: batch_rate(r, c, size, g)  # noqa: E731
                    self.part(shape, name, job)
            if self.args.large:
                self.notes.append(self.guarded_large(settings))
            for shape in self.shapes:
                rows = self.shuffled[shape.label]
                job = lambda r=rows: batch_rate(r, settings, size, False)  # noqa: E731
                self.part(shape, "a shuffled --no-group", job)

    def guarded_large(self, settings: ReplicaSettings) -> str:
        """The large run's line (or why it has none)."""
        from loadtest.bench_batch_large import large_line

        try:
            self.deadline.check()
            return large_line(self.args.large, settings, self.args.batch_size, dataset_rows)
        except Exception as error:
            traceback.print_exc()
            return f"large run {self.args.large}: not measured ({type(error).__name__}: {error})"

    def served(self) -> None:
        """(b), (c), (c') against the shipped app on a private cluster, stopped after."""
        from batch.pipeline import settings_from_config

        settings, size = settings_from_config(), self.args.batch_size
        with served_app(self.args.port) as url:
            self.run.say(f"app ready at {url}")
            for shape in self.shapes:
                # Each run's queries are its own (another seed): the app's query cache never
                # holds a query an earlier run computed.
                probe = dataset_rows(1, shape.rows_per_query, seed=1000 + shape.rows_per_query)
                warm(url, [*group_bodies(probe), *row_bodies(probe[:1])])
                rows = self.sorted[shape.label]
                self.part(shape, "b", lambda r=rows: serve_batch_rate(url, r, settings, size))
                head = dataset_rows(shape.queries, shape.rows_per_query, seed=1)
                head = head[: self.args.http_rows]
                self.part(shape, "c", lambda h=head: http_rate(url, row_bodies(h), len(h)))
                grouped = dataset_rows(shape.queries, shape.rows_per_query, seed=2)
                grouped = grouped[: self.args.group_rows or len(grouped)]
                self.part(shape, "c'", lambda g=grouped: http_rate(url, group_bodies(g), len(g)))


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    """The local part, then the served part (``--only`` one of them)."""
    o.shapes_ = parse_shapes(o.shapes)
    batch = Batch(o, run)
    for name, part in (("local", batch.local), ("serve", batch.served)):
        if o.only in ("", name):
            batch.guarded(name, part)
    if o.only:
        batch.notes.append(f"--only {o.only}: the other part's runs are not in this table")
    title = "Batch scoring (python -m batch), RFC-008 workload as a dataset"
    return [run.result(title, tables(batch.results), notes=(*NOTES, *batch.notes))]


WORKLOAD = Workload(
    options=(
        Option("--shapes", "200x10,20x100", "QxR,...: Q queries of R rows"),
        Option("--only", "", "local: (e)(a)(d); serve: (b)(c)(c')", ("", "local", "serve")),
        Option("--http-rows", 200, "rows of (c) and (d)"),
        Option("--group-rows", 0, "rows of (c'); 0: all"), Option("--batch-size", 512),
        Option("--port", 8000, "the app's port when free"),
        Option("--deadline-s", 7200.0, "no part starts after"),
        Option("--large", "2000x25", "QxR of the large shuffled run (tiny model); '' skips"),
    ),
    measure=measure,
)  # fmt: skip
