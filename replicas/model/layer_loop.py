"""The decoder stack's loop over layers, over stacked or per-layer weights.

A model's layer leaves are stacked on a leading ``layers`` axis as loaded (one array per leaf,
the form sharding rules, adapters, quantization and checkpoints speak). A ``jax.lax.scan``
over that stack compiles the layer once, but XLA:CPU's dot reads no offset into a buffer: each
iteration copies its layer's weights out of the stack first (a ``dynamic-slice`` fusion), so
every step reads and writes the layer weights once more. With the engine setting
``layer_loop: unrolled`` a decoder's engine keeps one array per layer and leaf
(``unstack_layers``) and the loop runs unrolled over them (``loop_layers``): no copy, the same
results bit for bit, each step compiled with every layer's ops (SmolLM2 on 2 CPU cores: fused
steps 1.05-1.39x faster, most in the smallest, warm-up 4.4-5x longer; docs/engine.md "The
layer loop"). ``layer_loop: auto`` keeps the stack and, on a CPU, one array per layer beside it
(``layers_for_loop``: the layer weights twice in memory): steps of at most ``SMALL_STEP_TOKENS``
tokens, where the copies weigh most, run unrolled over the arrays; larger ones scan the stack
(stacking the arrays inside a step costs more than the copies it saves: 0.77-0.79x at 128-256
tokens), so only the small steps' executables compile every layer's ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

Array = jax.Array
Params = dict[str, Any]
PerLayer = tuple  # params["layers"] as one tree per layer (``unstack_layers``)
SMALL_STEP_TOKENS = 64  # ``layer_loop: auto`` unrolls steps of at most this many tokens
UNROLLED = "layers_unrolled"  # params' key of ``auto``'s per-layer copy


def is_per_layer(layers: Any) -> bool:
    """params["layers"] held as one tree per layer (a tuple), not stacked leaves (a dict)."""
    return isinstance(layers, PerLayer)


def loop_layers(
    step: Callable[[Any, Any], tuple[Any, Any]],
    carry: Array,  # [..., D]: the hidden states the layers update
    layers: Any,
    *stacked: Any,
    small: tuple[PerLayer, int] | None = None,
) -> tuple[Any, Any]:
    """``jax.lax.scan(step, carry, (layers, *stacked))``; with per-layer ``layers`` the loop is
    unrolled, layer i reading its own weights and the i-th slice of every ``stacked`` tree
    (each ``[layers, ...]`` or None), and the outputs are stacked as scan stacks them.
    ``small``: (the same layers per layer, a token count): a ``carry`` of at most that many
    tokens (all axes but the last) runs unrolled over them instead."""
    if small is not None and math.prod(carry.shape[:-1]) <= small[1]:
        layers = small[0]
    if not is_per_layer(layers):
        return jax.lax.scan(step, carry, (layers, *stacked))
    outputs = []
    for i, layer in enumerate(layers):
        sliced = jax.tree.map(lambda leaf, i=i: leaf[i], stacked)
        carry, out = step(carry, (layer, *sliced))
        outputs.append(out)
    return carry, jax.tree.map(lambda *leaves: jnp.stack(leaves), *outputs)


def layers_for_loop(params: Params, loop: str, platform: str) -> Params:
    """``params`` as the ``layer_loop`` setting holds them on a mesh of ``platform``:
    ``unrolled``: per layer; ``auto`` on a CPU: stacked, and per layer as ``UNROLLED`` beside
    (an accelerator's dot reads its layer out of the stack in place, so it keeps the stack
    alone); ``scan``: stacked."""
    if loop == "unrolled":
        return unstack_layers(params)
    if loop == "auto" and platform == "cpu":
        return {**params, UNROLLED: unstack_layers(params)["layers"]}
    return params


def small_steps(params: Params) -> tuple[PerLayer, int] | None:
    """``loop_layers``' ``small`` for ``params``: its per-layer copy and the token count up to
    which a step runs unrolled over it; None without one."""
    return (params[UNROLLED], SMALL_STEP_TOKENS) if UNROLLED in params else None


def unstack_layers(params: Params) -> Params:
    """``params`` with its stacked layer leaves ``[layers, ...]`` split into one tree per layer
    (``PerLayer``), each leaf placed as its stack was less the leading axis; one jitted split
    per leaf, so a host group's processes run it together."""
    layers = params["layers"]
    if is_per_layer(layers):
        return params
    count = jax.tree.leaves(layers)[0].shape[0]
    split = jax.tree.map(lambda leaf: _split(leaf, count), layers)  # leaf -> tuple per layer
    per_layer = tuple(
        jax.tree.map(lambda parts, i=i: parts[i], split, is_leaf=lambda x: isinstance(x, tuple))
        for i in range(count)
    )
    return {**params, "layers": per_layer}


def _split(leaf: Any, count: int) -> tuple[Any, ...]:
    """One leaf ``[layers, ...]`` -> ``count`` leaves ``[...]``: arrays placed as the stack
    less its leading axis, abstract ones (a planner's ``ShapeDtypeStruct``) the same."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        layer = jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=_less_layers(leaf))
        return (layer,) * count
    if not isinstance(leaf, jax.Array):  # a host array (numpy)
        return tuple(leaf[i] for i in range(count))
    pieces = jax.jit(lambda a: tuple(a[i] for i in range(count)), out_shardings=_less_layers(leaf))
    return pieces(leaf)


def _less_layers(leaf: Any) -> Any:
    """A stacked leaf's sharding without its leading ``layers`` axis."""
    sharding = leaf.sharding
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*spec[1:]))
