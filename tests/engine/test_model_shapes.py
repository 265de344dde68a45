"""Production configs without weights, name-map coverage, and padding invariance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from cluster.mesh import build_mesh
from cluster.sharding import partition_spec
from replicas.checkpoints.loading import load_model
from replicas.checkpoints.name_map import tensor_mappings
from replicas.model.catalog import model_config
from replicas.model.causal_lm import CausalLM
from replicas.model.config import config_from_hf
from replicas.model.params import param_logical_axes, param_shapes, param_shardings
from tests.support.fp32 import assert_fp32_close
from tests.support.model_helpers import TINY_VARIANTS, batch, our_logprobs, tiny_hf_config

PRODUCTION = ("Qwen3-0.6B", "Llama-3.2-1B")


@pytest.mark.parametrize("name", sorted(PRODUCTION))
def test_production_config_shapes_without_weights(name):
    config = model_config(name)
    abstract = jax.eval_shape(CausalLM(config).init_params, jax.random.key(0))
    shapes = jax.tree.map(lambda leaf: tuple(leaf.shape), abstract)
    assert shapes == param_shapes(config)
    assert {leaf.dtype for leaf in jax.tree.leaves(abstract)} == {jnp.dtype(jnp.float32)}
    shardings = param_shardings(config, build_mesh((1, 1)))
    assert jax.tree.structure(shardings) == jax.tree.structure(abstract)


def test_production_configs_parsed():
    qwen, llama = model_config("Qwen3-0.6B"), model_config("Llama-3.2-1B")
    assert (qwen.family, qwen.head_dim, qwen.qk_norm, qwen.num_groups) == ("qwen3", 128, True, 2)
    assert llama.rope_scaling is not None and llama.rope_scaling.factor == 32.0
    assert llama.rope_theta == 500000.0 and llama.tie_word_embeddings


@pytest.mark.parametrize(
    ("name", "model_axis", "expected_q"),
    [
        ("Qwen3-0.6B", 4, PartitionSpec(None, None, "model", None)),  # 16 heads / 4
        ("Llama-3.2-1B", 8, PartitionSpec(None, None, "model", None)),  # 32 heads / 8
        ("Llama-3.2-1B", 3, PartitionSpec(None, None, None, None)),  # 32 % 3: replicate
    ],
)
def test_production_partition_specs_on_abstract_mesh(name, model_axis, expected_q):
    config = model_config(name)
    mesh = AbstractMesh((2, model_axis), ("data", "model"))
    axes, shapes = param_logical_axes(config), param_shapes(config)
    q = partition_spec(axes["layers"]["attn"]["q"], shapes["layers"]["attn"]["q"], mesh)
    assert q == expected_q
    embed = partition_spec(axes["embed"], shapes["embed"], mesh)
    assert embed == PartitionSpec("model" if config.vocab_size % model_axis == 0 else None, None)


def _leaf_paths(tree, prefix=()):
    if isinstance(tree, tuple):
        return {prefix}
    return set().union(*(_leaf_paths(v, (*prefix, k)) for k, v in tree.items()))


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_name_map_covers_every_leaf_exactly_once(variant):
    config = config_from_hf(tiny_hf_config(variant))
    mappings = tensor_mappings(config)
    paths = [m.path for m in mappings]
    assert len(set(paths)) == len(paths)
    assert set(paths) == _leaf_paths(param_logical_axes(config))
    hf = [n for m in mappings for n, _ in m.names(config.num_layers)]
    gguf = [n for m in mappings for _, n in m.names(config.num_layers)]
    assert len(set(hf)) == len(hf) and len(set(gguf)) == len(gguf)


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_padding_into_a_larger_bucket_changes_nothing(variant, tiny_checkpoint):
    """A sequence's logits do not depend on the bucket it is padded into, up to f32 rounding.

    Not bit-identical on XLA:CPU: dots of different sizes take different kernels (even q.k,
    whose contraction is over head_dim only, differs by an ulp), so logits of magnitude ~10
    move by a few ulps (~6e-6): within the float32 floor (tests/support/fp32.py). A mask or position
    bug moves them by orders of magnitude more.
    """
    loaded = load_model(tiny_checkpoint(variant), build_mesh((1, 1)))
    lengths = [5, 3, 8]
    small = batch(loaded.config.vocab_size, lengths, 8, seed=1)  # bucket 8
    large = np.zeros((3, 32), np.int32)  # bucket 32, same rows
    large[:, :8] = small
    in_small = our_logprobs(loaded, small, lengths, log_softmax=False)
    in_large = our_logprobs(loaded, large, lengths, log_softmax=False)
    by_itself = our_logprobs(loaded, small[:1, :5], [5], log_softmax=False)  # no padding
    pairs = [(in_small[i, :n], in_large[i, :n]) for i, n in enumerate(lengths)]
    pairs.append((in_small[0, :5], by_itself[0]))
    identical = all(np.array_equal(a, b) for a, b in pairs)
    worst = max(float(np.abs(a - b).max()) for a, b in pairs)
    scale = max(float(np.abs(a).max()) for a, _ in pairs)
    print(
        f"\n[padding] {variant}: max abs logit diff {worst:.3g} (max |logit| {scale:.3g}), "
        f"bit-identical: {identical}"
    )
    for got, want in pairs:
        assert_fp32_close(got, want, what=variant)
