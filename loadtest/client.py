"""The serial and retrying HTTP clients of the served benchmarks (loads of many requests in
flight go through loadtest.drive, the one load driver):

- :class:`RetryingClient`: what a user with a file of requests writes, requests in flight
  that send each 503 again after its Retry-After (``bench_batch``, ``bench_embed``), on the
  load driver;
- :class:`Server`: strictly one request at a time, readiness polled (``GET /health``), its
  ``GET /v1/stats`` counters read around each timed request, and a ``Deadline`` every wait
  checks (``bench_serve``, ``bench_batch``; ``first_minute``'s health wait).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.bench_serve_report import Sample
from loadtest.drive import Load, drive, header_seconds  # noqa: F401 (header_seconds: its old home)
from loadtest.harness import JSON_HEADERS, LABELS, loopback_url


class RetryingClient:
    """What a user with a file of requests writes: ``concurrency`` requests in flight to
    ``route`` (a closed loop of loadtest.drive), each 503 sent again after its Retry-After
    (1 s when it has none)."""

    def __init__(
        self, url: str, concurrency: int = 4, timeout_s: float = 300.0, route: str = "/v1/score"
    ) -> None:
        self._url = url
        self._load = Load(clients=concurrency, timeout_s=timeout_s, route=route, retry=True)

    def close(self) -> None:
        pass  # each run has its own connections

    def run(self, bodies: Sequence[bytes]) -> tuple[float, int]:
        """Wall seconds to answer every body, 503s retried, and how many were retried;
        RuntimeError on any answer but 200 or 503."""
        start = time.perf_counter()
        outcomes = asyncio.run(drive(self._url, self._load, list(bodies)))
        wall = time.perf_counter() - start
        if bad := [o for o in outcomes if o.status not in (200, 503)]:
            answer = f"HTTP {bad[0].status} {bad[0].reason}"
            raise RuntimeError(f"{self._url}{self._load.route}: {answer}")
        return wall, sum(o.status == 503 for o in outcomes)


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
