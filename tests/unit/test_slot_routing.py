"""The LoRA update grouped by slot (model.slot_routing): the route against literal arrays,
and the grouped update against the dense one-hot form for every mix of slots, block size,
data-shard grouping and projection layout (float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replicas.model.lora import GROUPED_FROM_SLOTS, update_form
from replicas.model.slot_routing import (
    MAX_BLOCK,
    MIN_BLOCK,
    block_size,
    dense_delta,
    grouped_delta,
    places,
    route_slots,
)
from tests.support.fp32 import assert_fp32_close

# Jitted whole: one compile per shape instead of one per operation (test time).
GROUPED = jax.jit(grouped_delta, static_argnames=("ins", "outs"))
DENSE = jax.jit(dense_delta, static_argnames=("ins", "outs"))
ROUTE = jax.jit(route_slots, static_argnames=("count", "groups", "block"))


def test_route_of_one_row_against_literal_arrays():
    """Slots [2, 0, 2, 1] over 3 slots in blocks of 2: runs of one block each, slot 0 at
    places 0-1, slot 1 at 2-3, slot 2 at 4-5; 4 marks an empty place; a last block past
    every run reads slot 0."""
    route = ROUTE(jnp.asarray([[2, 0, 2, 1]]), count=3, groups=1, block=2)
    assert places(4, 3, 2) == 8
    np.testing.assert_array_equal(route.source, [[1, 4, 3, 4, 0, 2, 4, 4]])
    np.testing.assert_array_equal(route.place, [[4, 0, 5, 2]])
    np.testing.assert_array_equal(route.block_slot, [[0, 1, 2, 0]])


def test_route_keeps_each_group_to_its_own_rows():
    """Two groups of one row each: a token's place and source index its own group, a slot
    with no tokens takes no place, and a run longer than a block takes two blocks."""
    route = ROUTE(jnp.asarray([[1, 1, 1], [0, 1, 0]]), count=2, groups=2, block=2)
    np.testing.assert_array_equal(route.source, [[0, 1, 2, 3, 3, 3], [0, 2, 1, 3, 3, 3]])
    np.testing.assert_array_equal(route.place, [[0, 1, 2], [0, 2, 1]])
    np.testing.assert_array_equal(route.block_slot, [[1, 1, 0], [0, 1, 0]])


def test_block_sizes_and_places_cover_any_mix():
    assert block_size(16, 9) == MIN_BLOCK
    assert block_size(1 << 20, 2) == MAX_BLOCK
    assert block_size(320, 9) == 32  # sqrt(32 * 320 / 9) = 34, above 320 / 9
    assert block_size(2048, 9) == 256  # 2048 / 9 = 228, above sqrt(32 * 2048 / 9) = 85
    for tokens in (112, 320, 896, 2048):  # below MAX_BLOCK's reach: at most ~2M blocks
        block = block_size(tokens, 9)
        assert places(tokens, 9, block) // block <= 2 * 9 + 2
    # every slot part-filling a block: still fits
    assert places(100, 9, 16) >= 100 + 9 * 15
    assert places(3, 9, 16) == 48  # three tokens, at most three runs


@pytest.mark.parametrize(
    ("rows", "tokens", "slots", "groups", "ins", "in_shape", "outs", "out_shape"),
    [
        (1, 5, 3, 1, "d", (8,), "he", (2, 4)),  # q/k/v: hidden in, heads out
        (4, 37, 9, 2, "he", (2, 4), "d", (8,)),  # o: heads in, two data shards
        (3, 64, 33, 1, "f", (12,), "d", (8,)),  # down: many slots
        (2, 19, 2, 2, "d", (8,), "f", (12,)),  # gate/up: few slots, a group per row
    ],
)
def test_grouped_update_equals_dense(rows, tokens, slots, groups, ins, in_shape, outs, out_shape):
    rng = np.random.default_rng(tokens)
    rank = 3

    def draw(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32))

    x, a, b = (
        draw(rows, tokens, *in_shape),
        draw(slots, *in_shape, rank),
        draw(slots, rank, *out_shape),
    )
    a = a.at[0].set(0.0)  # slot 0: the base model
    for mix in (rng.integers(0, slots, (rows, tokens)), np.zeros((rows, tokens), int)):
        mix = jnp.asarray(mix)
        onehot = jax.nn.one_hot(mix, slots, dtype=jnp.float32)
        want = DENSE(x, a, b, onehot, ins=ins, outs=outs)
        got = GROUPED(x, a, b, ROUTE(mix, count=slots, groups=groups), ins=ins, outs=outs)
        assert got.shape == (rows, tokens, *out_shape)
        assert_fp32_close(np.asarray(got), np.asarray(want), layers=1)


@pytest.mark.parametrize("platform", ["cpu", "tpu", "gpu"])
def test_auto_groups_from_many_slots(platform):
    threshold = GROUPED_FROM_SLOTS[platform]
    assert update_form("auto", threshold - 1, platform) == "dense"
    assert update_form("auto", threshold, platform) == "grouped"


def test_auto_follows_the_backend_and_unknown_platforms_take_the_cpu_threshold():
    assert update_form("auto", GROUPED_FROM_SLOTS["cpu"]) == "grouped"  # the suite runs on cpu
    assert update_form("auto", GROUPED_FROM_SLOTS["cpu"], "rocm") == "grouped"
    assert update_form("auto", GROUPED_FROM_SLOTS["gpu"] - 1, "gpu") == "dense"
    assert update_form("dense", 100) == "dense"
    with pytest.raises(ValueError, match="lora_update"):
        update_form("sparse", 9)
