"""RFC-008's workload from a server's first request on, cold: what users get after a restart.

Unlike ``bench_serve`` (which warms each shape before timing), nothing is sent before the
timed requests: from the moment /health answers, requests of 10 and 100 items (a fresh
300-token query each, 10-token items, 3 labels) alternate for ``--seconds``, one at a time.
Each row reads /v1/stats around its request: wall time, padding (computed / useful tokens)
and compiles. The summary is what a restart's first minute costs: padding over the window
and the median 100-item time, to compare against a server started with an empty cache.

    python -m loadtest run first_minute --url http://127.0.0.1:8000 [--seconds 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from loadtest.bench_serve_report import ID_RANGE, Sample, total
from loadtest.client import Deadline, Server, score_body
from loadtest.harness import TOOL_RESULTS, Option, Result, Run, Workload, col, ratio, table

ITEM_COUNTS = (10, 100)
QUERY_TOKENS, ITEM_TOKENS = 300, 10


def drive(server: Server, seconds: float, seed: int) -> list[tuple[int, Sample, dict]]:
    """Alternate 10- and 100-item requests with fresh queries until ``seconds`` pass."""
    rng = np.random.default_rng(seed)
    ids = lambda n: [int(t) for t in rng.integers(*ID_RANGE, n)]  # noqa: E731
    rows: list[tuple[int, Sample, dict]] = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        n = ITEM_COUNTS[len(rows) % len(ITEM_COUNTS)]
        body = score_body(ids(QUERY_TOKENS), [ids(ITEM_TOKENS) for _ in range(n)])
        before = server.stats()
        wall = server.score(body)
        after = server.stats()
        rows.append((n, Sample.between(wall, before, after), after))
    return rows


COLUMNS = (
    col("#", "d"), col("items", "d"), col("wall s", ".2f"), col("padding", ".2f"),
    col("request-path compiles", "d"), col("background compiles", "d"),
)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    deadline = Deadline.after(o.health_timeout_s + o.seconds + 600)
    with Server(o.url or "http://127.0.0.1:8000", deadline) as server:
        server.wait_healthy(o.health_timeout_s)
        started = server.stats()
        rows = drive(server, o.seconds, o.seed)
    grown = lambda after, key: after.get(key, 0) - started.get(key, 0)  # noqa: E731
    cells = [
        (i, n, s.wall_s, ratio(s.computed_tokens, s.useful_tokens),
         grown(after, "request_path_compiles"), grown(after, "background_compiles"))
        for i, (n, s, after) in enumerate(rows, 1)
    ]  # fmt: skip
    samples = [sample for _, sample, _ in rows]
    padding = ratio(
        total([s.computed_tokens for s in samples]), total([s.useful_tokens for s in samples])
    )
    hundred = [s.wall_s for n, s, _ in rows if n == 100]
    figures = {
        "requests": len(rows),
        "padding": padding,
        "median_100_item_s": statistics.median(hundred) if hundred else None,
    }
    notes = (f"requests {len(rows)}, padding over the window {padding or 0:.3f}",)
    tables = [table(COLUMNS, cells)]
    return [run.result("The first minute after a start", tables, notes=notes, figures=figures)]


WORKLOAD = Workload(
    url=True,
    options=(Option("--seconds", 60.0), Option("--seed", 0), Option("--health-timeout-s", 900.0)),
    measure=measure,
    out=TOOL_RESULTS,
)
