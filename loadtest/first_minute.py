"""RFC-008's workload from a server's first request on, cold: what users get after a restart.

Unlike ``bench_serve`` (which warms each shape before timing), nothing is sent before the
timed requests: from the moment /health answers, requests of 10 and 100 items (a fresh
300-token query each, 10-token items, 3 labels) alternate for ``--seconds``, one at a time.
Each row reads /v1/stats around its request: wall time, padding (computed / useful tokens)
and compiles. The summary is what a restart's first minute costs: padding over the window
and the median 100-item time, to compare against a server started with an empty cache.

    python -m loadtest.first_minute --url http://127.0.0.1:8000 [--seconds 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import numpy as np

from loadtest.bench_serve_report import ID_RANGE, Sample, ratio, total
from loadtest.server_client import Deadline, Server, score_body

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


def report(rows: Sequence[tuple[int, Sample, dict]], started: dict) -> str:
    lines = [
        "| # | items | wall s | padding | request-path compiles | background compiles |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for index, (n, sample, after) in enumerate(rows, 1):
        padding = ratio(sample.computed_tokens, sample.useful_tokens)
        lines.append(
            f"| {index} | {n} | {sample.wall_s:.2f} | {padding or 0:.2f} | "
            f"{after.get('request_path_compiles', 0) - started.get('request_path_compiles', 0)} | "
            f"{after.get('background_compiles', 0) - started.get('background_compiles', 0)} |"
        )
    samples = [sample for _, sample, _ in rows]
    padding = ratio(
        total([s.computed_tokens for s in samples]), total([s.useful_tokens for s in samples])
    )
    hundred = [s.wall_s for n, s, _ in rows if n == 100]
    lines.append("")
    lines.append(
        f"requests {len(rows)}, padding over the window {padding or 0:.3f}, median 100-item "
        f"time {statistics.median(hundred) if hundred else float('nan'):.2f} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--health-timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    server = Server(args.url, Deadline.after(args.health_timeout_s + args.seconds + 600))
    try:
        server.wait_healthy(args.health_timeout_s)
        started = server.stats()
        print(report(drive(server, args.seconds, args.seed), started), flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
