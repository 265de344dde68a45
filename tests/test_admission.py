"""Admission control arithmetic (replicas/serving/admission.py) with a hand-driven clock."""

from __future__ import annotations

from replicas.serving.admission import QueueEstimate, admit, retry_after_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_estimate_before_completions_admits() -> None:
    queue = QueueEstimate(clock=Clock())
    for _ in range(50):
        queue.started()
    assert queue.expected_wait_s() == 0.0
    assert admit(queue, 5.0).admitted


def test_littles_law_wait_and_refusal_with_retry_after() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(24):
        queue.started()
    for _ in range(4):  # one served every 0.5 s
        clock.now += 0.5
        queue.finished()
    clock.now += 0.5
    # 4 served in 2.5 busy seconds -> 1.6/s; the 20 in flight drain in 12.5 s.
    assert queue.completion_rate() == 1.6
    assert queue.expected_wait_s() == 12.5
    verdict = admit(queue, 4.0)
    assert not verdict.admitted and verdict.retry_after_s == 9
    assert admit(queue, 12.5).admitted
    assert admit(queue, 0.0).admitted  # 0 turns the check off


def test_idle_time_does_not_slow_the_rate() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(4):
        queue.started()
        clock.now += 1.0
        queue.finished()  # 4 served in 4 busy seconds
    clock.now += 100.0  # idle
    for _ in range(3):
        queue.started()
    assert queue.busy_clock() == 4.0
    assert queue.expected_wait_s() == 3.0  # 3 / (1 per second), not 3 / (4 per 104 s)


def test_batches_that_finish_many_calls_at_once_count_over_their_span() -> None:
    clock = Clock()
    queue = QueueEstimate(recent=32, clock=clock)
    for burst in range(3):  # 16 calls served together every 4 busy seconds
        for _ in range(16):
            queue.started()
        clock.now += 4.0
        for _ in range(16):
            queue.finished()
        assert queue.completion_rate() == 4.0, burst
    queue.started()
    assert queue.expected_wait_s() == 0.25


def test_refusals_do_not_count_as_service() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(6):
        queue.started()
    clock.now += 2.0
    queue.finished(served=False)
    assert queue.completion_rate() is None and queue.in_flight == 5
    for _ in range(4):
        queue.finished()
    assert queue.completion_rate() == 2.0  # 4 served in 2 busy seconds


def test_fewer_than_four_completions_are_no_basis() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(20):
        queue.started()
    clock.now += 30.0  # a first call that compiled for 30 s
    for _ in range(3):
        queue.finished()
    assert queue.completion_rate() is None and admit(queue, 5.0).admitted
    queue.finished()
    assert not admit(queue, 5.0).admitted  # 16 in flight at 4 per 30 s


def test_retry_after_is_whole_seconds_between_1_and_60() -> None:
    assert retry_after_seconds(5.2, 5.0) == 1
    assert retry_after_seconds(12.5, 5.0) == 8
    assert retry_after_seconds(1000.0, 5.0) == 60
