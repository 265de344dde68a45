"""Benchmark: /v1/rerank documents/s over HTTP at 10 and 100 documents.

Run it against a running server (``make serve``: the shipped config, ``rerank_method:
query_likelihood``), then against the same config with ``rerank_method: yes_no``; each run
writes its method's rows into one table of docs/benchmarks.md and keeps the other method's.
Documents come from the relevance set (tests/data/rerank_relevance), each request with its
own query and a per-request number in front of every document, so no request reads another's
cached prefix; one untimed request of each size runs first.

    python -m loadtest.bench_rerank --url http://127.0.0.1:8000 [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import time
from pathlib import Path

import httpx

from loadtest.bench_common import machine_description, write_section
from loadtest.rerank_quality import relevance_set

SECTION = "## Rerank over HTTP, shipped serve_config.yaml"
HEADER = "| rerank_method | documents | requests | median s | documents/s | tokens / request |"


def documents(tag: int, count: int) -> list[str]:
    """``count`` documents of the relevance set, each behind the request's own ``tag``."""
    pool = [doc for judged in relevance_set() for doc in judged.documents]
    return [f"{tag}. {pool[(tag * 7 + i) % len(pool)]}" for i in range(count)]


def timed_rerank(client: httpx.Client, query: str, docs: list[str]) -> tuple[float, int]:
    """Seconds and the model's tokens (usage) of one /v1/rerank."""
    start = time.perf_counter()
    reply = client.post("/v1/rerank", json={"query": query, "documents": docs})
    seconds = time.perf_counter() - start
    reply.raise_for_status()
    body = reply.json()
    assert len(body["results"]) == len(docs)
    return seconds, int(body["usage"]["total_tokens"])


def measure(url: str, sizes: list[int], repeats: int) -> tuple[str, list[str]]:
    """The served method and one table row per size."""
    queries = [judged.query for judged in relevance_set()]
    with httpx.Client(base_url=url, timeout=600) as client:
        method = client.get("/v1/models").json()["data"][0]["rerank_method"]
        rows, tag = [], 1000
        for size in sizes:
            timed_rerank(client, queries[-1], documents(tag, size))  # untimed: shapes recur
            runs = []
            for k in range(repeats):
                tag += 1
                runs.append(timed_rerank(client, queries[k % len(queries)], documents(tag, size)))
            median = statistics.median(seconds for seconds, _ in runs)
            tokens = statistics.median(t for _, t in runs)
            rows.append(
                f"| `{method}` | {size} | {repeats} | {median:.2f} | {size / median:.1f} "
                f"| {tokens:.0f} |"
            )
    return method, rows


def kept_rows(path: Path, method: str) -> list[str]:
    """The other methods' rows of the table already in ``path``."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    if SECTION not in lines:
        return []
    start = lines.index(SECTION) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("## ") or line.startswith("<!-- "):
            break
        if line.startswith("| `") and not line.startswith(f"| `{method}`"):
            rows.append(line)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--sizes", default="10,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    method, rows = measure(args.url, [int(n) for n in args.sizes.split(",")], args.repeats)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    table = "\n".join([HEADER, "|---|---:|---:|---:|---:|---:|", *rows])
    print(table)
    path = Path(args.output)
    today = datetime.date.today().isoformat()
    body = "\n".join(
        [
            f"`python -m loadtest.bench_rerank --url {args.url}` against `make serve`, then "
            "against the same config with `rerank_method: yes_no` (one server at a time, back "
            "to back); SmolLM2-135M-Instruct, float32.",
            "",
            f"- machine: {machine_description()}; latest run {today} at {commit or '?'}",
            "- each request: its own query and documents of the relevance set (10-20 tokens), "
            "a per-request number in front of each, so nothing is read from another request's "
            "cached prefix; one untimed request of each size first; one request at a time",
            "- tokens / request: the request's `usage.total_tokens`: query_likelihood's "
            "prompts (document + query), yes_no's query + document rows as `/v1/score` counts "
            "them (the shared ~60-token query once per document, though it is computed once)",
            "",
            HEADER,
            "|---|---:|---:|---:|---:|---:|",
            *sorted(kept_rows(path, method) + rows),
        ]
    )
    write_section(path, SECTION, body)


if __name__ == "__main__":
    main()
