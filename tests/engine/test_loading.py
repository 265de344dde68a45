"""Checkpoint loading against transformers (PyTorch fp32) on tiny random models, and bad input.

The measured max abs log-prob differences are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import CheckpointError, load_model
from replicas.checkpoints.sources import ModelSourceError
from replicas.model.config import UnsupportedModelError
from replicas.model.params import param_shapes
from tests.support.model_helpers import (
    batch,
    copy_gguf,
    hf_logprobs,
    max_valid_diff,
    our_logprobs,
    write_gguf,
)

LENGTHS = [12, 7, 3]  # right-padded to 12
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def mesh():
    return build_mesh((1, 1))


def _parity(model_path: Path, mesh, label: str) -> float:
    """Our logprobs vs transformers on the same file (a directory or a .gguf)."""
    loaded = load_model(model_path, mesh)
    model_dir, hf_kwargs = model_path, {}
    if model_path.suffix == ".gguf":
        model_dir, hf_kwargs = model_path.parent, {"gguf_file": model_path.name}
    tokens = batch(loaded.config.vocab_size, LENGTHS, 12)
    diff = max_valid_diff(
        hf_logprobs(model_dir, tokens, LENGTHS, **hf_kwargs),
        our_logprobs(loaded, tokens, LENGTHS),
        LENGTHS,
    )
    print(f"\n[parity] {label}: max abs logprob diff vs transformers fp32 = {diff:.3g}")
    return diff


@pytest.mark.parametrize("variant", ["llama", "llama3-untied", "qwen2", "qwen3", "llama-kv3"])
def test_safetensors_matches_transformers(variant, tiny_checkpoint, mesh):
    model_dir = tiny_checkpoint(variant)
    assert _parity(model_dir, mesh, f"safetensors {variant}") <= TOLERANCE


def test_loaded_tree_matches_param_shapes_and_config(tiny_checkpoint, mesh):
    loaded = load_model(tiny_checkpoint("qwen2"), mesh)
    shapes = jax.tree.map(lambda a: tuple(a.shape), loaded.params)
    assert shapes == param_shapes(loaded.config)
    assert all(a.dtype == np.float32 for a in jax.tree.leaves(loaded.params))
    assert loaded.config.family == "qwen2" and loaded.config.qkv_bias
    assert loaded.config.num_kv_heads == 2 and not loaded.config.tie_word_embeddings
    assert loaded.model.config == loaded.config


def test_sharded_safetensors_with_index(tmp_path, mesh):
    from tests.support.model_helpers import save_tiny

    model_dir = save_tiny("llama", tmp_path / "sharded", max_shard_size="40KB")
    assert (model_dir / "model.safetensors.index.json").is_file()
    assert len(list(model_dir.glob("*.safetensors"))) > 1
    assert _parity(model_dir, mesh, "sharded safetensors llama") <= TOLERANCE


def test_bfloat16_checkpoint_and_dtype(tmp_path, tiny_checkpoint, mesh):
    import torch
    from transformers import AutoModelForCausalLM

    bf16_dir = tmp_path / "bf16"
    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_checkpoint("qwen3")), dtype=torch.bfloat16
    )
    model.save_pretrained(bf16_dir, safe_serialization=True)
    # fp32 math on bf16-stored weights, both sides
    assert _parity(bf16_dir, mesh, "safetensors qwen3 stored as bf16") <= TOLERANCE
    loaded = load_model(bf16_dir, mesh, dtype="bfloat16")
    assert all(a.dtype == jax.numpy.bfloat16 for a in jax.tree.leaves(loaded.params))
    expected = model.model.layers[1].self_attn.k_norm.weight.detach().float().numpy()
    got = np.asarray(loaded.params["layers"]["attn"]["k_norm"]["scale"][1], np.float32)
    np.testing.assert_array_equal(got, expected)


# ----------------------------------------------------------------------------- GGUF


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_gguf_llama_matches_transformers_on_same_file(qtype, tiny_checkpoint, tmp_path, mesh):
    gguf_path = write_gguf(tiny_checkpoint("llama"), tmp_path / f"tiny-{qtype}.gguf", qtype)
    assert _parity(gguf_path, mesh, f"GGUF {qtype} llama") <= TOLERANCE


def test_gguf_quantization_really_changes_weights(tiny_checkpoint, tmp_path, mesh):
    """Q8_0 is close to the original weights but not equal: the file is really quantized."""
    model_dir = tiny_checkpoint("llama")
    exact = load_model(model_dir, mesh).params["layers"]["mlp"]["down"]
    quant = load_model(write_gguf(model_dir, tmp_path / "q8.gguf", "Q8_0"), mesh)
    error = np.abs(np.asarray(quant.params["layers"]["mlp"]["down"]) - np.asarray(exact)).max()
    assert 0 < error < 0.02


@pytest.mark.parametrize("variant", ["llama", "qwen2", "qwen3"])
def test_gguf_f32_round_trip_is_exact(variant, tiny_checkpoint, tmp_path, mesh):
    """Permuted (llama) or not (Qwen), names from gguf's own map: same params bit for bit."""
    model_dir = tiny_checkpoint(variant)
    from_hf = load_model(model_dir, mesh)
    from_gguf = load_model(write_gguf(model_dir, tmp_path / "f32.gguf", "F32"), mesh)
    assert from_gguf.config.head_dim == from_hf.config.head_dim  # qwen3: 32, not 64/4
    assert from_gguf.config.tie_word_embeddings == from_hf.config.tie_word_embeddings
    equal = jax.tree.map(
        lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
        from_hf.params,
        from_gguf.params,
    )
    assert all(jax.tree.leaves(equal)), equal


def test_gguf_without_unpermute_would_differ(tiny_checkpoint, tmp_path, mesh):
    """Guard: the permutation matters (q rows in the file differ from HF's)."""
    import gguf

    model_dir = tiny_checkpoint("llama")
    path = write_gguf(model_dir, tmp_path / "f32.gguf", "F32")
    raw = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    hf_q = np.asarray(load_model(model_dir, mesh).params["layers"]["attn"]["q"][0])  # [D, H, Dh]
    assert not np.array_equal(np.asarray(raw.data).T.reshape(hf_q.shape), hf_q)


def test_gguf_with_llama3_rope_factors_is_refused(tiny_checkpoint, tmp_path, mesh):
    plain = write_gguf(tiny_checkpoint("llama"), tmp_path / "plain.gguf", "F32")
    extra = {"rope_freqs.weight": np.ones(8, np.float32)}
    path = copy_gguf(plain, tmp_path / "rope.gguf", add=extra)
    with pytest.raises(UnsupportedModelError, match=r"rope_freqs\.weight"):
        load_model(path, mesh)


# ----------------------------------------------------------------------------- bad input


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(model_dir, target)
    return target


def _rewrite(model_dir: Path, edit) -> None:
    from safetensors.numpy import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_path(mesh, tmp_path):
    with pytest.raises(ModelSourceError, match="nope"):
        load_model(tmp_path / "nope", mesh)
    with pytest.raises(ModelSourceError, match=r"missing\.gguf"):
        load_model(str(tmp_path / "missing.gguf"), mesh)


def test_unknown_architecture(tmp_path, mesh):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(tmp_path, mesh)


def test_wrong_tensor_shape(tiny_checkpoint, tmp_path, mesh):
    model_dir = _copy(tiny_checkpoint("llama"), tmp_path)
    name = "model.layers.1.self_attn.k_proj.weight"  # [K*Dh, D] = (32, 64)

    def shrink(tensors):
        tensors[name] = tensors[name][:16]

    _rewrite(model_dir, shrink)
    with pytest.raises(
        CheckpointError, match=rf"{name}: expected shape \(32, 64\), got \(16, 64\)"
    ):
        load_model(model_dir, mesh)


def test_missing_tensor(tiny_checkpoint, tmp_path, mesh):
    model_dir = _copy(tiny_checkpoint("qwen2"), tmp_path)
    name = "model.layers.0.self_attn.v_proj.bias"
    _rewrite(model_dir, lambda tensors: tensors.pop(name))
    with pytest.raises(CheckpointError, match=f"missing tensor {name}"):
        load_model(model_dir, mesh)


def test_untied_config_without_lm_head(tiny_checkpoint, tmp_path, mesh):
    model_dir = _copy(tiny_checkpoint("llama3-untied"), tmp_path)
    _rewrite(model_dir, lambda tensors: tensors.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor lm_head\.weight"):
        load_model(model_dir, mesh)


def test_pickle_only_directory_is_refused(tiny_checkpoint, tmp_path, mesh):
    model_dir = _copy(tiny_checkpoint("llama"), tmp_path)
    (model_dir / "model.safetensors").unlink()
    (model_dir / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*never loaded"):
        load_model(model_dir, mesh)


def test_directory_without_weights(tiny_checkpoint, tmp_path, mesh):
    model_dir = _copy(tiny_checkpoint("llama"), tmp_path)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_model(model_dir, mesh)


def test_bad_dtype(tiny_checkpoint, mesh):
    with pytest.raises(CheckpointError, match="dtype"):
        load_model(tiny_checkpoint("llama"), mesh, dtype="int8")


def test_gguf_missing_tensor(tiny_checkpoint, tmp_path, mesh):
    full = write_gguf(tiny_checkpoint("qwen3"), tmp_path / "full.gguf", "Q8_0")
    path = copy_gguf(full, tmp_path / "cut.gguf", drop=("blk.1.attn_k_norm.weight",))
    with pytest.raises(CheckpointError, match=r"missing tensor blk\.1\.attn_k_norm\.weight"):
        load_model(path, mesh)
