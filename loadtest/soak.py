"""``python -m loadtest run soak``: a mixed closed-loop soak of a running server, with its RSS.

    python -m loadtest run soak --url http://127.0.0.1:8000 --minutes 10 [--clients 3]

``--clients`` closed-loop clients send, for ``--minutes``, a seeded mix of request kinds:

- ``repeat``: a query from a small fixed pool (query-cache hits), 1..100 text items of 0..24
  words;
- ``fresh``: a never-seen text query (query-cache misses), 1..100 items (``load.score_body``);
- ``tokens``: token-id query (half from a fixed pool, half fresh) and 1..100 token-id items;
- ``item_first``: ``item_first: true`` (the single-item path), 1..4 short items;
- ``invalid``: ``loadtest.fuzz_strategies.fuzz_bodies`` in turn (400s; never a 500).

``--pool N`` draws instead from N such bodies per client, fixed at the start: once each has
been served, there is nothing new to compile or to cache, so RSS that still grows is a leak.

Every ``--sample-s`` seconds it reads, from outside (psutil, this machine's process table),
the RSS of the Ray workers that host the ``ScoringReplica`` and ``ScoreIngress`` replicas
(process titles ``ray::ServeReplica:<app>:<deployment>...``, children of the raylet whose
proxy listens on the URL's port, so a test suite's Ray cluster beside it is not counted),
and ``GET /v1/stats`` (query cache bytes, compiles). The server is not modified. First (unless
``--no-fill-cache``) it fills the query cache to 90 % of its bound with distinct long queries:
the cache grows to its bound by design, which is warm-up, not growth.

Verdict: per worker process (Serve may run two ingress replicas), from warm-up (the first
sample at or after ``--warmup-s`` that also follows one completed request of every kind) on:
its floor (smallest RSS sample) in the last 2 minutes against its floor in the first 2;
"flat" when within ``--tolerance-pct`` (5 %). The warm-up, largest and final samples are
reported beside it, not judged: a sample taken during a large step includes that step's
working memory, which the step frees. Its result (loadtest/results/soak-<time>.json) holds
every sample and outcome; exits 1 when RSS is not flat, the scoring replica's process was
replaced, a valid request got anything but 200 or the documented refusal (503 ``overloaded``
with ``Retry-After``; the client then waits as told, at most 10 s), or a fuzz body got a 5xx
other than that refusal or no answer. ``replica_less_cache`` (replica RSS minus the query
cache's bytes, which ``query_cache_bytes`` bounds) is recorded to tell cache fill from other
growth; it is not judged. Not part of CI (``make soak``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from loadtest.client import WORDS, send
from loadtest.fuzz_strategies import fuzz_bodies
from loadtest.harness import LABELS, TOOL_RESULTS, Option, Result, Run, Workload, col, table
from loadtest.load import score_body
from loadtest.procs import MIB, find_workers, rss_mib, serving_raylet
from loadtest.soak_verdict import KINDS, verdict

WEIGHTS = (30, 20, 20, 15, 15)


@dataclass
class Tally:
    done: int = 0
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    unexpected: collections.Counter = field(default_factory=collections.Counter)
    seconds: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))


class Mix:
    """Seeded request bodies: ``next()`` returns ``(kind, json payload or raw bytes)``."""

    def __init__(self, seed: int, vocab_size: int, pool: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab_size
        pool_rng = random.Random(1000)
        self.queries = [
            " ".join(pool_rng.choice(WORDS) for _ in range(pool_rng.randint(8, 60)))
            for _ in range(6)
        ]
        self.token_queries = [self._ids(pool_rng, 8, 60) for _ in range(4)]
        self.invalid = fuzz_bodies(300, seed=seed)
        self.serial = 0
        # --pool: the same few bodies over and over (after one pass: no new signatures to
        # compile, every query cached), to tell a leak from warm-up that takes long.
        self.pool = [self._make() for _ in range(pool)]

    def next(self) -> tuple[str, dict | bytes]:
        return self.rng.choice(self.pool) if self.pool else self._make()

    def _ids(self, rng: random.Random, low: int, high: int) -> list[int]:
        # Above the special tokens (the delimiter is 0) and below the vocabulary size.
        return [rng.randrange(100, self.vocab) for _ in range(rng.randint(low, high))]

    def _items(self) -> list[str]:
        rng = self.rng
        count = rng.randint(1, 100)
        longest = rng.choice((2, 8, 24))
        return [
            " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, longest)))
            for _ in range(count)
        ]

    def _make(self) -> tuple[str, dict | bytes]:
        rng = self.rng
        self.serial += 1
        kind = rng.choices(KINDS, WEIGHTS)[0]
        softmax = rng.random() < 0.5
        if kind == "repeat":
            payload = {"query": rng.choice(self.queries), "items": self._items()}
        elif kind == "fresh":
            payload = score_body(rng, 100)
            payload["query"] = f"request {self.serial} {seed_word(rng)} {payload['query']}"
        elif kind == "tokens":
            fresh = rng.random() < 0.5
            query = self._ids(rng, 4, 60) if fresh else rng.choice(self.token_queries)
            items = [self._ids(rng, 1, rng.choice((3, 10, 30))) for _ in range(rng.randint(1, 100))]
            payload = {"query": query, "items": items}
        elif kind == "item_first":
            payload = {
                "query": rng.choice(self.queries[:3]),
                "items": [
                    f" {rng.choice(WORDS)} {rng.choice(WORDS)}" for _ in range(rng.randint(1, 4))
                ],
                "item_first": True,
            }
        else:
            return kind, self.invalid[self.serial % len(self.invalid)]
        payload["label_token_ids"] = list(LABELS)
        payload["apply_softmax"] = softmax
        return kind, payload


async def fill_query_cache(client: httpx.AsyncClient, vocab: int) -> dict:
    """Warm-up of the query cache: distinct 1000-token queries (one item each) until it is
    full (an insert evicted: its entry count stopped growing) or holds 90 % of
    ``query_cache_capacity_bytes``, so a cache that fills up to its bound (by design) is not
    read as growth. Returns the stats it stopped at."""
    rng = random.Random(-1)
    entries = -1
    for _ in range(100):
        stats = (await client.get("/v1/stats", timeout=30)).json()
        capacity = stats.get("query_cache_capacity_bytes") or 0
        full = stats.get("query_cache_entries", 0) <= entries
        if full or stats.get("query_cache_bytes", 0) >= 0.9 * capacity:
            return stats
        body = {
            "query": [rng.randrange(100, vocab) for _ in range(1000)],
            "items": [[rng.randrange(100, vocab)]],
            "label_token_ids": list(LABELS),
        }
        answer = await client.post("/v1/score", json=body)
        if answer.status_code == 503:
            await asyncio.sleep(min(float(answer.headers.get("retry-after", 1)), 10.0))
        else:
            entries = stats.get("query_cache_entries", 0)
    return stats


def seed_word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))


async def sample(client: httpx.AsyncClient, start: float, tally: Tally, raylet: int | None) -> dict:
    row: dict = {
        "t_s": round(time.monotonic() - start, 1),
        "done": tally.done,
        "kinds_done": sorted(tally.by_kind),
        "statuses": dict(sorted(tally.statuses.items())),
    }
    for role, procs in find_workers(raylet).items():
        row[f"{role}_rss_mib"] = rss_mib(procs)  # {pid: MiB}; Serve may run several
    try:
        stats = (await client.get("/v1/stats", timeout=30)).json()
        keys = ("query_cache_bytes", "query_cache_entries", "compile_count", "evicted_signatures")
        for key in keys:
            row[key] = stats.get(key)
        row["background_compiles"] = stats.get("background_compiles")
    except (httpx.HTTPError, ValueError):
        row["query_cache_bytes"] = None
    cache = row["query_cache_bytes"]
    replicas = row["replica_rss_mib"]
    if len(replicas) == 1 and isinstance(cache, int):
        # What the replica holds besides the query cache (bounded by query_cache_bytes).
        row["replica_less_cache_mib"] = {
            pid: round(mib - cache / MIB, 1) for pid, mib in replicas.items()
        }
    else:
        row["replica_less_cache_mib"] = {}
    return row


def expected(kind: str, status: int, reason: str, retry_after: str | None) -> bool:
    """Valid bodies: 200, or the documented refusal (503 overloaded + Retry-After). Fuzz
    bodies: never a 5xx or no answer (a mutation may happen to be valid: 200, or 503)."""
    if kind == "invalid":
        return status != 0 and (status < 500 or status == 503)
    return status == 200 or (status == 503 and reason == "overloaded" and bool(retry_after))


async def client_loop(client: httpx.AsyncClient, mix: Mix, stop_at: float, tally: Tally) -> None:
    while time.monotonic() < stop_at:
        kind, payload = mix.next()
        outcome = await send(client, payload)
        status, seconds, reason = outcome.status, outcome.seconds, outcome.reason
        retry_after = outcome.retry_after
        tally.done += 1
        tally.by_kind[kind] += 1
        tally.statuses[status] += 1
        tally.seconds[kind] += seconds
        if not expected(kind, status, reason, retry_after):
            tally.unexpected[f"{kind} {status} {reason}".strip()] += 1
        if status == 503 and retry_after and retry_after.isdigit():
            # A well-behaved client waits as told (capped) instead of spinning on refusals.
            await asyncio.sleep(min(float(retry_after), 10.0, max(stop_at - time.monotonic(), 0)))


def print_row(row: dict) -> None:
    errors = ", ".join(f"{k}:{v}" for k, v in row["statuses"].items() if k != 200) or "-"
    cache = row.get("query_cache_bytes")
    cache_mib = f"{cache / MIB:7.1f}" if isinstance(cache, int) else "      ?"
    replica = "+".join(str(v) for v in row["replica_rss_mib"].values()) or "?"
    ingress = "+".join(str(v) for v in row["ingress_rss_mib"].values()) or "?"
    print(
        f"{row['t_s'] / 60:5.2f} {row['done']:5d} {errors:>24} {replica:>11} {ingress:>13} "
        f"{cache_mib} {row.get('compile_count')!s:>8} {row.get('background_compiles')!s:>10}",
        flush=True,
    )


async def soak(args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout_s, limits=limits) as c:
        try:
            healthy = (await c.get("/health")).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if not healthy:
            raise SystemExit(f"{args.url}/health is not 200: start the server first")
        model = (await c.get("/v1/models")).json()["data"][0]
        tally, samples = Tally(), []
        raylet = serving_raylet(urlparse(args.url).port or 80)
        if raylet is None:
            print("warning: cannot see who listens on the URL's port: every Ray cluster's")
            print("ScoringReplica / ScoreIngress workers on this machine are counted")
        workers = find_workers(raylet)
        if not workers["replica"] or not workers["ingress"]:
            raise SystemExit("no ScoringReplica / ScoreIngress worker in this machine's ps")
        if args.fill_cache:
            filled = await fill_query_cache(c, model["vocab_size"])
            print(
                f"query cache filled: {filled.get('query_cache_bytes', 0) / MIB:.1f} MiB",
                flush=True,
            )
        print(
            "  min  reqs  non-200 answers by status  replica MiB   ingress MiB  cacheMiB compiles"
            " background",
            flush=True,
        )
        start = time.monotonic()
        stop_at = start + args.minutes * 60
        mixes = [Mix(args.seed + i, model["vocab_size"], args.pool) for i in range(args.clients)]
        kinds = frozenset(kind for mix in mixes for kind, _ in mix.pool) or frozenset(KINDS)
        loops = [asyncio.create_task(client_loop(c, mix, stop_at, tally)) for mix in mixes]
        while True:
            row = await sample(c, start, tally, raylet)
            samples.append(row)
            print_row(row)
            if all(t.done() for t in loops):
                break
            await asyncio.wait(loops, timeout=args.sample_s)
        for task in loops:
            task.result()  # re-raise a client's exception, if any
        wall = time.monotonic() - start
        healthy = (await c.get("/health")).status_code == 200
    return {
        "url": args.url,
        "model": model["id"],
        "minutes": args.minutes,
        "clients": args.clients,
        "seed": args.seed,
        "pool": args.pool,
        "filled_cache": args.fill_cache,
        "raylet_pid": raylet,
        "mix": dict(zip(KINDS, WEIGHTS, strict=True)),
        "wall_s": round(wall, 1),
        "requests": tally.done,
        "requests_per_s": round(tally.done / wall, 2),
        "by_kind": dict(tally.by_kind),
        "mean_s_by_kind": {k: round(tally.seconds[k] / n, 3) for k, n in tally.by_kind.items()},
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "unexpected": dict(tally.unexpected),
        "healthy_after": healthy,
        "verdict": verdict(samples, args.warmup_s, args.tolerance_pct, kinds),
        "samples": samples,
    }


COLUMNS = (
    col("role, pid", left=True), col("warm-up MiB", ".1f"), col("max MiB", ".1f"),
    col("max change", "+.2f", " %"), col("end MiB", ".1f"), col("floor first MiB", ".1f"),
    col("floor last MiB", ".1f"), col("floor change", "+.2f", " %"), col("flat", left=True),
    col("gone at s", ".1f"),
)  # fmt: skip


def verdict_rows(v: dict) -> list[tuple]:
    """One row per judged process (replica_less_cache: a diagnostic, not judged)."""
    rows = []
    for role in ("replica", "ingress", "replica_less_cache"):
        for pid, r in v.get(role, {}).get("processes", {}).items():
            rows.append((f"{role} {pid}", r["warmup_mib"], r["max_mib"], r["max_change_pct"],
                         r["final_mib"], r["floor_first_mib"], r["floor_last_mib"],
                         r["floor_change_pct"], "yes" if r["flat"] else "NOT flat",
                         r["gone_at_s"]))  # fmt: skip
    return rows


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.url = o.url or "http://127.0.0.1:8000"
    result = asyncio.run(soak(o))
    v = result["verdict"]
    ok = v["flat"] and not result["unexpected"] and result["healthy_after"]
    result["failed"] = not ok
    notes = (
        f"verdict: {'flat' if v['flat'] else 'NOT flat'} (within {o.tolerance_pct} %); "
        f"{result['requests']} requests, unexpected answers: {result['unexpected'] or 'none'}",
    )
    tables = [table(COLUMNS, verdict_rows(v))]
    return [run.result("Memory under soak", tables, key=time.strftime("soak-%Y%m%d-%H%M%S"),
                       notes=notes, figures=result)]  # fmt: skip


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--minutes", 10.0), Option("--clients", 3), Option("--sample-s", 10.0),
        Option("--warmup-s", 60.0), Option("--tolerance-pct", 5.0), Option("--timeout-s", 320.0),
        Option("--seed", 0), Option("--pool", 0, "cycle this many fixed bodies per client"),
        Option("--no-fill-cache", True, "skip filling the query cache to its bound first"),
    ),
    measure=measure,
    out=TOOL_RESULTS,
)  # fmt: skip
