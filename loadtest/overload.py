"""``python -m loadtest run overload``: open-loop overload of a running server (loopback only).

    python -m loadtest run overload --url http://127.0.0.1:8000 [--factor 4 | --rate R]
        [--requests 400] [--clients pooled,connection,processes] [--body words|issue]

1. Capacity: a closed loop of ``--concurrency`` clients sends ``--capacity-requests`` requests
   of ``--items`` items; capacity = completed requests per second.
2. Overload, once per client kind of ``--clients`` (loadtest.drive: one pooled
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
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

from loadtest.drive import (
    CLIENT_KINDS,
    Load,
    Outcome,
    Tally,
    drive,
    healthy,
    percentile,
    stats,
    tally,
    tally_table,
    word_body,
)
from loadtest.harness import LABELS, RESULTS, Option, Result, Run, Workload

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


def client_cpu_s() -> float:
    """CPU seconds of this process and its finished children (a processes client's)."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def split_by_window(outcomes: list[Outcome], start: float, seconds: float) -> dict:
    """p99 of rejections and successes sent inside and outside ``[start, start + seconds)``."""
    inside = [o for o in outcomes if start <= o.sent_s < start + seconds]
    outside = [o for o in outcomes if not start <= o.sent_s < start + seconds]

    def p99(group: list[Outcome], status: int) -> float:
        return round(percentile([o.seconds for o in group if o.status == status], 0.99), 3)

    return {
        name: {
            "sent": len(group),
            "p99_rejection_s": p99(group, 503),
            "p99_success_s": p99(group, 200),
        }
        for name, group in (("in_contention", inside), ("outside", outside))
    }


async def wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Poll /v1/stats until the replica has no work queued (bounded), as between the
    issue's clients; the next client then meets an idle server."""
    stop_at = time.monotonic() + timeout_s
    while time.monotonic() < stop_at and (await stats(url)).get("queued_works", 1):
        await asyncio.sleep(0.5)


async def one_client(kind: str, load: Load, args: argparse.Namespace) -> tuple[Tally, dict]:
    """``--requests`` requests at ``load.rate`` sent by a client of ``kind``: its tally and
    what else it saw (every outcome, the contention split)."""
    await wait_idle(args.url)
    with contention(args):
        cpu = client_cpu_s()
        outcomes = await drive(args.url, replace(load, client=kind), bodies(args, args.requests, 2))
        cpu = client_cpu_s() - cpu
    seen: dict = {"outcomes": [asdict(o) for o in outcomes]}
    if args.contention_s > 0:
        seen["contention"] = split_by_window(outcomes, args.contention_at, args.contention_s)
    return tally(outcomes, kind, load.rate, args.items, client_cpu_s=round(cpu, 1)), seen


async def run_overload(args: argparse.Namespace) -> tuple[float, list[tuple[Tally, dict]], bool]:
    """Capacity (a closed loop), then the overload once per client kind, then /health."""
    kinds = [kind.strip() for kind in args.clients.split(",") if kind.strip()]
    if not kinds or set(kinds) - set(CLIENT_KINDS):
        raise SystemExit(f"--clients: {kinds} not all in {CLIENT_KINDS}")
    closed = Load(clients=args.concurrency, timeout_s=args.timeout_s)
    cap = tally(await drive(args.url, closed, bodies(args, args.capacity_requests, 1))).achieved_rps
    load = Load(
        rate=args.rate or cap * args.factor, timeout_s=args.timeout_s, procs=args.procs, seed=2
    )
    runs = [await one_client(kind, load, args) for kind in kinds]
    await wait_idle(args.url)
    after = await drive(args.url, closed, bodies(args, 1, 3))
    return cap, runs, await healthy(args.url) and after[0].status == 200


def failed(t: Tally) -> bool:
    """Anything but 200 or an enveloped 503 overloaded with Retry-After, or no answer."""
    return not t.clean


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    cap, runs, healthy_after = asyncio.run(run_overload(o))
    tallies = [t for t, _ in runs]
    load = f"{o.rate:g} req/s" if o.rate else f"{o.factor:g}x capacity"
    notes = (
        f"capacity {cap:.2f} req/s ({o.concurrency} closed-loop clients, "
        f"{o.capacity_requests} requests of {o.items} items); {o.requests} requests at "
        f"{load} per client kind, one after another, the server idle between them",
        f"bodies: {o.body} ({'issue 80' if o.body == 'issue' else '60-word queries'}, "
        f"{o.items} items); healthy after: {healthy_after}",
    )
    key = f"overload-{'rate' if o.rate else 'factor'}-{o.body}"
    title = f"Overload at {load}, {o.body} bodies, by client kind"
    # The tallies only: the per-request outcomes (about 500 KB a run) stay out of docs/.
    figures = {
        "capacity_rps": round(cap, 2), "healthy_after": healthy_after,
        "tallies": [t.plain() | {k: v for k, v in s.items() if k != "outcomes"} for t, s in runs],
        "failed": any(map(failed, tallies)) or not healthy_after,
    }  # fmt: skip
    tables = [tally_table(tallies, "client")]
    return [run.result(title, tables, key=key, doc=OPERATIONS_DOC, notes=notes, figures=figures)]


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
