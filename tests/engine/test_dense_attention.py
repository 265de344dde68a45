"""Dense rows' attention: the causal spec's mask, and cuDNN's fused kernel against XLA (GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.model.attention import cudnn_dense_attention, with_attention
from replicas.model.causal_lm import AttentionSpec, CausalLM, CausalSpec, masked_attention
from replicas.model.config import ModelConfig, config_from_hf
from replicas.model.layers import QUERY_BLOCK, attend_dense, attend_item_stream
from replicas.model.masks import PAD, QUERY, segment_mask
from replicas.settings import SettingsError
from tests.support.model_helpers import tiny_hf_config

ON_GPU = jax.devices()[0].platform == "gpu"


def test_causal_mask_literal() -> None:
    mask = CausalSpec(jnp.asarray([3, 1])).dense_mask(4)
    expected_first = [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],  # padding reads the real keys and itself
    ]
    expected_second = [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 0, 0, 1],
    ]
    np.testing.assert_array_equal(np.asarray(mask), np.asarray([expected_first, expected_second]))


def test_causal_rows_equal_segment_rows_on_real_tokens() -> None:
    """The single-item layout's old mask (segments: query, then PAD) and the causal spec give
    bit-identical real tokens."""
    lengths = np.asarray([5, 2, 7])
    q, k, v = random_qkv(jax.random.key(0), rows=3, tokens=8, heads=4, kv_heads=2)
    segments = np.where(np.arange(8)[None] < lengths[:, None], QUERY, PAD)
    by_segments = masked_attention(q, k, v, CausalSpec(jnp.asarray(lengths)))
    reference = masked_attention(q, k, v, AttentionSpec(segment_mask(jnp.asarray(segments))))
    for row, length in enumerate(lengths):
        np.testing.assert_array_equal(by_segments[row, :length], reference[row, :length])


def test_auto_keeps_xla_on_cpu_and_cudnn_needs_a_gpu() -> None:
    model = CausalLM(tiny_config(), jnp.bfloat16)
    mesh = build_mesh((1, 1))
    if ON_GPU:
        pytest.skip("checks the CPU choice")
    chosen = with_attention(model, "auto", mesh)
    assert chosen.dense_attention is masked_attention
    assert chosen.stream_attention is attend_item_stream
    with pytest.raises(SettingsError, match="attention: cudnn needs a GPU"):
        with_attention(model, "cudnn", mesh)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN flash attention runs on NVIDIA GPUs only")
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(16, 8, 128), (9, 3, 64)])
def test_cudnn_equals_xla_on_real_tokens(heads: int, kv_heads: int, head_dim: int) -> None:
    lengths = jnp.asarray([310, 17, 1, 256])
    q, k, v = random_qkv(jax.random.key(1), 4, 320, heads, kv_heads, head_dim, jnp.bfloat16)
    fused = jax.jit(cudnn_dense_attention)(q, k, v, CausalSpec(lengths))
    reference = jax.jit(masked_attention)(q, k, v, CausalSpec(lengths))
    chosen = with_attention(CausalLM(tiny_config(), jnp.bfloat16), "auto", build_mesh((1, 1)))
    assert chosen.dense_attention is cudnn_dense_attention
    for row, length in enumerate(np.asarray(lengths)):
        got = np.asarray(fused[row, :length], np.float32)
        want = np.asarray(reference[row, :length], np.float32)
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)


def random_qkv(key, rows, tokens, heads, kv_heads, head_dim=16, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (rows, tokens, heads, head_dim), dtype)
    k = jax.random.normal(kk, (rows, tokens, kv_heads, head_dim), dtype)
    v = jax.random.normal(kv, (rows, tokens, kv_heads, head_dim), dtype)
    return q, k, v


def tiny_config() -> ModelConfig:
    return config_from_hf(tiny_hf_config("llama"))


@pytest.mark.parametrize("sliding", [None, 100])
def test_item_stream_with_a_window_of_many_query_blocks_equals_dense_attention(sliding) -> None:
    """A window of 512 runs query blocks of ``QUERY_BLOCK`` reading four blocks back: items
    of 1..512 tokens across block edges (and a partial last block) read exactly what a dense
    mask built by hand lets them: the valid prefix keys and their own earlier tokens."""
    assert QUERY_BLOCK < 512
    lengths, prefix = [3, 512, 200, 1, 384], 5
    stream = sum(lengths)  # 1100: not a multiple of the block
    item_ids = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])[None]
    offsets = np.concatenate([np.arange(n) for n in lengths])[None]
    valid = np.asarray([[True, False, True, True, False]])
    q, k, v = random_qkv(jax.random.key(2), 1, stream, heads=4, kv_heads=2)
    pk, pv = (x[:, :prefix] for x in random_qkv(jax.random.key(3), 1, prefix, 4, 2)[1:])
    positions = prefix + offsets  # as the engine places items behind a prefix
    window = None if sliding is None else jnp.asarray(sliding)
    got = jax.jit(attend_item_stream, static_argnames="window")(
        q, pk, pv, jnp.asarray(valid), k, v, jnp.asarray(item_ids), window=512,
        positions=jnp.asarray(positions), sliding_window=window,
    )  # fmt: skip
    same_item = (item_ids[0][:, None] == item_ids[0][None]) & (
        np.arange(stream)[:, None] >= np.arange(stream)[None]
    )
    prefix_mask = np.broadcast_to(valid, (stream, prefix))
    if sliding is not None:
        same_item &= positions[0][:, None] - positions[0][None] < sliding
        prefix_mask = prefix_mask & (positions[0][:, None] - np.arange(prefix)[None] < sliding)
    mask = np.concatenate([prefix_mask, same_item], axis=1)[None]  # [1, S, T + S]
    want = attend_dense(q, jnp.concatenate([pk, k], 1), jnp.concatenate([pv, v], 1), mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=1e-5)
