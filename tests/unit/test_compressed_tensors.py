"""The compressed-tensors parser (replicas/checkpoints/compressed_tensors.py): which
``quantization_config`` runs in which form, and every refusal naming what it found. The
checkpoints themselves, loaded: tests/engine/test_quantized_checkpoints.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from replicas.checkpoints.compressed_tensors import check_stored, checkpoint_form, served_form
from replicas.checkpoints.name_map import CheckpointError
from replicas.model.config import ModelConfig
from replicas.model.quant import QUANTIZED
from replicas.settings import SettingsError
from tests.support.compressed_tensors import PROJECTIONS, compressed_config

GROUP = "group_0"


def _config(kind: str = "int", **changes: object) -> dict:
    """A W8A8 config with ``changes``: ``format`` a top-level key, ``"group.x"`` the config
    group's, ``"weights.strategy"`` a key of its weights'."""
    config = copy.deepcopy(compressed_config(kind))
    group = config["config_groups"][GROUP]
    for key, value in changes.items():
        where, _, leaf = key.rpartition(".")
        node = {"": config, "group": group}.get(where) or group[where]
        node[leaf] = value
    return {"quantization_config": config}


def test_w8a8_int_and_float_run_as_int8_and_fp8() -> None:
    assert set(PROJECTIONS) == set(QUANTIZED)
    assert checkpoint_form({"model_type": "llama"}) is None
    assert checkpoint_form(_config("int")) == "int8"
    assert checkpoint_form(_config("float")) == "fp8"
    assert checkpoint_form(_config("int", format="naive-quantized")) == "int8"


REFUSED = {
    "gptq": ({"quantization_config": {"quant_method": "gptq", "bits": 4}},
             r"quant_method: 'gptq' is not read"),
    "int4 pack": (_config(format="pack-quantized"), r"format: 'pack-quantized' is not read"),
    "group": (_config(**{"weights.strategy": "group", "weights.group_size": 128}),
              r"group_0\.weights\.strategy: 'group' is not run"),
    "tensor": (_config(**{"weights.strategy": "tensor"}),
               r"group_0\.weights\.strategy: 'tensor'"),
    "int4 weights": (_config(**{"weights.num_bits": 4}), r"weights\.num_bits: 4"),
    "asymmetric": (_config(**{"weights.symmetric": False}), r"weights\.symmetric: False"),
    "static inputs": (_config(**{"input_activations.dynamic": False}),
                      r"input_activations\.dynamic: False"),
    "weights only": (_config(**{"group.input_activations": None}), r"input_activations: null"),
    "mixed types": (_config(**{"input_activations.type": "float"}), r"weights of type 'int'"),
    "kv cache": (_config(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_run_is_refused_naming_it(case: str) -> None:
    config, message = REFUSED[case]
    with pytest.raises(CheckpointError, match=message):
        checkpoint_form(config)


def test_the_checkpoint_decides_the_form_and_a_conflicting_setting_is_named() -> None:
    assert served_form("none", "int8") == "int8"
    assert served_form("int8", "int8") == "int8"
    assert served_form("int8_weight", None) == "int8_weight"
    with pytest.raises(SettingsError, match=r"^quantization: int8 conflicts .* already fp8"):
        served_form("int8", "fp8")


class _Stored:
    """Tensors by name with safetensors dtype names (``StoredTensors``)."""

    def __init__(self, arrays: dict[str, tuple[np.ndarray, str]]) -> None:
        self._arrays = arrays

    def names(self) -> set[str]:
        return set(self._arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._arrays[name][0].shape

    def kind(self, name: str) -> str:
        return self._arrays[name][1]

    def read(self, name: str) -> np.ndarray:
        return self._arrays[name][0]


CONFIG = ModelConfig(
    family="llama", vocab_size=32, hidden_size=8, intermediate_size=16, num_layers=1,
    num_heads=2, num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6, rope_theta=10000.0,
    tie_word_embeddings=True,
)  # fmt: skip
OUT = {"q_proj": 8, "k_proj": 4, "v_proj": 4, "o_proj": 8, "gate_proj": 16, "up_proj": 16,
       "down_proj": 8}  # fmt: skip


def _stored() -> dict[str, tuple[np.ndarray, str]]:
    arrays = {}
    for module, _, _ in PROJECTIONS.values():
        name = f"model.layers.0.{module}.weight"
        out = OUT[module.rpartition(".")[2]]
        arrays[name] = (np.zeros((out, 8), np.int8), "I8")
        arrays[name + "_scale"] = (np.ones((out, 1), np.float32), "F32")
    return arrays


def test_stored_tensors_are_checked_before_loading() -> None:
    down = "model.layers.0.mlp.down_proj.weight"
    check_stored(_Stored(_stored()), CONFIG, "int8")
    cases = {
        "fp8 said, int8 stored": ({}, "fp8", r"q_proj\.weight: stored as I8; a fp8 checkpoint"),
        "tensor-wise scale": ({down + "_scale": (np.ones(1, np.float32), "F32")}, "int8",
                              rf"{down}_scale: shape \(1,\)"),
        "zero point": ({down + "_zero_point": (np.full((8, 1), 3, np.int8), "I8")}, "int8",
                       rf"{down}_zero_point: not zero"),
        "lm head": ({"lm_head.weight_scale": (np.ones((32, 1), np.float32), "F32")}, "int8",
                    r"lm_head\.weight is quantized"),
    }  # fmt: skip
    for case, (change, form, message) in cases.items():
        with pytest.raises(CheckpointError, match=message):
            check_stored(_Stored({**_stored(), **change}), CONFIG, form)
        assert case
    zeros = {down + "_zero_point": (np.zeros((8, 1), np.int8), "I8")}
    check_stored(_Stored({**_stored(), **zeros}), CONFIG, "int8")  # symmetric's zeros: fine
