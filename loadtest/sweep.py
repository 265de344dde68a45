"""``python -m loadtest.sweep``: an open-loop load sweep of a running server (loopback only).

    python -m loadtest run sweep --url http://127.0.0.1:8000 --rates 0.25,0.5,1,2
        --duration-s 60 --query-tokens 120 --items 10 --item-tokens 20 [--plots FOLDER]

The workload is SGLang ``bench_score``'s, in token ids so every count is exact: a query of
``--query-tokens`` random ids and ``--items`` items of ``--item-tokens`` ids each (ids from
ID_RANGE, above every special token, so never the multi-item delimiter). For each offered rate
in turn, requests arrive open-loop for ``--duration-s``: Poisson arrivals (seeded exponential
gaps), each sent at its scheduled time however many are still outstanding; after the rate's
last arrival the sweep waits for all its answers before the next rate. A few untimed warm-up
requests come first.

Per rate: requests sent, achieved requests/s and items/s (200 answers over the time from the
first send to the last answer), counts by status (200, 503 by reason, other, client time-outs
and errors) and latency percentiles of the 200s and of the 503s: a result (every row's
figures), and latency.png and throughput.png in ``--plots``. Exits 1 when an answer was
neither 200 nor 503, or a request got no answer.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from loadtest.client import Outcome, send
from loadtest.harness import LABELS, Option, Result, Run
from loadtest.harness import Workload as Declared
from loadtest.sweep_report import RateRow, Shot, plain, plot, rates_table, summarize

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
    """POST one body; no answer in ``timeout_s`` (or none at all) is an Outcome of status 0."""
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    try:
        async with asyncio.timeout(timeout_s):
            outcome = await send(client, payload)
    except TimeoutError:
        outcome = Outcome(0, loop.time() - sent_at, "client_timeout", None)
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


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    """Every rate in turn; plots into ``--plots``; the result fails on a 5xx or no answer."""
    rates = tuple(float(r) for r in o.rates.split(",") if r.strip())
    if not rates or any(rate <= 0 for rate in rates):
        raise SystemExit("--rates: positive numbers, comma-separated")
    workload = Workload(o.query_tokens, o.items, o.item_tokens)
    url = o.url or "http://127.0.0.1:8000"
    config = SweepConfig(url, rates, o.duration_s, workload, o.seed, o.timeout_s, o.warmup)
    rows = asyncio.run(run_sweep(config, plan_sweep(config)))
    stamp = time.strftime("loadtest/results/sweep-%Y%m%d-%H%M%S", time.gmtime())
    plots = Path(o.plots or stamp)
    plots.mkdir(parents=True, exist_ok=True)
    plot(plots, rows, o.items)
    run.say(f"plots: {plots}/")
    notes = (
        "SGLang `bench_score`'s workload as token ids: a "
        f"{o.query_tokens}-token query and {o.items} items of {o.item_tokens} tokens per "
        f"request (a fresh random query each), Poisson arrivals at each offered rate for "
        f"{o.duration_s:g} s, then the next rate after every answer is in",
        "latencies are of the 200 answers",
    )
    failed = any(row.status_other or row.client_errors for row in rows)
    figures = {"rows": [plain(row) for row in rows], "failed": failed}
    title = "Open-loop load sweep, shipped serve_config.yaml"
    return [run.result(title, [rates_table(rows)], key="sweep", notes=notes, figures=figures)]


WORKLOAD = Declared(
    url=True,
    options=(
        Option("--rates", "0.25,0.5,1,2"), Option("--duration-s", 60.0),
        Option("--query-tokens", 120), Option("--items", 10), Option("--item-tokens", 20),
        Option("--seed", 0), Option("--timeout-s", 120.0, "per request"),
        Option("--warmup", 2, "untimed requests first"),
        Option("--plots", None, "folder for the two plots (loadtest/results/sweep-<UTC>)"),
    ),
    measure=measure,
)  # fmt: skip
