"""``python -m loadtest run burst``: a burst of small requests right after a large one
(semantics 16).

    python -m loadtest run burst --url http://127.0.0.1:8000 [--large-items 128] [--burst 12]

Warms the server with a few small requests (a work rate to go on), then sends one request of
``--large-items`` items (60-word query, 3-8-word items) and, once it is answered (or
``--during-s`` seconds after it was sent), ``--burst`` concurrent requests of
``--small-items`` items. Admission that counts work admits the whole burst when its work
fits in ``max_queue_wait_s``; counting calls it refused part of it. Prints each answer's
status and time; exits 1 unless all are 200.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx

from loadtest.client import word_body as body
from loadtest.harness import TOOL_RESULTS, Option, Result, Run, Workload, figures_table


async def timed(client: httpx.AsyncClient, payload: dict) -> dict:
    start = time.perf_counter()
    response = await client.post("/v1/score", json=payload)
    answer = {"status": response.status_code, "seconds": round(time.perf_counter() - start, 3)}
    if response.status_code != 200:
        answer["reason"] = response.json().get("reason", "")
        answer["message"] = response.json().get("message", "")
    return answer


async def run_burst(args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    async with httpx.AsyncClient(base_url=args.url, timeout=300) as client:
        for _ in range(4):
            await timed(client, body(rng, args.small_items))

        async def large_then_stats() -> tuple[dict, dict]:
            answer = await timed(client, body(rng, args.large_items))
            return answer, (await client.get("/v1/stats")).json()

        large_run = asyncio.create_task(large_then_stats())
        large = asyncio.create_task(_first(large_run))
        if args.during_s < 0:
            await large
        else:
            await asyncio.sleep(args.during_s)  # the burst arrives while the large one runs
        small = [body(rng, args.small_items, args.small_query_words) for _ in range(args.burst)]
        before = (await client.get("/v1/stats")).json()
        burst = await asyncio.gather(*(timed(client, payload) for payload in small))
        stats = (await client.get("/v1/stats")).json()
        _, at_large_end = await large_run
        return {
            "large": await large,
            "burst": burst,
            "all_200": all(a["status"] == 200 for a in [*burst, await large]),
            "replica_rejected_overloaded": stats.get("rejected_overloaded"),
            # Engine steps from the burst's sending to its last answer (with --during-s, the
            # large request's remaining steps too).
            "burst_steps": stats.get("steps", 0) - before.get("steps", 0),
            # Engine steps after the large request's answer until the burst's last one.
            "steps_after_large": stats.get("steps", 0) - at_large_end.get("steps", 0),
        }


async def _first(task: asyncio.Task) -> dict:
    answer, _ = await task
    return answer


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    result = asyncio.run(run_burst(o))
    result["failed"] = not result["all_200"]
    return [run.result("A burst after a large request", [figures_table(result)], figures=result)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--large-items", 128), Option("--small-items", 2), Option("--burst", 12),
        Option("--small-query-words", 60, "the burst's queries"),
        Option("--during-s", -1.0, "send the burst this long after the large (-1: after it)"),
    ),
    measure=measure,
    out=TOOL_RESULTS,
)  # fmt: skip
