"""The ingress's memory of the scoring replicas' overload refusals (semantics 12).

A replica refuses a request when its expected wait exceeds ``max_queue_wait_s`` and says
by how much (``ScoringError.excess_wait_s``). Its queue drains by at most one second of
wait per second, so every request in that time would be refused as well. Under an
open-loop overload most requests arrive in that time, and each one's refusal used to cost
a handle call: Serve's router, the replica's event loop (beside the engine's threads, on
the same cores) and the answer's transport, about a third of a refusal's CPU
(docs/operations.md, "Refusals at 40 requests/s, every client").

``RefusalWindow`` keeps that lower bound, capped at ``MAX_WINDOW_S``, and refuses locally
while it lasts. The cap keeps the ingress asking the replicas at least once a second, so
they still decide (a queue that drained faster, a new replica) and the answer is never
staler than that. A refusal on a fresh replica (no work rate yet: no excess) opens no
window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from replicas.errors import Reason, ScoringError

MAX_WINDOW_S = 1.0


@dataclass
class RefusalWindow:
    """Refuses locally until the last replica refusal's lower bound (at most ``max_window_s``
    after it) passes. One per ingress replica; its event loop is its only user."""

    max_window_s: float = MAX_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _until: float = 0.0  # refuse locally before this time
    _retry_at: float = 0.0  # when the last refusal's Retry-After ends
    _max_wait_s: float = 0.0
    local_refusals: int = 0

    def refused(self, error: ScoringError, max_wait_s: float) -> None:
        """A replica's answer was ``error``: an ``overloaded`` 503 opens or extends the
        window; anything else leaves it."""
        if error.reason != Reason.OVERLOADED or not error.excess_wait_s:
            return
        now = self.clock()
        if error.excess_wait_s > 0:
            self._until = max(self._until, now + min(error.excess_wait_s, self.max_window_s))
            self._retry_at = max(self._retry_at, now + (error.retry_after_s or 1))
            self._max_wait_s = max_wait_s

    def refusal(self) -> ScoringError | None:
        """The 503 to answer now without calling a replica, or None (ask the replica)."""
        now = self.clock()
        if now >= self._until:
            return None
        self.local_refusals += 1
        retry_after = max(1, math.ceil(self._retry_at - now))
        message = (
            f"scoring replica overloaded: expected wait exceeds max_queue_wait_s "
            f"{self._max_wait_s} s by over {self._until - now:.1f} s; retry later"
        )
        return ScoringError(Reason.OVERLOADED, message, None, 503, retry_after)
