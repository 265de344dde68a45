"""Mistral, Gemma 2 and Gemma 3 (text, and a multimodal checkpoint's text tower): equal to
transformers (PyTorch fp32) on sequences longer than their sliding windows, and multi-item
scoring equal to single-item across the window in every layout (semantics 19).

Tiny random checkpoints are saved with transformers (tests/support/model_helpers.py: windows of 4-5
tokens, soft-caps small enough to bite); the engine tests run one model with every option on
at once (windows on some layers, local RoPE base, soft-caps, QK-norm, Gemma norms).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import model_config
from replicas.model.causal_lm import CausalLM
from replicas.model.config import NO_WINDOW
from replicas.model.errors import UnsupportedModelError
from replicas.model.masks import segment_mask, within_window
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close, assert_fp32_close_ragged
from tests.support.model_helpers import batch, hf_logprobs, max_valid_diff, our_logprobs, write_gguf

LENGTHS = [12, 9, 3]  # right-padded to 12; windows are 4 (Gemma) and 5 (Mistral)
TOLERANCE = 1e-4
DELIMITER = 0
SETTINGS = {
    "token_buckets": (16, 32, 64),
    "item_token_buckets": (16, 32, 64),
    "max_multi_item_seq_len": 256,
    "background_compile": False,
}


@pytest.fixture(scope="module")
def mesh():
    return build_mesh((1, 1))


def _without(loaded, **changes):
    """``loaded`` with config fields changed (same weights)."""
    config = loaded.config.replace(**changes)
    return dataclasses.replace(loaded, model=CausalLM(config), config=config)


def test_window_mask_of_a_packed_row_is_the_literal_matrix():
    # query q0 q1 q2, item 1 (positions 3, 4), item 2 (positions 3, 4); window 2.
    import jax.numpy as jnp

    segments = jnp.asarray([[0, 0, 0, 1, 1, 2, 2]])
    positions = jnp.asarray([[0, 1, 2, 3, 4, 3, 4]])
    mask = segment_mask(segments) & within_window(positions, positions, 2)
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [0, 1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 0, 0, 0],  # item 1 token 0 (pos 3): q2 and itself
            [0, 0, 0, 1, 1, 0, 0],  # item 1 token 1 (pos 4): its item only, q2 is out
            [0, 0, 1, 0, 0, 1, 0],  # item 2 token 0: q2 and itself, never item 1
            [0, 0, 0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(np.asarray(mask[0]), expected)


@pytest.mark.parametrize("variant", ["mistral", "gemma2", "gemma3"])
def test_logits_equal_transformers_past_the_window(variant, tiny_checkpoint, mesh):
    model_dir = tiny_checkpoint(variant)
    loaded = load_model(model_dir, mesh)
    assert loaded.config.family == variant and loaded.config.windowed
    tokens = batch(loaded.config.vocab_size, LENGTHS, 12)
    reference = hf_logprobs(model_dir, tokens, LENGTHS)
    diff = max_valid_diff(reference, our_logprobs(loaded, tokens, LENGTHS), LENGTHS)
    print(f"\n[parity] {variant}: max abs logprob diff vs transformers fp32 = {diff:.3g}")
    assert diff <= TOLERANCE
    # The window is what makes it equal: without it the same weights disagree.
    unwindowed = our_logprobs(_without(loaded, sliding_window=None), tokens, LENGTHS)
    assert max_valid_diff(reference, unwindowed, LENGTHS) > 1e-2
    if variant == "gemma2":
        uncapped = _without(loaded, attn_softcap=None, final_softcap=None)
        assert max_valid_diff(reference, our_logprobs(uncapped, tokens, LENGTHS), LENGTHS) > 1e-2


def test_gemma2_gguf_loads_with_its_norms_soft_caps_and_window(tiny_checkpoint, tmp_path, mesh):
    """A GGUF written as llama.cpp's converter writes Gemma 2 (gguf's names, norms stored as
    1 + w, soft-caps and window in the metadata) scores like the safetensors in transformers."""
    model_dir = tiny_checkpoint("gemma2-gguf")
    loaded = load_model(write_gguf(model_dir, tmp_path / "gemma2.gguf"), mesh)
    config = loaded.config
    assert (config.attn_softcap, config.final_softcap, config.sliding_window) == (5.0, 8.0, 4)
    tokens = batch(config.vocab_size, LENGTHS, 12)
    reference = hf_logprobs(model_dir, tokens, LENGTHS)
    diff = max_valid_diff(reference, our_logprobs(loaded, tokens, LENGTHS), LENGTHS)
    print(f"\n[parity] gemma2 GGUF: max abs logprob diff vs transformers fp32 = {diff:.3g}")
    assert diff <= TOLERANCE


def test_gemma3_gguf_loads_with_its_layer_pattern_rope_bases_and_query_scale(
    tiny_checkpoint, tmp_path, mesh
):
    """A Gemma 3 GGUF written as llama.cpp's converter writes it (gguf's names, QK-norms and
    the four block norms stored as 1 + w, the window and the global layers' linear RoPE
    factor in the metadata; layer kinds by Gemma 3's pattern of five windowed layers then a
    global one) scores like the safetensors in transformers."""
    model_dir = tiny_checkpoint("gemma3-gguf")
    loaded = load_model(write_gguf(model_dir, tmp_path / "gemma3.gguf"), mesh)
    config = loaded.config
    assert config.family == "gemma3" and config.qk_norm
    assert config.sliding_layers == (True,) * 5 + (False,) and config.sliding_window == 4
    assert (config.rope_theta, config.rope_linear_factor, config.local_rope_theta) == (
        1e6,
        8.0,
        1e4,
    )
    assert config.query_scale == 16**-0.5 and config.attn_softcap is None
    tokens = batch(config.vocab_size, LENGTHS, 12)
    reference = hf_logprobs(model_dir, tokens, LENGTHS)
    diff = max_valid_diff(reference, our_logprobs(loaded, tokens, LENGTHS), LENGTHS)
    print(f"\n[parity] gemma3 GGUF: max abs logprob diff vs transformers fp32 = {diff:.3g}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize(
    ("name", "kinds"), [("Gemma-2-9B", (True, False, True)), ("Gemma-3-12B", (True,) * 3)]
)
def test_per_layer_cost_configs_keep_the_first_layers_kinds(name, kinds):
    """A 3-layer model of a 42- or 48-layer family with ``layer_types`` (as the planner's
    per-layer cost compiles once built them, and tiny test models do): replacing the layer
    count alone names the mismatch (what ``plan`` printed before ``with_layers``)."""
    config = model_config(name)
    assert len(config.sliding_layers) == config.num_layers
    fewer = config.with_layers(3)
    assert fewer.num_layers == 3 and fewer.sliding_layers == kinds
    window = config.sliding_window
    assert fewer.layer_windows() == tuple(window if k else NO_WINDOW for k in kinds)
    restored = fewer.replace(num_layers=config.num_layers, sliding_layers=config.sliding_layers)
    assert restored == config  # nothing else changed
    with pytest.raises(UnsupportedModelError, match=f"{config.num_layers} entries for 3 layers"):
        config.replace(num_layers=3)


def test_gemma3_config_reads_layer_types_and_both_rope_bases(tiny_checkpoint, mesh):
    config = load_model(tiny_checkpoint("gemma3"), mesh).config
    assert config.sliding_layers == (True, False, True) and config.sliding_window == 4
    assert (config.rope_theta, config.rope_linear_factor, config.local_rope_theta) == (
        1e6,
        8.0,
        1e4,
    )
    assert config.qk_norm and config.norm_offset and config.post_norms and config.embed_scale
    assert config.attn_softcap is None and config.final_softcap is None


def _save_gemma3_multimodal(directory):
    """A tiny Gemma3ForConditionalGeneration (text tower of the gemma3 variant, a one-layer
    SigLIP tower) saved with save_pretrained."""
    import torch
    import transformers

    from tests.support.model_helpers import randomize_, tiny_hf_config

    text = tiny_hf_config("gemma3").to_dict()
    vision = {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
    }  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=255
    )
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32)
    randomize_(model, 3)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def test_gemma3_multimodal_checkpoint_loads_its_text_tower(tmp_path, mesh):
    model_dir = _save_gemma3_multimodal(tmp_path / "gemma3-mm")
    loaded = load_model(model_dir, mesh)
    assert loaded.config.family == "gemma3" and loaded.config.num_layers == 3
    tokens = batch(loaded.config.vocab_size - 1, LENGTHS, 12)  # no image token
    reference = hf_logprobs(model_dir, tokens, LENGTHS)
    diff = max_valid_diff(reference, our_logprobs(loaded, tokens, LENGTHS), LENGTHS)
    print(f"\n[parity] gemma3 text tower: max abs logprob diff = {diff:.3g}")
    assert diff <= TOLERANCE


# ----------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def every_option(tiny_checkpoint, mesh):
    """The tiny Gemma 3 with Gemma 2's soft-caps added: windows on layers 0 and 2, local RoPE
    base, QK-norm, soft-caps, (1 + w) norms before and after each block. The final cap of 2
    keeps log-probs within ~10 nats, so fp32 rounding (~1e-6 relative; the same without
    windows) stays under the 1e-5 bound."""
    loaded = load_model(tiny_checkpoint("gemma3"), mesh)
    loaded = _without(loaded, attn_softcap=5.0, final_softcap=2.0)
    return loaded.model, loaded.params, mesh


def _engine(tiny, **overrides) -> ScoringEngine:
    model, params, mesh = tiny
    return ScoringEngine(
        model, params, mesh, ReplicaSettings.from_keys(**SETTINGS | overrides), "tiny"
    )


@pytest.fixture(scope="module")
def engines(every_option):
    multi = {"multi_item_scoring_delimiter": DELIMITER}
    return {
        "single": _engine(every_option),
        "shared_prefix": _engine(every_option, **multi),
        "packed_reference": _engine(every_option, **multi, layout="packed_reference"),
        "fused": _engine(every_option, **multi, fused_step_tokens=64),
    }


def _work(seed: int, query: int, item_lens: tuple[int, ...]) -> ScoreWork:
    rng = np.random.default_rng(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, 255, n))

    return ScoreWork(ids(query), tuple(ids(n) for n in item_lens), (5, 7, 9))


# Queries longer than the window; items of 0 to 7 tokens (longer ones cross the window, so
# their last tokens see none of the query on the windowed layers).
WORKS = [_work(0, 13, (3, 0, 7, 1)), _work(1, 30, (5,) * 6), _work(2, 2, (6, 2))]


@pytest.mark.parametrize("layout", ["shared_prefix", "packed_reference", "fused"])
def test_multi_item_equals_single_item_across_the_window(engines, layout):
    single = engines["single"].score_batch(WORKS)
    multi = engines[layout].score_batch(WORKS)
    diff = max(float(np.abs(x - y).max(initial=0.0)) for x, y in zip(single, multi, strict=True))
    print(f"\n[windows] {layout} vs single-item: max abs logprob diff = {diff:.2g}")
    assert_fp32_close_ragged(multi, single)


def test_pallas_engine_equals_single_item_across_the_window(engines, every_option):
    """The Pallas item-stream kernels (interpret mode on CPU) inside the engine's sharded
    step: windows per layer, soft-caps and query scale reach them."""
    pallas = _engine(every_option, multi_item_scoring_delimiter=DELIMITER, attention="pallas")
    works = WORKS[:1]
    assert_fp32_close_ragged(pallas.score_batch(works), engines["single"].score_batch(works))


def test_changing_one_item_leaves_the_others_bit_identical(engines):
    engine = engines["shared_prefix"]
    base = _work(4, 13, (3, 6, 2, 7))
    changed = ScoreWork(base.query_ids, ((7, 8, 9), *base.item_ids[1:]), base.label_ids)
    (a,), (b,) = engine.score_batch([base]), engine.score_batch([changed])
    assert not np.array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1:], b[1:])


def test_cached_and_extended_queries_stay_exact(every_option):
    engine = _engine(every_option, multi_item_scoring_delimiter=DELIMITER, background_compile=True)
    cold = _engine(every_option, multi_item_scoring_delimiter=DELIMITER, query_cache_bytes=0)
    system = _work(5, 40, ()).query_ids  # two whole 16-token blocks, then 8 more
    first = ScoreWork((*system, 3, 4, 5), _work(6, 0, (4, 6)).item_ids, (5, 7, 9))
    engine.score_batch([first])
    again = ScoreWork(first.query_ids, _work(7, 0, (2, 7, 5)).item_ids, (5, 7, 9))
    hits = engine.stats().query_cache_hits
    [cached] = engine.score_batch([again])
    assert engine.stats().query_cache_hits == hits + 1
    assert_fp32_close(cached, cold.score_batch([again])[0])
    longer = ScoreWork((*system, 9, 8, 7, 6), again.item_ids, (5, 7, 9))
    engine.score_batch([longer])  # computed whole; the extension step compiles meanwhile
    engine.wait_for_background_compiles()
    extended = ScoreWork((*system, 1, 2, 3, 4), again.item_ids, (5, 7, 9))
    [warm] = engine.score_batch([extended])
    assert [kind for kind, _ in engine.last_signatures] == ["extend", "items"]
    assert engine.stats().reused_prefix_tokens == 32
    # The extension reads the cached keys through the item stream's two merged parts, the
    # cold query runs dense: the same math summed otherwise, equal to fp32 rounding.
    assert_fp32_close(warm, cold.score_batch([extended])[0])


# ----------------------------------------------------------------------------- Pallas


def test_pallas_item_stream_takes_windows_and_soft_caps_like_the_reference():
    """Interpret mode (the TPU kernels' code on CPU) against the XLA reference: items of 1-8
    tokens behind prefixes of 20 and 7 tokens, window 6 (items' late tokens see little or
    none of the prefix), query scale and soft-cap of Gemma."""
    import functools

    import jax
    import jax.numpy as jnp

    from replicas.model.layers import attend_item_stream
    from replicas.model.pallas_attention import item_stream_attention

    rng = np.random.default_rng(0)
    rows, prefix_lengths, s, t = (
        [[1, 3, 8, 5, 1, 7, 8, 2, 6], [8, 8, 1, 1, 4, 7, 2]],
        [20, 7],
        45,
        24,
    )
    item_ids = np.full((2, s), -1, np.int32)
    positions = np.zeros((2, s), np.int32)
    for row, lengths in enumerate(rows):
        cursor = 0
        for item, n in enumerate(lengths):
            item_ids[row, cursor : cursor + n] = item
            positions[row, cursor : cursor + n] = prefix_lengths[row] + np.arange(n)
            cursor += n

    def normal(*shape):
        return jnp.asarray(3.0 * rng.standard_normal(shape), jnp.float32)

    valid = jnp.asarray(np.arange(t)[None] < np.asarray(prefix_lengths)[:, None])
    args = (normal(2, s, 4, 16), normal(2, t, 2, 16), normal(2, t, 2, 16), valid)
    args += (normal(2, s, 2, 16), normal(2, s, 2, 16), jnp.asarray(item_ids))
    options = {"scale": 24**-0.5, "softcap": 5.0, "positions": jnp.asarray(positions)}
    reference = jax.jit(attend_item_stream, static_argnames=("window", "scale", "softcap"))
    kernel = jax.jit(
        functools.partial(item_stream_attention, window=8, interpret=True, block=8),
        static_argnames=("scale", "softcap"),
    )
    real = item_ids >= 0
    windowed = np.asarray(kernel(*args, **options, sliding_window=jnp.int32(6)))[real]
    expected = np.asarray(reference(*args, window=8, **options, sliding_window=jnp.int32(6)))
    np.testing.assert_allclose(windowed, expected[real], rtol=0, atol=1e-5)
    unwindowed = np.asarray(reference(*args, window=8, scale=24**-0.5, softcap=5.0))[real]
    assert np.abs(unwindowed - expected[real]).max() > 1e-2  # the window changed the rows


WINDOWED_COMPILE = """
import jax, jax.numpy as jnp
from jax.experimental import topologies
from replicas.model.pallas_attention import item_stream_attention
topo = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
B, S, T, H, K, Dh = 1, 40, 24, 4, 2, 16
args = [spec((B, S, H, Dh)), spec((B, T, K, Dh)), spec((B, T, K, Dh)), spec((B, T), jnp.bool_),
        spec((B, S, K, Dh)), spec((B, S, K, Dh)), spec((B, S), jnp.int32), spec((B, S), jnp.int32),
        spec((), jnp.int32)]
def fn(*a):
    return item_stream_attention(*a[:7], 8, 0.0625, 50.0, a[7], a[8], interpret=False)
compiled = jax.jit(fn).lower(*args).compile()
assert "tpu_custom_call" in compiled.as_text()
print("compiled", topo.devices[0].device_kind)
"""


def test_windowed_soft_capped_pallas_kernels_compile_for_tpu():
    """Mosaic lowers the kernels with the window arrays and soft-cap (deviceless, v6e)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    libtpu = Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"
    assert libtpu.is_file(), f"{libtpu} is missing: the Makefile installs it"
    env = {
        **os.environ, "JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_LIBRARY_PATH": str(libtpu), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", WINDOWED_COMPILE], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "compiled TPU v" in done.stdout
