"""Benchmark: /v1/rerank documents/s over HTTP at 10 and 100 documents.

Run it against a running server (``make serve``: the shipped config, ``rerank_method:
query_likelihood``), then against the same config with ``rerank_method: yes_no``; each run
stores its method's result (docs/results/rerank-<method>.json).
Documents come from the relevance set (tests/data/rerank_relevance), each request with its
own query and a per-request number in front of every document, so no request reads another's
cached prefix; one untimed request of each size runs first.

    python -m loadtest run rerank --url http://127.0.0.1:8000 [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from functools import partial

import httpx

from loadtest.harness import Option, Result, Run, Workload, col, counts, table, timed_together
from loadtest.rerank_quality import relevance_set


def documents(tag: int, count: int) -> list[str]:
    """``count`` documents of the relevance set, each behind the request's own ``tag``."""
    pool = [doc for judged in relevance_set() for doc in judged.documents]
    return [f"{tag}. {pool[(tag * 7 + i) % len(pool)]}" for i in range(count)]


def measure_sizes(url: str, sizes: list[int], repeats: int) -> tuple[str, list[tuple]]:
    """The served method and one table row per size: every size once a round in turn, each
    request with a fresh tag, after one untimed round (shapes recur)."""
    queries = [judged.query for judged in relevance_set()]
    tags, tokens = itertools.count(1000), {size: [] for size in sizes}
    with httpx.Client(base_url=url, timeout=600) as client:
        method = client.get("/v1/models").json()["data"][0]["rerank_method"]

        def rerank(size: int) -> None:
            tag = next(tags)
            body = {"query": queries[tag % len(queries)], "documents": documents(tag, size)}
            reply = client.post("/v1/rerank", json=body).raise_for_status().json()
            assert len(reply["results"]) == size
            tokens[size].append(int(reply["usage"]["total_tokens"]))

        calls = {str(size): partial(rerank, size) for size in sizes}
        seconds = timed_together(calls, repeats)
    return method, [
        (f"`{method}`", size, repeats, seconds[str(size)], size / seconds[str(size)],
         statistics.median(tokens[size][1:]))
        for size in sizes
    ]  # fmt: skip


COLUMNS = (
    col("rerank_method", left=True), col("documents", "d"), col("requests", "d"),
    col("median s", ".2f"), col("documents/s", ".1f"), col("tokens / request", ".0f"),
)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    """One result per served method: run it against each ``rerank_method`` in turn."""
    method, rows = measure_sizes(o.url or "http://127.0.0.1:8000", counts(o.sizes), o.repeats)
    notes = (
        f"against `make serve` with `rerank_method: {method}`; SmolLM2-135M-Instruct, float32",
        "each request: its own query and documents of the relevance set (10-20 tokens), a "
        "per-request number in front of each, so nothing is read from another request's cached "
        "prefix; one untimed request of each size first, then rounds of one request of each size "
        "in turn; one request at a time",
        "tokens / request: the request's `usage.total_tokens`: query_likelihood's prompts "
        "(document + query), yes_no's query + document rows as `/v1/score` counts them",
    )
    title = f"Rerank over HTTP, `rerank_method: {method}`"
    return [run.result(title, [table(COLUMNS, rows)], key=f"rerank-{method}", notes=notes)]


WORKLOAD = Workload(
    url=True,
    options=(Option("--sizes", "10,100"), Option("--repeats", 3)),
    measure=measure,
)
