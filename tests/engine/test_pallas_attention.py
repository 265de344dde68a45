"""Pallas item-stream attention: interpret mode against the XLA reference and a dense numpy
part, literal one-key cases, and a deviceless Mosaic compile for v6e and v5e."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replicas.model.encoder import attend_segments
from replicas.model.layers import attend_dense, attend_item_stream
from replicas.model.pallas_attention import (
    attention_part,
    item_stream_attention,
    merge_parts,
    segment_attention,
)

reference = jax.jit(attend_item_stream, static_argnames="window")
LIBTPU = Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"


def _normal(rng: np.random.Generator, *shape: int) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def _stream_ids(rows: list[list[int]], length: int) -> jax.Array:
    """Item lengths per row -> [B, S] item ids, contiguous runs, -1 after the last item."""
    ids = np.full((len(rows), length), -1, np.int32)
    for row, lengths in enumerate(rows):
        starts = np.cumsum([0, *lengths])
        for item, (start, stop) in enumerate(itertools.pairwise(starts)):
            ids[row, start:stop] = item
    return jnp.asarray(ids)


def _stream_case(seed: int, rows: list[list[int]], prefix_lengths: list[int], *, s=45, t=24):
    """q, prefix_k, prefix_v, prefix_valid, k, v, item_ids with H=4, K=2 (G=2), Dh=16."""
    rng = np.random.default_rng(seed)
    batch = len(rows)
    valid = np.arange(t)[None, :] < np.asarray(prefix_lengths)[:, None]  # [B, T]
    return (
        _normal(rng, batch, s, 4, 16),
        _normal(rng, batch, t, 2, 16),
        _normal(rng, batch, t, 2, 16),
        jnp.asarray(valid),
        _normal(rng, batch, s, 2, 16),
        _normal(rng, batch, s, 2, 16),
        _stream_ids(rows, s),
    )


def _check_rows(actual: jax.Array, expected: jax.Array, item_ids: jax.Array, atol: float):
    rows = np.asarray(item_ids) >= 0  # [B, S]: padding rows are nobody's business
    actual = np.asarray(actual.astype(jnp.float32))[rows]
    assert not np.isnan(actual).any()
    np.testing.assert_allclose(actual, np.asarray(expected)[rows], rtol=0, atol=atol)


# Items of 1..8 tokens (window 8) crossing 8- and 16-token kv blocks, padding at the end.
ROWS = [[1, 3, 8, 5, 1, 7, 8, 2, 6], [8, 8, 1, 1, 4, 7, 2]]


@pytest.mark.parametrize("block", [8, 16])
def test_item_stream_matches_reference_float32(block: int):
    args = _stream_case(0, ROWS, prefix_lengths=[20, 7])  # S=45: not a multiple of the block
    expected = reference(*args, window=8)
    fn = functools.partial(item_stream_attention, window=8, interpret=True, block=block)
    actual = jax.jit(fn)(*args)
    assert actual.shape == expected.shape and actual.dtype == jnp.float32
    _check_rows(actual, expected, args[-1], atol=1e-5)


def test_empty_prefix_single_item_rows():
    args = _stream_case(1, [[6], [3]], prefix_lengths=[0, 0], s=12, t=8)
    expected = reference(*args, window=8)
    fn = functools.partial(item_stream_attention, window=8, interpret=True, block=8)
    actual = jax.jit(fn)(*args)
    _check_rows(actual, expected, args[-1], atol=1e-5)


def test_bfloat16_inputs_within_bf16_tolerance():
    args = _stream_case(2, ROWS, prefix_lengths=[24, 11])
    expected = reference(*args, window=8)  # float32 reference
    low = [a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a for a in args]
    fn = functools.partial(item_stream_attention, window=8, interpret=True, block=16)
    actual = jax.jit(fn)(*low)
    assert actual.dtype == jnp.bfloat16
    _check_rows(actual, expected, args[-1], atol=2e-2)


def _dense_part(q, k, v, q_seg, kv_seg, *, causal: bool, window: int | None):
    """float64 numpy twin of attention_part: (out [B, S, H, Dh], lse [B, S, H])."""
    q, k, v, q_seg, kv_seg = (np.asarray(x, np.float64) for x in (q, k, v, q_seg, kv_seg))
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)  # [B, T, H, Dh]
    logits = np.einsum("bshd,bthd->bhst", q, k) * q.shape[-1] ** -0.5
    mask = (q_seg[:, :, None] == kv_seg[:, None, :]) & (q_seg[:, :, None] >= 0)  # [B, S, T]
    s, t = np.arange(q.shape[1])[:, None], np.arange(k.shape[1])[None, :]
    if causal:
        mask &= t <= s
        if window is not None:
            mask &= t > s - window
    logits = np.where(mask[:, None], logits, -np.inf)
    lse = np.logaddexp.reduce(logits, axis=-1)  # [B, H, S]
    probs = np.exp(logits - np.where(np.isfinite(lse), lse, 0.0)[..., None])
    return np.einsum("bhst,bthd->bshd", probs, v), lse.transpose(0, 2, 1)


def test_windowed_part_with_segments_longer_than_window_matches_dense():
    rng = np.random.default_rng(3)
    q, k, v = _normal(rng, 1, 37, 4, 16), _normal(rng, 1, 37, 2, 16), _normal(rng, 1, 37, 2, 16)
    seg = jnp.asarray([[0] * 30 + [1] * 4 + [-1] * 3], jnp.int32)  # 30 >> window 12
    out, lse = attention_part(q, k, v, seg, seg, causal=True, window=12, interpret=True, block=8)
    want_out, want_lse = _dense_part(q, k, v, seg, seg, causal=True, window=12)
    rows = np.asarray(seg[0]) >= 0
    np.testing.assert_allclose(np.asarray(out)[0, rows], want_out[0, rows], atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse)[0, rows], want_lse[0, rows], atol=1e-5)
    assert np.all(np.asarray(lse)[0, ~rows] == -np.inf) and np.all(np.asarray(out)[0, ~rows] == 0)


def test_kv_blocks_outside_the_window_and_after_the_diagonal_are_never_read():
    # One 32-token segment, window 8, blocks of 8: query block 2 (tokens 16..23) may only read
    # kv blocks 1 and 2. NaN values in blocks 0 and 3 would poison it if they were visited.
    rng = np.random.default_rng(4)
    q, k, v = _normal(rng, 1, 32, 2, 16), _normal(rng, 1, 32, 1, 16), _normal(rng, 1, 32, 1, 16)
    poisoned = v.at[:, :8].set(jnp.nan).at[:, 24:].set(jnp.nan)
    seg = jnp.zeros((1, 32), jnp.int32)
    out, _ = attention_part(
        q, k, poisoned, seg, seg, causal=True, window=8, interpret=True, block=8
    )
    want, _ = _dense_part(q, k, v, seg, seg, causal=True, window=8)
    np.testing.assert_allclose(np.asarray(out)[0, 16:24], want[0, 16:24], atol=1e-5)


def test_one_visible_key_and_fully_masked_row():
    # Non-causal, T != S. Query 0 sees key 1 only, query 1 sees keys 0 and 2, query 2 nothing.
    q = jnp.asarray([[1.0, 2.0], [0.5, -1.0], [3.0, 3.0]])[None, :, None, :]  # [1, 3, 1, 2]
    k = jnp.asarray([[1.0, 0.0], [2.0, 1.0], [0.0, 4.0], [1.0, 1.0]])[None, :, None, :]
    v = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])[None, :, None, :]
    q_seg = jnp.asarray([[1, 0, -1]], jnp.int32)
    kv_seg = jnp.asarray([[0, 1, 0, -2]], jnp.int32)
    out, lse = attention_part(q, k, v, q_seg, kv_seg, causal=False, window=None, interpret=True)
    scale = 2**-0.5
    logit_00, logit_02 = 0.5 * scale, -4.0 * scale  # query 1 . keys 0 and 2
    p0 = 1 / (1 + np.exp(logit_02 - logit_00))
    lse = np.asarray(lse)[0, :, 0]  # [3]
    assert lse[0] == pytest.approx(4.0 * scale, abs=1e-6)  # the one key's scaled logit
    assert lse[1] == pytest.approx(np.logaddexp(logit_00, logit_02), abs=1e-6)
    assert lse[2] == -np.inf
    np.testing.assert_allclose(np.asarray(out)[0, 0, 0], [3.0, 4.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(out)[0, 1, 0], [5 - 4 * p0, 6 - 4 * p0], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[0, 2, 0], [0.0, 0.0])


def test_merge_parts_is_exact_and_zero_when_every_part_is_empty():
    out_a, out_b = jnp.full((1, 2, 1, 2), 2.0), jnp.full((1, 2, 1, 2), 5.0)
    lse_a = jnp.asarray([[[np.log(1.0)], [-np.inf]]])  # [1, 2, 1]
    lse_b = jnp.asarray([[[np.log(3.0)], [-np.inf]]])
    merged = np.asarray(merge_parts([(out_a, lse_a), (out_b, lse_b)]))
    np.testing.assert_allclose(merged[0, 0, 0], [(2 + 3 * 5) / 4] * 2, atol=1e-6)
    np.testing.assert_array_equal(merged[0, 1, 0], [0.0, 0.0])


def test_segment_attention_is_attend_segments_within_each_sequence():
    """The encoder's kernel: every query sees exactly its own sequence's keys, both ways
    (literal segments: sequences of 10, 17 and 5 tokens then padding; one of 40)."""
    ids = np.array([[0] * 10 + [1] * 17 + [2] * 5 + [-1] * 8, [0] * 40], np.int32)
    q, k, v = (jax.random.normal(jax.random.key(n), (2, 40, 2, 16), jnp.float32) for n in (1, 2, 3))
    got = segment_attention(q, k, v, jnp.asarray(ids), interpret=True, block=16)
    want = attend_segments(q, k, v, jnp.asarray(ids), 40)
    real = ids >= 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=0)
    assert not np.asarray(got)[~real].any()  # padding attends to nothing: zeros


def test_query_only_tokens_read_their_sequence_and_are_read_by_none():
    """A late-interaction query's fill tokens (id -3 - n, ``masks.reader_ids``): through the
    kernel, the blocked and the dense form alike, each reads sequence n's other tokens and
    no token reads it (literal: sequence 0's last 4 tokens query-only)."""
    ids = np.array([[0] * 6 + [-3] * 4 + [1] * 12 + [-1] * 10], np.int32)  # [1, 32]
    q, k, v = (jax.random.normal(jax.random.key(n), (1, 32, 2, 16), jnp.float32) for n in (4, 5, 6))
    readers = ids.copy()
    readers[readers <= -3] = 0
    literal = (readers[0][:, None] == ids[0][None, :]) & (readers[0][:, None] >= 0)  # [32, 32]
    assert literal[:10, :6].all() and not literal[:, 6:10].any()
    want = attend_dense(q, k, v, jnp.asarray(literal)[None])
    real = readers >= 0
    for got in (
        segment_attention(q, k, v, jnp.asarray(ids), interpret=True, block=16),
        attend_segments(q, k, v, jnp.asarray(ids), 16),
        attend_segments(q, k, v, jnp.asarray(ids), 32),
    ):
        np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6)


def test_tpu_blocks_must_be_lane_multiples():
    x = jnp.zeros((1, 8, 1, 16))
    seg = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="multiple of 128"):
        attention_part(x, x, x, seg, seg, causal=True, window=8, interpret=False, block=64)


COMPILE_SCRIPT = """
import jax, jax.numpy as jnp
from jax.experimental import topologies
from replicas.model.pallas_attention import item_stream_attention
topo = topologies.get_topology_desc(platform="tpu", topology_name={topology!r})
sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
B, S, T, H, K, Dh = 1, 40, 24, 4, 2, 16
args = [spec((B, S, H, Dh)), spec((B, T, K, Dh)), spec((B, T, K, Dh)), spec((B, T), jnp.bool_),
        spec((B, S, K, Dh)), spec((B, S, K, Dh)), spec((B, S), jnp.int32)]
fn = lambda *a: item_stream_attention(*a, 8, interpret=False)
compiled = jax.jit(fn).lower(*args).compile()
assert "tpu_custom_call" in compiled.as_text()
print("compiled", topo.devices[0].device_kind, compiled.memory_analysis())
"""


@pytest.mark.parametrize("topology", ["v6e:2x2", "v5e:2x2"])
def test_mosaic_compiles_deviceless(topology: str):
    if not LIBTPU.is_file():
        pytest.fail(
            f"{LIBTPU} is missing: the Makefile installs it with "
            "`pip install --no-deps --target .venv/libtpu libtpu==0.0.42.1`"
        )
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v6e-4",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_LIBRARY_PATH": str(LIBTPU),
        # Compile-only: no chip to guard, and another libtpu user may hold /tmp/libtpu_lockfile.
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    script = COMPILE_SCRIPT.format(topology=topology)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"deviceless compile for {topology} failed:\n{done.stderr[-4000:]}"
    assert "compiled TPU v" in done.stdout
