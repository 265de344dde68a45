"""End-to-end benchmark of a running scorejax server over HTTP (loopback only).

Against a server started with `make serve` (`serve run serve_config.yaml`) it times, side by
side in one run: the server's multi-item scoring, its own single-item path (the same body with
`item_first: true`) and transformers' batched single-item scoring of the same weights in this
process. Around every timed request it reads the replica's GET /v1/stats counters (engine
seconds, padding, query cache, compiles); the targets are judged on the result.

    python -m loadtest run serve --url http://127.0.0.1:8000 [--items 1,10,100,1000]
        [--slow-items 1,10,100] [--query-tokens 300] [--item-tokens 10] [--repeats 3] [--no-hf]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import numpy as np

from loadtest.bench_common import matmul_peak_flops
from loadtest.bench_serve_report import (
    CACHE_ITEMS,
    COLUMNS,
    ID_RANGE,
    CacheResult,
    Compiles,
    ItemsRow,
    Report,
    Timing,
    Workload,
    notes,
    row_cells,
    summarize,
    targets_table,
    total,
)
from loadtest.client import Deadline, DeadlineExceeded, ScoreFailed, Server, score_body
from loadtest.harness import LABELS, MODEL, Option, Result, Run, counts, table, timed
from loadtest.harness import Workload as Workload_
from loadtest.peers import hf_scorer, load_hf_model
from replicas.contract import ScoreWork
from replicas.model.config import ModelConfig
from replicas.model.flops import multi_item_flops

SLOW_FROM = 100  # own single-item and transformers cases run once from this many items on


class Bench:
    """One run's measurements: a server, a workload and its seeded token-id generator."""

    def __init__(self, server: Server, workload: Workload) -> None:
        self.server = server
        self.workload = workload
        self._rng = np.random.default_rng(workload.seed)

    def ids(self, count: int) -> list[int]:
        """``count`` random token ids in ID_RANGE."""
        return [int(t) for t in self._rng.integers(*ID_RANGE, count)]

    def query(self) -> list[int]:
        return self.ids(self.workload.query_tokens)

    def items(self, count: int) -> list[list[int]]:
        return [self.ids(self.workload.item_tokens) for _ in range(count)]

    def repeats(self, n: int, slow: bool) -> int:
        """Timed repeats of a case: one for slow cases from SLOW_FROM items on."""
        return 1 if slow and n >= SLOW_FROM else self.workload.repeats

    def measure(self, n: int, item_first: bool) -> Timing:
        """Median over fresh random queries once the shape's own signature is compiled."""
        self.server.warm(score_body(self.query(), self.items(n), item_first))
        samples = []
        for _ in range(self.repeats(n, slow=item_first)):
            body = score_body(self.query(), self.items(n), item_first)
            samples.append(self.server.timed(body))
        return summarize(samples)

    def transformers(self, n: int, model: Any) -> float:
        """transformers batched single-item seconds (no request is in flight meanwhile)."""
        self.server.check_deadline()
        work = ScoreWork(tuple(self.query()), tuple(tuple(item) for item in self.items(n)), LABELS)
        return timed(hf_scorer(work, model), self.repeats(n, slow=True))

    def query_cache(self, n: int) -> CacheResult:
        """Cold (new query) vs warm (same query, fresh items) pairs, after warming the shape."""
        self.server.warm(score_body(self.query(), self.items(n)))
        cold, warm = [], []
        for _ in range(self.workload.repeats):
            query = self.query()
            cold.append(self.server.timed(score_body(query, self.items(n))))
            warm.append(self.server.timed(score_body(query, self.items(n))))
        return CacheResult(
            items=n,
            pairs=len(cold),
            cold_s=statistics.median(s.wall_s for s in cold),
            warm_s=statistics.median(s.wall_s for s in warm),
            warm_hits=total([s.cache_hits for s in warm]),
        )


def model_config(name: str) -> ModelConfig:
    """The model's config without jax (from config.json or GGUF metadata via transformers)."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.config import config_from_hf

    return config_from_hf(load_hf_config(resolve_model_source(name)))


@dataclass(frozen=True)
class Plan:
    """What to measure: item counts and options from the command line."""

    items: tuple[int, ...]
    slow_items: tuple[int, ...]
    hf: bool

    def counts(self) -> list[int]:
        return sorted(set(self.items) | set(self.slow_items))


def measure_row(
    bench: Bench, n: int, plan: Plan, hf_model: Any, config: ModelConfig, peak: float
) -> ItemsRow:
    """Every case of one item count; a failed case leaves "-" and a note."""
    errors: list[str] = []
    multi = single = None
    hf_s = None
    if n in plan.items:
        try:
            multi = bench.measure(n, item_first=False)
        except ScoreFailed as error:
            errors.append(f"multi-item: {error}")
    if n in plan.slow_items:
        try:
            single = bench.measure(n, item_first=True)
        except ScoreFailed as error:
            errors.append(f"single-item: {error}")
        if hf_model is not None:
            hf_s = bench.transformers(n, hf_model)
    flops = None
    if multi is not None:
        w = bench.workload
        useful = multi_item_flops(config, w.query_tokens, [w.item_tokens] * n)
        flops = useful / multi.wall_s / peak
    return ItemsRow(n, multi, single, hf_s, flops, "; ".join(errors))


def drive(server: Server, plan: Plan, workload: Workload, health_timeout_s: float) -> Report:
    """Health, peak, then every case in order; stops early (keeping results) at the deadline."""
    server.wait_healthy(health_timeout_s)
    served = server.model_id()
    if served not in (None, MODEL):
        raise SystemExit(f"the server serves {served!r}; this benchmark compares {MODEL}")
    peak = matmul_peak_flops()
    print(f"float32 matmul peak (XLA): {peak / 1e9:.0f} GFLOP/s", flush=True)
    config = model_config(MODEL)
    hf_model = None
    if plan.hf and plan.slow_items:
        print(f"loading {MODEL} into transformers (fp32) for the baseline", flush=True)
        hf_model = load_hf_model(MODEL)
    bench = Bench(server, workload)
    start_stats = server.stats()
    rows: list[ItemsRow] = []
    cache = None
    try:
        for n in plan.counts():
            rows.append(measure_row(bench, n, plan, hf_model, config, peak))
            print(rows[-1], flush=True)
        cache = bench.query_cache(CACHE_ITEMS)
    except (DeadlineExceeded, ScoreFailed) as error:
        print(f"stopped early: {error}", flush=True)
    compiles = Compiles.between(start_stats, server.stats())
    return Report(tuple(rows), cache, compiles, peak, workload, hf_model is not None)


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    """The served benchmark against ``--url`` (default http://127.0.0.1:8000)."""
    plan = Plan(tuple(counts(o.items)), tuple(counts(o.slow_items)), o.hf)
    workload = Workload(o.query_tokens, o.item_tokens, o.repeats)
    with Server(o.url or "http://127.0.0.1:8000", Deadline.after(o.deadline_s)) as server:
        report = drive(server, plan, workload, o.health_timeout_s)
    tables = [table(COLUMNS, [row_cells(r) for r in report.rows]), targets_table(report)]
    title = "End to end over HTTP, shipped serve_config.yaml"
    figures = {"peak_flops": report.peak_flops, "cache": report.cache, "compiles": report.compiles}
    return [run.result(title, tables, notes=notes(report), figures=asdict_all(figures))]


def asdict_all(figures: dict) -> dict:
    return {
        k: None if v is None else asdict(v) if is_dataclass(v) else v for k, v in figures.items()
    }


WORKLOAD = Workload_(
    url=True,
    options=(
        Option("--items", "1,10,100,1000"), Option("--slow-items", "1,10,100"),
        Option("--query-tokens", 300), Option("--item-tokens", 10), Option("--repeats", 3),
        Option("--no-hf", True, "skip the transformers baseline"),
        Option("--deadline-s", 3600.0, "whole-run budget"), Option("--health-timeout-s", 300.0),
    ),
    measure=measure,
)  # fmt: skip
