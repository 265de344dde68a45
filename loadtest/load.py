"""Load and fuzz a running scorejax server over HTTP (loopback only), bounded in count and time.

    python -m loadtest run load --url http://127.0.0.1:8000 [--requests 200] [--concurrency 16]

Phases: warm-up, a load run (latency percentiles, throughput), a fuzz run of malformed bodies.
Reports compiles during the load run (from GET /v1/stats) and 5xx answers during the fuzz run;
both targets are 0. Exits non-zero when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from loadtest.fuzz_cases import fuzz_bodies
from loadtest.harness import TOOL_RESULTS, Option, Result, Run, Workload, figures_table

LABELS = [7042, 4528, 11452]
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class LoadResult:
    latencies: tuple[float, ...]
    statuses: tuple[int, ...]
    wall_s: float


def score_body(rng: random.Random, max_items: int) -> dict:
    words = ["alpha", "beta", "gamma", "delta", "capital", "river", "city", "blue"]
    query = " ".join(rng.choice(words) for _ in range(rng.randint(4, 40)))
    items = [
        " " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 8)))
        for _ in range(rng.randint(1, max_items))
    ]
    return {"query": query, "items": items, "label_token_ids": LABELS}


async def _send(client: httpx.AsyncClient, url: str, content: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        response = await client.post(url, content=content, headers=JSON)
        status = response.status_code
    except httpx.HTTPError:
        status = 0  # connection failure or time-out: counted as a failure
    return status, time.perf_counter() - start


async def run_bodies(
    base_url: str, bodies: list[bytes], concurrency: int, deadline_s: float
) -> LoadResult:
    """POST every body to /v1/score with at most ``concurrency`` in flight, until the deadline."""
    url = f"{base_url}/v1/score"
    queue = list(reversed(bodies))
    results: list[tuple[int, float]] = []
    stop_at = time.monotonic() + deadline_s
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:

        async def worker() -> None:
            while queue and time.monotonic() < stop_at:
                results.append(await _send(client, url, queue.pop()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(
        tuple(r[1] for r in results), tuple(r[0] for r in results), time.perf_counter() - start
    )


def compile_count(base_url: str) -> int:
    return int(httpx.get(f"{base_url}/v1/stats", timeout=30).json()["compile_count"])


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    base = o.url or "http://127.0.0.1:8000"
    rng = random.Random(0)
    bodies = [json.dumps(score_body(rng, o.max_items)).encode() for _ in range(o.requests)]
    asyncio.run(run_bodies(base, bodies[: o.concurrency], o.concurrency, o.deadline_s))
    before = compile_count(base)
    load = asyncio.run(run_bodies(base, bodies, o.concurrency, o.deadline_s))
    compiles = compile_count(base) - before
    ok = sum(s == 200 for s in load.statuses)
    fuzz = asyncio.run(run_bodies(base, fuzz_bodies(o.fuzz), o.concurrency, o.deadline_s))
    server_errors = sum(s >= 500 or s == 0 for s in fuzz.statuses)
    healthy = httpx.get(f"{base}/health", timeout=30).status_code == 200
    figures = {
        "requests": len(load.statuses), "ok": ok, "per_s": len(load.statuses) / load.wall_s,
        "p50_s": statistics.median(load.latencies), "p95_s": percentile(load.latencies, 0.95),
        "max_s": max(load.latencies), "compiles_after_warmup": compiles,
        "fuzz_bodies": len(fuzz.statuses), "fuzz_5xx_or_no_answer": server_errors,
        "healthy_after": healthy,
    }  # fmt: skip
    figures["failed"] = not (compiles == 0 and server_errors == 0 and healthy and ok == len(bodies))
    return [run.result("Closed-loop load and fuzz", [figures_table(figures)], figures=figures)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--requests", 200), Option("--concurrency", 16), Option("--max-items", 16),
        Option("--fuzz", 300), Option("--deadline-s", 300.0),
    ),
    measure=measure,
    out=TOOL_RESULTS,
)  # fmt: skip
