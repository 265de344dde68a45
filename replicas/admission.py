"""Admission control (semantics 12): answer overload at once instead of queueing it.

``QueueEstimate`` turns a queue depth and recent service times into an expected wait; a
request whose expected wait exceeds ``max_queue_wait_s`` is refused with 503 ``overloaded``
and a ``Retry-After``. The ingress keeps one over its calls to the replicas (depth: calls in
flight; rate: completions per second over a sliding window, Little's law); each replica keeps
one over its own works (queued for a batch or in the step). Pure Python with an injected
clock, so the arithmetic is tested without servers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RATE_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 60


def retry_after_seconds(expected_wait_s: float, max_wait_s: float) -> int:
    """Whole seconds until the queue has likely drained to the allowed wait (1..60)."""
    return int(min(max(math.ceil(expected_wait_s - max_wait_s), 1), MAX_RETRY_AFTER_S))


@dataclass
class QueueEstimate:
    """Calls in flight and when recent ones completed; ``expected_wait_s`` for one more."""

    window_s: float = RATE_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    in_flight: int = 0
    _completions: deque[float] = field(default_factory=deque)

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, served: bool = True) -> None:
        """One call left the queue; only served calls count toward the service rate (a
        fast refusal says nothing about how fast the queue drains)."""
        self.in_flight = max(self.in_flight - 1, 0)
        if served:
            self._completions.append(self.clock())
        self._forget()

    def _forget(self) -> None:
        horizon = self.clock() - self.window_s
        while self._completions and self._completions[0] < horizon:
            self._completions.popleft()

    def completion_rate(self) -> float | None:
        """Completions per second over the window; None before two completions (no basis
        for an estimate yet: admit)."""
        self._forget()
        if len(self._completions) < 2:
            return None
        # At least a second: a batch completes many calls at one instant.
        span = max(self.clock() - self._completions[0], 1.0)
        return len(self._completions) / span

    def expected_wait_s(self) -> float:
        """Little's law: a new call waits for the calls ahead of it at the recent rate."""
        rate = self.completion_rate()
        return 0.0 if rate is None else self.in_flight / rate


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    expected_wait_s: float
    retry_after_s: int = 0


def admit(estimate: QueueEstimate, max_wait_s: float) -> Verdict:
    """Admit while the expected wait is within ``max_wait_s`` (0 disables the check)."""
    wait = estimate.expected_wait_s()
    if max_wait_s <= 0 or wait <= max_wait_s:
        return Verdict(True, wait)
    return Verdict(False, wait, retry_after_seconds(wait, max_wait_s))
