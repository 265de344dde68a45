"""Admission control (semantics 12): answer overload at once instead of queueing it.

``QueueEstimate`` turns a queue depth and the recent service rate into an expected wait; a
request whose expected wait exceeds ``max_queue_wait_s`` is refused with 503 ``overloaded``
and a ``Retry-After``. The ingress keeps one over its calls to the replicas (depth: calls in
flight; rate: served calls per busy second, Little's law); each replica keeps one over its
own works (queued for a batch or in the step). Pure Python with an injected
clock, so the arithmetic is tested without servers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RECENT_COMPLETIONS = 32
MIN_COMPLETIONS = 4  # fewer is no basis (the first calls may include compiles): admit
MAX_RETRY_AFTER_S = 60


def retry_after_seconds(expected_wait_s: float, max_wait_s: float) -> int:
    """Whole seconds until the queue has likely drained to the allowed wait (1..60)."""
    return int(min(max(math.ceil(expected_wait_s - max_wait_s), 1), MAX_RETRY_AFTER_S))


@dataclass
class QueueEstimate:
    """Calls in flight and the service rate; ``expected_wait_s`` for one more call.

    The rate counts only busy time (some call in flight), so idle minutes do not make a
    fresh burst look slow, and spans the last ``recent`` completions plus the gap before
    them, so a batch finishing many calls at one instant is not mistaken for a fast queue.
    """

    recent: int = RECENT_COMPLETIONS
    clock: Callable[[], float] = time.monotonic
    in_flight: int = 0
    _busy_total: float = 0.0  # busy seconds before the current busy period
    _busy_since: float = 0.0  # wall time the current busy period began
    _completions: deque[float] = field(default_factory=deque)  # busy-clock times

    def busy_clock(self) -> float:
        """Seconds during which at least one call was in flight."""
        if self.in_flight:
            return self._busy_total + self.clock() - self._busy_since
        return self._busy_total

    def started(self) -> None:
        if not self.in_flight:
            self._busy_since = self.clock()
        self.in_flight += 1

    def finished(self, served: bool = True) -> None:
        """One call left the queue; only served calls count toward the service rate (a
        fast refusal says nothing about how fast the queue drains)."""
        if served:
            self._completions.append(self.busy_clock())
            while len(self._completions) > self.recent + 1:
                self._completions.popleft()
        if self.in_flight == 1:
            self._busy_total += self.clock() - self._busy_since
        self.in_flight = max(self.in_flight - 1, 0)

    def completion_rate(self) -> float | None:
        """Served calls per busy second; None before ``MIN_COMPLETIONS`` (no basis yet:
        admit)."""
        times = self._completions
        if len(times) < MIN_COMPLETIONS:
            return None
        if len(times) > self.recent:  # the oldest kept marks where the others' span began
            count, since = len(times) - 1, times[0]
        else:
            count, since = len(times), 0.0
        return count / max(self.busy_clock() - since, 1.0)

    def expected_wait_s(self) -> float:
        """Little's law: a new call waits for the calls ahead of it at the service rate."""
        rate = self.completion_rate()
        return 0.0 if rate is None else self.in_flight / rate


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    expected_wait_s: float
    retry_after_s: int = 0
    max_wait_s: float = 0.0

    def refusal(self, who: str) -> str:
        """The 503 message of a refused verdict; ``who`` is what is overloaded."""
        return (
            f"{who} overloaded: expected wait {self.expected_wait_s:.1f} s exceeds "
            f"max_queue_wait_s {self.max_wait_s} s; retry later"
        )


def admit(estimate: QueueEstimate, max_wait_s: float) -> Verdict:
    """Admit while the expected wait is within ``max_wait_s`` (0 disables the check)."""
    wait = estimate.expected_wait_s()
    if max_wait_s <= 0 or wait <= max_wait_s:
        return Verdict(True, wait)
    return Verdict(False, wait, retry_after_seconds(wait, max_wait_s), max_wait_s)
