"""loadtest.rerank_quality's figures on literal rankings (hand-computed)."""

import math

import pytest

from loadtest.rerank_quality import Judged, chance, ndcg, quality, relevance_set

ONE = Judged("q", ("a", "b", "c", "d"), (0, 2, 0, 1))


def test_a_perfect_order_scores_one_and_a_reversed_one_scores_zero_pairs() -> None:
    assert quality([ONE], [[0.1, 0.9, 0.2, 0.5]]) == {
        "queries": 1, "top1": 1.0, "pairwise": 1.0, "ndcg4": 1.0,
    }  # fmt: skip
    worst = quality([ONE], [[0.9, 0.1, 0.8, 0.5]])
    assert worst["top1"] == 0.0 and worst["pairwise"] == 0.0


def test_ndcg_and_ties() -> None:
    # the order b, a, d, c: gains 3, 0, 1, 0 against the ideal 3, 1, 0, 0
    want = (3 + 1 / math.log2(4)) / (3 + 1 / math.log2(3))
    assert ndcg(ONE.grades, [0.5, 0.9, 0.1, 0.2]) == pytest.approx(want)
    tied = quality([ONE], [[0.5, 0.5, 0.5, 0.5]])  # ties count half, the first index first
    assert tied["pairwise"] == 0.5 and tied["top1"] == 0.0


def test_chance_is_the_expectation_over_every_order() -> None:
    figures = chance([ONE])
    assert figures["top1"] == pytest.approx(0.25) and figures["pairwise"] == pytest.approx(0.5)
    assert 0.5 < figures["ndcg4"] < 0.75


def test_the_relevance_set_has_thirty_graded_queries_with_one_answer_each() -> None:
    judged = relevance_set()
    assert len(judged) >= 30 and len({j.query for j in judged}) == len(judged)
    for item in judged:
        assert len(item.documents) == len(item.grades) == 4 and item.grades.count(2) == 1
