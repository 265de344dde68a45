"""The ingress's refusal window (app/refusals.py) with a hand-driven clock: an overloaded
replica's refusal says by how much its expected wait exceeds max_queue_wait_s, so the
ingress refuses locally for that long, at most a second."""

from __future__ import annotations

import math

from app.refusals import RefusalWindow
from replicas.errors import Reason, ScoringError


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def overloaded(excess_s: float | None) -> ScoringError:
    retry_after = max(1, math.ceil(excess_s or 0))
    message = "scoring replica overloaded"
    return ScoringError(Reason.OVERLOADED, message, None, 503, retry_after, None, excess_s)


def test_a_refusal_opens_a_window_of_its_lower_bound_at_most_a_second() -> None:
    clock = Clock()
    window = RefusalWindow(clock=clock)
    assert window.refusal() is None  # nothing refused yet: ask the replica
    window.refused(overloaded(40.3), 5.0)  # a wait of 45.3 s: 40.3 s beyond 5 s
    clock.now += 0.4
    local = window.refusal()
    assert local is not None and local.status_code == 503 and local.reason == "overloaded"
    assert local.retry_after_s == 41  # ceil(41 - 0.4): what the replica said, less the time
    assert local.headers == {"Retry-After": "41"} and "max_queue_wait_s 5.0 s" in local.message
    clock.now += 0.6  # a second after the refusal: ask the replica again
    assert window.refusal() is None and window.local_refusals == 1


def test_a_short_excess_opens_a_shorter_window_and_none_opens_none() -> None:
    clock = Clock()
    window = RefusalWindow(clock=clock)
    window.refused(overloaded(0.25), 5.0)  # the steady state of an overload: just beyond
    clock.now += 0.2
    assert window.refusal() is not None and window.refusal().retry_after_s == 1
    clock.now += 0.05
    assert window.refusal() is None
    window.refused(overloaded(None), 5.0)  # no excess known (a fresh replica's refusals)
    assert window.refusal() is None


def test_other_errors_open_no_window() -> None:
    window = RefusalWindow(clock=Clock())
    window.refused(ScoringError(Reason.UNAVAILABLE, "replica died", None, 503, 30), 5.0)
    window.refused(ScoringError(Reason.INVALID_REQUEST, "bad"), 5.0)
    window.refused(ScoringError(Reason.OVERLOADED, "deadline", None, 503, None), 5.0)
    assert window.refusal() is None and window.local_refusals == 0
