"""``python -m loadtest run overload``: open-loop overload of a running server (loopback only).

    python -m loadtest run overload --url http://127.0.0.1:8000 [--factor 4 | --rate R]
        [--requests 400]

1. Capacity: a closed loop of ``--concurrency`` clients sends ``--capacity-requests`` requests
   of ``--items`` items; capacity = completed requests per second.
2. Overload: ``--requests`` requests arrive open-loop (Poisson, seeded) at ``--factor`` x
   capacity (or at ``--rate`` requests/s), each waiting at most ``--timeout-s``.
3. Afterwards: ``/health`` and one request must answer 200.

``--contention-at S --contention-s D`` starts ``--contention-procs`` busy-looping processes S
seconds into the overload for D seconds: the machine gets slower under the server, as when a
neighbour takes the cores, and the summary splits rejections and successes by whether they
were sent in that window.

Its result holds every outcome and the counts: answered / 200 / 503 overloaded (with
Retry-After) / anything else, the p50 and p99 of rejections and of successes, and timeouts;
exits 1 when a request got anything but 200 or an enveloped 503 with Retry-After, timed out,
or the server was not healthy afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import httpx

from loadtest.client import Outcome, closed_loop, percentile, send
from loadtest.client import word_body as body
from loadtest.harness import TOOL_RESULTS, Option, Result, Run, Workload, figures_table


async def capacity(client: httpx.AsyncClient, args: argparse.Namespace) -> float:
    """Completed requests per second of a closed loop of ``--concurrency`` clients."""
    rng = random.Random(1)
    payloads = [body(rng, args.items) for _ in range(args.capacity_requests)]
    done, wall = await closed_loop(client, payloads[::-1], args.concurrency)
    return sum(o.status == 200 for o in done) / wall


async def overload(client: httpx.AsyncClient, rate: float, args: argparse.Namespace) -> list:
    rng = random.Random(2)
    tasks = []
    start = time.perf_counter()

    async def sent_at(moment: float, payload: dict) -> Outcome:
        return replace(await send(client, payload), sent_s=round(moment, 3))

    for _ in range(args.requests):
        payload = body(rng, args.items)
        tasks.append(asyncio.create_task(sent_at(time.perf_counter() - start, payload)))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


@contextmanager
def contention(args: argparse.Namespace) -> Iterator[None]:
    """``--contention-procs`` processes that wait ``--contention-at`` s, then spin for
    ``--contention-s`` s (none when ``--contention-s`` is 0)."""
    if args.contention_s <= 0:
        yield
        return
    spin = multiprocessing.get_context("spawn")
    procs = [
        spin.Process(target=delayed_busy_loop, args=(args.contention_at, args.contention_s))
        for _ in range(args.contention_procs)
    ]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


def delayed_busy_loop(delay_s: float, seconds: float) -> None:
    time.sleep(delay_s)  # a time into the run, not a wait for a server
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def split_by_window(outcomes: list[Outcome], start: float, seconds: float) -> dict:
    """p99 of rejections and successes sent inside and outside ``[start, start + seconds)``."""
    inside = [o for o in outcomes if start <= o.sent_s < start + seconds]
    outside = [o for o in outcomes if not start <= o.sent_s < start + seconds]
    return {
        name: {
            "sent": len(group),
            "p99_rejection_s": round(percentile(seconds_of(group, 503), 0.99), 3),
            "p99_success_s": round(percentile(seconds_of(group, 200), 0.99), 3),
        }
        for name, group in (("in_contention", inside), ("outside", outside))
    }


def seconds_of(outcomes: list[Outcome], status: int) -> list[float]:
    return [o.seconds for o in outcomes if o.status == status]


def summary(outcomes: list[Outcome], rate: float, cap: float) -> dict:
    ok = [o.seconds for o in outcomes if o.status == 200]
    queued = [o.queue_s for o in outcomes if o.status == 200 and o.queue_s is not None]
    shed = [o for o in outcomes if o.status == 503 and o.reason == "overloaded"]
    other = [o for o in outcomes if o.status != 200 and o not in shed]
    return {
        "capacity_rps": round(cap, 2),
        "offered_rps": round(rate, 2),
        "requests": len(outcomes),
        "answered": sum(o.status != 0 for o in outcomes),
        "ok": len(ok),
        "overloaded_503": len(shed),
        "overloaded_with_retry_after": sum(o.retry_after is not None for o in shed),
        "other": sorted({f"{o.status} {o.reason}" for o in other}),
        "other_count": len(other),
        "timeouts": sum(o.status in (0, 408, 504) for o in outcomes),
        "p50_rejection_s": round(percentile([o.seconds for o in shed], 0.5), 3),
        "p99_rejection_s": round(percentile([o.seconds for o in shed], 0.99), 3),
        "p50_success_s": round(percentile(ok, 0.5), 3),
        "p99_success_s": round(percentile(ok, 0.99), 3),
        "p50_success_queue_s": round(percentile(queued, 0.5), 3),
        "p99_success_queue_s": round(percentile(queued, 0.99), 3),
    }


async def run_overload(args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=args.requests + 16)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout_s, limits=limits) as c:
        cap = await capacity(c, args)
        rate = args.rate or cap * args.factor
        with contention(args):
            outcomes = await overload(c, rate, args)
        result = summary(outcomes, rate, cap)
        if args.contention_s > 0:
            window = (args.contention_at, args.contention_s)
            result["contention"] = split_by_window(outcomes, *window)
        healthy = (await c.get("/health")).status_code == 200
        after = await send(c, body(random.Random(3), args.items))
        result["healthy_after"] = healthy and after.status == 200
        result["outcomes"] = [asdict(o) for o in outcomes]
    return result


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    result = asyncio.run(run_overload(o))
    bad = result["other_count"] or result["timeouts"] or not result["healthy_after"]
    missing_retry = result["overloaded_503"] != result["overloaded_with_retry_after"]
    result["failed"] = bool(bad or missing_retry)
    shown = {k: v for k, v in result.items() if k != "outcomes"}
    return [run.result("Overload", [figures_table(shown)], figures=result)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--items", 16), Option("--concurrency", 8), Option("--capacity-requests", 40),
        Option("--factor", 4.0), Option("--rate", 0.0, "requests/s (0: factor x capacity)"),
        Option("--requests", 400), Option("--timeout-s", 320.0),
        Option("--contention-at", 60.0), Option("--contention-s", 0.0, "0: no contention"),
        Option("--contention-procs", 2),
    ),
    measure=measure,
    out=TOOL_RESULTS,
)  # fmt: skip
