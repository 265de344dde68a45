"""Results of loadtest.bench_serve: samples, rows, ratios, targets, its tables and notes.

Pure (no network, no jax, no torch), so it unit-tests in milliseconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from loadtest import harness
from loadtest.harness import LABELS, Table, Target, col, grown, ratio
from loadtest.harness import shown as shown_

times = partial(shown_, fmt=".1f", suffix="x")  # a speed-up such as ``9.6x``, or "-"

ID_RANGE = (100, 40000)  # random token ids are drawn from [low, high)
CACHE_ITEMS = 10  # items per request of the query-cache measurement


def total(values: Sequence[float | None]) -> float | None:
    """Sum of ``values``; None if any is unknown (or there are none)."""
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None))


def stat_delta(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> float | None:
    """``after[key] - before[key]`` of a numeric counter; None where either is missing."""
    return grown(before, after).get(key)


@dataclass(frozen=True)
class Workload:
    """Random token-id requests: query and item lengths, timed repeats, the generator's seed."""

    query_tokens: int
    item_tokens: int
    repeats: int
    seed: int = 0


@dataclass(frozen=True)
class Timing:
    """Median wall seconds of timed requests; served/engine and padding over all of them."""

    wall_s: float
    served_over_engine: float | None = None
    padding: float | None = None


@dataclass(frozen=True)
class Sample:
    """One timed request: client wall seconds and the replica counters' growth around it."""

    wall_s: float
    engine_s: float | None
    computed_tokens: float | None
    useful_tokens: float | None
    cache_hits: float | None

    @classmethod
    def between(cls, wall_s: float, before: Mapping[str, Any], after: Mapping[str, Any]) -> Sample:
        return cls(
            wall_s,
            stat_delta(before, after, "engine_seconds"),
            stat_delta(before, after, "computed_tokens"),
            stat_delta(before, after, "useful_tokens"),
            stat_delta(before, after, "query_cache_hits"),
        )


def summarize(samples: Sequence[Sample]) -> Timing:
    """Median wall time; served/engine and padding over all samples together."""
    return Timing(
        wall_s=statistics.median(s.wall_s for s in samples),
        served_over_engine=ratio(
            sum(s.wall_s for s in samples), total([s.engine_s for s in samples])
        ),
        padding=ratio(
            total([s.computed_tokens for s in samples]), total([s.useful_tokens for s in samples])
        ),
    )


@dataclass(frozen=True)
class ItemsRow:
    """Every case measured at one item count (None: not measured or failed, see ``notes``)."""

    items: int
    multi: Timing | None = None
    single: Timing | None = None
    transformers_s: float | None = None
    flops_fraction: float | None = None
    notes: str = ""

    @property
    def multi_s(self) -> float | None:
        return None if self.multi is None else self.multi.wall_s

    @property
    def single_s(self) -> float | None:
        return None if self.single is None else self.single.wall_s

    @property
    def multi_vs_single(self) -> float | None:
        return ratio(self.single_s, self.multi_s)

    @property
    def multi_vs_transformers(self) -> float | None:
        return ratio(self.transformers_s, self.multi_s)

    @property
    def single_vs_transformers(self) -> float | None:
        return ratio(self.transformers_s, self.single_s)


@dataclass(frozen=True)
class CacheResult:
    """Query cache: median cold (new query) vs warm (same query, fresh items) seconds."""

    items: int
    pairs: int
    cold_s: float
    warm_s: float
    warm_hits: float | None  # growth of query_cache_hits over the warm requests

    @property
    def speedup(self) -> float | None:
        return ratio(self.cold_s, self.warm_s)


@dataclass(frozen=True)
class Compiles:
    """Growth of the replica's compile counters over the whole run (None: not reported)."""

    request_path: float | None
    background: float | None
    total: float | None

    @classmethod
    def between(cls, before: Mapping[str, Any], after: Mapping[str, Any]) -> Compiles:
        return cls(
            stat_delta(before, after, "request_path_compiles"),
            stat_delta(before, after, "background_compiles"),
            stat_delta(before, after, "compile_count"),
        )


@dataclass(frozen=True)
class Report:
    """Everything one run measured."""

    rows: tuple[ItemsRow, ...]
    cache: CacheResult | None
    compiles: Compiles
    peak_flops: float
    workload: Workload
    hf: bool


COLUMNS = (
    col("items", "d"), col("multi-item s", ".3f"), col("own single-item s", ".3f"),
    col("transformers s", ".3f"), col("multi vs own single", ".1f", "x"),
    col("multi vs transformers", ".1f", "x"), col("own single vs transformers", ".1f", "x"),
    col("served/engine", ".2f"), col("padding", ".2f"), col("model FLOP/s / peak", ".0%"),
    col("notes", left=True),
)  # fmt: skip


def row_cells(row: ItemsRow) -> tuple:
    """One table row under COLUMNS."""
    served = row.multi.served_over_engine if row.multi else None
    padding = row.multi.padding if row.multi else None
    return (row.items, row.multi_s, row.single_s, row.transformers_s, row.multi_vs_single,
            row.multi_vs_transformers, row.single_vs_transformers, served, padding,
            row.flops_fraction, row.notes)  # fmt: skip


def row_at(rows: Sequence[ItemsRow], items: int) -> ItemsRow | None:
    return next((r for r in rows if r.items == items), None)


def at(
    rows: Sequence[ItemsRow], items: int, get: Callable[[ItemsRow], float | None]
) -> float | None:
    row = row_at(rows, items)
    return None if row is None else get(row)


def worst(
    rows: Sequence[ItemsRow],
    get: Callable[[ItemsRow], float | None],
    highest: bool,
    show: Callable[[float], str],
) -> tuple[float | None, str]:
    """The worst known value over ``rows`` (the highest or the lowest), and it shown with its
    item count."""  # fmt: skip
    known = [(v, r.items) for r in rows if (v := get(r)) is not None]
    if not known:
        return None, "-"
    value, items = max(known) if highest else min(known)
    return value, f"{show(value)} (worst: {items} item{'' if items == 1 else 's'})"


def at_least(goal: str, measured: tuple[float | None, str], limit: float) -> Target:
    return Target(goal, measured[0], limit, True, measured[1])


def at_most(goal: str, measured: tuple[float | None, str], limit: float) -> Target:
    return Target(goal, measured[0], limit, False, measured[1])


def targets(report: Report) -> list[Target]:
    """The goals of the end-to-end benchmark with their measured values."""
    rows, ratio_text = report.rows, lambda v: f"{v:.2f}"
    shown = lambda v, show=times: (v, show(v))  # noqa: E731
    single = [shown(at(rows, n, lambda r: r.multi_vs_single)) for n in (10, 100)]
    hf = [shown(at(rows, n, lambda r: r.multi_vs_transformers)) for n in (10, 100)]
    own = worst(rows, lambda r: r.single_vs_transformers, False, times)
    served = worst(rows, lambda r: r.multi.served_over_engine if r.multi else None, True,
                   ratio_text)  # fmt: skip
    padding = worst(rows, lambda r: r.multi.padding if r.multi else None, True, ratio_text)
    flops = shown(at(rows, 100, lambda r: r.flops_fraction), lambda v: shown_(v, ".0%"))
    cache = shown(report.cache.speedup if report.cache else None)
    cache_items = report.cache.items if report.cache else CACHE_ITEMS
    compiles = shown(report.compiles.request_path, lambda v: shown_(v, ".0f"))
    return [
        at_least("multi-item >= 6x own single-item, 10 items", single[0], 6),
        at_least("multi-item >= 19x own single-item, 100 items", single[1], 19),
        at_least("multi-item >= 10x transformers, 10 items", hf[0], 10),
        at_least("multi-item >= 30x transformers, 100 items", hf[1], 30),
        at_least("own single-item time <= transformers time (speed-up >= 1.0x, every N)", own, 1.0),
        at_most("served/engine <= 1.3 (multi-item, every N)", served, 1.3),
        at_least("model FLOP/s >= 60% of measured peak, 100 items", flops, 0.6),
        at_least(f"cached query >= 2.5x faster, {cache_items} items", cache, 2.5),
        at_most("0 request-path compiles", compiles, 0),
        at_most("padding (computed / useful tokens) <= 1.15 (multi-item, every N)", padding, 1.15),
    ]


def targets_table(report: Report) -> Table:
    """The targets: goal, measured, met/missed."""
    return harness.targets_table(targets(report))


def notes(report: Report) -> tuple[str, ...]:
    """What was run and how, and the figures outside the tables."""
    w, (low, high) = report.workload, ID_RANGE
    hf = (
        "transformers: fp32 batched `query + item` rows of the same GGUF weights in the client "
        "process, `logits_to_keep=1`, torch threads = cores, run while no request is in flight"
        if report.hf
        else "transformers: not run (`--no-hf`)"
    )
    lines = [
        "against a running server (`make serve`: `serve run serve_config.yaml` as shipped), "
        "client and server on the same machine; `-`: not measured or not reported by /v1/stats",
        f"workload: {w.query_tokens}-token query, {w.item_tokens}-token items, random token "
        f"ids in [{low}, {high}) (seed {w.seed}), labels {list(LABELS)}, sent as token ids",
        f"multi-item: median of {w.repeats} requests after one untimed warm-up, each with a "
        "fresh random query (the query cache cannot help); own single-item: the same body with "
        '`"item_first": true` (rows are item + query); slow cases run once at >= 100 items',
        hf,
        "measured float32 matmul peak (XLA in the client process, before any traffic): "
        f"{report.peak_flops / 1e9:.0f} GFLOP/s",
        "served/engine: client wall time over the replica's `engine_seconds` growth; padding: "
        "`computed_tokens` over `useful_tokens` growth; model FLOP/s: analytic useful FLOPs "
        "(`replicas/model/flops.py`) over the multi-item time",
    ]
    if report.cache is not None:
        c = report.cache
        lines.append(
            f"query cache at {c.items} items (median of {c.pairs} pairs): cold {c.cold_s:.3f} s"
            f", warm (same query, fresh items) {c.warm_s:.3f} s, {times(c.speedup)} faster; "
            f"cache hits during the warm requests: {shown_(c.warm_hits, '.0f')}"
        )
    k = report.compiles
    lines.append(
        f"compiles during the whole run: request path {shown_(k.request_path, '.0f')}, "
        f"background {shown_(k.background, '.0f')}, compile_count {shown_(k.total, '+.0f')}"
    )
    return tuple(lines)
