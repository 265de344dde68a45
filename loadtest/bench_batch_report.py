"""loadtest.bench_batch's pure parts: dataset shapes, measured rates, its tables and ratios.

No Ray, no jax, no torch: the helpers here unit-test in well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.harness import Table, col, grown, table

# The runs of one shape, in the table's order, with what each one is.
RUNS = {
    "e": "(e) engine, each query's rows as one work, in process",
    "a sorted": "(a) `--engine local`, rows sorted by query, `--no-group`",
    "a shuffled": "(a) `--engine local`, rows shuffled, grouped in the job (the default)",
    "a shuffled, cache warm": "(a) the same shuffled, grouped job again on its compilation cache",
    "a shuffled --no-group": "(a) `--engine local`, rows shuffled, `--no-group`",
    "b": "(b) `--engine serve` through the running app, rows sorted by query",
    "c": "(c) HTTP, one /v1/score request per row, concurrency 4",
    "c'": "(c') HTTP, one /v1/score request per query group, concurrency 4",
    "d": "(d) transformers, batched `query + item` rows (one batch per query)",
}
# Targets of issue 34 (docs/batch.md): (a) >= 0.9x (e) and (c'), >= 5x (c) at 10 rows per
# query; sorted input within 1.15x of grouped input. Issue 46: shuffled input, grouped in the
# job, within 1.15x of sorted input's time (wall); the job >= 0.9x the engine alone, both
# warm (the job on the compilation cache its first run left, as the shipped config keeps).
TARGETS = {
    "a/e": 0.9,
    "a warm/e": 0.9,
    "a/c'": 0.9,
    "a/c": 5.0,
    "grouped/sorted": 1.15,
    "shuffled slowdown (wall)": 1.15,
}
AT_MOST = ("grouped/sorted", "shuffled slowdown (wall)")  # targets that are upper bounds


@dataclass(frozen=True)
class Shape:
    """``queries`` queries of ``rows_per_query`` rows each."""

    queries: int
    rows_per_query: int

    @property
    def rows(self) -> int:
        return self.queries * self.rows_per_query

    @property
    def label(self) -> str:
        return f"{self.queries}x{self.rows_per_query}"


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``"200x10,20x100"`` -> shapes; ValueError naming the bad part."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        queries, sep, rows = part.partition("x")
        if not sep or not queries.isdigit() or not rows.isdigit() or "0" in (queries, rows):
            raise ValueError(f"--shapes: QUERIESxROWS_PER_QUERY, e.g. 200x10; got {part!r}")
        shapes.append(Shape(int(queries), int(rows)))
    if not shapes:
        raise ValueError("--shapes: at least one QUERIESxROWS_PER_QUERY")
    return tuple(shapes)


@dataclass(frozen=True)
class Rate:
    """One run: items scored in wall seconds, with what the engine counted meanwhile."""

    items: int
    wall_s: float
    steady_items_per_s: float | None = None  # after the first result arrived (None: one batch)
    engine_s: float | None = None
    steps: int | None = None
    cache_hits: int | None = None
    computed_tokens: int | None = None
    useful_tokens: int | None = None
    retried_503: int = 0

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def engine_items_per_s(self) -> float | None:
        return self.items / self.engine_s if self.engine_s else None

    @property
    def steady(self) -> float:
        """The steady rate: after the first result, else per engine second, else wall."""
        for value in (self.steady_items_per_s, self.engine_items_per_s):
            if value:
                return value
        return self.items_per_s

    @property
    def padding(self) -> float | None:
        if not self.computed_tokens or not self.useful_tokens:
            return None
        return self.computed_tokens / self.useful_tokens


def steady_items_per_s(
    marks: Sequence[tuple[float, int]], wall_s: float | None = None
) -> float | None:
    """Items per second after the first of ``marks`` (arrival time, items arrived then):
    the first batch carries the job's start (actor start, model load, compiles). None when
    the arrivals span less than a fifth of ``wall_s``: Ray Data handed the driver most blocks
    at once at the end, so their spacing says nothing of the rate (the engine-second rate is
    used then)."""
    if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
        return None
    if wall_s is not None and marks[-1][0] - marks[0][0] < wall_s / 5:
        return None
    return sum(n for _, n in marks[1:]) / (marks[-1][0] - marks[0][0])


def stat_rate(
    items: int, wall_s: float, before: Mapping[str, Any], after: Mapping[str, Any], **extra: Any
) -> Rate:
    """A run's rate with the replica's /v1/stats counters' growth around it."""

    moved = grown(before, after).get
    return Rate(
        items,
        wall_s,
        engine_s=moved("engine_seconds"),
        steps=moved("steps"),
        cache_hits=moved("query_cache_hits"),
        computed_tokens=moved("computed_tokens"),
        useful_tokens=moved("useful_tokens"),
        **extra,
    )


def ratio(numerator: Rate | None, denominator: Rate | None, per: str = "steady") -> float | None:
    """One run's items/s over another's (None when either is missing): ``per`` "steady" (both
    steady), "engine" (items per engine second over the steady rate; None without engine
    seconds) or "wall" (both per wall second, the job's whole time)."""
    if numerator is None or denominator is None:
        return None
    if per == "wall":
        return numerator.items_per_s / denominator.items_per_s
    if per == "engine":
        top = numerator.engine_items_per_s
        return top / denominator.steady if top else None
    return numerator.steady / denominator.steady


def ratios(runs: Mapping[str, Rate]) -> dict[str, float | None]:
    """The issues' ratios on steady items/s; ``grouped/sorted`` is (e) over (a) sorted
    (the engine given each query's rows as one work is the grouped input's packing); the
    shuffled slowdowns: (a) sorted over (a) shuffled (grouped in the job; and ``--no-group``),
    per engine second and per wall second (the job's whole time, shuffle included); ``a
    warm/e``: the shuffled job run again on its compilation cache, per engine second, over
    (e) (which is timed after its own compiles)."""
    sorted_, shuffled, engine = runs.get("a sorted"), runs.get("a shuffled"), runs.get("e")
    return {
        "a/e": ratio(sorted_, engine),
        "a/c'": ratio(sorted_, runs.get("c'")),
        "a/c": ratio(sorted_, runs.get("c")),
        "grouped/sorted": ratio(engine, sorted_),
        "a shuffled/e": ratio(shuffled, engine, "engine"),
        "a warm/e": ratio(runs.get("a shuffled, cache warm"), engine, "engine"),
        "shuffled slowdown": ratio(sorted_, shuffled),
        "shuffled slowdown (wall)": ratio(sorted_, shuffled, "wall"),
        "shuffled slowdown, --no-group (wall)": ratio(
            sorted_, runs.get("a shuffled --no-group"), "wall"
        ),
    }


RUN_COLUMNS = (
    col("run", left=True), col("items", "d"), col("items/s (wall)", ".1f"),
    col("items/s (steady)", ".1f"), col("items/s (engine s)", ".1f"), col("wall s", ".1f"),
    col("engine s", ".1f"), col("engine steps", "d"), col("query cache hits", "d"),
    col("computed / useful tokens", ".2f"), col("503 retries", "d"),
)  # fmt: skip


def runs_table(label: str, runs: Mapping[str, Rate]) -> Table:
    rows = [
        (title, r.items, r.items_per_s, r.steady, r.engine_items_per_s, r.wall_s, r.engine_s,
         r.steps, r.cache_hits, r.padding, r.retried_503)
        for name, title in RUNS.items() if (r := runs.get(name)) is not None
    ]  # fmt: skip
    return table(RUN_COLUMNS, rows, title=f"{label} (queries x rows per query):", missing="")


def ratios_table(results: Mapping[str, Mapping[str, Rate]]) -> Table:
    """One line per shape: each ratio, with the target where the issue sets one."""
    names = list(ratios({}))
    heads = [
        f"{n} (target {'<=' if n in AT_MOST else '>='} {TARGETS[n]})" if n in TARGETS else n
        for n in names
    ]
    rows = [(label, *ratios(runs).values()) for label, runs in results.items()]
    title = (
        "Ratios of steady items/s ((a): sorted; grouped/sorted: (e) over (a) sorted; the "
        "shuffled slowdown: (a) sorted over (a) shuffled, steady and wall):"
    )
    columns = [col("shape", left=True), *(col(h, ".2f") for h in heads)]
    return table(columns, rows, title=title, missing="")


NOTES = (
    "SmolLM2-135M-Instruct, float32; token-id rows (a 300-token query, one 10-token item, 3 "
    "labels), the shipped serve_config.yaml ((e), (a): without its warm-up; (b), (c), (c'): the "
    "app as `make serve` deploys it, on a Ray cluster the bench starts); one run, side by side",
    "wall: the job's whole time (actor start, model load and compiles included for (a)); "
    "steady: items after the first result arrived over the time after it ((a), (b)), else per "
    "engine second; HTTP runs and (d) after untimed warm-up requests; each first (a) job on an "
    "empty compilation cache (it compiles, steps beside its compiles), the cache-warm (a) on "
    "the cache its first run left, the app with the shipped one",
    "(b) scores the same rows as (a); (c) and (c') rows of the same shape with queries of their "
    "own, so the app's query cache holds none of them when they start",
    "engine s, steps, cache hits, tokens: the engine's counters ((b), (c), (c'): the replica's "
    "/v1/stats around the run)",
)


def tables(results: Mapping[str, Mapping[str, Rate]]) -> list[Table]:
    """One table per shape, then the ratios."""
    return [*(runs_table(k, v) for k, v in results.items()), ratios_table(results)]
