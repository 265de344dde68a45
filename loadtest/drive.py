"""The one load driver: every HTTP load the harness makes goes through :func:`drive`.

A :class:`Load` says what arrives when and for how long:

- open loop (``rate`` > 0): requests sent at their arrival times however many are still
  outstanding; Poisson (seeded exponential gaps) or ``fixed`` gaps; ``rate=math.inf`` is a
  burst (every request at once); a step of rates is one ``Load`` per step, run in turn;
- closed loop (``rate`` 0): ``clients`` requests in flight, the next sent when one is
  answered (``polite_s``: after a 503, first wait its Retry-After, at most that long;
  ``retry``: then send the same body again, until it is answered otherwise);
- bounds: ``count`` requests (the bodies' number when they are a list) and ``seconds``;
- client kinds (``client``): ``pooled``, one asyncio ``httpx.AsyncClient`` (a service calling
  scorejax); ``connection``, a fresh TCP connection per request (``http.client`` in a thread:
  a script's ``requests.post``, a ``curl`` per request; the cheapest client there is in
  Python, so the client's CPU does not become the bottleneck); ``processes``, ``procs``
  processes, each a ``connection`` client at its share of the rate, on one clock.

Every request becomes one :class:`Outcome` (status 0: no answer), a list of them one
:class:`Tally` (status counts, 503 reasons and Retry-After, latency percentiles, the
``x-queue-time`` / ``x-total-time`` headers), and tallies one table and one ``figures``
schema (``{"tallies": [...]}``) of the harness's Result. The presets (loadtest.presets,
loadtest.overload, loadtest.soak) choose a Load, the bodies and what else they measure.

Why not locust (2.47 on PyPI, measured in a scratch venv on 2026-12-02): it installs 38
packages beside it (flask, gevent, pyzmq, socketio, requests, pytest...), about 61 MB; its
import takes 1.0 s and runs gevent's ``monkey.patch_all()``: afterwards ``socket.socket`` is
gevent's and ``time.sleep`` gevent's hub, in the whole process (the harness, httpx, asyncio,
Ray's client). Its users are closed loops: open-loop Poisson arrivals only through a
LoadTestShape spawning users, and a fresh connection per request or per-request headers
(Retry-After, x-queue-time) through its event hooks. This module is under 400 lines on httpx
and the standard library, which the harness already has; a preset is a Load and its bodies.
"""

from __future__ import annotations

import asyncio
import collections
import http.client
import itertools
import json
import math
import multiprocessing
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlparse

import httpx

from loadtest.harness import JSON_HEADERS, LABELS, Table, col, table

CLIENT_KINDS = ("pooled", "connection", "processes")
TIMING_HEADERS = ("x-queue-time", "x-total-time")  # Outcome's queue_s and total_s
WORDS = ["alpha", "beta", "gamma", "delta", "capital", "river", "city", "blue", "stone"]
Body = dict | bytes
Bodies = Sequence[Body] | Callable[[int], Body]  # a list, or the i-th body made on demand
Post = Callable[[bytes], Awaitable["Outcome"]]


@dataclass(frozen=True)
class Outcome:
    """One request: its answer and when it was sent (seconds after the load's start)."""

    status: int  # 0: no answer within the client's timeout, or no connection
    seconds: float
    reason: str = ""  # the error envelope's reason ("client_timeout", "client_error:..."")
    retry_after: str | None = None
    queue_s: float | None = None  # x-queue-time: handed to the replicas -> its step
    total_s: float | None = None  # x-total-time: the request's time inside the ingress
    sent_s: float = 0.0
    late_s: float = 0.0  # how long after its scheduled time it was sent
    index: int = 0  # which body
    stats: dict | None = None  # GET /v1/stats right after the answer (Load.stats)


@dataclass(frozen=True)
class Load:
    rate: float = 0.0  # open loop: requests/s (math.inf: a burst); 0: closed loop
    clients: int = 1  # closed loop: requests in flight
    count: int = 0  # at most this many requests (0: as many bodies as there are)
    seconds: float = math.inf  # no request is sent after this
    arrivals: str = "poisson"  # or "fixed"
    seed: int = 0
    timeout_s: float = 120.0  # per request
    client: str = "pooled"  # CLIENT_KINDS
    procs: int = 1  # processes of the "processes" client
    polite_s: float = 0.0  # closed loop: wait a 503's Retry-After, at most this long
    retry: bool = False  # closed loop: send a 503's body again after its Retry-After
    stats: bool = False  # read GET /v1/stats after each answer
    route: str = "/v1/score"  # where every body is POSTed


def arrivals(load: Load, count: int = 0) -> list[float]:
    """Send times (seconds after the start): cumulated gaps, exponential of mean 1/rate
    (Poisson) or 1/rate each (fixed), ``count`` of them at most, before ``load.seconds``."""
    if count == 0 and (math.isinf(load.seconds) or math.isinf(load.rate)):
        raise ValueError("an open loop needs a count or a finite number of seconds")
    rng, times, at = random.Random(load.seed), [], 0.0
    while count == 0 or len(times) < count:
        at += rng.expovariate(load.rate) if load.arrivals == "poisson" else 1.0 / load.rate
        if at >= load.seconds:
            break
        times.append(at)
    return times


async def drive(url: str, load: Load, bodies: Bodies, into: list | None = None) -> list[Outcome]:
    """Send ``bodies`` to ``url``'s ``load.route`` as ``load`` says; every Outcome, by index
    (``into``, when given, gets each as it comes: a live view for the caller)."""
    if load.client not in CLIENT_KINDS:
        raise ValueError(f"client {load.client!r} not in {CLIENT_KINDS}")
    if load.client == "processes":
        return await _processes(url, load, list(bodies))  # type: ignore[arg-type]
    if not callable(bodies) and not bodies:
        return []
    count = load.count if callable(bodies) else min(load.count or len(bodies), len(bodies))
    body_at = bodies if callable(bodies) else bodies.__getitem__
    into = [] if into is None else into
    pace = _open if load.rate else _closed
    async with _poster(url, load, count) as post:
        done = await pace(post, load, body_at, count, into, time.time())
    return sorted(done, key=lambda o: o.index)


@asynccontextmanager
async def _poster(url: str, load: Load, count: int) -> AsyncIterator[Post]:
    """The client kind's POST for one load: an async callable of raw bytes."""
    if load.client != "pooled":  # a thread per request in flight, a connection per request
        with ThreadPoolExecutor(max(count, load.clients) or 1024) as pool:
            loop, args = asyncio.get_running_loop(), (load.timeout_s, load.route)
            yield lambda raw: loop.run_in_executor(pool, post_once, url, raw, *args)
        return
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=load.timeout_s, limits=limits) as client:

        async def post(raw: bytes) -> Outcome:
            outcome = await send(client, raw, load.timeout_s, load.route)
            return replace(outcome, stats=await stats(url)) if load.stats else outcome

        yield post


async def _shot(
    post: Post, body: Body, index: int, start: float, offset: float, into: list
) -> Outcome:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = time.time() - start
    outcome = replace(await post(raw), sent_s=round(sent, 4), late_s=sent - offset, index=index)
    into.append(outcome)
    return outcome


async def _open(post: Post, load: Load, body_at: Callable, count: int, into: list, start: float):
    tasks = []
    for i, offset in enumerate(arrivals(load, count)):
        await asyncio.sleep(max(0.0, start + offset - time.time()))
        tasks.append(asyncio.create_task(_shot(post, body_at(i), i, start, offset, into)))
    return list(await asyncio.gather(*tasks))


async def _closed(post: Post, load: Load, body_at: Callable, count: int, into: list, start: float):
    serial, stop_at, done = itertools.count(), start + load.seconds, []

    async def client() -> None:
        while time.time() < stop_at and (i := next(serial)) < (count or math.inf):
            body, again = body_at(i), True
            while again:
                outcome = await _shot(post, body, i, start, time.time() - start, into)
                done.append(outcome)
                again = load.retry and outcome.status == 503
                await asyncio.sleep(min(_pause_s(outcome, load), max(stop_at - time.time(), 0)))

    await asyncio.gather(*(client() for _ in range(load.clients)))
    return done


def _pause_s(outcome: Outcome, load: Load) -> float:
    """A closed-loop client's wait after ``outcome``: when polite or retrying, a 503's
    Retry-After (1 s without one), at most ``polite_s`` when that is set."""
    if outcome.status != 503 or not (load.polite_s or load.retry):
        return 0.0
    told = float(outcome.retry_after) if (outcome.retry_after or "").isdigit() else 1.0
    return min(told, load.polite_s or math.inf)


async def _processes(url: str, load: Load, bodies: list[Body]) -> list[Outcome]:
    """``procs`` processes, each a connection-per-request client sending every ``procs``-th
    body at ``rate / procs``, started together one second after the pool is up."""
    n, bodies = load.procs, bodies[: load.count or len(bodies)]
    parts = [
        replace(load, client="connection", rate=load.rate / n, seed=load.seed + i) for i in range(n)
    ]
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(abs, range(n)))  # every process up before the clock starts
        start, loop = time.time() + 1.0, asyncio.get_running_loop()
        runs = [
            loop.run_in_executor(pool, _one_process, url, part, bodies[i::n], start)
            for i, part in enumerate(parts)
        ]
        done = await asyncio.gather(*runs)
    return [replace(o, index=o.index * n + i) for i, part in enumerate(done) for o in part]


def _one_process(url: str, load: Load, bodies: list[Body], start: float) -> list[Outcome]:
    async def run() -> list[Outcome]:
        async with _poster(url, load, len(bodies)) as post:
            return await _open(post, load, bodies.__getitem__, len(bodies), [], start)

    return asyncio.run(run())


async def send(
    client: httpx.AsyncClient, raw: bytes, timeout_s: float = math.inf, route: str = "/v1/score"
) -> Outcome:
    """POST one raw JSON body to ``route`` on ``client``, ``timeout_s`` in all."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s if math.isfinite(timeout_s) else None):
            response = await client.post(route, content=raw, headers=JSON_HEADERS)
    except (httpx.TimeoutException, TimeoutError):
        return Outcome(0, time.perf_counter() - start, "client_timeout")
    except httpx.HTTPError as error:
        return Outcome(0, time.perf_counter() - start, f"client_error:{type(error).__name__}")
    return _answer(response.status_code, response.headers, response.content, start)


def post_once(url: str, raw: bytes, timeout_s: float, route: str = "/v1/score") -> Outcome:
    """One POST to ``route`` on a connection of its own (closed after the answer)."""
    parsed, start = urlparse(url), time.perf_counter()
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
    try:
        connection.request("POST", route, raw, JSON_HEADERS)
        response = connection.getresponse()
        content = response.read()
    except TimeoutError:
        return Outcome(0, time.perf_counter() - start, "client_timeout")
    except OSError as error:
        return Outcome(0, time.perf_counter() - start, f"client_error:{type(error).__name__}")
    finally:
        connection.close()
    return _answer(response.status, response.headers, content, start)


def header_seconds(milliseconds: str | None) -> float | None:
    """A timing header (whole milliseconds) in seconds."""
    return float(milliseconds) / 1e3 if milliseconds is not None else None


def _answer(status: int, headers: Mapping[str, str], content: bytes, start: float) -> Outcome:
    seconds, reason = time.perf_counter() - start, ""
    if status != 200:
        try:
            reason = str(json.loads(content)["reason"])
        except (ValueError, KeyError, TypeError):
            reason = "no_envelope"
    queue_s, total_s = (header_seconds(headers.get(h)) for h in TIMING_HEADERS)
    return Outcome(status, seconds, reason, headers.get("retry-after"), queue_s, total_s)


async def stats(url: str, path: str = "/v1/stats") -> dict[str, Any]:
    """GET ``path`` as JSON; {} when it cannot be read."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            response = await client.get(path)
            body = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


async def healthy(url: str) -> bool:
    """GET /health answers 200."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return (await client.get("/health")).status_code == 200
    except httpx.HTTPError:
        return False


def word_body(rng: random.Random, items: int, words: int = 60) -> dict:
    """A /v1/score body in words: a ``words``-word query and ``items`` items of 3-8 words."""
    query = " ".join(rng.choice(WORDS) for _ in range(words))
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(items)]
    return {"query": query, "items": docs, "label_token_ids": list(LABELS)}


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


@dataclass(frozen=True)
class Tally:
    """One load's outcomes counted; seconds (NaN: no such answer)."""

    label: str
    offered_rps: float
    requests: int
    wall_s: float  # first send to last answer
    achieved_rps: float  # 200 answers / wall_s
    items_per_s: float  # items of the 200 answers / wall_s
    status_200: int
    status_503: int
    reasons_503: dict[str, int]
    retry_after_503: int  # 503s that carried a Retry-After header
    status_other: int
    other_statuses: dict[str, int]  # "<status> <reason>" -> count
    client_errors: int  # no answer: client time-out or connection error (timeouts included)
    client_timeouts: int
    p50_s: float  # of the 200s
    p90_s: float
    p99_s: float
    max_s: float
    p50_503_s: float
    p90_503_s: float
    p99_503_s: float
    p99_503_ingress_s: float  # the 503s' x-total-time
    p50_queue_s: float  # the 200s' x-queue-time
    p99_queue_s: float
    max_late_s: float  # the client's worst lag behind the arrival schedule
    client_cpu_s: float | None = None

    @property
    def clean(self) -> bool:
        """Every answer a 200 or the documented refusal (503 overloaded, Retry-After)."""
        refusals = set(self.reasons_503) <= {"overloaded"}
        retry = self.retry_after_503 == self.status_503
        return refusals and retry and not (self.status_other or self.client_errors)

    def plain(self) -> dict[str, Any]:
        """As JSON holds it: NaN as None."""
        return {k: None if v != v else v for k, v in asdict(self).items()}

    def one_line(self) -> str:
        return (
            f"{self.label}: {self.requests} sent, {self.status_200} ok, {self.status_503} 503, "
            f"{self.status_other} other, {self.client_errors} no answer; "
            f"{self.items_per_s:.2f} items/s, p50 {self.p50_s:.3f} s, p99 {self.p99_s:.3f} s"
        )


def tally(
    outcomes: Sequence[Outcome], label: str = "", offered: float = 0.0, items: int = 0, **kw: Any
) -> Tally:
    """The Tally of one load's outcomes (``items`` per request)."""
    ok = [o for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status == 503]
    other = [o for o in outcomes if o.status not in (0, 200, 503)]
    lost = [o for o in outcomes if o.status == 0]
    ends = [o.sent_s + o.seconds for o in outcomes]
    wall = max(ends) - min(o.sent_s for o in outcomes) if outcomes else 0.0
    per_s = 1.0 / wall if wall > 0 else 0.0
    secs = lambda group, *fractions: [percentile([o.seconds for o in group], f) for f in fractions]  # noqa: E731
    known = lambda values: [v for v in values if v is not None]  # noqa: E731
    queued = known(o.queue_s for o in ok)
    return Tally(
        label, offered, len(outcomes), wall, len(ok) * per_s, len(ok) * items * per_s,
        len(ok), len(shed), dict(collections.Counter(o.reason for o in shed)),
        sum(o.retry_after is not None for o in shed), len(other),
        dict(collections.Counter(f"{o.status} {o.reason}" for o in other)), len(lost),
        sum(o.reason == "client_timeout" for o in lost), *secs(ok, 0.5, 0.9, 0.99, 1.0),
        *secs(shed, 0.5, 0.9, 0.99), percentile(known(o.total_s for o in shed), 0.99),
        percentile(queued, 0.5), percentile(queued, 0.99),
        max((o.late_s for o in outcomes), default=0.0), **kw,
    )  # fmt: skip


COLUMNS = (
    col("sent", "d"), col("200", "d"), col("503 (with Retry-After)", left=True),
    col("other", "d"), col("no answer", "d"), col("achieved req/s", ".3f"),
    col("items/s", ".2f"), col("p50 s", ".3f"), col("p90 s", ".3f"), col("p99 s", ".3f"),
    col("503 p50 s", ".3f"), col("503 p99 s", ".3f"), col("503 p99 in the ingress s", ".3f"),
    col("queue p99 s", ".3f"), col("client CPU s", ".1f"),
)  # fmt: skip


def tally_table(tallies: Sequence[Tally], heading: str = "load") -> Table:
    """The one table of tallies, a row each."""
    rows = []
    for t in tallies:
        p = t.plain()
        rows.append((t.label, t.requests, t.status_200, f"{t.status_503} ({t.retry_after_503})",
                     t.status_other, t.client_errors, p["achieved_rps"], p["items_per_s"],
                     p["p50_s"], p["p90_s"], p["p99_s"], p["p50_503_s"], p["p99_503_s"],
                     p["p99_503_ingress_s"], p["p99_queue_s"], t.client_cpu_s))  # fmt: skip
    return table((col(heading, left=True), *COLUMNS), rows)
