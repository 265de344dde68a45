"""Rows that share a query become one multi-item work per engine call, cut by the limits (the
engine stage checks each work before its engine, as a replica does), and each row gets back
exactly its own items' scores (batch/packing.py);
``--engine serve`` keeps a bounded number of calls in flight and retries 503s
(batch/serve_stage.py)."""

from __future__ import annotations

import numpy as np
import pytest

from batch.packing import Slot, pack_works, unpack
from batch.rows import ScoreColumns, is_one_item, row_payload
from batch.stages import EngineStage
from replicas.contract import ModelInfo, ScoreWork, ScoringLimits
from replicas.engine_contract import EngineStats
from replicas.errors import ScoringError

LABELS = (5, 6)


def work(query: tuple[int, ...], *items: tuple[int, ...]) -> ScoreWork:
    return ScoreWork(query, items, LABELS)


class CountingEngine:
    """Counts its calls; checks nothing (a ScoringEngine trusts the limits to its caller)."""

    def __init__(self, limits: ScoringLimits) -> None:
        self.info, self.calls = ModelInfo("tiny", 300, 0, limits), 0

    def score_batch(self, works: list[ScoreWork]) -> list[np.ndarray]:
        self.calls += 1
        return [np.zeros((w.num_items, len(w.label_ids)), np.float32) for w in works]

    def stats(self) -> EngineStats:
        return EngineStats.zero()


def test_the_engine_stage_checks_every_works_limits_before_its_engine() -> None:
    """``python -m batch`` drives the engine without a replica, so its engine stage makes the
    replica's check (``check_model_limits``) on every work it hands over."""
    engine = CountingEngine(ScoringLimits(max_items_per_request=2, max_multi_item_seq_len=20))
    stage = EngineStage.around(engine)
    with pytest.raises(ScoringError) as refused:
        stage.call([work((1,), (2,)), work((1,), (2,), (3,), (4,))])
    assert refused.value.reason == "too_many_items" and engine.calls == 0
    with pytest.raises(ScoringError, match="max_multi_item_seq_len"):
        stage.call([work((1,) * 16, (2,), (3,))])  # 16 + 1 + 2 + 2 = 21
    assert engine.calls == 0
    stage.call([work((1,), (2,), (3,))])
    assert engine.calls == 1


def test_rows_of_one_query_are_one_work_in_row_order() -> None:
    q, r = (1, 2, 3), (4, 5)
    works = [work(q, (7,)), work(r, (8,)), None, work(q, (9, 9), (10,)), work(q)]
    packs = pack_works(works, ScoringLimits(), multi_item=True)
    assert [p.work for p in packs] == [work(q, (7,), (9, 9), (10,)), work(r, (8,))]
    assert packs[0].slots == (Slot(0, 0, 1), Slot(3, 1, 3))
    assert packs[1].slots == (Slot(1, 0, 1),)


def test_a_pack_is_cut_where_the_next_row_would_break_a_limit() -> None:
    q = (1, 2, 3)
    works = [work(q, (7,), (7,)), work(q, (8,)), work(q, (9,), (9,))]
    packs = pack_works(works, ScoringLimits(max_items_per_request=3), multi_item=True)
    assert [p.work.num_items for p in packs] == [3, 2]
    assert [p.slots for p in packs] == [(Slot(0, 0, 2), Slot(1, 2, 3)), (Slot(2, 0, 2),)]
    # packed length: query 3 + 1, each item 1 + 1 -> 2 items of one token fit 8
    packs = pack_works(works, ScoringLimits(max_multi_item_seq_len=8), multi_item=True)
    assert [p.work.num_items for p in packs] == [2, 1, 2]


def test_unpack_gives_each_row_its_own_items() -> None:
    q = (1,)
    works = [work(q, (7,)), None, work(q, (8,), (9,)), work(q)]
    packs = pack_works(works, ScoringLimits(), multi_item=True)
    answer = np.arange(6, dtype=np.float32).reshape(3, 2)  # [items, labels]
    rows = unpack(packs, [answer], len(works))
    np.testing.assert_array_equal(rows[0], [[0, 1]])
    np.testing.assert_array_equal(rows[2], [[2, 3], [4, 5]])
    assert rows[1].shape == (0, 0) and rows[3].shape == (0, 0)


def test_a_string_or_a_list_of_ids_is_one_item_a_list_of_them_is_many() -> None:
    assert is_one_item("x") and is_one_item([1, 2])
    assert not is_one_item(["x", "y"]) and not is_one_item([[1], [2]]) and not is_one_item([])
    columns = ScoreColumns((5,), query="q", item="i")
    assert row_payload({"q": "a", "i": "b"}, columns)["items"] == ["b"]
    assert row_payload({"q": [1], "i": np.array([2, 3])}, columns)["items"] == [[2, 3]]
    assert row_payload({"q": "a", "i": ["b", "c"]}, columns)["items"] == ["b", "c"]


class FakeHandle:
    """A DeploymentHandle's ``score`` that answers 503 overloaded first, then exp(logprobs)."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls = refusals, 0
        self.score = self

    def remote(self, **fields: object) -> FakeHandle:
        self.fields = fields
        return self

    def result(self) -> dict[str, object]:
        from replicas.errors import Reason, ScoringError

        self.calls += 1
        if self.calls <= self.refusals:
            raise ScoringError(Reason.OVERLOADED, "busy", status_code=503, retry_after_s=1)
        items = self.fields["items"]
        return {"scores": [[np.exp(-1.5), np.exp(-2.5)] for _ in items]}  # type: ignore[attr-defined]


def test_engine_serve_sends_a_refused_pack_again_after_retry_after() -> None:
    from batch.serve_stage import ServeScore

    stage = ServeScore.__new__(ServeScore)
    stage._handle, stage._tally = FakeHandle(refusals=1), None
    answer = stage._score(work((1, 2), (3,), (4, 5)))
    assert stage._handle.calls == 2
    np.testing.assert_allclose(answer, [[-1.5, -2.5], [-1.5, -2.5]])
    assert stage._handle.fields["items"] == [[3], [4, 5]]


class Outstanding:
    """Responses of a fake handle: counts those sent and not yet collected; request 2's
    first response is a 503 overloaded."""

    def __init__(self) -> None:
        self.open, self.most, self.sent = 0, 0, []

    def send(self, request: int) -> Outstanding.Response:
        self.sent.append(request)
        self.open += 1
        self.most = max(self.most, self.open)
        return Outstanding.Response(self, request, refuse=self.sent == [0, 1, 2])

    class Response:
        def __init__(self, owner: Outstanding, request: int, refuse: bool) -> None:
            self.owner, self.request, self.refuse = owner, request, refuse

        def result(self) -> int:
            from replicas.errors import Reason, ScoringError

            self.owner.open -= 1
            if self.refuse:
                raise ScoringError(Reason.OVERLOADED, "busy", status_code=503, retry_after_s=0)
            return 10 * self.request


def test_engine_serve_keeps_max_in_flight_calls_and_answers_in_order() -> None:
    from batch.serve_stage import call_all

    handle = Outstanding()
    assert call_all(handle.send, list(range(7)), 3, None) == [10 * n for n in range(7)]
    assert handle.most == 3, "never more than max_in_flight responses outstanding"
    assert sorted(handle.sent) == [0, 1, 2, 2, 3, 4, 5, 6], "the refused call sent again"


def test_engine_serve_raises_a_400_instead_of_retrying_it() -> None:
    from batch.serve_stage import call_all
    from replicas.errors import Reason, ScoringError

    class Refused:
        def result(self) -> None:
            raise ScoringError(Reason.EMPTY_QUERY, "empty", status_code=400)

    with pytest.raises(ScoringError):
        call_all(lambda request: Refused(), [1], 4, None)


def test_the_summary_adds_up_the_stages_counts() -> None:
    from batch.summary import Summary

    totals = {"rows": 5, "items": 8, "error:empty_query": 2, "error:too_many_items": 1}
    totals |= {"computed_tokens": 120, "useful_tokens": 100, "engine_ms": 2500, "retried_503": 3}
    summary = Summary.from_totals(totals, wall_s=4.0).as_dict()
    assert summary["errors"] == {"empty_query": 2, "too_many_items": 1}
    assert (summary["items_per_s"], summary["padding"], summary["engine_s"]) == (2.0, 1.2, 2.5)
    assert summary["retried_503"] == 3
