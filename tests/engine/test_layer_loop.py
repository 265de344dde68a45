"""``layer_loop: unrolled`` and ``auto`` (replicas.model.layer_loop): one array per layer, the
loop unrolled (``auto``: steps of at most ``SMALL_STEP_TOKENS`` tokens over a per-layer copy
beside the stack, larger ones scanning the stack), every answer bit-identical to the scan's.

The loop itself against ``jax.lax.scan`` on a literal step; then engines of a tiny Llama with
and without it on every path a decoder's layers run: a prefix step and the item stream behind
it (the query cache's second call), fused rows, single-item rows, prompt log-probs, and
adapters mixed in one step (the stacked adapter slots sliced per layer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replicas.contract import PromptWork, ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.layer_loop import (
    SMALL_STEP_TOKENS,
    UNROLLED,
    is_per_layer,
    layers_for_loop,
    loop_layers,
    unstack_layers,
)
from replicas.settings import ReplicaSettings, SettingsError
from tests.engine.test_engine import SMALL, tiny  # noqa: F401 (``tiny``: a fixture here too)
from tests.support.lora_helpers import ALL_TARGETS, lora_settings, save_adapter
from tests.support.model_helpers import save_tiny

DELIMITER = 0


def test_the_unrolled_loop_equals_the_scan_on_a_literal_step() -> None:
    weights = {"w": jnp.arange(3.0 * 2 * 2).reshape(3, 2, 2), "b": jnp.asarray([1.0, -2.0, 0.5])}
    extra = jnp.asarray([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])  # [layers, 2], scanned beside

    def step(x, scanned):
        layer, e = scanned
        y = x @ layer["w"] + layer["b"] + e
        return y, y.sum()

    x0 = jnp.asarray([1.0, 2.0])
    want = jax.lax.scan(step, x0, (weights, extra))
    per_layer = unstack_layers({"layers": weights})["layers"]
    assert is_per_layer(per_layer) and len(per_layer) == 3
    np.testing.assert_array_equal(per_layer[1]["w"], weights["w"][1])
    got = loop_layers(step, x0, per_layer, extra)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    np.testing.assert_array_equal(got[0], [1423.5, 1579.5])  # worked by hand
    assert got[1].shape == (3,)  # outputs stacked as scan stacks them


def test_small_carries_run_unrolled_over_the_per_layer_copy_larger_ones_scan() -> None:
    weights = {
        "w": jnp.arange(3.0 * 2 * 2).reshape(3, 2, 2) / 10,
        "b": jnp.asarray([1.0, -2.0, 0.5]),
    }
    per_layer = unstack_layers({"layers": weights})["layers"]

    def step(x, scanned):
        (layer,) = scanned
        y = x @ layer["w"] + layer["b"]
        return y, y.sum()

    for rows, scans in ((2, 0), (3, 1)):  # 2 tokens of 2 unroll, 3 scan the stack
        x0 = jnp.arange(rows * 2.0).reshape(rows, 2)

        def auto(x, weights=weights, per_layer=per_layer):
            return loop_layers(step, x, weights, small=(per_layer, 2))

        assert str(jax.make_jaxpr(auto)(x0)).count("scan[") == scans
        want = jax.lax.scan(step, x0, (weights,))
        jax.tree.map(np.testing.assert_array_equal, auto(x0), want)


def test_auto_adds_a_per_layer_copy_on_a_cpu_only() -> None:
    params = {"embed": jnp.ones(2), "layers": {"w": jnp.arange(6.0).reshape(3, 2)}}
    auto = layers_for_loop(params, "auto", "cpu")
    assert auto["layers"] is params["layers"] and is_per_layer(auto[UNROLLED])
    np.testing.assert_array_equal(auto[UNROLLED][2]["w"], [4.0, 5.0])
    for platform in ("tpu", "gpu"):
        assert layers_for_loop(params, "auto", platform) is params
    assert is_per_layer(layers_for_loop(params, "unrolled", "tpu")["layers"])
    assert layers_for_loop(params, "scan", "cpu") is params
    assert SMALL_STEP_TOKENS == 64  # the settings' docstring and docs say 64


def _engines(tiny, **keys):  # noqa: F811
    model, params, mesh = tiny
    made = {}
    for loop in ("scan", "unrolled", "auto"):
        settings = ReplicaSettings.from_keys(**{**SMALL, **keys, "layer_loop": loop})
        made[loop] = ScoringEngine(model, params, mesh, settings, "tiny")
    return made


def _works(seed: int) -> list[ScoreWork]:
    rng = np.random.default_rng(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, 300, n))

    return [
        ScoreWork(ids(13), (ids(3), (), ids(7), ids(1)), (5, 7, 9)),
        ScoreWork(ids(40), tuple(ids(5) for _ in range(9)), (3,)),
    ]


@pytest.mark.parametrize(
    "keys",
    [
        {"multi_item_scoring_delimiter": DELIMITER},  # prefix step, then the item stream
        {"multi_item_scoring_delimiter": DELIMITER, "fused_step_tokens": 128},
        {},  # single-item rows
    ],
    ids=["shared_prefix", "fused", "single_item"],
)
def test_unrolled_scores_are_bit_identical_to_the_scan(tiny, keys) -> None:  # noqa: F811
    engines = _engines(tiny, **keys)
    assert is_per_layer(engines["unrolled"].params["layers"])
    assert is_per_layer(engines["auto"].params[UNROLLED])
    assert not is_per_layer(engines["scan"].params["layers"])
    for call in (0, 1):  # the second call's queries come from the query cache
        want = engines["scan"].score_batch(_works(call))
        for loop in ("unrolled", "auto"):
            got = engines[loop].score_batch(_works(call))
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)


def test_unrolled_prompt_log_probs_are_bit_identical_to_the_scan(tiny) -> None:  # noqa: F811
    engines = _engines(tiny)
    work = PromptWork((tuple(range(5, 30)), (*range(5, 12), 90, 91)), top_k=2)
    want = engines["scan"].score_batch([work])[0]
    for loop in ("unrolled", "auto"):
        got = engines[loop].score_batch([work])[0]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.token_logprobs, w.token_logprobs)
            np.testing.assert_array_equal(g.top_ids, w.top_ids)


def test_unrolled_adapters_mixed_in_one_step_are_bit_identical_to_the_scan(tmp_path) -> None:
    base = save_tiny("qwen3", tmp_path / "base")
    adapters = (
        (
            "a",
            str(
                save_adapter(
                    base, tmp_path / "a", seed=1, r=4, lora_alpha=8, target_modules=ALL_TARGETS
                )
            ),
        ),
        (
            "b",
            str(
                save_adapter(
                    base,
                    tmp_path / "b",
                    seed=2,
                    r=2,
                    lora_alpha=4,
                    target_modules=["q_proj", "down_proj"],
                )
            ),
        ),
    )
    rng = np.random.default_rng(7)
    works = [
        ScoreWork(
            tuple(int(t) for t in rng.integers(1, 256, 11)),
            tuple(tuple(int(t) for t in rng.integers(1, 256, n)) for n in (4, 0, 6)),
            (3, 17),
            adapter=name,
        )
        for name in ("a", "b", None)
    ]
    got = {}
    for loop in ("scan", "unrolled"):
        keys = {**lora_settings(max_loras=2, max_lora_rank=4), "layer_loop": loop}
        settings = ReplicaSettings.from_keys(**keys, model=str(base), lora_adapters=adapters)
        got[loop] = ScoringEngine.from_settings(settings, warm=False).score_batch(works)
    for g, w in zip(got["unrolled"], got["scan"], strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_bad_layer_loop_names_the_setting() -> None:
    with pytest.raises(SettingsError, match="layer_loop: must be one of"):
        ReplicaSettings.from_keys(model="tiny", layer_loop="unroll")


@pytest.mark.parametrize("quantization", ["int8", "int8_weight"])
def test_auto_quantized_layers_are_bit_identical_to_the_scan(tmp_path, quantization) -> None:
    base = save_tiny("qwen3", tmp_path / "base")
    rng = np.random.default_rng(3)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, 256, n))

    works = [ScoreWork(ids(query), (ids(3), (), ids(5)), (3, 17)) for query in (9, 70)]
    got = {}
    for loop in ("scan", "auto"):  # a fused step of <= 64 tokens, then one of > 64
        keys = {"quantization": quantization, "layer_loop": loop, "fused_step_tokens": 128}
        settings = ReplicaSettings.from_keys(
            **keys, model=str(base), multi_item_scoring_delimiter=DELIMITER
        )
        engine = ScoringEngine.from_settings(settings, warm=False)
        got[loop] = [engine.score_batch([work])[0] for work in works]  # a step each
        widths = [dims.tokens for _, dims in engine.executables()]
    assert min(widths) <= SMALL_STEP_TOKENS < max(widths)  # both sides of auto's bound
    for g, w in zip(got["auto"], got["scan"], strict=True):
        np.testing.assert_array_equal(g, w)
