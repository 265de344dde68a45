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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import numpy as np

from loadtest.bench_llamacpp_served import SHAPES, work_ids
from loadtest.client import Deadline, Server, score_body
from loadtest.harness import JSON_HEADERS, Option, Result, Run, Workload, col, table, timed_together

RERANK = "/v1/rerank, 10 documents"
WORDS = ("river", "stone", "blue", "garden", "night", "paper", "window", "cloud", "salt")


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    urls, names = o.urls.split(","), o.names.split(",")
    deadline = Deadline.after(o.deadline_s)
    servers = [Endpoint(Server(url, deadline), httpx.Client(timeout=300.0), url) for url in urls]
    for server in servers:
        server.server.wait_healthy(o.health_timeout_s)
    bodies = round_bodies(np.random.default_rng(0), o.warm + o.rounds)
    calls = {
        f"{shape}|{name}": sender(server, shape, iter(each))
        for shape, each in bodies.items()
        for name, server in zip(names, servers, strict=True)
    }
    run.say(f"{o.warm} warm rounds, then {o.rounds} timed")
    seconds = timed_together(calls, o.rounds, o.warm, shuffle=True)
    rows = []
    for shape in bodies:
        keys = [f"{shape}|{name}" for name in names]
        cells = [f"{seconds[k]:.3f} ({seconds.spread(k)[0]:.3f}-{seconds.spread(k)[1]:.3f})"
                 for k in keys]  # fmt: skip
        rows.append((shape, *cells, seconds[keys[-1]] / seconds[keys[0]]))
    columns = [col("workload", left=True), *(col(f"{name} s", left=True) for name in names),
               col(f"{names[-1]} / {names[0]}", ".3f", "x")]  # fmt: skip
    notes = [f"servers: {', '.join(f'{n} at {u}' for n, u in zip(names, urls, strict=True))}",
             f"medians (interquartile range) of {o.rounds} rounds after {o.warm} warm ones, "
             "one request at a time, every request of a round in a shuffled order"]  # fmt: skip
    title = f"Two servers side by side: {' against '.join(names)}"
    figures = {"times": {k: list(v) for k, v in seconds.samples.items()}}
    key = f"served-ab-{'-'.join(names)}"
    return [run.result(title, [table(columns, rows)], key=key, notes=notes, figures=figures)]


@dataclass(frozen=True)
class Endpoint:
    server: Server  # /v1/score, /health
    client: httpx.Client  # the other routes, pooled as Server's
    url: str


def round_bodies(rng: np.random.Generator, rounds: int) -> dict[str, list[bytes]]:
    """Each workload's body of every round: a fresh query a round, the same on each server."""
    bodies: dict[str, list[bytes]] = {name: [] for name, *_ in SHAPES} | {RERANK: []}
    for _ in range(rounds):
        for name, query, items, item_tokens in SHAPES:
            bodies[name].append(score_body(*work_ids(rng, query, items, item_tokens)))
        words = [str(w) for w in rng.choice(WORDS, 40)]
        documents = [" ".join(words[i : i + 4]) for i in range(0, 40, 4)]
        rerank = {"query": " ".join(words[:3]), "documents": documents}
        bodies[RERANK].append(json.dumps(rerank).encode())
    return bodies


def sender(at: Endpoint, shape: str, bodies: Iterator[bytes]) -> Callable[[], object]:
    """A call sending the next of ``bodies`` to ``at`` (its /v1/score, or its /v1/rerank)."""
    if shape != RERANK:
        return lambda: at.server.score(next(bodies))

    def rerank() -> None:
        reply = at.client.post(f"{at.url}/v1/rerank", content=next(bodies), headers=JSON_HEADERS)
        if reply.status_code != 200:
            raise RuntimeError(f"/v1/rerank answered {reply.status_code}: {reply.text[:300]}")

    return rerank


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
