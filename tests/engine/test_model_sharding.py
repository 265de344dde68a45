"""Sharded parameters on a (data=2, model=2) mesh of 4 host devices equal one device.

The 4 CPU devices need XLA_FLAGS before jax initializes, so the check runs in a subprocess
(tests/support/sharded_check.py) and this test asserts on its JSON output.
"""

from __future__ import annotations

import pytest

from tests.support.model_helpers import json_lines_on_host_devices

VARIANTS = ["llama", "llama-kv3", "qwen2", "qwen3"]
PALLAS_VARIANTS = ["llama", "llama-kv3"]  # the two head layouts (interpret mode is slow)
INT8_VARIANTS = ["llama", "qwen3"]
# int8 across two paths that round float32 differently: its quantization bound
# (tests/engine/test_quantized.py's TO_FLOAT32, docs/quantization.md "Item isolation").
INT8_BOUND = 0.01


@pytest.fixture(scope="module")
def sharded_results(tiny_checkpoint) -> dict[str, dict]:
    directories = [
        str(tiny_checkpoint(variant))
        + ("+pallas" if variant in PALLAS_VARIANTS else "")
        + ("+int8" if variant in INT8_VARIANTS else "")
        for variant in VARIANTS
    ]
    lines = json_lines_on_host_devices("tests.support.sharded_check", *directories, timeout=300)
    assert len(lines) == len(VARIANTS), lines
    return dict(zip(VARIANTS, lines, strict=True))


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_by_two_mesh_equals_one_device(variant, sharded_results):
    result = sharded_results[variant]
    print(
        f"\n[sharded] {variant}: max abs logprob diff 2x2 mesh vs 1 device = "
        f"{result['max_abs_diff']:.3g}"
    )
    assert result["devices"] == 4
    assert result["q_devices"] == 4
    # The model axis sums each matmul's partials in another order: float32 rounding of these
    # random models' full-vocabulary log-probs (tens of nats), within the float32 floor
    # (tests/support/fp32.py); a sharding mistake is off by orders more.
    assert result["fp32_ratio"] <= 1.0


@pytest.mark.parametrize("variant", PALLAS_VARIANTS)
def test_the_pallas_item_attention_sharded_equals_xla_on_one_device(variant, sharded_results):
    # Interpret mode on CPU: llama's heads split over the model axis in shard_map,
    # llama-kv3's indivisible kv heads run with heads replicated.
    assert sharded_results[variant]["pallas_engine_ratio"] <= 1.0


@pytest.mark.parametrize("variant", INT8_VARIANTS)
def test_int8_on_the_model_axis_stays_within_its_bound_of_one_device(variant, sharded_results):
    # Split by tokens on the model axis (model.token_split): each token quantized on its own
    # chip (the same values and scales), the o and down projections' parts rescaled to the
    # compute dtype before their sum (one int32 sum on one device): float32 rounding, and so
    # int8's bound across paths.
    diff = sharded_results[variant]["int8_engine_diff"]
    print(f"\n[sharded] {variant}: int8 max abs score diff 2x2 mesh vs 1 device = {diff:.3g}")
    assert diff <= INT8_BOUND


def test_int8_keeps_o_whole_on_every_chip_and_down_split(sharded_results):
    # o reads every head of its own tokens (an int8 all-to-all), down sums its parts.
    assert sharded_results["llama"]["int8_o"] == [None, None, None, None]
    assert sharded_results["llama"]["int8_down"] == [None, "model", None]


def test_a_row_parallel_int8_projection_reduce_scatters_the_compute_dtype(sharded_results):
    found = sharded_results["llama"]["row_parallel_all_reduces"]
    assert "s32 all-reduce" in found["one sum"]  # int32 partial sums cross the model axis
    assert found["split"] == ["f32 reduce-scatter"]  # rescaled first: float32 here, bf16 on TPU


def test_heads_split_over_model_axis(sharded_results):
    llama = sharded_results["llama"]  # 4 heads, 2 kv heads, vocab 256, mlp 128
    assert llama["q"] == [None, None, "model", None]
    assert llama["k"] == [None, None, "model", None]
    assert llama["o"] == [None, "model", None, None]
    assert llama["gate"] == [None, None, "model"]
    assert llama["embed"] == ["model", None]
    assert llama["q_shard_shape"] == [2, 64, 2, 16]  # [layers, D, H/2, Dh]


def test_indivisible_kv_heads_fall_back_to_replication(sharded_results):
    kv3 = sharded_results["llama-kv3"]  # 6 heads split in 2; 3 kv heads cannot be
    assert kv3["k"] == [None, None, None, None]
    assert kv3["q"] == [None, None, "model", None]
    assert kv3["q_shard_shape"] == [2, 48, 3, 8]
