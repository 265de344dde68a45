"""The encoder's blocked bidirectional attention equals dense attention under the literal
rule (``masks.bidirectional_mask``) for every window its sequences fit in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replicas.model.encoder import attend_segments
from replicas.model.layers import attend_dense
from replicas.model.masks import bidirectional_mask

# Jitted whole, as the encoder runs them: one compile each instead of one per operation
# (test time; the window is static, as there).
BLOCKED = jax.jit(attend_segments, static_argnames="window")
DENSE = jax.jit(lambda q, k, v, item_ids: attend_dense(q, k, v, bidirectional_mask(item_ids)))


def _stream(lengths: list[int], width: int) -> np.ndarray:
    ids = np.full(width, -1, np.int32)
    start = 0
    for n, length in enumerate(lengths):
        ids[start : start + length] = n
        start += length
    return ids


@pytest.mark.parametrize("window", [5, 40])  # blocks reading both sides; one block
def test_blocked_segments_equal_dense_attention_under_the_literal_mask(window: int) -> None:
    rows = np.stack([_stream([5, 1, 3, 5, 2], 37), _stream([4, 4, 4, 4, 4, 4, 4], 37)])
    item_ids = jnp.asarray(rows)  # [2, 37], -1 padding at the end
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 37, 2, 8)).astype(np.float32)) for _ in range(3))
    got = BLOCKED(q, k, v, item_ids, window)
    want = DENSE(q, k, v, item_ids)
    real = rows >= 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-6, rtol=0)
    assert np.isfinite(np.asarray(got)).all()
