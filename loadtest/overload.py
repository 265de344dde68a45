"""``python -m loadtest.overload``: open-loop overload against a running server (loopback only).

    python -m loadtest.overload --url http://127.0.0.1:8000 [--factor 4] [--requests 400]

1. Capacity: a closed loop of ``--concurrency`` clients sends ``--capacity-requests`` requests
   of ``--items`` items; capacity = completed requests per second.
2. Overload: ``--requests`` requests arrive open-loop (Poisson, seeded) at ``--factor`` x
   capacity, each waiting at most ``--timeout-s``.
3. Afterwards: ``/health`` and one request must answer 200.

Prints answered / 200 / 503 overloaded (with Retry-After) / anything else, the p50 and p99 of
rejections and of successes, and timeouts; exits 1 when a request got anything but 200 or an
enveloped 503 with Retry-After, timed out, or the server was not healthy afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

import httpx

from loadtest.load import percentile

LOOPBACK = ("127.", "localhost", "[::1]", "::1")
WORDS = ["alpha", "beta", "gamma", "delta", "capital", "river", "city", "blue", "stone"]


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: no answer within the client's timeout
    seconds: float
    reason: str
    retry_after: str | None


def body(rng: random.Random, items: int) -> dict:
    query = " ".join(rng.choice(WORDS) for _ in range(60))
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(items)]
    return {"query": query, "items": docs, "label_token_ids": [7042, 4528, 11452]}


async def send(client: httpx.AsyncClient, payload: dict) -> Outcome:
    start = time.perf_counter()
    try:
        response = await client.post("/v1/score", json=payload)
    except httpx.TimeoutException:
        return Outcome(0, time.perf_counter() - start, "client_timeout", None)
    seconds = time.perf_counter() - start
    reason = ""
    if response.status_code != 200:
        try:
            reason = response.json()["reason"]  # the error envelope (app/errors.py)
        except (ValueError, KeyError, TypeError):
            reason = "no_envelope"
    return Outcome(response.status_code, seconds, reason, response.headers.get("retry-after"))


async def capacity(client: httpx.AsyncClient, args: argparse.Namespace) -> float:
    rng = random.Random(1)
    payloads = [body(rng, args.items) for _ in range(args.capacity_requests)]
    start, done = time.perf_counter(), []

    async def worker() -> None:
        while payloads:
            done.append(await send(client, payloads.pop()))

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    ok = sum(o.status == 200 for o in done)
    return ok / (time.perf_counter() - start)


async def overload(client: httpx.AsyncClient, rate: float, args: argparse.Namespace) -> list:
    rng = random.Random(2)
    tasks = []
    for _ in range(args.requests):
        tasks.append(asyncio.create_task(send(client, body(rng, args.items))))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


def summary(outcomes: list[Outcome], rate: float, cap: float) -> dict:
    ok = [o.seconds for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status == 503 and o.reason == "overloaded"]
    other = [o for o in outcomes if o.status != 200 and o not in shed]
    return {
        "capacity_rps": round(cap, 2),
        "offered_rps": round(rate, 2),
        "requests": len(outcomes),
        "answered": sum(o.status != 0 for o in outcomes),
        "ok": len(ok),
        "overloaded_503": len(shed),
        "overloaded_with_retry_after": sum(o.retry_after is not None for o in shed),
        "other": sorted({f"{o.status} {o.reason}" for o in other}),
        "other_count": len(other),
        "timeouts": sum(o.status in (0, 408, 504) for o in outcomes),
        "p50_rejection_s": round(percentile([o.seconds for o in shed], 0.5), 3),
        "p99_rejection_s": round(percentile([o.seconds for o in shed], 0.99), 3),
        "p50_success_s": round(percentile(ok, 0.5), 3),
        "p99_success_s": round(percentile(ok, 0.99), 3),
    }


async def run(args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=args.requests + 16)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout_s, limits=limits) as c:
        cap = await capacity(c, args)
        outcomes = await overload(c, cap * args.factor, args)
        result = summary(outcomes, cap * args.factor, cap)
        healthy = (await c.get("/health")).status_code == 200
        after = await send(c, body(random.Random(3), args.items))
        result["healthy_after"] = healthy and after.status == 200
        result["outcomes"] = [asdict(o) for o in outcomes]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--capacity-requests", type=int, default=40)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--timeout-s", type=float, default=320.0)
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args(argv)
    if not (urlparse(args.url).hostname or "").startswith(LOOPBACK):
        parser.error("--url must be a loopback address")
    result = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    result.pop("outcomes")
    print(json.dumps(result, indent=1))
    bad = result["other_count"] or result["timeouts"] or not result["healthy_after"]
    missing_retry = result["overloaded_503"] != result["overloaded_with_retry_after"]
    return 1 if bad or missing_retry else 0


if __name__ == "__main__":
    sys.exit(main())
