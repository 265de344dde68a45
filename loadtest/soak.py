"""``python -m loadtest run soak``: a mixed closed-loop soak of a running server, with its RSS.

    python -m loadtest run soak --url http://127.0.0.1:8000 --minutes 10 [--clients 3]

``--clients`` closed-loop clients send, for ``--minutes``, a seeded mix of request kinds:

- ``repeat``: a query from a small fixed pool (query-cache hits), 1..100 text items of 0..24
  words;
- ``fresh``: a never-seen text query (query-cache misses), 1..100 items (``presets.word_items``);
- ``tokens``: token-id query (half from a fixed pool, half fresh) and 1..100 token-id items;
- ``item_first``: ``item_first: true`` (the single-item path), 1..4 short items;
- ``invalid``: ``loadtest.fuzz_strategies.fuzz_bodies`` in turn (400s; never a 500).

``--pool N`` draws instead from N such bodies per client (one pool of N x ``--clients``),
fixed at the start: once each has been served, there is nothing new to compile or to cache,
so RSS that still grows is a leak.

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
from urllib.parse import urlparse

import httpx

from loadtest.drive import WORDS, Load, Outcome, drive, healthy, stats, tally, tally_table
from loadtest.fuzz_strategies import fuzz_bodies
from loadtest.harness import LABELS, TOOL_RESULTS, Option, Result, Run, Workload, col, table
from loadtest.presets import word_items
from loadtest.procs import MIB, find_workers, rss_mib, serving_raylet
from loadtest.soak_verdict import KINDS, verdict

WEIGHTS = (30, 20, 20, 15, 15)


class Mix:
    """Seeded request bodies: ``body(i)`` is the i-th (asked in order), ``kinds[i]`` its kind."""

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
        self.kinds: list[str] = []
        # --pool: the same few bodies over and over (after one pass: no new signatures to
        # compile, every query cached), to tell a leak from warm-up that takes long.
        self.pool = [self._make() for _ in range(pool)]

    def body(self, i: int) -> dict | bytes:
        kind, payload = self.rng.choice(self.pool) if self.pool else self._make()
        self.kinds.append(kind)
        return payload

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
            payload = word_items(rng, 100)
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


async def sample(url: str, start: float, done: list[Outcome], mix: Mix, raylet: int | None) -> dict:
    row: dict = {
        "t_s": round(time.monotonic() - start, 1),
        "done": len(done),
        "kinds_done": sorted({mix.kinds[o.index] for o in done}),
        "statuses": dict(sorted(collections.Counter(o.status for o in done).items())),
    }
    for role, procs in find_workers(raylet).items():
        row[f"{role}_rss_mib"] = rss_mib(procs)  # {pid: MiB}; Serve may run several
    served = await stats(url)
    keys = ("query_cache_bytes", "query_cache_entries", "compile_count", "evicted_signatures")
    for key in (*keys, "background_compiles"):
        row[key] = served.get(key)
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


async def prepare(args: argparse.Namespace) -> tuple[dict, int | None]:
    """/health, the model card, the serving raylet, the query cache filled (warm-up)."""
    if not await healthy(args.url):
        raise SystemExit(f"{args.url}/health is not 200: start the server first")
    model = (await stats(args.url, "/v1/models"))["data"][0]
    raylet = serving_raylet(urlparse(args.url).port or 80)
    if raylet is None:
        print("warning: cannot see who listens on the URL's port: every Ray cluster's")
        print("ScoringReplica / ScoreIngress workers on this machine are counted")
    workers = find_workers(raylet)
    if not workers["replica"] or not workers["ingress"]:
        raise SystemExit("no ScoringReplica / ScoreIngress worker in this machine's ps")
    if args.fill_cache:
        async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout_s) as client:
            filled = await fill_query_cache(client, model["vocab_size"])
        print(f"query cache filled: {filled.get('query_cache_bytes', 0) / MIB:.1f} MiB", flush=True)
    return model, raylet


async def soak(args: argparse.Namespace) -> dict:
    model, raylet = await prepare(args)
    print("  min  reqs  non-200 answers by status  replica MiB   ingress MiB  cacheMiB compiles"
          " background", flush=True)  # fmt: skip
    mix = Mix(args.seed, model["vocab_size"], args.pool * args.clients)
    kinds = frozenset(kind for kind, _ in mix.pool) or frozenset(KINDS)
    load = Load(clients=args.clients, seconds=args.minutes * 60, timeout_s=args.timeout_s,
                polite_s=10.0)  # a well-behaved client waits a refusal's Retry-After  # fmt: skip
    done: list[Outcome] = []
    start, samples = time.monotonic(), []
    loop = asyncio.create_task(drive(args.url, load, mix.body, into=done))
    while True:
        samples.append(await sample(args.url, start, done, mix, raylet))
        print_row(samples[-1])
        if loop.done():
            break
        await asyncio.wait([loop], timeout=args.sample_s)
    loop.result()  # re-raise the driver's exception, if any
    wall, statuses = time.monotonic() - start, collections.Counter(o.status for o in done)
    by_kind = collections.defaultdict(list)
    for o in done:
        by_kind[mix.kinds[o.index]].append(o)
    unexpected = collections.Counter(
        f"{mix.kinds[o.index]} {o.status} {o.reason}".strip()
        for o in done if not expected(mix.kinds[o.index], o.status, o.reason, o.retry_after)
    )  # fmt: skip
    return {
        "url": args.url, "model": model["id"], "minutes": args.minutes, "clients": args.clients,
        "seed": args.seed, "pool": args.pool, "filled_cache": args.fill_cache,
        "raylet_pid": raylet, "mix": dict(zip(KINDS, WEIGHTS, strict=True)),
        "wall_s": round(wall, 1), "requests": len(done),
        "requests_per_s": round(len(done) / wall, 2),
        "by_kind": {k: len(v) for k, v in by_kind.items()},
        "mean_s_by_kind": {k: round(sum(x.seconds for x in v) / len(v), 3)
                           for k, v in by_kind.items()},
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "unexpected": dict(unexpected), "healthy_after": await healthy(args.url),
        "tallies": [tally(done, "soak")],  # plain in measure, once tabled
        "verdict": verdict(samples, args.warmup_s, args.tolerance_pct, kinds),
        "samples": samples,
    }  # fmt: skip


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
    tables = [table(COLUMNS, verdict_rows(v)), tally_table(result["tallies"])]
    result["tallies"] = [t.plain() for t in result["tallies"]]
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
