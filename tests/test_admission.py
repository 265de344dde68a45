"""Admission control arithmetic (replicas/admission.py) with a hand-driven clock."""

from __future__ import annotations

from replicas.admission import QueueEstimate, admit, retry_after_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_estimate_before_two_completions_admits() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(50):
        queue.started()
    assert queue.expected_wait_s() == 0.0
    assert admit(queue, 5.0).admitted


def test_littles_law_wait_and_refusal_with_retry_after() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(24):
        queue.started()
    for _ in range(4):  # one completion every 0.5 s: 2 per second
        clock.now += 0.5
        queue.finished()
    clock.now += 0.5
    # 4 completions over the 2 s since the first one -> 2/s; 20 in flight wait 10 s.
    assert queue.completion_rate() == 2.0
    assert queue.expected_wait_s() == 10.0
    verdict = admit(queue, 4.0)
    assert not verdict.admitted and verdict.retry_after_s == 6
    assert admit(queue, 10.0).admitted
    assert admit(queue, 0.0).admitted  # 0 turns the check off


def test_old_completions_leave_the_window() -> None:
    clock = Clock()
    queue = QueueEstimate(window_s=10.0, clock=clock)
    queue.started()
    queue.started()
    queue.finished()
    queue.finished()
    clock.now += 11.0
    assert queue.completion_rate() is None  # a stale rate is no basis: admit
    assert queue.in_flight == 0


def test_a_burst_of_completions_counts_over_at_least_a_second() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(16):
        queue.started()
    for _ in range(16):
        queue.finished()  # one batch of 16 completes at one instant
    assert queue.completion_rate() == 16.0


def test_retry_after_is_whole_seconds_between_1_and_60() -> None:
    assert retry_after_seconds(5.2, 5.0) == 1
    assert retry_after_seconds(12.5, 5.0) == 8
    assert retry_after_seconds(1000.0, 5.0) == 60
