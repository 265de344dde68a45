"""SmoothQuant for ``quantization: int8_smooth`` (docs/quantization.md): per input channel j of
each projection, ``s_j = max|X_j|^ALPHA / max|W_j|^(1 - ALPHA)`` moves the activations'
outlier channels into the weights (``X / s`` times ``s W`` is ``X W``), folded where it costs
nothing at run time:

- q, k, v: into ``attn_norm``'s weight (their common input is its output);
- o: into v's output channels (attention is linear in v; a key/value head's channels are
  shared by its query heads, so ``s`` is the largest over them), and v's bias;
- gate, up: into ``mlp_norm``'s weight;
- down: into up's output channels (``act(gate) * up`` is linear in up).

``max|X_j|`` comes from the float model run once over ``CALIBRATION_TEXT`` (a text shipped
in the repository) at load: deterministic, no network. The quantized step is then ``int8``'s
exactly (per-output-channel weights, per-token activation scales): item isolation is
``int8``'s. LoRA adapters read the unsmoothed inputs, so they are refused with this form.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replicas.model.causal_lm import CausalLM, CausalSpec

CALIBRATION_TEXT = Path(__file__).parent / "data" / "quant_calibration.txt"
ALPHA = 0.65  # best of 0.5, 0.65, 0.8 on SmolLM2 (docs/quantization.md)
CHUNK = 128  # calibration tokens per row: every row full, so no padding enters a maximum
FLOOR = 1e-5  # a channel never active (or all-zero weights) is not divided by ~0

Layers = dict[str, Any]


def calibration_rows(ids: Sequence[int], chunk: int = CHUNK) -> np.ndarray:
    """The calibration text's token ids cut into full rows ``[rows, chunk]`` (the tail that
    does not fill one is dropped; a text shorter than ``chunk``: one row of all of it)."""
    ids = np.asarray(ids, np.int32)
    if len(ids) < chunk:
        return ids[None]
    return ids[: len(ids) // chunk * chunk].reshape(-1, chunk)


def activation_maxima(model: CausalLM, params: dict[str, Any], tokens: np.ndarray) -> Layers:
    """The float model over ``tokens [B, T]`` (every row full) -> per layer, the largest |x|
    of each input channel of each projection group: ``qkv_in [L, D]``, ``o_in [L, H, Dh]``,
    ``gate_up_in [L, D]``, ``down_in [L, F]`` (float32, numpy)."""
    layer = model.layer
    batch, width = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
    spec = CausalSpec(lengths=jnp.full((batch,), width, jnp.int32))

    def step(h: jax.Array, scanned: tuple[Any, Any]) -> tuple[jax.Array, Any]:
        layer_params, kind = scanned
        (h, _, _), state = layer.apply(
            {"params": layer_params}, h, positions, spec, kind, None, mutable=["intermediates"]
        )
        return h, state["intermediates"]

    @jax.jit
    def run(params: dict[str, Any], tokens: jax.Array) -> Any:
        x = model._embed(params, tokens)
        return jax.lax.scan(step, x, (params["layers"], model.layer_kinds()))[1]

    sown = run(params, jnp.asarray(tokens))
    attn, mlp = sown["attn"], sown["mlp"]
    as_np = lambda v: np.asarray(v[0], np.float32)  # noqa: E731 (sow keeps a tuple)
    return {"qkv_in": as_np(attn["qkv_in"]), "o_in": as_np(attn["o_in"]),
            "gate_up_in": as_np(mlp["gate_up_in"]), "down_in": as_np(mlp["down_in"])}  # fmt: skip


def factors(x_max: np.ndarray, w_max: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """SmoothQuant's ``s = max|X|^alpha / max|W|^(1 - alpha)`` per input channel."""
    x_max, w_max = np.maximum(x_max, FLOOR), np.maximum(w_max, FLOOR)
    return (x_max**alpha / w_max ** (1 - alpha)).astype(np.float32)


def _in_max(*weights: np.ndarray) -> np.ndarray:
    """``[L, in, *out]`` weights -> the largest |w| of each input channel ``[L, in]``."""
    return np.max([np.abs(w).reshape(*w.shape[:2], -1).max(-1) for w in weights], axis=0)


def _divide_norm(norm: dict[str, np.ndarray], s: np.ndarray, offset: bool) -> dict:
    """A norm's weight whose output is divided by ``s``: ``w / s`` (Gemma's ``1 + w``: its
    ``(1 + w) / s - 1``)."""
    w = norm["scale"].astype(np.float32)
    out = (1.0 + w) / s - 1.0 if offset else w / s
    return {**norm, "scale": out.astype(norm["scale"].dtype)}


def smooth_layers(
    layers: Layers, maxima: Layers, num_kv_heads: int, norm_offset: bool = False,
    alpha: float = ALPHA,
) -> Layers:  # fmt: skip
    """Float stacked layers (numpy, leaves ``[L, ...]``) -> the same function with every
    projection's input smoothed (module docstring); the model's outputs are unchanged up to
    float rounding."""
    attn, mlp = dict(layers["attn"]), dict(layers["mlp"])
    out = {**layers, "attn": attn, "mlp": mlp}
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    s = factors(maxima["qkv_in"], _in_max(*(f32(attn[n]) for n in "qkv")), alpha)  # [L, D]
    out["attn_norm"] = _divide_norm(layers["attn_norm"], s, norm_offset)
    for n in "qkv":
        attn[n] = (f32(attn[n]) * s[:, :, None, None]).astype(attn[n].dtype)
    o = f32(attn["o"])  # [L, H, Dh, D]
    lead, heads, head_dim = o.shape[0], o.shape[1], o.shape[2]
    grouped = (lead, num_kv_heads, heads // num_kv_heads, head_dim)
    x_max = maxima["o_in"].reshape(grouped).max(2)  # [L, K, Dh]: shared by a group's heads
    s = factors(x_max, np.abs(o).max(-1).reshape(grouped).max(2), alpha)  # [L, K, Dh]
    attn["v"] = (f32(attn["v"]) / s[:, None]).astype(attn["v"].dtype)  # v [L, D, K, Dh]
    if "v_bias" in attn:
        attn["v_bias"] = (f32(attn["v_bias"]) / s).astype(attn["v_bias"].dtype)
    per_head = np.repeat(s, heads // num_kv_heads, axis=1)  # [L, H, Dh]: head h = k * G + g
    attn["o"] = (o * per_head[..., None]).astype(attn["o"].dtype)
    s = factors(maxima["gate_up_in"], _in_max(f32(mlp["gate"]), f32(mlp["up"])), alpha)
    out["mlp_norm"] = _divide_norm(layers["mlp_norm"], s, norm_offset)
    mlp["gate"] = (f32(mlp["gate"]) * s[:, :, None]).astype(mlp["gate"].dtype)
    up = f32(mlp["up"]) * s[:, :, None]  # [L, D, F]
    s = factors(maxima["down_in"], _in_max(f32(mlp["down"])), alpha)  # [L, F]
    mlp["up"] = (up / s[:, None, :]).astype(mlp["up"].dtype)
    mlp["down"] = (f32(mlp["down"]) * s[:, :, None]).astype(mlp["down"].dtype)
    return out
