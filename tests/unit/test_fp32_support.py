"""tests/support/fp32.py: the float32 floor every path comparison of the suite asserts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.fp32 import assert_fp32_close, fp32_bound, fp32_ratio


def test_the_bound_is_the_documented_one() -> None:
    # docs/testing.md: 1.27e-4 at a log-prob of -11.2 on SmolLM2's 30 layers.
    (bound,) = fp32_bound(np.array([-11.2]), layers=30)
    assert bound == pytest.approx(1e-5 + 32 * math.sqrt(30) * 2.0**-24 * 11.2)
    assert round(bound, 6) == 1.27e-4


def test_differences_are_read_against_the_bound() -> None:
    want = np.array([-1.0, -11.0])
    assert fp32_ratio(want, want) == 0.0
    assert fp32_ratio(want + fp32_bound(want) / 2, want) == pytest.approx(0.5)
    with pytest.raises(AssertionError, match="float32 floor"):
        assert_fp32_close(want + 2 * fp32_bound(want), want)


def test_infinities_of_one_sign_in_both_are_equal_and_in_one_only_not() -> None:
    assert fp32_ratio([-np.inf, -2.0], [-np.inf, -2.0]) == 0.0
    with pytest.raises(AssertionError, match="non-finite"):
        fp32_ratio([-np.inf, -2.0], [-3.0, -2.0])
    with pytest.raises(AssertionError, match="non-finite"):
        fp32_ratio([np.inf], [-np.inf])


def test_a_nan_is_refused_even_in_both() -> None:
    """The log of a negative logit is NaN on either path: equal NaNs would pass a comparison
    that compared nothing."""
    logged = np.array([-0.36, np.nan])  # np.log of the logits [0.7, -0.3]
    with pytest.raises(AssertionError, match="NaN compared"):
        fp32_ratio(logged, logged.copy())
