"""Masks built from lengths and segment ids, checked against literal matrices."""

import jax.numpy as jnp
import numpy as np

from replicas.masks import (
    DELIMITER,
    PAD,
    QUERY,
    item_positions,
    item_self_mask,
    prefix_visible,
    segment_mask,
)


def test_packed_reference_mask_is_shared_prefix_plus_block_diagonal_without_delimiters():
    # query(2) <d> item1(2) <d> item2(1) <d> pad
    segments = jnp.array([[QUERY, QUERY, DELIMITER, 1, 1, DELIMITER, 2, DELIMITER, PAD]])
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],  # delimiter: query + itself, read by nobody
            [1, 1, 0, 1, 0, 0, 0, 0, 0],  # item 1 sees the query, never a delimiter
            [1, 1, 0, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 1, 0, 0],  # item 2 never sees item 1
            [1, 1, 0, 0, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 0, 0, 0, 1],  # padding: only itself
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(np.asarray(segment_mask(segments))[0], expected)


def test_single_item_rows_are_causal_with_padding():
    segments = jnp.array([[QUERY, QUERY, QUERY, PAD], [QUERY, PAD, PAD, PAD]])
    expected = np.array(
        [
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]],
            [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(np.asarray(segment_mask(segments)), expected)


def test_item_self_mask_is_causal_per_item_and_keeps_padding_rows_finite():
    mask = np.asarray(item_self_mask(jnp.array([[2, 0]]), 3))
    np.testing.assert_array_equal(mask[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(mask[0, 1], np.eye(3, dtype=bool))


def test_prefix_visibility_and_item_positions_continue_from_the_query():
    np.testing.assert_array_equal(
        np.asarray(prefix_visible(jnp.array([2, 3]), 4)), [[1, 1, 0, 0], [1, 1, 1, 0]]
    )
    positions = np.asarray(item_positions(jnp.array([5, 2]), 2, 3))
    np.testing.assert_array_equal(positions[0], [[5, 6, 7], [5, 6, 7]])
    np.testing.assert_array_equal(positions[1], [[2, 3, 4], [2, 3, 4]])
