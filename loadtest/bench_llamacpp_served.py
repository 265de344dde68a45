"""A running server against llama.cpp on the same GGUF, from the server's first request on.

RFC-008's served workloads, a fresh query per request on both sides (no query cache hit, no
KV reuse across requests): a 9-token query with 2 items (an empty one and one token), and a
300-token query with 10 and 100 items of 10 tokens, 3 labels each. Each round sends every
workload once over HTTP (one request at a time) and runs llama.cpp in this process on the
same token ids (the query evaluated once, its KV cache kept across the items), the two in
turn, alternating which goes first. Nothing is sent before the first timed round: the first
rounds are what a user gets right after /health answers, and each row says how many compiles
(request path, background) ran during its request and how many were pending when it ended.

    python -m loadtest run llamacpp_served --url http://127.0.0.1:8000 [--rounds 5] \
        [--server LABEL]

``--server`` names the server's tree in the result (the harness stamps this client's tree)
and keys the stored result, so servers of several commits can be compared side by side.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadtest import peers
from loadtest.bench_serve_report import ID_RANGE
from loadtest.client import Deadline, Server, score_body
from loadtest.harness import Option, Result, Run, Workload, col, ratio, table, timed_together

SHAPES = (("9-token query, 2 items", 9, 2, 1), ("300-token query, 10 items", 300, 10, 10),
          ("300-token query, 100 items", 300, 100, 10))  # fmt: skip


@dataclass(frozen=True)
class Turn:
    """One workload once on both sides in one round."""

    shape: str
    round: int
    served_s: float
    llama_s: float | None
    request_path: int  # compiles on the request path during the served request
    background: int  # background compiles finished during it
    pending: int  # background compiles queued or running when it ended


def work_ids(rng: np.random.Generator, query: int, items: int, item_tokens: int):
    """A fresh query's ids and its items' (the small shape's first item is empty)."""
    ids = lambda n: [int(t) for t in rng.integers(*ID_RANGE, n)]  # noqa: E731
    if items == 2 and item_tokens == 1:
        return ids(query), [[], ids(1)]
    return ids(query), [ids(item_tokens) for _ in range(items)]


def one_turn(server: Server, llama, shape, r: int, rng: np.random.Generator) -> Turn:
    name, query_n, items_n, item_tokens = shape
    query, items = work_ids(rng, query_n, items_n, item_tokens)
    calls = {"served": lambda: server.score(score_body(query, items))}
    if llama is not None:
        calls["local"] = lambda: llama.shared(query, items)
    if r % 2:  # alternating which goes first
        calls = dict(reversed(calls.items()))
    times = timed_together(calls, 1, warm=0, counters=server.stats)
    grown = lambda key: int(times.moved.get(key, 0))  # noqa: E731
    pending = int(server.stats().get("background_pending", 0))
    return Turn(name, r, times["served"], times.get("local"), grown("request_path_compiles"),
                grown("background_compiles"), pending)  # fmt: skip


def drive(server: Server, llama, rounds: int, seed: int) -> list[Turn]:
    rng = np.random.default_rng(seed)
    return [one_turn(server, llama, shape, r, rng) for r in range(rounds) for shape in SHAPES]


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summary_rows(turns: Sequence[Turn]) -> list[tuple]:
    rows = []
    for name, *_ in SHAPES:
        mine = [t for t in turns if t.shape == name]
        served, local = median([t.served_s for t in mine]), median([t.llama_s for t in mine])
        first = mine[0].served_s if mine else None
        rows.append((name, served, first, local, ratio(local, served)))
    return rows


SUMMARY = (
    col("workload", left=True), col("scorejax s (median)", ".3f"), col("first round s", ".3f"),
    col("llama.cpp s", ".3f"), col("llama.cpp / scorejax", ".2f", "x"),
)  # fmt: skip
ROUNDS = (
    col("round", "d"), col("workload", left=True), col("scorejax s", ".3f"),
    col("llama.cpp s", ".3f"), col("request-path compiles", "d"),
    col("background compiles", "d"), col("pending after", "d"),
)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    llama = peers.llama_cpp()
    deadline = Deadline.after(o.health_timeout_s + 3600)
    with Server(o.url or "http://127.0.0.1:8000", deadline) as server:
        server.wait_healthy(o.health_timeout_s)
        turns = drive(server, llama, o.rounds, o.seed)
    rows = summary_rows(turns)
    cells = [(t.round + 1, t.shape, t.served_s, t.llama_s, t.request_path, t.background,
              t.pending) for t in turns]  # fmt: skip
    server_tree = o.server or "not given (--server)"
    notes = (
        f"server: `make serve` of {server_tree}, shipped config; the client on the same host",
        f"{o.rounds} rounds from the server's first request on (nothing sent before); "
        "a fresh random query per request on both sides",
        "llama.cpp: llama-cpp-python in this process, Q4_1 GGUF, the query once and its KV "
        "cache kept across the items"
        if llama is not None
        else peers.NOT_INSTALLED,
        f"compiles during the run: {sum(t.request_path for t in turns)} on the request path, "
        f"{sum(t.background for t in turns)} in the background",
    )
    figures = {name: {"served_s": s, "llama_s": q, "ratio": r} for name, s, _, q, r in rows}
    key = f"llamacpp-served-{o.server}" if o.server else "llamacpp-served"
    title = f"Served against llama.cpp, from the first request ({server_tree})"
    tables = [table(SUMMARY, rows), table(ROUNDS, cells)]
    return [run.result(title, tables, key=key, notes=notes, figures=figures)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--rounds", 5), Option("--seed", 0), Option("--health-timeout-s", 900.0),
        Option("--server", "", "the server's tree (keys the stored result)"),
    ),
    measure=measure,
)  # fmt: skip
