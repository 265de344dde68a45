"""The quantized projection (replicas/model/quant.py) against its numpy oracle, and the rules
its scales keep: per output channel for weights, per token for activations."""

from __future__ import annotations

import numpy as np
import pytest

from replicas.model.quant import (
    QUANTIZED,
    check_backend,
    quantize,
    quantize_layers,
    quantized_project,
    reference_project,
)
from replicas.settings import ReplicaSettings, SettingsError

RNG = np.random.default_rng(0)


def _case(n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """x [2, 5, *in] with rows of very different magnitudes; w [*in, *out]."""
    shape_in = (64,) if n_in == 1 else (2, 64)  # int8_weight: two blocks along the last
    shape_out = (3, 8) if n_in == 1 else (16,)
    x = RNG.normal(size=(2, 5, *shape_in)).astype(np.float32)
    x *= np.logspace(-3, 2, 5, dtype=np.float32)[None, :, *([None] * n_in)]
    x[0, 1] = 0.0  # an all-zero token (a padding row): scale 1, output 0
    w = (0.05 * RNG.normal(size=(*shape_in, *shape_out))).astype(np.float32)
    return x, w


@pytest.mark.parametrize("n_in", [1, 2])
@pytest.mark.parametrize("quantization", ["int8", "int8_smooth", "int8_weight"])
def test_op_matches_dequantize_then_matmul(n_in: int, quantization: str) -> None:
    import jax.numpy as jnp

    x, w = _case(n_in)
    values, scale = quantize(w, n_in, quantization, xp=np)
    got = np.asarray(
        quantized_project(jnp.asarray(x), values, scale, n_in, quantization, jnp.float32)
    )
    want = reference_project(x, values, scale, n_in, quantization)
    # float32 rounding of one rescaled sum (int8: the int32 sum itself is exact)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * np.abs(want).max())
    exact = np.tensordot(x.astype(np.float64), w.astype(np.float64), axes=n_in)
    rel = np.abs(got - exact).max(axis=tuple(range(2, got.ndim)))
    norm = np.abs(exact).max(axis=tuple(range(2, got.ndim))) + 1e-30
    assert (rel / norm).max() < 0.05  # quantized, per token: every row keeps its own scale


@pytest.mark.parametrize("n_in", [1, 2])
@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_the_op_in_two_halves_is_the_op(n_in: int, quantization: str) -> None:
    """``quantize_tokens`` then ``project_tokens`` (how model.token_split runs it, the
    quantized tokens gathered between the halves) is ``quantized_project`` to the bit."""
    import jax.numpy as jnp

    from replicas.model.quant import project_tokens, quantize_tokens

    x, w = _case(n_in)
    values, scale = quantize(w, n_in, quantization, xp=np)
    whole = quantized_project(jnp.asarray(x), values, scale, n_in, quantization, jnp.float32)
    x_q, x_scale = quantize_tokens(jnp.asarray(x), n_in, quantization)
    halves = project_tokens(x_q, x_scale, values, scale, n_in, quantization, jnp.float32)
    np.testing.assert_array_equal(np.asarray(halves), np.asarray(whole))


def test_weight_scales_are_per_output_channel() -> None:
    w = np.array([[1.0, -0.01], [-2.0, 0.02]], np.float32)  # [in 2, out 2]
    values, scale = quantize(w, 1, "int8", xp=np)
    np.testing.assert_allclose(scale, [2.0 / 127, 0.02 / 127], rtol=1e-6)
    assert values.dtype == np.int8 and values[1].tolist() == [-127, 127]  # each column's max
    assert np.all(np.abs(values * scale - w) <= scale / 2 * (1 + 1e-6))


def test_int8_weight_scales_are_per_block_of_the_contracted_axis() -> None:
    w = np.ones((2, 64, 3), np.float32)  # [layers, in, out]
    w[:, 40] = 8.0  # an outlier in the second block only
    values, scale = quantize(w, 1, "int8_weight", lead=1, xp=np)
    assert scale.shape == (2, 2, 3)  # [layers, 64 / 32 blocks, out]
    np.testing.assert_allclose(scale[:, 0], 1 / 127, rtol=1e-6)  # not squeezed by the outlier
    np.testing.assert_allclose(scale[:, 1], 8 / 127, rtol=1e-6)
    assert (values[:, :32] == 127).all()


def test_a_token_does_not_depend_on_its_batch_mates() -> None:
    """Activation scales are per token: changing every other token (here by 1000x, which a
    per-tensor scale would feel) leaves a token's output bit for bit."""
    import jax.numpy as jnp

    x, w = _case(1)
    values, scale = quantize(w, 1, "int8", xp=np)
    other = x.copy()
    other[1] *= 1000.0
    other[0, 2:] = -other[0, 2:]
    run = lambda a: np.asarray(  # noqa: E731
        quantized_project(jnp.asarray(a), values, scale, 1, "int8", jnp.float32)
    )
    np.testing.assert_array_equal(run(x)[0, :2], run(other)[0, :2])


def test_quantize_layers_adds_a_scale_beside_each_weight() -> None:
    layers = {
        "attn": {"q": np.ones((2, 4, 2, 3)), "k": np.ones((2, 4, 1, 3)),
                 "v": np.ones((2, 4, 1, 3)), "o": np.ones((2, 2, 3, 4))},
        "mlp": {"gate": np.ones((2, 4, 6)), "up": np.ones((2, 4, 6)), "down": np.ones((2, 6, 4))},
        "attn_norm": {"scale": np.ones((2, 4))},
    }  # fmt: skip
    out = quantize_layers(layers, "int8", xp=np)
    for (block, name), n_in in QUANTIZED.items():
        assert out[block][name].dtype == np.int8
        assert out[block][name + "_scale"].shape == (2, *layers[block][name].shape[1 + n_in :])
    assert out["attn_norm"] == layers["attn_norm"] and quantize_layers(layers, "none") is layers


def test_setting_loads_flat_and_in_its_section() -> None:
    assert ReplicaSettings().model.quantization == "none"
    assert ReplicaSettings.from_mapping({"quantization": "int8"}).model.quantization == "int8"
    nested = ReplicaSettings.from_mapping({"model": {"quantization": "int8_weight"}})
    assert nested.model.quantization == "int8_weight"
    with pytest.raises(SettingsError, match=r"^quantization: must be one of"):
        ReplicaSettings.from_mapping({"quantization": "int4"})


def test_fp8_is_refused_where_the_backend_has_none() -> None:
    with pytest.raises(SettingsError, match=r"^quantization: fp8 needs"):
        check_backend("fp8", "cpu")
    check_backend("fp8", "gpu", "NVIDIA H100 80GB HBM3")
    check_backend("int8", "cpu")
