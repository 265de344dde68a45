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

import httpx

from loadtest.client import closed_loop, percentile
from loadtest.fuzz_strategies import fuzz_bodies
from loadtest.harness import LABELS, TOOL_RESULTS, Option, Result, Run, Workload, figures_table


def score_body(rng: random.Random, max_items: int) -> dict:
    words = ["alpha", "beta", "gamma", "delta", "capital", "river", "city", "blue"]
    query = " ".join(rng.choice(words) for _ in range(rng.randint(4, 40)))
    items = [
        " " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 8)))
        for _ in range(rng.randint(1, max_items))
    ]
    return {"query": query, "items": items, "label_token_ids": list(LABELS)}


async def phases(o: argparse.Namespace, bodies: list[bytes]) -> dict:
    """Warm-up, the load run between two compile counts, the fuzz run, /health."""
    async with httpx.AsyncClient(base_url=o.url, timeout=120) as client:
        run = lambda sent: closed_loop(client, sent, o.concurrency, o.deadline_s)  # noqa: E731
        compiles = lambda: client.get("/v1/stats", timeout=30)  # noqa: E731
        await run(bodies[: o.concurrency])
        before = (await compiles()).json()["compile_count"]
        load, wall = await run(bodies)
        after = (await compiles()).json()["compile_count"]
        fuzz, _ = await run(fuzz_bodies(o.fuzz))
        healthy = (await client.get("/health", timeout=30)).status_code == 200
    latencies = [outcome.seconds for outcome in load]
    return {
        "requests": len(load), "ok": sum(x.status == 200 for x in load), "per_s": len(load) / wall,
        "p50_s": statistics.median(latencies), "p95_s": percentile(latencies, 0.95),
        "max_s": max(latencies), "compiles_after_warmup": int(after) - int(before),
        "fuzz_bodies": len(fuzz),
        "fuzz_5xx_or_no_answer": sum(x.status >= 500 or x.status == 0 for x in fuzz),
        "healthy_after": healthy,
    }  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    rng = random.Random(0)
    bodies = [json.dumps(score_body(rng, o.max_items)).encode() for _ in range(o.requests)]
    figures = asyncio.run(phases(o, bodies))
    good = figures["compiles_after_warmup"] == 0 and figures["fuzz_5xx_or_no_answer"] == 0
    figures["failed"] = not (good and figures["healthy_after"] and figures["ok"] == len(bodies))
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
