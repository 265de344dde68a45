"""The kinds of client an open-loop overload is sent by (``loadtest.overload --clients``).

Users' clients differ in what a request costs them and in how their requests reach the
server, so a refusal's latency is measured with each:

- ``pooled``: one asyncio ``httpx.AsyncClient`` with no connection limit (a service calling
  scorejax, the harness's own client);
- ``connection``: a thread and a fresh TCP connection per request (``http.client``: a
  script's ``requests.post`` in a thread pool, a ``curl`` per request), the cheapest client
  per request there is in Python, so the client's own CPU does not become the bottleneck
  (``httpx.post`` builds an SSL context per call: 28 ms of CPU, more than a refusal costs
  the server);
- ``processes``: ``--procs`` processes, each a ``connection`` client at its share of the rate.

Each sends ``count`` bodies at Poisson arrivals of ``rate`` per second (seeded), every
request bounded by ``timeout_s``, and returns one ``Outcome`` per request (``sent_s``: when
it was sent, seconds into the run; ``total_s``: the server's own ``x-total-time``).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing
import random
import resource
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from urllib.parse import urlparse

import httpx

from loadtest.client import TIMING_HEADERS, Outcome, header_seconds, send

CLIENT_KINDS = ("pooled", "connection", "processes")


@dataclass(frozen=True)
class Plan:
    """One client's open loop: ``count`` bodies at ``rate`` requests/s."""

    url: str
    bodies: tuple[bytes, ...]
    rate: float
    timeout_s: float
    seed: int = 2

    def arrivals(self) -> list[float]:
        """Seconds into the run at which each body is sent (Poisson, seeded)."""
        rng, at, moments = random.Random(self.seed), 0.0, []
        for _ in self.bodies:
            moments.append(at)
            at += rng.expovariate(self.rate)
        return moments


@dataclass(frozen=True)
class ClientRun:
    outcomes: tuple[Outcome, ...]
    client_cpu_s: float  # the client's own CPU seconds (every process of it)


def run_client(kind: str, plan: Plan, procs: int) -> ClientRun:
    """The outcomes of ``plan`` sent by a client of ``kind`` (CLIENT_KINDS)."""
    if kind == "pooled":
        return _own_cpu(lambda: asyncio.run(pooled(plan)))
    if kind == "connection":
        return _own_cpu(lambda: connection_per_request(plan, time.time()))
    if kind == "processes":
        return processes(plan, procs)
    raise ValueError(f"--clients: {kind!r} not in {CLIENT_KINDS}")


def _own_cpu(send_all: Callable[[], list[Outcome]]) -> ClientRun:
    before = _cpu_s()
    outcomes = send_all()
    return ClientRun(tuple(outcomes), _cpu_s() - before)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def pooled(plan: Plan) -> list[Outcome]:
    """One AsyncClient, no connection limit: a task per request."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=plan.url, timeout=plan.timeout_s, limits=limits) as c:
        start, tasks = time.perf_counter(), []

        async def sent_at(moment: float, body: bytes) -> Outcome:
            return replace(await send(c, body), sent_s=round(moment, 3))

        for moment, body in zip(plan.arrivals(), plan.bodies, strict=True):
            await asyncio.sleep(max(0.0, start + moment - time.perf_counter()))
            tasks.append(asyncio.create_task(sent_at(time.perf_counter() - start, body)))
        return list(await asyncio.gather(*tasks))


def connection_per_request(plan: Plan, start_at: float) -> list[Outcome]:
    """A thread and a fresh connection per request, the first sent at wall time
    ``start_at`` (so several processes share one clock)."""
    outcomes: list[Outcome] = []
    threads = []
    for moment, body in zip(plan.arrivals(), plan.bodies, strict=True):
        time.sleep(max(0.0, start_at + moment - time.time()))  # the open loop's arrival
        sent = round(time.time() - start_at, 3)
        thread = threading.Thread(target=_post_into, args=(plan, body, sent, outcomes))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return outcomes


def _post_into(plan: Plan, body: bytes, sent_s: float, into: list[Outcome]) -> None:
    into.append(replace(post_once(plan.url, body, plan.timeout_s), sent_s=sent_s))


def post_once(url: str, body: bytes, timeout_s: float, route: str = "/v1/score") -> Outcome:
    """One POST on a connection of its own (closed after the answer)."""
    parsed = urlparse(url)
    start = time.perf_counter()
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
    try:
        connection.request("POST", route, body, {"content-type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
    except TimeoutError:
        return Outcome(0, time.perf_counter() - start, "client_timeout", None)
    except OSError as error:
        return Outcome(0, time.perf_counter() - start, f"client_error:{type(error).__name__}", None)
    finally:
        connection.close()
    seconds = time.perf_counter() - start
    reason = "" if response.status == 200 else _reason(raw)
    queue_s, total_s = (header_seconds(response.getheader(h)) for h in TIMING_HEADERS)
    retry_after = response.getheader("retry-after")
    return Outcome(response.status, seconds, reason, retry_after, 0.0, queue_s, total_s)


def _reason(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["reason"])
    except (ValueError, KeyError, TypeError):
        return "no_envelope"


def processes(plan: Plan, procs: int) -> ClientRun:
    """``procs`` processes, each a connection-per-request client sending every ``procs``-th
    body at ``rate / procs`` (started together, one second after the pool is up)."""
    parts = [
        Plan(plan.url, plan.bodies[i::procs], plan.rate / procs, plan.timeout_s, plan.seed + i)
        for i in range(procs)
    ]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=spawn) as pool:
        list(pool.map(_ready, range(procs)))  # every process up before the clock starts
        start_at = time.time() + 1.0
        results = list(pool.map(_one_process, parts, [start_at] * procs))
    outcomes = sorted((o for part, _ in results for o in part), key=lambda o: o.sent_s)
    return ClientRun(tuple(outcomes), sum(cpu for _, cpu in results))


def _ready(_: int) -> bool:
    return True


def _one_process(plan: Plan, start_at: float) -> tuple[list[Outcome], float]:
    before = _cpu_s()
    outcomes = connection_per_request(plan, start_at)
    return outcomes, _cpu_s() - before


def encoded(bodies: Sequence[dict]) -> tuple[bytes, ...]:
    return tuple(json.dumps(body).encode() for body in bodies)
