"""Two running servers side by side in one run: the same requests, in turn, on each.

    python -m loadtest run served_ab --urls http://127.0.0.1:8101,http://127.0.0.1:8102 \
        --names before,after [--rounds 12] [--warm 2]

For comparing two trees' servers (each started with ``make serve``'s settings on its own
port): every round sends each workload once to each server, one request at a time, in a
shuffled order; the query is fresh per round (no query cache hit) and the same on both
servers. The first ``--warm`` rounds are not timed (each server's exact signatures compile
in the background there, llamacpp_served shows the first rounds). Workloads: RFC-008's
served ones (a 9-token query with 2 items, a 300-token query with 10 and 100 items of 10
tokens, 3 labels) and a /v1/rerank of 10 short documents.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from loadtest.bench_llamacpp_served import SHAPES, work_ids
from loadtest.client import Deadline, Server, score_body
from loadtest.harness import Option, Result, Run, Workload, col, table

RERANK = "/v1/rerank, 10 documents"
WORDS = ("river", "stone", "blue", "garden", "night", "paper", "window", "cloud", "salt")


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    urls, names = o.urls.split(","), o.names.split(",")
    deadline = Deadline.after(o.deadline_s)
    servers = [Endpoint(Server(url, deadline), httpx.Client(timeout=300.0), url) for url in urls]
    for server in servers:
        server.server.wait_healthy(o.health_timeout_s)
    rng, order = np.random.default_rng(0), random.Random(0)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(o.warm + o.rounds):
        run.say(f"round {r + 1} of {o.warm + o.rounds}{' (warm)' if r < o.warm else ''}")
        for shape, send in workloads(rng):
            turns = list(zip(names, servers, strict=True))
            order.shuffle(turns)
            for name, server in turns:
                seconds = send(server)
                if r >= o.warm:
                    times.setdefault((shape, name), []).append(seconds)
    rows = []
    for shape in dict.fromkeys(shape for shape, _ in times):
        medians = [statistics.median(times[shape, name]) for name in names]
        spread = [np.percentile(times[shape, name], [25, 75]) for name in names]
        cells = [
            f"{m:.3f} ({lo:.3f}-{hi:.3f})" for m, (lo, hi) in zip(medians, spread, strict=True)
        ]
        rows.append((shape, *cells, medians[-1] / medians[0]))
    columns = [col("workload", left=True), *(col(f"{name} s", left=True) for name in names),
               col(f"{names[-1]} / {names[0]}", ".3f", "x")]  # fmt: skip
    notes = [f"servers: {', '.join(f'{n} at {u}' for n, u in zip(names, urls, strict=True))}",
             f"medians (interquartile range) of {o.rounds} rounds after {o.warm} warm ones, "
             "one request at a time, the servers in a shuffled order each round"]  # fmt: skip
    title = f"Two servers side by side: {' against '.join(names)}"
    figures = {"times": {f"{shape}|{name}": t for (shape, name), t in times.items()}}
    key = f"served-ab-{'-'.join(names)}"
    return [run.result(title, [table(columns, rows)], key=key, notes=notes, figures=figures)]


@dataclass(frozen=True)
class Endpoint:
    server: Server  # /v1/score, /health
    client: httpx.Client  # the other routes, pooled as Server's
    url: str


def workloads(rng: np.random.Generator) -> list[tuple[str, Callable[[Endpoint], float]]]:
    """This round's requests, each a function timing it on a server."""
    sends = []
    for name, query, items, item_tokens in SHAPES:
        query_ids, item_ids = work_ids(rng, query, items, item_tokens)
        body = score_body(query_ids, item_ids)
        sends.append((name, lambda at, b=body: at.server.score(b)))
    words = [str(w) for w in rng.choice(WORDS, 40)]
    documents = [" ".join(words[i : i + 4]) for i in range(0, 40, 4)]
    rerank = json.dumps({"query": " ".join(words[:3]), "documents": documents}).encode()
    sends.append((RERANK, lambda at, b=rerank: timed_post(at, "/v1/rerank", b)))
    return sends


def timed_post(at: Endpoint, path: str, body: bytes) -> float:
    start = time.perf_counter()
    headers = {"content-type": "application/json"}
    reply = at.client.post(f"{at.url}{path}", content=body, headers=headers)
    if reply.status_code != 200:
        raise RuntimeError(f"{path} answered {reply.status_code}: {reply.text[:300]}")
    return time.perf_counter() - start


WORKLOAD = Workload(
    options=(
        Option("--urls", "http://127.0.0.1:8101,http://127.0.0.1:8102"),
        Option("--names", "before,after"),
        Option("--rounds", 12),
        Option("--warm", 2),
        Option("--deadline-s", 3600.0),
        Option("--health-timeout-s", 900.0),
    ),
    measure=measure,
)
