"""``python -m loadtest.sweep``: an open-loop load sweep of a running server (loopback only).

    python -m loadtest.sweep --url http://127.0.0.1:8000 --rates 0.25,0.5,1,2 --duration-s 60
        --query-tokens 120 --items 10 --item-tokens 20 [--out loadtest/results/sweep-<UTC>/]

The workload is SGLang ``bench_score``'s, in token ids so every count is exact: a query of
``--query-tokens`` random ids and ``--items`` items of ``--item-tokens`` ids each (ids from
ID_RANGE, above every special token, so never the multi-item delimiter). For each offered rate
in turn, requests arrive open-loop for ``--duration-s``: Poisson arrivals (seeded exponential
gaps), each sent at its scheduled time however many are still outstanding; after the rate's
last arrival the sweep waits for all its answers before the next rate. A few untimed warm-up
requests come first.

Per rate: requests sent, achieved requests/s and items/s (200 answers over the time from the
first send to the last answer), counts by status (200, 503 by reason, other, client time-outs
and errors) and latency percentiles of the 200s and of the 503s. Writes results.csv,
results.json, latency.png and throughput.png into ``--out`` and prints a markdown table.
Exits 1 when an answer was neither 200 nor 503, or a request got no answer.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from tqdm import tqdm

from loadtest.load import LABELS, LOOPBACK
from loadtest.overload import Outcome, send
from loadtest.sweep_report import RateRow, Shot, summarize, write_results

ID_RANGE = (1000, 20000)  # random token ids are drawn from [low, high)


@dataclass(frozen=True)
class Workload:
    query_tokens: int
    items: int
    item_tokens: int


@dataclass(frozen=True)
class SweepConfig:
    url: str
    rates: tuple[float, ...]
    duration_s: float
    workload: Workload
    seed: int = 0
    timeout_s: float = 120.0
    warmup: int = 2


@dataclass(frozen=True)
class RatePlan:
    """One offered rate's requests: send times (seconds after the rate starts) and bodies."""

    rate: float
    offsets: tuple[float, ...]
    payloads: tuple[dict[str, Any], ...]


def arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Poisson arrival times in [0, duration_s): cumulated exponential gaps of mean 1/rate."""
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def token_ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(*ID_RANGE) for _ in range(count)]


def score_payload(rng: random.Random, workload: Workload) -> dict[str, Any]:
    """A /v1/score body in token ids: exactly the workload's query and item lengths."""
    items = [token_ids(rng, workload.item_tokens) for _ in range(workload.items)]
    query = token_ids(rng, workload.query_tokens)
    return {"query": query, "items": items, "label_token_ids": list(LABELS)}


def plan_sweep(config: SweepConfig) -> list[RatePlan]:
    """Every rate's seeded schedule and bodies (the same config always gives the same plan)."""
    plans = []
    for rate in config.rates:
        offsets = arrivals(rate, config.duration_s, random.Random(f"{config.seed}:at:{rate}"))
        rng = random.Random(f"{config.seed}:body:{rate}")
        payloads = tuple(score_payload(rng, config.workload) for _ in offsets)
        plans.append(RatePlan(rate, tuple(offsets), payloads))
    return plans


def id_range_problem(model: dict[str, Any]) -> str | None:
    """Why ID_RANGE does not suit the model card of GET /v1/models; None when it does."""
    vocab, delimiter = model.get("vocab_size"), model.get("multi_item_scoring_delimiter")
    if isinstance(vocab, int) and vocab < ID_RANGE[1]:
        return f"token ids up to {ID_RANGE[1] - 1} exceed the vocabulary ({vocab})"
    if isinstance(delimiter, int) and ID_RANGE[0] <= delimiter < ID_RANGE[1]:
        return f"the delimiter {delimiter} lies inside the token id range {ID_RANGE}"
    return None


async def shoot(
    client: httpx.AsyncClient, payload: dict[str, Any], timeout_s: float, late_s: float = 0.0
) -> Shot:
    """POST one body; any failure to get an answer in ``timeout_s`` is an Outcome of status 0."""
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    try:
        async with asyncio.timeout(timeout_s):
            outcome = await send(client, payload)
    except TimeoutError:
        outcome = Outcome(0, loop.time() - sent_at, "client_timeout", None)
    except httpx.HTTPError as error:
        outcome = Outcome(0, loop.time() - sent_at, f"client_error:{type(error).__name__}", None)
    return Shot(outcome, sent_at, loop.time(), late_s)


async def run_rate(
    client: httpx.AsyncClient, plan: RatePlan, timeout_s: float, on_done: Callable[[], None]
) -> list[Shot]:
    """Send ``plan``'s bodies at their scheduled times (open loop); wait for every answer."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for offset, payload in zip(plan.offsets, plan.payloads, strict=True):
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        late_s = loop.time() - (start + offset)
        task = asyncio.create_task(shoot(client, payload, timeout_s, late_s))
        task.add_done_callback(lambda _: on_done())
        tasks.append(task)
    return list(await asyncio.gather(*tasks))


async def prepare(client: httpx.AsyncClient, config: SweepConfig) -> None:
    """Check the model's vocabulary against ID_RANGE, then the untimed warm-up requests."""
    try:
        models = (await client.get("/v1/models")).raise_for_status().json()
    except (httpx.HTTPError, ValueError) as error:
        raise SystemExit(f"loadtest.sweep: GET {config.url}/v1/models failed: {error!r}") from None
    problem = id_range_problem(models["data"][0]) if models.get("data") else None
    if problem:
        raise SystemExit(f"loadtest.sweep: {problem}")
    rng = random.Random(f"{config.seed}:warmup")
    for _ in range(config.warmup):
        shot = await shoot(client, score_payload(rng, config.workload), config.timeout_s)
        if shot.outcome.status != 200:
            raise SystemExit(f"loadtest.sweep: warm-up got {shot.outcome}")


async def run_sweep(config: SweepConfig, plans: Sequence[RatePlan]) -> list[RateRow]:
    """Run every plan in turn against ``config.url``, one summarized row per rate."""
    most = max((len(plan.offsets) for plan in plans), default=0)
    limits = httpx.Limits(max_connections=most + 16, max_keepalive_connections=most + 16)
    rows = []
    async with httpx.AsyncClient(
        base_url=config.url, timeout=config.timeout_s, limits=limits
    ) as client:
        await prepare(client, config)
        with tqdm(total=sum(len(p.offsets) for p in plans), unit="req") as bar:
            for plan in plans:
                bar.set_postfix_str(f"offered {plan.rate:g} req/s")
                shots = await run_rate(client, plan, config.timeout_s, lambda: bar.update(1))
                rows.append(summarize(plan.rate, shots, config.workload.items))
                bar.write(rows[-1].one_line(), file=sys.stderr)
    return rows


def _rates(text: str) -> tuple[float, ...]:
    rates = tuple(float(part) for part in text.split(",") if part.strip())
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError("rates must be positive numbers, comma-separated")
    return rates


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rates", type=_rates, default=(0.25, 0.5, 1.0, 2.0))
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--query-tokens", type=int, default=120)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--item-tokens", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests first")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    parser.add_argument("--out", type=Path, default=Path(f"loadtest/results/sweep-{stamp}"))
    args = parser.parse_args(argv)
    if not (urlparse(args.url).hostname or "").startswith(LOOPBACK):
        parser.error("--url must be a loopback address")
    return args


def config_of(args: argparse.Namespace) -> SweepConfig:
    workload = Workload(args.query_tokens, args.items, args.item_tokens)
    return SweepConfig(
        url=args.url.rstrip("/"),
        rates=args.rates,
        duration_s=args.duration_s,
        workload=workload,
        seed=args.seed,
        timeout_s=args.timeout_s,
        warmup=args.warmup,
    )


def run_parameters(config: SweepConfig) -> dict[str, Any]:
    """The run's settings as flat JSON/CSV values."""
    return {
        "url": config.url,
        "duration_s": config.duration_s,
        **asdict(config.workload),
        "seed": config.seed,
        "timeout_s": config.timeout_s,
        "warmup": config.warmup,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_of(args)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = asyncio.run(run_sweep(config, plan_sweep(config)))
    parameters = {**run_parameters(config), "started_utc": started}
    print(write_results(args.out, parameters, rows))
    failed = any(row.status_other or row.client_errors for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
