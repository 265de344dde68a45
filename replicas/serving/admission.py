"""Admission control (semantics 12 and 16): answer overload at once, counting work.

``QueueEstimate`` keeps the work queued ahead (cost units: tokens to compute plus a call's
fixed cost, ``replicas.contract.work_cost``) and the recent work rate (units served per busy
second). The expected wait of a new request is the work ahead of it, less what the oldest
call has already drained, over that rate; a request whose expected wait exceeds
``max_queue_wait_s`` is refused with 503 ``overloaded`` and a ``Retry-After``. Counting work,
not calls, admits a burst of small requests after a large one and refuses a small one stuck
behind a giant. The ingress keeps one over its calls to the replicas; each replica keeps one
over its own works (queued for a batch or in the step). Pure Python with an injected clock,
so the arithmetic is tested without servers.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

RECENT_COMPLETIONS = 32
MIN_COMPLETIONS = 4  # fewer is no basis (the first calls may include compiles): admit
MIN_RATE_SPAN_S = 0.1  # the rate's busy span is at least this long (no rate from an instant)
MAX_RETRY_AFTER_S = 60


def retry_after_seconds(expected_wait_s: float, max_wait_s: float) -> int:
    """Whole seconds until the queue has likely drained to the allowed wait (1..60)."""
    return int(min(max(math.ceil(expected_wait_s - max_wait_s), 1), MAX_RETRY_AFTER_S))


@dataclass
class QueueEstimate:
    """Work in flight and the work rate; ``expected_wait_s`` for one more call.

    ``started(cost)`` returns a ticket that ``finished`` hands back. The rate counts only
    busy time (some call in flight), so idle minutes do not make a fresh burst look slow;
    it spans the last ``recent`` completions plus the gap before them, so a batch finishing
    many calls at one instant is not mistaken for a fast queue, and ends at the last
    completion: a long call still running is credited with what it has drained (at most its
    cost) instead of diluting the rate.
    """

    recent: int = RECENT_COMPLETIONS
    clock: Callable[[], float] = time.monotonic
    _ahead: dict[int, float] = field(default_factory=dict)  # ticket -> cost, oldest first
    _tickets: Iterator[int] = field(default_factory=itertools.count)
    _busy_total: float = 0.0  # busy seconds before the current busy period
    _busy_since: float = 0.0  # wall time the current busy period began
    _head_since: float = 0.0  # busy clock since which the oldest call in flight has drained
    _completions: deque[tuple[float, float]] = field(default_factory=deque)  # (busy clock, cost)
    _origin: float = 0.0  # busy clock the rate's window may start at (after an unclean step)
    _prior: float | None = None  # the rate before an unclean step, until the window refills

    @property
    def in_flight(self) -> int:
        return len(self._ahead)

    @property
    def queued_work(self) -> float:
        """Cost units of every call in flight."""
        return sum(self._ahead.values())

    def busy_clock(self) -> float:
        """Seconds during which at least one call was in flight."""
        if self._ahead:
            return self._busy_total + self.clock() - self._busy_since
        return self._busy_total

    def started(self, cost: float = 1.0) -> int:
        """One call of ``cost`` units joins the queue; returns its ticket."""
        if not self._ahead:
            self._busy_since = self.clock()
            self._head_since = self._busy_total
        ticket = next(self._tickets)
        self._ahead[ticket] = float(cost)
        return ticket

    def finished(self, ticket: int, served: bool = True, clean: bool = True) -> None:
        """The call of ``ticket`` left the queue; only served calls count toward the rate (a
        fast refusal says nothing about how fast the queue drains). A served call whose step
        was not ``clean`` (a compile ran beside it) says the engine was slower than it is:
        the window forgets it and everything before it, and starts again after it; until it
        refills, the rate before stands in."""
        if ticket not in self._ahead:
            return
        now = self.busy_clock()
        cost = self._ahead.pop(ticket)
        if served and not clean:
            self._prior = self.work_rate()  # what the engine did before the compile
            self._completions.clear()
            self._origin = now
        elif served:
            self._completions.append((now, cost))
            while len(self._completions) > self.recent + 1:
                self._completions.popleft()
        if not self._ahead:
            self._busy_total += self.clock() - self._busy_since
        self._head_since = now  # the next oldest call drains from here

    def work_rate(self) -> float | None:
        """Cost units served per busy second; while fewer than ``MIN_COMPLETIONS`` are in
        the window, the rate measured before the unclean step that restarted it (an
        overload that triggers background compiles must not open admission wide), or None
        before any (no basis yet: admit)."""
        times = self._completions
        if len(times) < MIN_COMPLETIONS:
            return self._prior
        if len(times) > self.recent:  # the oldest kept marks where the others' span began
            since, served = times[0][0], sum(cost for _, cost in itertools.islice(times, 1, None))
        else:
            since, served = self._origin, sum(cost for _, cost in times)
        # Up to the last completion: the call in progress since is credited by work_ahead.
        return served / max(times[-1][0] - since, MIN_RATE_SPAN_S)

    def work_ahead(self, rate: float) -> float:
        """Units still to serve before a new call: all in flight, less what the oldest call
        has drained at ``rate`` since it became the oldest (at most its own cost)."""
        if not self._ahead:
            return 0.0
        head = next(iter(self._ahead.values()))
        drained = min(rate * (self.busy_clock() - self._head_since), head)
        return max(self.queued_work - drained, 0.0)

    def expected_wait_s(self) -> float:
        """The work ahead of a new call over the recent work rate (0 with no basis)."""
        rate = self.work_rate()
        return 0.0 if rate is None else self.work_ahead(rate) / rate


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    expected_wait_s: float
    retry_after_s: int = 0
    max_wait_s: float = 0.0
    cold_calls: int = 0  # refused with no work rate yet: this many calls were in flight

    def refusal(self, who: str) -> str:
        """The 503 message of a refused verdict; ``who`` is what is overloaded."""
        if self.cold_calls:
            return (
                f"{who} overloaded: no work rate measured yet and {self.cold_calls} calls "
                "in flight, the most admitted before one is; retry later"
            )
        return (
            f"{who} overloaded: expected wait {self.expected_wait_s:.1f} s exceeds "
            f"max_queue_wait_s {self.max_wait_s} s; retry later"
        )


def admit(estimate: QueueEstimate, max_wait_s: float, cold_calls: int = 0) -> Verdict:
    """Admit while the expected wait is within ``max_wait_s`` (0 disables the check). With
    no work rate yet (no basis for a wait), admit while fewer than ``cold_calls`` calls are
    in flight (0: any number), so a fresh replica hit by an overload queues at most about
    one engine call's worth before its first completions measure the rate."""
    wait = estimate.expected_wait_s()
    cold = max_wait_s > 0 and cold_calls > 0 and estimate.work_rate() is None
    if cold and estimate.in_flight >= cold_calls:
        return Verdict(False, wait, 1, max_wait_s, cold_calls=estimate.in_flight)
    if max_wait_s <= 0 or wait <= max_wait_s:
        return Verdict(True, wait)
    return Verdict(False, wait, retry_after_seconds(wait, max_wait_s), max_wait_s)
