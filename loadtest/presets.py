"""Presets of the one load driver (loadtest.drive) against a running server (loopback only).

    python -m loadtest run sweep --url URL --rates 0.25,0.5,1,2 --duration-s 60 [--plots DIR]
    python -m loadtest run load --url URL [--requests 200] [--concurrency 16] [--fuzz 300]
    python -m loadtest run burst --url URL [--large-items 128] [--burst 12] [--during-s S]
    python -m loadtest run first_minute --url URL [--seconds 60] [--seed 0]

- ``sweep``: steps of open-loop Poisson rates, SGLang ``bench_score``'s workload in token ids
  (a ``--query-tokens`` query and ``--items`` items of ``--item-tokens``, ids from ID_RANGE,
  above every special token); each rate for ``--duration-s``, the next once every answer is
  in; a tally per rate, latency.png and throughput.png in ``--plots``. Fails on an answer
  that is neither 200 nor 503, or none.
- ``load``: a closed loop of ``--concurrency`` clients, warm-up, the load between two
  compile counts (target 0), then malformed bodies (target: no 5xx, no lost answer).
- ``burst`` (semantics 16): after a few small requests, one of ``--large-items`` items and,
  once answered (or ``--during-s`` after it was sent), ``--burst`` small ones at once (an
  open loop at rate inf); the engine steps they took. Fails unless all are 200.
- ``first_minute``: RFC-008's workload from a server's first request on, cold: 10- and
  100-item requests (300-token queries, fresh each) one at a time for ``--seconds`` from the
  moment /health answers, /v1/stats read after each: padding, compiles, the 100-item median.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench_serve_report import ID_RANGE as COLD_IDS
from loadtest.bench_serve_report import Sample, total
from loadtest.client import Deadline, Server, score_body
from loadtest.drive import (
    WORDS,
    Load,
    Tally,
    arrivals,
    drive,
    healthy,
    stats,
    tally,
    tally_table,
    word_body,
)
from loadtest.fuzz_strategies import fuzz_bodies
from loadtest.harness import (
    LABELS,
    TOOL_RESULTS,
    Option,
    Result,
    Run,
    Workload,
    col,
    figures_table,
    ratio,
    table,
)

URL = "http://127.0.0.1:8000"
ID_RANGE = (1000, 20000)  # the sweep's random token ids are drawn from [low, high)


@dataclass(frozen=True)
class Shape:
    query_tokens: int
    items: int
    item_tokens: int


def score_payload(rng: random.Random, shape: Shape) -> dict[str, Any]:
    """A /v1/score body in token ids: exactly the shape's query and item lengths."""
    ids = lambda n: [rng.randrange(*ID_RANGE) for _ in range(n)]  # noqa: E731
    items = [ids(shape.item_tokens) for _ in range(shape.items)]
    return {"query": ids(shape.query_tokens), "items": items, "label_token_ids": list(LABELS)}


def sweep_plan(
    rates: Sequence[float], seconds: float, shape: Shape, seed: int = 0, timeout_s: float = 120.0
) -> list[tuple[Load, tuple[dict, ...]]]:
    """Each rate's Load and bodies, seeded (the same arguments give the same plan)."""
    plan = []
    for i, rate in enumerate(rates):
        load = Load(rate=rate, seconds=seconds, seed=seed * 1000 + i, timeout_s=timeout_s)
        rng = random.Random(f"{seed}:body:{rate}")
        plan.append((load, tuple(score_payload(rng, shape) for _ in arrivals(load))))
    return plan


def id_range_problem(model: dict[str, Any]) -> str | None:
    """Why ID_RANGE does not suit the model card of GET /v1/models; None when it does."""
    vocab, delimiter = model.get("vocab_size"), model.get("multi_item_scoring_delimiter")
    if isinstance(vocab, int) and vocab < ID_RANGE[1]:
        return f"token ids up to {ID_RANGE[1] - 1} exceed the vocabulary ({vocab})"
    if isinstance(delimiter, int) and ID_RANGE[0] <= delimiter < ID_RANGE[1]:
        return f"the delimiter {delimiter} lies inside the token id range {ID_RANGE}"
    return None


async def run_sweep(
    url: str, plan: Sequence[tuple[Load, Sequence[dict]]], o: argparse.Namespace, run: Run
) -> list[Tally]:
    """The model card checked, ``--warmup`` untimed requests, then each rate in turn."""
    models = await stats(url, "/v1/models")
    problem = id_range_problem(models["data"][0]) if models.get("data") else None
    if problem or not models:
        raise SystemExit(f"loadtest sweep: {problem or f'GET {url}/v1/models failed'}")
    shape, rng = Shape(o.query_tokens, o.items, o.item_tokens), random.Random(f"{o.seed}:warmup")
    warm = [score_payload(rng, shape) for _ in range(o.warmup)]
    if any(x.status != 200 for x in await drive(url, Load(timeout_s=o.timeout_s), warm)):
        raise SystemExit("loadtest sweep: a warm-up request got no 200")
    tallies = []
    for load, bodies in plan:
        tallies.append(tally(await drive(url, load, bodies), f"{load.rate:g}", load.rate, o.items))
        run.say(tallies[-1].one_line())
    return tallies


def plot(out: Path, tallies: Sequence[Tally], items: int) -> None:
    """latency.png (200s' P50/P90/P99 against offered rate) and throughput.png (items/s)."""
    from matplotlib.figure import Figure  # Agg, no pyplot state; loaded only here

    rates = [t.offered_rps for t in tallies]
    latency = [(name, [getattr(t, f"{name.lower()}_s") for t in tallies], style)
               for name, style in (("P50", "-"), ("P90", "--"), ("P99", ":"))]  # fmt: skip
    throughput = [("achieved", [t.items_per_s for t in tallies], "-"),
                  ("ideal (offered x items)", [r * items for r in rates], "--")]  # fmt: skip
    for name, lines, ylabel, title in (
        ("latency", latency, "latency of 200 answers (s)", "/v1/score latency, open-loop Poisson"),
        ("throughput", throughput, "items scored per second (200s)", f"{items} items a request"),
    ):
        figure = Figure(figsize=(6.4, 4.2), layout="constrained")
        axes = figure.subplots()
        for label, values, style in lines:
            axes.plot(rates, values, style, marker="o", label=label)
        axes.set(xlabel="offered rate (requests/s)", ylabel=ylabel, title=title)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.savefig(out / f"{name}.png", dpi=120)


def measure_sweep(o: argparse.Namespace, run: Run) -> list[Result]:
    rates = tuple(float(r) for r in o.rates.split(",") if r.strip())
    if not rates or any(rate <= 0 for rate in rates):
        raise SystemExit("--rates: positive numbers, comma-separated")
    shape, url = Shape(o.query_tokens, o.items, o.item_tokens), o.url or URL
    plan = sweep_plan(rates, o.duration_s, shape, o.seed, o.timeout_s)
    tallies = asyncio.run(run_sweep(url, plan, o, run))
    plots = Path(o.plots or time.strftime("loadtest/results/sweep-%Y%m%d-%H%M%S", time.gmtime()))
    plots.mkdir(parents=True, exist_ok=True)
    plot(plots, tallies, o.items)
    run.say(f"plots: {plots}/")
    notes = (
        f"SGLang `bench_score`'s workload as token ids: a {o.query_tokens}-token query and "
        f"{o.items} items of {o.item_tokens} tokens per request (a fresh random query each), "
        f"Poisson arrivals at each offered rate for {o.duration_s:g} s, then the next rate "
        "after every answer is in",
        "latencies are of the 200 answers",
    )
    failed = any(t.status_other or t.client_errors for t in tallies)
    figures = {"tallies": [t.plain() for t in tallies], "failed": failed}
    title = "Open-loop load sweep, shipped serve_config.yaml"
    tables = [tally_table(tallies, "offered req/s")]
    return [run.result(title, tables, key="sweep", notes=notes, figures=figures)]


def word_items(rng: random.Random, max_items: int) -> dict:
    """A text body: a 4-40-word query, 1..``max_items`` items of 0-8 words."""
    query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40)))
    items = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))
             for _ in range(rng.randint(1, max_items))]  # fmt: skip
    return {"query": query, "items": items, "label_token_ids": list(LABELS)}


async def closed_load(o: argparse.Namespace) -> tuple[list[Tally], dict]:
    """Warm-up, the load between two compile counts, the fuzz run, /health."""
    url, rng = o.url or URL, random.Random(0)
    bodies = [word_items(rng, o.max_items) for _ in range(o.requests)]
    load = Load(clients=o.concurrency, seconds=o.deadline_s)
    await drive(url, load, bodies[: o.concurrency])
    before = (await stats(url)).get("compile_count", 0)
    loaded = tally(await drive(url, load, bodies), "load")
    after = (await stats(url)).get("compile_count", 0)
    fuzz = await drive(url, load, fuzz_bodies(o.fuzz))
    figures = {
        "compiles_after_warmup": int(after) - int(before),
        "fuzz_5xx_or_no_answer": sum(x.status >= 500 or x.status == 0 for x in fuzz),
        "healthy_after": await healthy(url),
    }
    bad = figures["compiles_after_warmup"] or figures["fuzz_5xx_or_no_answer"]
    figures["failed"] = bool(bad or not figures["healthy_after"] or loaded.status_200 < len(bodies))
    return [loaded, tally(fuzz, "fuzz")], figures


def tallied(run: Run, title: str, tallies: list[Tally], figures: dict) -> list[Result]:
    """The one result: the tallies' table and the other figures', every figure stored."""
    tables = [tally_table(tallies), figures_table(figures)]
    return [run.result(title, tables, figures={**figures, "tallies": [t.plain() for t in tallies]})]


def measure_load(o: argparse.Namespace, run: Run) -> list[Result]:
    return tallied(run, "Closed-loop load and fuzz", *asyncio.run(closed_load(o)))


async def burst(o: argparse.Namespace) -> tuple[list[Tally], dict]:
    url, rng, one = o.url or URL, random.Random(0), Load(timeout_s=300.0)
    await drive(url, one, [word_body(rng, o.small_items) for _ in range(4)])  # a work rate

    async def large_then_stats(body: dict) -> tuple[list, dict]:
        return await drive(url, one, [body]), await stats(url)

    large = asyncio.create_task(large_then_stats(word_body(rng, o.large_items)))
    if o.during_s < 0:
        await large
    else:
        await asyncio.sleep(o.during_s)  # the burst arrives while the large one runs
    small = [word_body(rng, o.small_items, o.small_query_words) for _ in range(o.burst)]
    before = await stats(url)
    shots = await drive(url, Load(rate=math.inf, timeout_s=300.0), small)
    after = await stats(url)
    big, at_large_end = await large
    steps = lambda since: after.get("steps", 0) - since.get("steps", 0)  # noqa: E731
    figures = {
        "all_200": all(x.status == 200 for x in [*shots, *big]),
        "replica_rejected_overloaded": after.get("rejected_overloaded"),
        # Engine steps from the burst's sending to its last answer (with --during-s, the
        # large request's remaining steps too), and after the large one's answer.
        "burst_steps": steps(before), "steps_after_large": steps(at_large_end),
    }  # fmt: skip
    figures["failed"] = not figures["all_200"]
    return [tally(big, "large"), tally(shots, "burst")], figures


def measure_burst(o: argparse.Namespace, run: Run) -> list[Result]:
    return tallied(run, "A burst after a large request", *asyncio.run(burst(o)))


ITEM_COUNTS, QUERY_TOKENS, ITEM_TOKENS = (10, 100), 300, 10


def cold_bodies(seed: int) -> Callable[[int], bytes]:
    """The i-th body (asked in order): 10 and 100 items in turn, a fresh query each."""
    rng = np.random.default_rng(seed)
    ids = lambda n: [int(t) for t in rng.integers(*COLD_IDS, n)]  # noqa: E731
    items = lambda i: [ids(ITEM_TOKENS) for _ in range(ITEM_COUNTS[i % 2])]  # noqa: E731
    return lambda i: score_body(ids(QUERY_TOKENS), items(i))


COLD_COLUMNS = (
    col("#", "d"), col("items", "d"), col("status", "d"), col("wall s", ".2f"),
    col("padding", ".2f"), col("request-path compiles", "d"), col("background compiles", "d"),
)  # fmt: skip


def measure_first_minute(o: argparse.Namespace, run: Run) -> list[Result]:
    url = o.url or URL
    with Server(url, Deadline.after(o.health_timeout_s)) as server:
        server.wait_healthy(o.health_timeout_s)
        started = server.stats()
    load = Load(clients=1, seconds=o.seconds, timeout_s=600.0, stats=True)
    outcomes = asyncio.run(drive(url, load, cold_bodies(o.seed)))
    grown = lambda after, key: after.get(key, 0) - started.get(key, 0)  # noqa: E731
    cells, samples, previous = [], [], started
    for x in outcomes:
        after, n = x.stats or {}, ITEM_COUNTS[x.index % 2]
        sample = Sample.between(x.seconds, previous, after)
        samples.append((n, sample))
        padding = ratio(sample.computed_tokens, sample.useful_tokens)
        compiles = (grown(after, f"{k}_compiles") for k in ("request_path", "background"))
        cells.append((x.index + 1, n, x.status, x.seconds, padding, *compiles))
        previous = after
    computed, useful = (
        total([getattr(s, k) for _, s in samples]) for k in ("computed_tokens", "useful_tokens")
    )
    padding = ratio(computed, useful)
    hundred = [s.wall_s for n, s in samples if n == 100]
    cold = tally(outcomes, "first minute")
    figures = {
        "requests": len(outcomes), "padding": padding,
        "median_100_item_s": statistics.median(hundred) if hundred else None,
        "tallies": [cold.plain()], "failed": cold.status_200 < len(outcomes),
    }  # fmt: skip
    notes = (f"requests {len(outcomes)}, padding over the window {padding or 0:.3f}",)
    tables = [table(COLD_COLUMNS, cells)]
    return [run.result("The first minute after a start", tables, notes=notes, figures=figures)]


PRESETS = {
    "sweep": Workload(url=True, measure=measure_sweep, options=(
        Option("--rates", "0.25,0.5,1,2"), Option("--duration-s", 60.0),
        Option("--query-tokens", 120), Option("--items", 10), Option("--item-tokens", 20),
        Option("--seed", 0), Option("--timeout-s", 120.0, "per request"),
        Option("--warmup", 2, "untimed requests first"),
        Option("--plots", None, "folder for the two plots (loadtest/results/sweep-<UTC>)"),
    )),
    "load": Workload(url=True, measure=measure_load, out=TOOL_RESULTS, options=(
        Option("--requests", 200), Option("--concurrency", 16), Option("--max-items", 16),
        Option("--fuzz", 300), Option("--deadline-s", 300.0),
    )),
    "burst": Workload(url=True, measure=measure_burst, out=TOOL_RESULTS, options=(
        Option("--large-items", 128), Option("--small-items", 2), Option("--burst", 12),
        Option("--small-query-words", 60, "the burst's queries"),
        Option("--during-s", -1.0, "send the burst this long after the large (-1: after it)"),
    )),
    "first_minute": Workload(url=True, measure=measure_first_minute, out=TOOL_RESULTS, options=(
        Option("--seconds", 60.0), Option("--seed", 0), Option("--health-timeout-s", 900.0),
    )),
}  # fmt: skip
WORKLOAD = PRESETS["load"]  # loadtest.workloads reads PRESETS[name] first
