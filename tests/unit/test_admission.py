"""Admission control arithmetic (replicas/serving/admission.py) with a hand-driven clock.

Semantics 16: the expected wait is the work queued ahead (cost units: tokens) over the
recent work rate (units per busy second), never calls over calls per second.
"""

from __future__ import annotations

import pytest

from replicas.contract import CALL_OVERHEAD_TOKENS, ScoreWork, work_cost
from replicas.serving.admission import QueueEstimate, admit, retry_after_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def serve_one_at_a_time(queue: QueueEstimate, clock: Clock, cost: float, seconds: float) -> None:
    """One call of ``cost`` units that the replica serves alone in ``seconds``."""
    ticket = queue.started(cost)
    clock.now += seconds
    queue.finished(ticket)


def test_no_estimate_before_completions_admits() -> None:
    queue = QueueEstimate(clock=Clock())
    for _ in range(50):
        queue.started(1000)
    assert queue.expected_wait_s() == 0.0
    assert admit(queue, 5.0).admitted


def test_with_no_work_rate_yet_at_most_one_calls_worth_is_admitted() -> None:
    """A fresh replica hit by an overload (no completion yet, so no basis for a wait) admits
    ``cold_calls`` calls, then refuses at once with Retry-After 1 until its first completions
    measure the rate; admission by wait follows."""
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    tickets = []
    for _ in range(16):
        assert admit(queue, 5.0, cold_calls=16).admitted
        tickets.append(queue.started(100))
    refused = admit(queue, 5.0, cold_calls=16)
    assert not refused.admitted and refused.retry_after_s == 1 and refused.cold_calls == 16
    assert "no work rate measured yet and 16 calls in flight" in refused.refusal("replica")
    assert admit(queue, 0.0, cold_calls=16).admitted  # 0 turns every check off
    for ticket in tickets[:4]:  # 100 units every 0.5 s: 200 units/s, 1200 units ahead: 6 s
        clock.now += 0.5
        queue.finished(ticket)
    assert queue.work_rate() == 200.0
    by_wait = admit(queue, 5.0, cold_calls=16)
    assert not by_wait.admitted and by_wait.cold_calls == 0 and by_wait.retry_after_s == 1
    clock.now += 0.25
    queue.finished(tickets[4])  # 500 units in 2.25 s, 1100 ahead: 4.95 s
    assert admit(queue, 5.0, cold_calls=16).admitted


def test_wait_is_work_ahead_over_work_rate_with_retry_after() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    tickets = [queue.started(100) for _ in range(24)]
    for ticket in tickets[:4]:  # 100 units served every 0.5 s: 200 units/s
        clock.now += 0.5
        queue.finished(ticket)
    assert queue.work_rate() == 200.0 and queue.queued_work == 2000.0
    assert queue.expected_wait_s() == 10.0  # the 20 calls ahead, 2000 units at 200/s
    clock.now += 0.25  # the oldest call has drained 50 of its 100 units; the rate holds
    assert queue.work_rate() == 200.0 and queue.work_ahead(200.0) == 1950.0
    verdict = admit(queue, 4.0)
    assert not verdict.admitted and verdict.expected_wait_s == 9.75
    assert verdict.retry_after_s == 6  # ceil(9.75 - 4)
    assert admit(queue, 9.75).admitted
    assert admit(queue, 0.0).admitted  # 0 turns the check off


def test_a_burst_of_small_calls_after_one_large_call_is_admitted() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(3):
        serve_one_at_a_time(queue, clock, 100, 0.1)  # small calls: 1000 units/s
    serve_one_at_a_time(queue, clock, 3000, 3.0)  # one 128-item call: 3 s
    # By calls, 4 calls in 3.3 s is 1.2 calls/s: 12 small calls "wait" 10 s and a burst
    # of 12 would be refused past the 6th. By work, 3300 units in 3.3 s: 1000 units/s.
    assert queue.work_rate() == pytest.approx(1000.0)
    verdicts = []
    for _ in range(12):
        verdicts.append(admit(queue, 5.0))
        queue.started(100)
    assert all(v.admitted for v in verdicts)
    assert verdicts[-1].expected_wait_s == pytest.approx(1.1)  # 11 small calls: 1100 units


def test_a_small_call_behind_a_giant_in_flight_is_refused_at_once() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(4):
        serve_one_at_a_time(queue, clock, 1000, 1.0)  # 1000 units/s
    queue.started(60_000)  # a maximal request: about a minute of work
    clock.now += 1.0
    refused = admit(queue, 5.0)
    assert not refused.admitted and refused.expected_wait_s == pytest.approx(59.0)
    assert refused.retry_after_s == 54
    clock.now += 54.5  # the giant has 4.5 s of work left
    assert admit(queue, 5.0).admitted


def test_a_burst_of_large_calls_after_small_ones_is_refused_when_it_does_not_fit() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(8):
        serve_one_at_a_time(queue, clock, 50, 0.05)  # tiny calls: 1000 units/s
    verdicts = []
    for _ in range(4):  # 1000-item calls: 2 s of work each
        verdicts.append(admit(queue, 5.0))
        queue.started(2000)
    # By calls (20 calls/s) all four would pass; by work the 4th has 6 s ahead.
    assert [v.admitted for v in verdicts] == [True, True, True, False]
    assert verdicts[3].expected_wait_s == pytest.approx(6.0)


def test_idle_time_does_not_slow_the_rate() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    for _ in range(4):
        serve_one_at_a_time(queue, clock, 10, 1.0)  # 40 units in 4 busy seconds
    clock.now += 100.0  # idle
    for _ in range(3):
        queue.started(10)
    assert queue.busy_clock() == 4.0
    assert queue.expected_wait_s() == 3.0  # 30 units at 10 per second, not 40 per 104 s


def test_batches_that_finish_many_calls_at_once_count_over_their_span() -> None:
    clock = Clock()
    queue = QueueEstimate(recent=32, clock=clock)
    for burst in range(3):  # 16 calls of 10 units served together every 4 busy seconds
        tickets = [queue.started(10) for _ in range(16)]
        clock.now += 4.0
        for ticket in tickets:
            queue.finished(ticket)
        assert queue.work_rate() == 40.0, burst
    queue.started(10)
    assert queue.expected_wait_s() == 0.25


def test_refusals_do_not_count_as_service() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    tickets = [queue.started(10) for _ in range(6)]
    clock.now += 2.0
    queue.finished(tickets[0], served=False)
    assert queue.work_rate() is None and queue.in_flight == 5 and queue.queued_work == 50
    for ticket in tickets[1:5]:
        queue.finished(ticket)
    assert queue.work_rate() == 20.0  # 40 units served in 2 busy seconds
    queue.finished(tickets[1])  # a ticket handed back twice changes nothing
    assert queue.in_flight == 1 and queue.work_rate() == 20.0


def test_fewer_than_four_completions_are_no_basis() -> None:
    clock = Clock()
    queue = QueueEstimate(clock=clock)
    tickets = [queue.started(10) for _ in range(20)]
    clock.now += 30.0  # a first call that compiled for 30 s
    for ticket in tickets[:3]:
        queue.finished(ticket)
    assert queue.work_rate() is None and admit(queue, 5.0).admitted
    queue.finished(tickets[3])
    assert not admit(queue, 5.0).admitted  # 160 units at 40 per 30 s


def test_work_cost_counts_the_shared_query_once() -> None:
    work = ScoreWork(query_ids=tuple(range(300)), item_ids=((1,) * 10,) * 100, label_ids=(3,))
    assert work_cost(work, multi_item=True) == CALL_OVERHEAD_TOKENS + 300 + 1000
    assert work_cost(work, multi_item=False) == CALL_OVERHEAD_TOKENS + 100 * 310
    first = ScoreWork(work.query_ids, work.item_ids, work.label_ids, item_first=True)
    assert work_cost(first, multi_item=True) == CALL_OVERHEAD_TOKENS + 100 * 310
    empty = ScoreWork(query_ids=(1, 2), item_ids=(), label_ids=(3,))
    assert work_cost(empty, multi_item=True) == CALL_OVERHEAD_TOKENS + 2


def test_retry_after_is_whole_seconds_between_1_and_60() -> None:
    assert retry_after_seconds(5.2, 5.0) == 1
    assert retry_after_seconds(12.5, 5.0) == 8
    assert retry_after_seconds(1000.0, 5.0) == 60


def test_an_unclean_completion_restarts_the_rate_after_it() -> None:
    """A step beside a compile (issue 43) is slower than the engine: its call, and every
    call before it, leave the rate; the window starts after it, so its busy seconds are
    not charged to the clean calls that follow."""
    now = [0.0]
    queue = QueueEstimate(clock=lambda: now[0])
    slow = queue.started(10)
    now[0] += 5.0  # 10 units in 5 s: beside a compile
    queue.finished(slow, served=True, clean=False)
    for _ in range(4):  # then 10 units a second, clean
        ticket = queue.started(10)
        now[0] += 1.0
        queue.finished(ticket)
    assert queue.work_rate() == pytest.approx(10.0)


def test_until_the_window_refills_after_an_unclean_step_the_rate_before_stands() -> None:
    """Issue 57.4: a background compile during overload restarted the rate, and with no
    basis every request was admitted (60 in 1.6 s at 40 requests/s, queue waits up to 27 s
    with max_queue_wait_s 5). The rate before the compile now stands in."""
    now = [0.0]
    queue = QueueEstimate(clock=lambda: now[0])
    for _ in range(5):  # 10 units a second
        ticket = queue.started(10)
        now[0] += 1.0
        queue.finished(ticket)
    slow = queue.started(10)
    now[0] += 5.0
    queue.finished(slow, served=True, clean=False)
    assert queue.work_rate() == pytest.approx(10.0)
    for _ in range(8):  # 80 units queued: 8 s at the rate before
        queue.started(10)
    verdict = admit(queue, 5.0)
    assert not verdict.admitted and verdict.expected_wait_s == pytest.approx(8.0)
