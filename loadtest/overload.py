"""``python -m loadtest run overload``: open-loop overload of a running server (loopback only).

    python -m loadtest run overload --url http://127.0.0.1:8000 [--factor 4 | --rate R]
        [--requests 400] [--clients pooled,connection,processes] [--body words|issue]

1. Capacity: a closed loop of ``--concurrency`` clients sends ``--capacity-requests`` requests
   of ``--items`` items; capacity = completed requests per second.
2. Overload, once per client kind of ``--clients`` (loadtest.overload_clients: one pooled
   AsyncClient, a fresh connection per request, ``--procs`` processes of those), one after
   another, the server idle between them: ``--requests`` requests arrive open-loop (Poisson,
   seeded) at ``--factor`` x capacity (or at ``--rate`` requests/s), each waiting at most
   ``--timeout-s``. ``--body words`` sends the harness's bodies (60-word queries, items of
   3-8 words), ``--body issue`` issue 80's: ``"Overload "`` 40 times and 16 items
   ``" candidate number i"``.
3. Afterwards: ``/health`` and one request must answer 200.

``--contention-at S --contention-s D`` starts ``--contention-procs`` busy-looping processes S
seconds into each overload for D seconds: the machine gets slower under the server, as when
a neighbour takes the cores (each in a session of its own, so Linux's autogroup scheduler
weighs each like a neighbour's), and the summary splits rejections and successes by whether
they were sent in that window.

Its result is a table with a row per client kind: answered / 200 / 503 overloaded (with
Retry-After) / anything else, timeouts, the p50 and p99 of rejections as the client saw them
and inside the ingress (``x-total-time``), the successes' p99 and their queue p99
(``x-queue-time``), and the client's own CPU seconds; it exits 1 when a request got
anything but 200 or an enveloped 503 with Retry-After, timed out, or the server was not
healthy afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

import httpx

from loadtest.client import Outcome, closed_loop, percentile, send, word_body
from loadtest.harness import LABELS, RESULTS, Option, Result, Run, Workload, col, table
from loadtest.overload_clients import CLIENT_KINDS, ClientRun, Plan, encoded, run_client

OPERATIONS_DOC = "docs/operations.md"
IDLE_TIMEOUT_S = 300.0  # the server drains what one client left queued before the next


def issue_body(items: int) -> dict:
    """Issue 80's body: a 40-word query of one repeated word, items that differ by a number."""
    candidates = [f" candidate number {i}" for i in range(items)]
    return {"query": "Overload " * 40, "items": candidates, "label_token_ids": list(LABELS)}


def bodies(args: argparse.Namespace, count: int, seed: int) -> list[dict]:
    if args.body == "issue":
        return [issue_body(args.items)] * count
    rng = random.Random(seed)
    return [word_body(rng, args.items) for _ in range(count)]


async def capacity(client: httpx.AsyncClient, args: argparse.Namespace) -> float:
    """Completed requests per second of a closed loop of ``--concurrency`` clients."""
    payloads = bodies(args, args.capacity_requests, seed=1)
    done, wall = await closed_loop(client, payloads[::-1], args.concurrency)
    return sum(o.status == 200 for o in done) / wall


@contextmanager
def contention(args: argparse.Namespace) -> Iterator[None]:
    """``--contention-procs`` processes, each in a session of its own, that wait
    ``--contention-at`` s, then spin for ``--contention-s`` s (none when it is 0)."""
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
    os.setsid()  # an autogroup of its own: weighed as a neighbour's process, not the client's
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
    inside = [o.total_s for o in shed if o.total_s is not None]
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
        "p99_rejection_ingress_s": round(percentile(inside, 0.99), 3),
        "p50_success_s": round(percentile(ok, 0.5), 3),
        "p99_success_s": round(percentile(ok, 0.99), 3),
        "p50_success_queue_s": round(percentile(queued, 0.5), 3),
        "p99_success_queue_s": round(percentile(queued, 0.99), 3),
    }


async def wait_idle(client: httpx.AsyncClient, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Poll /v1/stats until the replica has no work queued (bounded), as between the
    issue's clients; the next client then meets an idle server."""
    stop_at = time.monotonic() + timeout_s
    while time.monotonic() < stop_at:
        try:
            if (await client.get("/v1/stats")).json().get("queued_works", 0) == 0:
                return
        except (httpx.HTTPError, ValueError):
            pass
        await asyncio.sleep(0.5)


def one_client(kind: str, rate: float, cap: float, args: argparse.Namespace) -> dict:
    """The summary of ``--requests`` requests at ``rate`` sent by a client of ``kind``."""
    plan = Plan(args.url, encoded(bodies(args, args.requests, 2)), rate, args.timeout_s)
    with contention(args):
        sent: ClientRun = run_client(kind, plan, args.procs)
    outcomes = list(sent.outcomes)
    result = {"client": kind, **summary(outcomes, rate, cap)}
    result["client_cpu_s"] = round(sent.client_cpu_s, 1)
    if args.contention_s > 0:
        result["contention"] = split_by_window(outcomes, args.contention_at, args.contention_s)
    result["outcomes"] = [asdict(o) for o in outcomes]
    return result


async def run_overload(args: argparse.Namespace) -> dict:
    """Capacity, then the overload once per client kind, then the health check."""
    kinds = [kind.strip() for kind in args.clients.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in CLIENT_KINDS]
    if unknown or not kinds:
        raise SystemExit(f"--clients: {unknown or kinds} not in {CLIENT_KINDS}")
    limits = httpx.Limits(max_connections=args.concurrency + 16)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout_s, limits=limits) as c:
        cap = await capacity(c, args)
        rate = args.rate or cap * args.factor
        runs = []
        for kind in kinds:
            await wait_idle(c)
            runs.append(await asyncio.to_thread(one_client, kind, rate, cap, args))
        await wait_idle(c)
        healthy = (await c.get("/health")).status_code == 200
        after = await send(c, bodies(args, 1, 3)[0])
    return {"runs": runs, "healthy_after": healthy and after.status == 200}


def failed(run: dict) -> bool:
    """Anything but 200 or an enveloped 503 with Retry-After, or a time-out."""
    missing_retry = run["overloaded_503"] != run["overloaded_with_retry_after"]
    return bool(run["other_count"] or run["timeouts"] or missing_retry)


COLUMNS = (
    col("client", left=True), col("offered req/s"), col("answered"), col("200"),
    col("503 overloaded (with Retry-After)"), col("other / timeouts"),
    col("refusals p50 / p99 s"), col("refusals p99 in the ingress s"), col("successes p99 s"),
    col("successes' queue p99 s"), col("client CPU s"),
)  # fmt: skip


def row(run: dict) -> tuple:
    return (
        run["client"], run["offered_rps"], run["answered"], run["ok"],
        f"{run['overloaded_503']} ({run['overloaded_with_retry_after']})",
        f"{run['other_count']} / {run['timeouts']}",
        f"{run['p50_rejection_s']:.3f} / {run['p99_rejection_s']:.3f}",
        f"{run['p99_rejection_ingress_s']:.3f}", f"{run['p99_success_s']:.2f}",
        f"{run['p99_success_queue_s']:.2f}", f"{run['client_cpu_s']:.1f}",
    )  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    result = asyncio.run(run_overload(o))
    runs = result["runs"]
    result["failed"] = any(failed(r) for r in runs) or not result["healthy_after"]
    load = f"{o.rate:g} req/s" if o.rate else f"{o.factor:g}x capacity"
    notes = (
        f"capacity {runs[0]['capacity_rps']} req/s ({o.concurrency} closed-loop clients, "
        f"{o.capacity_requests} requests of {o.items} items); {o.requests} requests at "
        f"{load} per client kind, one after another, the server idle between them",
        f"bodies: {o.body} ({'issue 80' if o.body == 'issue' else '60-word queries'}, "
        f"{o.items} items); healthy after: {result['healthy_after']}",
    )
    key = f"overload-{'rate' if o.rate else 'factor'}-{o.body}"
    title = f"Overload at {load}, {o.body} bodies, by client kind"
    tables = [table(COLUMNS, [row(r) for r in runs])]
    # The summaries only: the per-request outcomes (about 500 KB a run) stay out of docs/.
    stored = {**result, "runs": [{k: v for k, v in r.items() if k != "outcomes"} for r in runs]}
    return [run.result(title, tables, key=key, doc=OPERATIONS_DOC, notes=notes, figures=stored)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--items", 16), Option("--concurrency", 8), Option("--capacity-requests", 40),
        Option("--factor", 4.0), Option("--rate", 0.0, "requests/s (0: factor x capacity)"),
        Option("--requests", 400), Option("--timeout-s", 320.0),
        Option("--clients", ",".join(CLIENT_KINDS), "client kinds, one run each, in order"),
        Option("--procs", 4, "processes of the processes client"),
        Option("--body", "words", "the bodies sent", choices=("words", "issue")),
        Option("--contention-at", 60.0), Option("--contention-s", 0.0, "0: no contention"),
        Option("--contention-procs", 2),
    ),
    measure=measure,
    out=RESULTS,
)  # fmt: skip
