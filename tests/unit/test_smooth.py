"""SmoothQuant's rescaling (replicas/model/smooth.py, ``quantization: int8_smooth``) in numpy:
each fold keeps its projections' products (the float model's function) while moving the
activations' channel maxima into the weights, and the settings refuse it beside LoRA."""

from __future__ import annotations

import numpy as np
import pytest

from replicas.model.smooth import calibration_rows, factors, smooth_layers
from replicas.settings import ReplicaSettings, SettingsError

L, D, H, K, DH, F = 2, 8, 4, 2, 3, 10  # layers, hidden, heads, kv heads, head dim, MLP width
RNG = np.random.default_rng(0)


def _layers(v_bias: bool) -> dict:
    n = lambda *shape: RNG.normal(size=shape).astype(np.float32)  # noqa: E731
    attn = {"q": n(L, D, H, DH), "k": n(L, D, K, DH), "v": n(L, D, K, DH), "o": n(L, H, DH, D)}
    if v_bias:
        attn["v_bias"] = n(L, K, DH)
    return {"attn": attn, "mlp": {"gate": n(L, D, F), "up": n(L, D, F), "down": n(L, F, D)},
            "attn_norm": {"scale": n(L, D)}, "mlp_norm": {"scale": n(L, D)}}  # fmt: skip


def _maxima() -> dict:
    m = lambda *shape: np.exp(3 * RNG.normal(size=shape)).astype(np.float32)  # noqa: E731
    return {"qkv_in": m(L, D), "o_in": m(L, H, DH), "gate_up_in": m(L, D), "down_in": m(L, F)}


def _norm(layers: dict, name: str, i: int, offset: bool) -> np.ndarray:
    w = layers[name]["scale"][i].astype(np.float64)
    return 1.0 + w if offset else w


@pytest.mark.parametrize("offset", [False, True])
def test_every_fold_keeps_the_float_function(offset: bool) -> None:
    layers, maxima = _layers(v_bias=True), _maxima()
    out = smooth_layers(layers, maxima, K, norm_offset=offset)
    x = RNG.normal(size=(5, D))  # normalized tokens, before the norm's weight
    probs = RNG.random(size=(K, 5, 5))  # any attention pattern: its output is linear in v
    silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
    for i in range(L):
        a, b = layers["attn"], out["attn"]
        for name in "qk":  # q, k (and v, checked through o below) read attn_norm's output
            want = np.einsum("td,dhk->thk", x * _norm(layers, "attn_norm", i, offset), a[name][i])
            got = np.einsum("td,dhk->thk", x * _norm(out, "attn_norm", i, offset), b[name][i])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        attn = []
        for tree in (layers, out):  # o reads P (h v + bias), h = attn_norm's output
            h = x * _norm(tree, "attn_norm", i, offset)
            v = h @ tree["attn"]["v"][i].reshape(D, -1) + tree["attn"]["v_bias"][i].reshape(-1)
            att = np.einsum("kts,skd->tkd", probs, v.reshape(5, K, DH))  # [T, K, Dh]
            att = np.repeat(att, H // K, axis=1)  # heads k * G + g share kv head k
            attn.append(np.einsum("thd,hde->te", att, tree["attn"]["o"][i]))
        np.testing.assert_allclose(attn[1], attn[0], rtol=1e-4, atol=1e-4 * np.abs(attn[0]).max())
        mlp = []
        for tree in (layers, out):
            h = x * _norm(tree, "mlp_norm", i, offset)
            m = tree["mlp"]
            mlp.append((silu(h @ m["gate"][i]) * (h @ m["up"][i])) @ m["down"][i])
        np.testing.assert_allclose(mlp[1], mlp[0], rtol=1e-4, atol=1e-4 * np.abs(mlp[0]).max())


def test_inputs_lose_their_outlier_channels() -> None:
    """After smoothing, an input's channel maxima are ``max|X_j| / s_j``: with alpha 0.65 a
    channel 1000x the others ends up ~1000^0.35 ~ 11x (weights alike)."""
    x_max = np.ones((1, 8), np.float32)
    x_max[0, 3] = 1000.0
    s = factors(x_max, np.ones((1, 8), np.float32), alpha=0.65)
    np.testing.assert_allclose(s, x_max**0.65, rtol=1e-6)
    smoothed = x_max / s
    assert 10 < smoothed.max() / smoothed.min() < 12


def test_calibration_rows_are_full() -> None:
    assert calibration_rows(range(300), chunk=128).shape == (2, 128)  # the tail is dropped
    assert calibration_rows(range(5), chunk=128).shape == (1, 5)


def test_int8_smooth_is_refused_beside_lora_slots() -> None:
    assert ReplicaSettings.from_keys(quantization="int8_smooth").model.quantization == "int8_smooth"
    with pytest.raises(SettingsError, match=r"^quantization: int8_smooth .* max_loras > 0"):
        ReplicaSettings.from_keys(quantization="int8_smooth", max_loras=2)
