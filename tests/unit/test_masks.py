"""Masks built from lengths and segment ids, checked against literal matrices."""

import jax
import jax.numpy as jnp
import numpy as np

from replicas.model import masks
from replicas.model.masks import DELIMITER, PAD, QUERY, lookback

# Jitted whole, as the engine runs them: one compile per call instead of one per operation
# (test time); the block sizes and reaches are static, as there.
segment_mask = jax.jit(masks.segment_mask)
work_segment_mask = jax.jit(masks.work_segment_mask)
bidirectional_mask = jax.jit(masks.bidirectional_mask)
bidirectional_window_mask = jax.jit(masks.bidirectional_window_mask, static_argnames="half")
key_blocks = jax.jit(masks.key_blocks, static_argnames=("block", "back", "fill"))
own_item_mask = jax.jit(masks.own_item_mask, static_argnames=("block", "back"))
neighbor_blocks = jax.jit(masks.neighbor_blocks, static_argnames=("block", "reach", "fill"))
segment_block_mask = jax.jit(masks.segment_block_mask, static_argnames=("block", "reach"))
window_block_mask = jax.jit(masks.window_block_mask, static_argnames=("block", "reach", "half"))


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


def test_fused_rows_keep_each_work_to_its_own_query_and_item():
    # work 0: query(2) item1(1) item2(2); work 1: query(1) item1(1); pad
    works = jnp.array([[0, 0, 0, 0, 0, 1, 1, -1]])
    segments = jnp.array([[QUERY, QUERY, 1, 2, 2, QUERY, 1, PAD]])
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],  # item 1 sees its query
            [1, 1, 0, 1, 0, 0, 0, 0],  # item 2 never sees item 1
            [1, 1, 0, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 1, 0, 0],  # work 1's query never sees work 0
            [0, 0, 0, 0, 0, 1, 1, 0],  # work 1's item sees only its own query
            [0, 0, 0, 0, 0, 0, 0, 1],  # padding: only itself
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(np.asarray(work_segment_mask(works, segments))[0], expected)


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


def test_key_blocks_pair_each_block_with_the_blocks_before_it():
    x = jnp.arange(6)[None]  # one row, S' = 6, blocks of 2
    np.testing.assert_array_equal(
        np.asarray(key_blocks(x, 2, 1, fill=-9))[0], [[-9, -9, 0, 1], [0, 1, 2, 3], [2, 3, 4, 5]]
    )
    np.testing.assert_array_equal(
        np.asarray(key_blocks(x, 2, 2, fill=-9))[0],
        [[-9, -9, -9, -9, 0, 1], [-9, -9, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]],
    )
    np.testing.assert_array_equal(np.asarray(key_blocks(x, 6, 0))[0], [[0, 1, 2, 3, 4, 5]])


def test_lookback_reaches_the_start_of_the_longest_item_and_no_further():
    assert lookback(window=4, block=4, blocks=3) == 1  # the block before, as a window of 4
    assert lookback(window=512, block=128, blocks=16) == 4  # 511 keys back: four blocks
    assert lookback(window=513, block=128, blocks=16) == 4
    assert lookback(window=514, block=128, blocks=16) == 5
    assert lookback(window=512, block=128, blocks=2) == 1  # only one block before the last
    assert lookback(window=1, block=1, blocks=8) == 0  # one-token items read themselves


def test_own_item_mask_is_causal_within_each_item_across_block_edges():
    # stream: item0(3) item1(2) pad, in blocks of W = 3: [0 0 0] [1 1 -1]
    mask = np.asarray(own_item_mask(jnp.array([[0, 0, 0, 1, 1, -1]]), 3, 1))[0]  # [2, 3, 6]
    first_block = [  # keys: 3 fill slots, then stream 0..2
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]
    second_block = [  # keys: stream 0..2 (item 0), then stream 3..5
        [0, 0, 0, 1, 0, 0],  # item 1's first token: itself only, never item 0
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0],  # padding reads nothing (the prefix keeps its softmax finite)
    ]
    np.testing.assert_array_equal(mask, np.array([first_block, second_block], dtype=bool))


def test_own_item_mask_reaches_into_the_previous_block_for_a_straddling_item():
    # item0(1) item1(3) in blocks of W = 2: item 1 spans stream 1..3, across the block edge
    mask = np.asarray(own_item_mask(jnp.array([[0, 1, 1, 1]]), 2, 1))[0]  # [2, 2, 4]
    np.testing.assert_array_equal(mask[1, 0], [0, 1, 1, 0])  # stream 2 reads stream 1 and 2
    np.testing.assert_array_equal(mask[1, 1], [0, 1, 1, 1])  # stream 3 reads 1..3


def test_own_item_mask_of_blocks_smaller_than_the_window_reads_back_as_far_as_an_item_reaches():
    # item0(1) item1(4) pad in blocks of 2 for a window of 4 (lookback 2): item 1 spans stream
    # 1..4, so stream 4 reads two blocks back
    mask = np.asarray(own_item_mask(jnp.array([[0, 1, 1, 1, 1, -1]]), 2, 2))[0]  # [3, 2, 6]
    expected = [
        [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]],  # keys: 4 fill slots, stream 0..1
        [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]],  # keys: 2 fill slots, stream 0..3
        [[0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]],  # keys: stream 0..5; padding reads nothing
    ]
    np.testing.assert_array_equal(mask, np.array(expected, dtype=bool))


def test_encoder_rows_read_their_own_sequence_both_ways_and_never_another():
    # seq0(2) seq1(3) seq2(1) pad: each sequence a full block on the diagonal
    mask = np.asarray(bidirectional_mask(jnp.array([[0, 0, 1, 1, 1, 2, -1]])))[0]
    expected = [
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],  # the first token reads the second too (no causality)
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],  # a one-token sequence reads itself
        [0, 0, 0, 0, 0, 0, 0],  # padding reads nothing, and nobody reads it
    ]
    np.testing.assert_array_equal(mask, np.array(expected, dtype=bool))


def test_neighbor_blocks_pair_each_block_with_the_blocks_on_both_sides():
    x = jnp.arange(6)[None]  # one row, S' = 6, blocks of 2
    np.testing.assert_array_equal(
        np.asarray(neighbor_blocks(x, 2, 1, fill=-9))[0],
        [[-9, -9, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5], [2, 3, 4, 5, -9, -9]],
    )
    np.testing.assert_array_equal(np.asarray(neighbor_blocks(x, 3, 0))[0], [[0, 1, 2], [3, 4, 5]])


def test_segment_block_mask_reads_a_straddling_sequence_forward_and_back():
    # seq0(1) seq1(3) pad(2) in blocks of 2, reach 1: seq 1 spans stream 1..3
    mask = np.asarray(segment_block_mask(jnp.array([[0, 1, 1, 1, -1, -1]]), 2, 1))[0]
    expected = [  # [3 blocks, 2 queries, 6 keys]
        [[0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]],  # keys: 2 fill, stream 0..3
        [[0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0]],  # keys: stream 0..5; 2 reads 3, after it
        [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]],  # stream 4..5, padding: reads nothing
    ]
    np.testing.assert_array_equal(mask, np.array(expected, dtype=bool))


def test_a_local_layer_reads_half_a_window_each_way_inside_its_own_packed_sequence():
    # seq0(5) seq1(2) pad, positions restarting at 0 in each; half window 1 (local_attention 2)
    ids = jnp.array([[0, 0, 0, 0, 0, 1, 1, -1]])
    positions = jnp.array([[0, 1, 2, 3, 4, 0, 1, 0]])
    mask = np.asarray(bidirectional_window_mask(ids, positions, 1))[0]
    expected = [
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 0],  # position 0 of seq1: near seq0's 4 by stream, not read
        [0, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],  # padding reads nothing
    ]
    np.testing.assert_array_equal(mask, np.array(expected, dtype=bool))


def test_window_block_mask_keeps_keys_within_half_a_window_of_each_query():
    # positions of seq0(4) in blocks of 2, reach 1, half window 1; ANDed with the segments'
    positions = jnp.array([[0, 1, 2, 3]])
    near = np.asarray(window_block_mask(positions, 2, 1, 1))[0]
    expected = [  # [2 blocks, 2 queries, 6 keys]; the fill (position 0) is near position 0
        [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]],  # keys: fill fill 0 1 2 3
        [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]],  # keys: 0 1 2 3 fill fill
    ]
    np.testing.assert_array_equal(near, np.array(expected, dtype=bool))
    segments = np.asarray(segment_block_mask(jnp.array([[0, 0, 0, 0]]), 2, 1))[0]
    both = (near & segments).astype(int)  # the segments drop the fill
    assert both[0, 1].tolist() == [0, 0, 1, 1, 1, 0] and both[1, 1].tolist() == [0, 0, 1, 1, 0, 0]
