"""Checkpoints that are already quantized, loaded as they are (docs/quantization.md): a GGUF's
Q8_0 blocks as ``int8_weight`` (the ``gguf`` package's own dequantization as the reference),
and compressed-tensors int8/fp8 W8A8 checkpoints written here by hand in llm-compressor's
format (its refusals of what cannot run: tests/unit/test_compressed_tensors.py)."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import SafetensorsFiles, assemble_params, load_model
from replicas.checkpoints.name_map import CheckpointError, to_our_layout
from replicas.checkpoints.sources import load_hf_config, resolve_model_source
from replicas.model.config import config_from_hf
from replicas.model.quant import QUANTIZED, dequantize
from replicas.settings import SettingsError
from tests.engine.test_quantized import TO_FLOAT32
from tests.support.compressed_tensors import PROJECTIONS, compressed_config, write_compressed
from tests.support.fp32 import assert_fp32_close
from tests.support.model_helpers import (
    batch,
    hf_logprobs,
    max_valid_diff,
    our_logprobs,
    tiny_hf_config,
    write_gguf,
)

LENGTHS = [12, 7, 3]


@pytest.fixture(scope="module")
def mesh():
    return build_mesh((1, 1))


# ----------------------------------------------------------------------------- GGUF Q8_0


def _q8_0_bytes(tensor) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 tensor's raw blocks (fp16 d, then 32 int8): (values [out, in], d [out, in/32])."""
    blocks = np.asarray(tensor.data).reshape(-1, 34)
    out = int(tensor.shape[1])  # ggml order: ne[0] = in, ne[1] = out
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(out, -1)
    return blocks[:, 2:].copy().view(np.int8).reshape(out, -1), d


def _hf_layout(leaf: np.ndarray, n_in: int) -> np.ndarray:
    """One layer's ``[*in, *out]`` leaf as ``[out, in]`` (heads flattened, no permutation)."""
    return leaf.reshape(int(np.prod(leaf.shape[:n_in])), -1).T


def test_gguf_q8_0_blocks_are_kept_as_int8_weight(tiny_checkpoint, tmp_path, mesh) -> None:
    """Every projection's int8 values and block scales are the file's (llama q/k rows
    un-permuted, the o projection's blocks along Dh), so the leaves dequantize to exactly
    what gguf's own dequantize gives; v and o (not permuted) equal the file's bytes; the
    model then equals the float32 model on those dequantized weights at the float32 floor."""
    import gguf

    model_dir = tiny_checkpoint("llama-hd32")
    path = write_gguf(model_dir, tmp_path / "q8.gguf", "Q8_0")
    kept = load_model(path, mesh, quantization="int8_weight")
    plain = load_model(path, mesh)  # none: gguf-dequantized into float32
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for (block, leaf), (_, gguf_name, _) in PROJECTIONS.items():
        n_in = QUANTIZED[(block, leaf)]
        values = np.asarray(kept.params["layers"][block][leaf])
        scale = np.asarray(kept.params["layers"][block][leaf + "_scale"])
        assert values.dtype == np.int8 and scale.dtype == np.float32
        for layer in range(kept.config.num_layers):
            tensor = raw[f"blk.{layer}.{gguf_name}.weight"]
            assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
            want = np.asarray(plain.params["layers"][block][leaf][layer])  # gguf's dequantize
            got = dequantize(values[layer], scale[layer], n_in, np)
            np.testing.assert_array_equal(got, want, err_msg=f"{block}.{leaf} {layer}")
            np.testing.assert_array_equal(scale[layer].astype(np.float16), scale[layer])  # fp16 d
            axis = n_in - 1  # the blocked (last contracted) axis
            size = values.shape[1 + axis] // scale.shape[1 + axis]
            assert size == 32, (size, leaf)
            repeated = np.repeat(scale[layer], size, axis)
            np.testing.assert_array_equal(np.rint(want / repeated), values[layer])
    for block, leaf, gguf_name in (("attn", "v", "attn_v"), ("attn", "o", "attn_output")):
        qs, d = _q8_0_bytes(raw[f"blk.1.{gguf_name}.weight"])  # [out, in], [out, in / 32]
        values = np.asarray(kept.params["layers"][block][leaf][1])  # v [D, K, Dh]; o [H, Dh, D]
        scale = np.asarray(kept.params["layers"][block][leaf + "_scale"][1])
        n_in = QUANTIZED[(block, leaf)]  # contracted axes lead: [*in, *out]
        np.testing.assert_array_equal(_hf_layout(values, n_in), qs)
        np.testing.assert_array_equal(_hf_layout(scale, n_in), d)
    tokens = batch(kept.config.vocab_size, LENGTHS, 12)
    want = our_logprobs(plain, tokens, LENGTHS)
    got = our_logprobs(kept, tokens, LENGTHS)
    for row, n in enumerate(LENGTHS):
        assert_fp32_close(got[row, :n], want[row, :n], what="int8_weight from Q8_0")


def test_gguf_q8_0_blocks_across_heads_are_re_quantized(tiny_checkpoint, tmp_path, mesh, caplog):
    """head_dim 16: a Q8_0 block of the o projection spans two heads, which int8_weight's
    blocks (along Dh, a head's own) cannot hold; that leaf is re-quantized from gguf's
    dequantized values (a warning names it), the others are still kept as they are."""
    path = write_gguf(tiny_checkpoint("llama"), tmp_path / "q8.gguf", "Q8_0")
    kept = load_model(path, mesh, quantization="int8_weight")
    plain = load_model(path, mesh)
    layers, plain_layers = kept.params["layers"], plain.params["layers"]
    assert layers["attn"]["o_scale"].shape == (2, 4, 1, 64)  # [L, H, Dh / 16, D]
    assert "blk.0.attn_output.weight: its blocks do not fit int8_weight's" in caplog.text
    q = dequantize(np.asarray(layers["attn"]["q"][1]), np.asarray(layers["attn"]["q_scale"][1]), 1)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(plain_layers["attn"]["q"][1]))
    o = dequantize(np.asarray(layers["attn"]["o"][1]), np.asarray(layers["attn"]["o_scale"][1]), 2)
    assert not np.array_equal(np.asarray(o), np.asarray(plain_layers["attn"]["o"][1]))


# ----------------------------------------------------------------------------- compressed-tensors


def _assert_leaves_are_the_files(params: dict, stored: dict, layers: int) -> None:
    for (block, leaf), (module, _, layout) in PROJECTIONS.items():
        values = np.asarray(params["layers"][block][leaf])
        scale = np.asarray(params["layers"][block][leaf + "_scale"])
        for layer in range(layers):
            file_values, file_scale = stored[f"model.layers.{layer}.{module}.weight"]
            want = to_our_layout(layout, file_values, values.shape[1:])
            np.testing.assert_array_equal(values[layer], want)
            assert values.dtype == file_values.dtype
            want_scale = file_scale.astype(np.float32).reshape(scale.shape[1:])
            np.testing.assert_array_equal(scale[layer], want_scale)


@pytest.fixture(scope="module")
def initialized(tmp_path_factory) -> Path:
    """A tiny Llama with transformers' own initialization (N(0, 0.02) weights, unit norms):
    the weights test_quantized.py's int8 bound was measured on (the suite's randomized tiny
    models have log-probs spread over several nats, where W8A8 moves them by tenths)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_hf_config("llama"), dtype=torch.float32)
    directory = tmp_path_factory.mktemp("tiny-llama-init")
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def compressed_int8(initialized, tmp_path_factory) -> tuple[Path, Path, dict]:
    return write_compressed(initialized, tmp_path_factory.mktemp("ct-int8"), "int")


def test_compressed_tensors_int8_is_loaded_as_it_is(compressed_int8, mesh) -> None:
    """The checkpoint decides the form (the setting left at none): int8 values and channel
    scales placed as the file has them; its log-probs within int8's bound of transformers on
    the dequantized weights (not equal: the activations are quantized per token)."""
    directory, dense, stored = compressed_int8
    loaded = load_model(directory, mesh)
    assert loaded.config.quantization == "int8"
    _assert_leaves_are_the_files(loaded.params, stored, loaded.config.num_layers)
    tokens = batch(loaded.config.vocab_size, LENGTHS, 12)
    diff = max_valid_diff(
        hf_logprobs(dense, tokens, LENGTHS), our_logprobs(loaded, tokens, LENGTHS), LENGTHS
    )
    print(f"\n[compressed-tensors int8] max abs log-prob diff vs transformers: {diff:.3g}")
    assert 0 < diff <= TO_FLOAT32, diff
    with pytest.raises(SettingsError, match=r"^quantization: int8_weight conflicts .* int8"):
        load_model(directory, mesh, quantization="int8_weight")


def test_compressed_tensors_fp8_leaves_and_its_cpu_refusal(tiny_checkpoint, tmp_path, mesh):
    """fp8 (e4m3 values, bf16 scales in the file) is placed as it is; this CPU cannot run
    it, so loading it stops at start-up with fp8's message."""
    directory, _, stored = write_compressed(tiny_checkpoint("llama"), tmp_path, "float")
    with pytest.raises(SettingsError, match=r"^quantization: fp8 needs fp8 matmuls"):
        load_model(directory, mesh)
    config = config_from_hf(load_hf_config(resolve_model_source(directory)))
    with contextlib.ExitStack() as stack:
        files = SafetensorsFiles(directory, stack)
        fp8 = config.replace(quantization="fp8")
        params, _ = assemble_params(files, fp8, mesh, np.dtype(np.float32))
    _assert_leaves_are_the_files(params, stored, config.num_layers)


def test_compressed_tensors_tensor_refusals(compressed_int8, tmp_path, mesh) -> None:
    """What the files hold beyond the config: an ignored projection, an asymmetric zero
    point, a quantized LM head; each named at start-up."""
    from safetensors.numpy import load_file, save_file

    directory, _, _ = compressed_int8
    tensors = load_file(str(directory / "model.safetensors"))
    down = "model.layers.1.mlp.down_proj.weight"
    cases = {
        "ignored": ({down: tensors[down].astype(np.float32)}, (down + "_scale",),
                    rf"{down}: no {down}_scale"),
        "zero point": ({down + "_zero_point": np.ones((64, 1), np.int8)}, (),
                       rf"{down}_zero_point: not zero"),
        "lm head": ({"lm_head.weight": np.ones((256, 64), np.int8),
                     "lm_head.weight_scale": np.ones((256, 1), np.float32)}, (),
                    r"lm_head\.weight is quantized"),
    }  # fmt: skip
    for case, (add, drop, message) in cases.items():
        target = tmp_path / case.replace(" ", "-")
        shutil.copytree(directory, target)
        changed = {k: v for k, v in {**tensors, **add}.items() if k not in drop}
        save_file(changed, str(target / "model.safetensors"))
        with pytest.raises(CheckpointError, match=message):
            load_model(target, mesh)


def test_a_compressed_tensors_encoder_is_refused(tmp_path, mesh) -> None:
    """Encoders run unquantized: said before any tensor is looked for."""
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(tmp_path)  # fmt: skip
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = compressed_config("int")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"compressed-tensors int8 checkpoint of a bert"):
        load_model(tmp_path, mesh)
