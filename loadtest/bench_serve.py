"""End-to-end benchmark of a running scorejax server over HTTP (loopback only).

Against a server started with `make serve` (`serve run serve_config.yaml`) it times, side by
side in one run: the server's multi-item scoring, its own single-item path (the same body with
`item_first: true`) and transformers' batched single-item scoring of the same weights in this
process. Around every timed request it reads the replica's GET /v1/stats counters (engine
seconds, padding, query cache, compiles). It prints a markdown table as it goes and writes the
section "## End to end over HTTP, shipped serve_config.yaml" into --output.

    python -m loadtest.bench_serve --url http://127.0.0.1:8000 [--items 1,10,100,1000]
        [--slow-items 1,10,100] [--query-tokens 300] [--item-tokens 10] [--repeats 3]
        [--no-hf] [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench_common import (
    LABELS,
    MODEL,
    hf_scorer,
    load_hf_model,
    machine_description,
    matmul_peak_flops,
    timed,
    write_section,
)
from loadtest.bench_serve_report import (
    CACHE_ITEMS,
    HEADER,
    ID_RANGE,
    SECTION,
    CacheResult,
    Compiles,
    ItemsRow,
    Report,
    Timing,
    Workload,
    format_row,
    section_body,
    summarize,
    targets_table,
    total,
)
from loadtest.server_client import (
    Deadline,
    DeadlineExceeded,
    ScoreFailed,
    Server,
    ServerNotReady,
    loopback_url,
    score_body,
)
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


def run(server: Server, plan: Plan, workload: Workload, health_timeout_s: float) -> Report:
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
    print(HEADER, flush=True)
    try:
        for n in plan.counts():
            rows.append(measure_row(bench, n, plan, hf_model, config, peak))
            print(format_row(rows[-1]), flush=True)
        cache = bench.query_cache(CACHE_ITEMS)
    except (DeadlineExceeded, ScoreFailed) as error:
        print(f"stopped early: {error}", flush=True)
    return Report(
        rows=tuple(rows),
        cache=cache,
        compiles=Compiles.between(start_stats, server.stats()),
        peak_flops=peak,
        workload=workload,
        hf=hf_model is not None,
        machine=machine_description(),
        command=command_line(),
        date=time.strftime("%Y-%m-%d"),
    )


def command_line() -> str:
    """The command that is running, for the docs section."""
    return "python -m loadtest.bench_serve " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(n) for n in text.split(",") if n.strip())
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError("item counts must be >= 1")
    return counts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; exits (status 2) on a non-loopback --url."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--items", type=_counts, default=(1, 10, 100, 1000))
    parser.add_argument("--slow-items", type=_counts, default=(1, 10, 100))
    parser.add_argument("--query-tokens", type=int, default=300)
    parser.add_argument("--item-tokens", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--output", default="docs/benchmarks.md")
    parser.add_argument("--deadline-s", type=float, default=3600.0, help="whole-run budget")
    parser.add_argument("--health-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        args.url = loopback_url(args.url)
    except ValueError as error:
        parser.error(f"--url: {error}")
    if args.repeats < 1 or args.query_tokens < 1 or args.item_tokens < 1:
        parser.error("--repeats, --query-tokens and --item-tokens must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the targets and write the docs section; 1 if not healthy."""
    args = parse_args(argv)
    plan = Plan(args.items, args.slow_items, not args.no_hf)
    workload = Workload(args.query_tokens, args.item_tokens, args.repeats)
    server = Server(args.url, Deadline.after(args.deadline_s))
    try:
        report = run(server, plan, workload, args.health_timeout_s)
    except ServerNotReady as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        server.close()
    print(targets_table(report), flush=True)
    write_section(Path(args.output), SECTION, section_body(report))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
