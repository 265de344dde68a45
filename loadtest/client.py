"""The one HTTP client every served benchmark and load tool sends through.

- :func:`send`: one async POST timed, its answer an :class:`Outcome` (status 0: no answer),
  and :func:`closed_loop`: bodies sent by ``concurrency`` async workers (``load``,
  ``overload``, ``sweep``, ``soak``, ``burst``);
- :class:`RetryingClient`: what a user with a file of requests writes, threads that send each
  503 again after its Retry-After (``bench_batch``, ``bench_embed``);
- :class:`Server`: strictly one request at a time, readiness polled (``GET /health``), its
  ``GET /v1/stats`` counters read around each timed request, and a ``Deadline`` every wait
  checks (``bench_serve``, ``bench_batch``, ``first_minute``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.bench_serve_report import Sample
from loadtest.harness import JSON_HEADERS, LABELS, loopback_url

TIMING_HEADERS = ("x-queue-time", "x-total-time")  # Outcome's queue_s and total_s
WORDS = ["alpha", "beta", "gamma", "delta", "capital", "river", "city", "blue", "stone"]


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: no answer within the client's timeout, or no connection
    seconds: float
    reason: str
    retry_after: str | None
    sent_s: float = 0.0  # when it was sent, seconds into the overload phase
    queue_s: float | None = None  # a 200's x-queue-time: handed to the replicas -> its step
    total_s: float | None = None  # x-total-time: the request's time inside the ingress


async def send(
    client: httpx.AsyncClient, payload: dict | bytes, route: str = "/v1/score"
) -> Outcome:
    """POST one body (JSON, or raw bytes as they are): its status, seconds, the error
    envelope's reason, Retry-After and x-queue-time."""
    start = time.perf_counter()
    raw = isinstance(payload, bytes)
    try:
        response = await (
            client.post(route, content=payload, headers=JSON_HEADERS)
            if raw
            else client.post(route, json=payload)
        )
    except httpx.TimeoutException:
        return Outcome(0, time.perf_counter() - start, "client_timeout", None)
    except httpx.HTTPError as error:
        return Outcome(0, time.perf_counter() - start, f"client_error:{type(error).__name__}", None)
    seconds = time.perf_counter() - start
    queue_s, total_s = (
        header_seconds(response.headers.get(h)) for h in ("x-queue-time", "x-total-time")
    )
    reason = "" if response.status_code == 200 else _reason(response, "no_envelope")
    retry_after = response.headers.get("retry-after")
    return Outcome(response.status_code, seconds, reason, retry_after, 0.0, queue_s, total_s)


def header_seconds(milliseconds: str | None) -> float | None:
    """A timing header (whole milliseconds) in seconds."""
    return float(milliseconds) / 1e3 if milliseconds is not None else None


async def closed_loop(
    client: httpx.AsyncClient,
    bodies: Sequence[dict | bytes],
    concurrency: int,
    deadline_s: float = float("inf"),
) -> tuple[list[Outcome], float]:
    """Every body sent, at most ``concurrency`` in flight, until ``deadline_s`` passes; the
    outcomes and the wall seconds."""  # fmt: skip
    queue, done = list(reversed(bodies)), []
    stop_at, start = time.monotonic() + deadline_s, time.perf_counter()

    async def worker() -> None:
        while queue and time.monotonic() < stop_at:
            done.append(await send(client, queue.pop()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - start


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


class RetryingClient:
    """What a user with a file of requests writes: ``concurrency`` threads posting to
    ``route``, each 503 sent again after its Retry-After (1 s when it has none)."""

    def __init__(
        self, url: str, concurrency: int = 4, timeout_s: float = 300.0, route: str = "/v1/score"
    ) -> None:
        self._url, self._concurrency = f"{url}{route}", concurrency
        limits = httpx.Limits(max_connections=concurrency)
        self._client = httpx.Client(timeout=timeout_s, limits=limits)

    def close(self) -> None:
        self._client.close()

    def post(self, body: bytes) -> int:
        """POST until a 200; the number of 503s retried. RuntimeError on any other status."""
        retried = 0
        while True:
            response = self._client.post(self._url, content=body, headers=JSON_HEADERS)
            if response.status_code == 200:
                return retried
            if response.status_code != 503:
                status = f"HTTP {response.status_code} {response.text[:300]}"
                raise RuntimeError(f"{self._url}: {status}")
            retried += 1
            time.sleep(float(response.headers.get("retry-after", 1)))  # the server's Retry-After

    def run(self, bodies: Sequence[bytes]) -> tuple[float, int]:
        """Wall seconds to answer every body, ``concurrency`` in flight; 503s retried."""
        start = time.perf_counter()
        with ThreadPoolExecutor(self._concurrency) as pool:
            retried = sum(pool.map(self.post, bodies))
        return time.perf_counter() - start, retried


class ScoreFailed(RuntimeError):
    """A score request got no 200 answer (an error status, a time-out, no connection)."""


class DeadlineExceeded(RuntimeError):
    """The run's time budget (--deadline-s) is spent."""


class ServerNotReady(RuntimeError):
    """GET /health did not answer 200 in time."""


@dataclass(frozen=True)
class Deadline:
    """A monotonic-clock instant after which no new request is sent."""

    stop_at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def check(self) -> None:
        if time.monotonic() > self.stop_at:
            raise DeadlineExceeded("the --deadline-s budget is spent")


class Server:
    """A scorejax server at a loopback URL, driven strictly one request at a time."""

    def __init__(self, base_url: str, deadline: Deadline, timeout_s: float = 300.0) -> None:
        self._base = loopback_url(base_url)
        self._deadline = deadline
        self._client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_deadline(self) -> None:
        """DeadlineExceeded once the run's time budget is spent."""
        self._deadline.check()

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Poll GET /health until it answers 200; RuntimeError after ``timeout_s``."""
        stop_at = time.monotonic() + timeout_s
        while time.monotonic() < stop_at:
            try:
                if self._client.get(f"{self._base}/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise ServerNotReady(f"{self._base}/health did not answer 200 within {timeout_s:.0f} s")

    def model_id(self) -> str | None:
        """The served model's id from GET /v1/models (None if unreadable)."""
        try:
            return str(self._client.get(f"{self._base}/v1/models").json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None

    def stats(self) -> dict[str, Any]:
        """GET /v1/stats of the scoring replica; {} when it cannot be read."""
        try:
            response = self._client.get(f"{self._base}/v1/stats")
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def score(self, body: bytes) -> float:
        """POST /v1/score; wall seconds until the full answer. ScoreFailed unless 200."""
        self.check_deadline()
        start = time.perf_counter()
        try:
            response = self._client.post(
                f"{self._base}/v1/score", content=body, headers=JSON_HEADERS
            )
        except httpx.HTTPError as error:
            raise ScoreFailed(f"no answer ({type(error).__name__})") from None
        wall = time.perf_counter() - start
        if response.status_code != 200:
            raise ScoreFailed(f"HTTP {response.status_code} {_reason(response)}")
        return wall

    def warm(self, body: bytes) -> None:
        """Untimed requests of ``body``'s shape until its own signature is compiled: a new
        shape runs on a covering signature and compiles once it recurs (a second request
        when the first was declined as a one-off), then ``settle``."""
        before = self.stats().get("declined_one_off", 0)
        self.score(body)
        if self.stats().get("declined_one_off", 0) > before:
            self.score(body)
        self.settle()

    def settle(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> None:
        """Poll /v1/stats until no background compile is pending (bounded): timed requests
        should see the steady state users get from then on."""
        stop_at = time.monotonic() + timeout_s
        while time.monotonic() < stop_at and self.stats().get("background_pending", 0):
            time.sleep(poll_s)

    def timed(self, body: bytes) -> Sample:
        """One score request with the replica stats read right before and after it."""
        before = self.stats()
        wall = self.score(body)
        return Sample.between(wall, before, self.stats())


def _reason(response: httpx.Response, missing: str = "") -> str:
    """The error envelope's reason (replicas/errors.py); ``missing`` without one."""
    try:
        return str(response.json()["reason"])
    except (ValueError, KeyError, TypeError):
        return missing


def score_body(query: list[int], items: list[list[int]], item_first: bool = False) -> bytes:
    """A /v1/score body in token ids (no tokenizer involved)."""
    payload = {
        "query": query,
        "items": items,
        "label_token_ids": list(LABELS),
        "item_first": item_first,
    }
    return json.dumps(payload).encode()
