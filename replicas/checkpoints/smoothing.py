"""``quantization: int8_smooth`` at load (replicas.model.smooth): the float checkpoint is
placed, run once over the shipped calibration text to find each projection input's largest
channels, smoothed on the host, quantized as ``int8`` and placed again."""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from replicas.checkpoints.sources import ModelSource, load_tokenizer
from replicas.model.causal_lm import CausalLM, Params
from replicas.model.config import ModelConfig
from replicas.model.params import param_shardings
from replicas.model.quant import quantize_layers
from replicas.model.smooth import (
    CALIBRATION_TEXT,
    activation_maxima,
    calibration_rows,
    smooth_layers,
)
from replicas.settings.common import SettingsError

logger = logging.getLogger(__name__)


def calibration_ids(source: ModelSource) -> list[int]:
    """The shipped calibration text in the model's own tokens (its local tokenizer)."""
    try:
        tokenizer = load_tokenizer(source)
    except (OSError, ValueError) as error:
        raise SettingsError(
            f"quantization: int8_smooth calibrates on {CALIBRATION_TEXT.name} with the model's "
            f"tokenizer, and {source} has none ({error}); use int8 or int8_weight"
        ) from error
    text = CALIBRATION_TEXT.read_text(encoding="utf-8")
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def smoothed_params(
    params: Params, float_model: CausalLM, config: ModelConfig, ids: list[int], mesh: Mesh
) -> Params:
    """Float ``params`` (placed, ``float_model``'s) -> the ``int8_smooth`` tree of
    ``config``: layers smoothed and quantized, everything else as it was."""
    start = time.perf_counter()
    maxima = activation_maxima(float_model, params, calibration_rows(ids))
    host = jax.tree.map(np.asarray, params["layers"])  # [layers, ...] float, on the host
    smoothed = smooth_layers(host, maxima, config.num_kv_heads, config.norm_offset)
    quantized = quantize_layers(smoothed, config.quantization, xp=np)
    shardings = param_shardings(config, mesh)["layers"]
    layers = jax.tree.map(_place, quantized, shardings)
    logger.info("int8_smooth: calibrated and quantized in %.1f s", time.perf_counter() - start)
    return {**params, "layers": layers}


def _place(array: np.ndarray, sharding: Any) -> jax.Array:
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
