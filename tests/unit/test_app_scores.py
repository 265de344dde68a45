"""Log-probabilities -> scores: softmax over the labels, or exp (semantics 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from app.scores import to_scores


def test_exp_gives_full_vocabulary_probabilities() -> None:
    logprobs = np.log(np.array([[0.5, 0.25], [0.1, 0.2]], dtype=np.float32))
    assert np.allclose(to_scores(logprobs, apply_softmax=False), [[0.5, 0.25], [0.1, 0.2]])


def test_softmax_normalizes_each_row_over_the_labels_only() -> None:
    logprobs = np.log(np.array([[0.5, 0.25], [0.1, 0.3]], dtype=np.float32))
    scores = to_scores(logprobs, apply_softmax=True)
    assert np.allclose(scores, [[2 / 3, 1 / 3], [0.25, 0.75]])


def test_empty_and_single_label() -> None:
    assert to_scores(np.zeros((0, 3), np.float32), apply_softmax=True) == []
    assert to_scores(np.array([[-7.0]], np.float32), apply_softmax=True) == [[1.0]]
    assert to_scores(np.array([[-7.0]], np.float32), apply_softmax=False) == [[math.exp(-7.0)]]


def test_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match="shape"):
        to_scores(np.zeros(3, np.float32), apply_softmax=False)


finite_logprobs = arrays(
    np.float32,
    st.tuples(st.integers(1, 5), st.integers(1, 6)),
    elements=st.floats(-80, 0, width=32),
)


@given(finite_logprobs)
def test_softmax_rows_sum_to_one_and_keep_order(logprobs: np.ndarray) -> None:
    scores = np.array(to_scores(logprobs, apply_softmax=True))
    assert np.allclose(scores.sum(axis=1), 1.0)
    exp = np.array(to_scores(logprobs, apply_softmax=False))
    # Softmax over the labels is exp renormalized per row, whatever the row's scale.
    assert np.allclose(scores, exp / exp.sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-12)
