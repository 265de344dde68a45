"""Benchmark: reranking long documents by their chunks (semantics 24) over HTTP, three clients.

``--docs`` documents of ``--doc-tokens`` tokens (spread evenly from the first length to the
second) against one query, on a running server (the shipped model):

- chunked: one /v1/rerank with ``max_chunks_per_doc`` and ``chunk_tokens`` (every chunk an
  item behind the query, scored in the request's steps, folded by the server);
- pre-cut: the same chunks sent as documents of their own in one /v1/rerank
  (``max_chunks_per_doc: 1``), folded by the client;
- per chunk: a client that chunks and calls /v1/rerank once per chunk (``--concurrency`` at
  a time: ``1,8`` both), as clients of servers without chunking do.

The chunks are cut here with the server's own code (``app.chunks``) and the SmolLM2 tokenizer,
so all three score the same texts; the table's last column is the largest difference of a
document's relevance from the chunked answer (0 or the float32 floor). Each client runs once
untimed first (shapes compile), then ``--repeats`` times.

    python -m loadtest run long_rerank --url http://127.0.0.1:8000 \\
        [--docs 20] [--doc-tokens 2000,8000] [--chunk-tokens 512] [--concurrency 1,8]

The full size needs the server's ``max_request_tokens`` above the documents' tokens (~110k;
the shipped config says 32768) and, with ``limit_to_warmup``, envelopes of chunk-sized items.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from loadtest.harness import Option, Result, Run, Workload, col, counts, table, timed_together
from loadtest.rerank_quality import relevance_set

ANSWER = " The treaty that ended the long war was signed in the harbour town of Zanzibar."
QUERY = "Where was the treaty that ended the war signed?"


def long_documents(tokenizer: Any, count: int, shortest: int, longest: int) -> list[str]:
    """``count`` documents of ``shortest``..``longest`` tokens made of the relevance set's
    passages; the answer sits in the middle of the third document (past its first chunk)."""
    pool = [doc for judged in relevance_set() for doc in judged.documents]
    lengths = np.linspace(shortest, longest, count).astype(int) if count > 1 else [longest]
    documents, at = [], 0
    for index, length in enumerate(lengths):
        parts: list[str] = []
        tokens = 0
        while tokens < length:
            passage = f" {pool[at % len(pool)]}"
            at += 1
            parts.append(passage)
            tokens += len(tokenizer(passage, add_special_tokens=False)["input_ids"])
        if index == min(2, count - 1):
            parts.insert(len(parts) // 2, ANSWER)
        documents.append("".join(parts).strip())
    return documents


MAX_RETRIES = 200  # 503s one request is sent again after, at most


def _post(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The answer, and how many 503s (``overloaded``) were sent again after their Retry-After
    (at most ``MAX_RETRIES``), as a client of a server that refuses what it cannot start
    within its bound does."""
    retried = 0
    while (reply := client.post("/v1/rerank", json=body)).status_code == 503:
        if retried == MAX_RETRIES:  # a server that never admits it: fail, never hang
            break
        retried += 1
        time.sleep(float(reply.headers.get("retry-after", 1)))
    reply.raise_for_status()
    return reply.json(), retried


# A client's run: each document's relevance, requests, tokens the server read, 503s retried.
Answer = tuple[np.ndarray, int, int, int]


def _by_index(body: dict[str, Any]) -> np.ndarray:
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    return np.asarray([scores[i] for i in range(len(scores))], np.float64)


def _fold(chunk_scores: np.ndarray, owners: tuple[int, ...], documents: int) -> np.ndarray:
    owned = np.asarray(owners)
    return np.asarray([chunk_scores[owned == d].max() for d in range(documents)], np.float64)


def clients(
    client: httpx.Client, documents: list[str], chunks: Any, options: argparse.Namespace
) -> dict[str, Callable[[], Answer]]:
    """Each client: () -> (each document's relevance, requests, tokens the server read, 503s
    retried)."""
    texts, owners, count = list(chunks.texts), chunks.owners, len(documents)
    chunking = {"chunk_tokens": options.chunk_tokens}
    chunking["max_chunks_per_doc"] = chunks.options.max_chunks

    def chunked() -> Answer:
        body, retried = _post(client, {"query": QUERY, "documents": documents, **chunking})
        return _by_index(body), 1, body["usage"]["total_tokens"], retried

    def pre_cut() -> Answer:
        one = {"query": QUERY, "documents": texts, "max_chunks_per_doc": 1}
        body, retried = _post(client, one)
        return _fold(_by_index(body), owners, count), 1, body["usage"]["total_tokens"], retried

    def per_chunk(concurrency: int) -> Callable[[], Answer]:
        def one(text: str) -> tuple[dict[str, Any], int]:
            return _post(client, {"query": QUERY, "documents": [text]})

        def run() -> Answer:
            with ThreadPoolExecutor(concurrency) as pool:
                answers = list(pool.map(one, texts))
            bodies = [body for body, _ in answers]
            scores = np.asarray([b["results"][0]["relevance_score"] for b in bodies], np.float64)
            tokens = sum(b["usage"]["total_tokens"] for b in bodies)
            retried = sum(n for _, n in answers)
            return _fold(scores, owners, count), len(texts), tokens, retried

        return run

    per = {f"per-chunk requests, {n} at a time": per_chunk(n) for n in counts(options.concurrency)}
    return {"chunked (one request)": chunked, "pre-cut chunks as documents": pre_cut, **per}


def measure_clients(options: argparse.Namespace) -> tuple[str, list[tuple], dict[str, Any]]:
    from app.chunks import ChunkOptions, chunk_documents
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    tokenizer = load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct"))
    shortest, longest = counts(options.doc_tokens)
    documents = long_documents(tokenizer, options.docs, shortest, longest)
    most = -(-longest // options.chunk_tokens) + 1
    chunks = chunk_documents(tokenizer, documents, ChunkOptions(most, options.chunk_tokens), None)
    url = options.url or "http://127.0.0.1:8000"
    limits = httpx.Limits(max_connections=max(counts(options.concurrency)) + 1)
    with httpx.Client(base_url=url, timeout=3600, limits=limits) as client:
        method = client.get("/v1/models").json()["data"][0]["rerank_method"]
        seconds = timed_together(clients(client, documents, chunks, options), options.repeats)
    reference = seconds.last["chunked (one request)"][0]
    slowest = seconds[f"per-chunk requests, {counts(options.concurrency)[0]} at a time"]
    rows = []
    for name, (relevance, requests, tokens, retried) in seconds.last.items():
        median = seconds[name]
        diff = float(np.max(np.abs(relevance - reference)))
        rows.append((name, requests, retried, len(chunks.texts), median,
                     len(chunks.texts) / median, slowest / median, tokens, diff))  # fmt: skip
    facts = {"method": method, "top": int(np.argmax(reference)), "chunks": len(chunks.texts)}
    return method, rows, facts


COLUMNS = (
    col("client", left=True), col("requests", "d"), col("503s retried", "d"), col("chunks", "d"),
    col("median s", ".2f"),
    col("chunks/s", ".1f"), col("vs per-chunk", ".1f", suffix="x"), col("tokens", "d"),
    col("max relevance diff", ".1e"),
)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    method, rows, facts = measure_clients(o)
    shortest, longest = counts(o.doc_tokens)
    notes = (
        f"against {o.server}, `rerank_method: {method}`; SmolLM2-135M-Instruct, float32",
        f"{o.docs} documents of {shortest}-{longest} tokens (relevance-set passages) against one "
        f"query, chunks of {o.chunk_tokens} tokens: {facts['chunks']} chunks; the answer sits "
        f"past the first chunk of document 2, ranked first: {facts['top'] == 2}",
        f"per-chunk requests: {o.concurrency} at a time (`vs per-chunk`: against the first); "
        f"one untimed run of each client first, then the median of {o.repeats} rounds, each "
        "client once a round in turn; tokens: the answers' `usage.total_tokens`; a 503 "
        "`overloaded` (the server's bound on a request's wait) is sent again after its "
        "Retry-After, its wait counted in the client's time",
        "target: chunked >= 5x the per-chunk client",
    )
    title = f"Long documents: chunked rerank, `rerank_method: {method}`"
    key = f"long_rerank-{method}"
    return [run.result(title, [table(COLUMNS, rows)], key=key, notes=notes)]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--docs", 20),
        Option("--doc-tokens", "2000,8000"),
        Option("--chunk-tokens", 512),
        Option("--concurrency", "1,8"),
        Option("--repeats", 1),
        Option("--server", "`make serve` (serve_config.yaml)", help="what serves --url"),
    ),
    measure=measure,
)
