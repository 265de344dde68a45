"""replicas/serving/merging.py: which waiting batches the next engine call takes."""

from __future__ import annotations

from collections import deque

import pytest

from replicas.contract import EmbedWork, PromptWork, ScoreWork
from replicas.serving.merging import call_budget, take_for_one_call, waits_for_company
from replicas.settings import ReplicaSettings, SettingsError


def waiting(*batches: list[int]) -> deque:
    """Batches of works given by their token counts; each batch's 'future' is its index."""
    return deque((batch, n) for n, batch in enumerate(batches))


def test_batches_join_while_works_and_units_fit() -> None:
    queue = waiting([10], [5, 5], [30], [1])
    assert take_for_one_call(queue, 8, 20, int) == [([10], 0), ([5, 5], 1)]
    assert take_for_one_call(queue, 8, 20, int) == [([30], 2)]  # the first runs, too big or not
    assert take_for_one_call(queue, 8, 20, int) == [([1], 3)] and not queue


def test_no_bound_merges_up_to_max_works_in_arrival_order() -> None:
    queue = waiting([100], [100, 100], [100], [100])
    assert [f for _, f in take_for_one_call(queue, 4, 0, int)] == [0, 1, 2]
    assert [f for _, f in take_for_one_call(queue, 4, 0, int)] == [3]


def test_a_later_batch_that_fits_does_not_jump_the_queue() -> None:
    queue = waiting([10], [15], [1])
    assert [f for _, f in take_for_one_call(queue, 8, 20, int)] == [0]
    assert [f for _, f in take_for_one_call(queue, 8, 20, int)] == [1, 2]


def test_the_bound_in_seconds_is_that_many_seconds_of_the_recent_work_rate() -> None:
    assert call_budget(3.0, 400.0) == 1200.0  # units a call may hold
    assert call_budget(0.0, 400.0) == 0.0 == call_budget(0.0, None)  # 0: unbounded
    queue = waiting([10], [5])
    assert take_for_one_call(queue, 8, call_budget(3.0, None), int) == [([10], 0)]  # no rate yet
    assert take_for_one_call(queue, 8, call_budget(3.0, None), int) == [([5], 1)]


def test_the_retired_token_bound_names_its_replacement() -> None:
    with pytest.raises(SettingsError, match=r"^max_call_tokens: replaced by max_call_s"):
        ReplicaSettings.from_keys(max_call_tokens=1024)


@pytest.mark.parametrize("value", [-1, float("nan")])
def test_a_negative_bound_is_refused_naming_the_setting(value: float) -> None:
    with pytest.raises(SettingsError, match="max_call_s: must be >= 0"):
        ReplicaSettings.from_keys(max_call_s=value)


def test_only_works_that_pack_across_requests_wait_for_company() -> None:
    embed, score = EmbedWork(((1, 2),)), ScoreWork((1,), ((2,),), (3,))
    prompt = PromptWork(((1, 2),))
    assert waits_for_company(waiting([embed]), 16)
    assert waits_for_company(waiting([score], [embed]), 16)
    assert not waits_for_company(waiting([score], [prompt]), 16)
    assert not waits_for_company(waiting([embed] * 8, [embed] * 8), 16)  # a full call: none
    assert not waits_for_company(waiting(), 16)


def test_pack_wait_must_not_be_negative() -> None:
    assert ReplicaSettings.from_mapping({"pack_wait_s": 0.01}).batching.pack_wait_s == 0.01
    with pytest.raises(SettingsError, match="pack_wait_s"):
        ReplicaSettings.from_mapping({"pack_wait_s": -1})
