"""LoRA adapter slots beside the weights (semantics 21): the low-rank update of every row
computed batched over slots, so requests of different adapters share one step.

Each targeted projection ``W`` gets stacked ``A [layers, M, *in, r]`` and ``B [layers, M, r,
*out]`` under ``params["lora"]["layers"][target]``, M = adapter slots (slot 0 = no adapter:
zeros), r = the largest rank (a smaller adapter fills its first columns, the rest zeros, which
add exact zeros). The adapter's scaling (``lora_alpha / r``, or ``/ sqrt(r)`` with rslora) is
folded into B when it is loaded. ``M`` and ``r`` are compiled dimensions: loading an adapter
writes arrays and compiles nothing.

Which slot a token reads travels with the token itself: a tagged id ``slot * V + id`` (V the
vocabulary). Every layout packs token ids from the work, so the slot reaches every step
(shared prefix, item stream, fused rows, single-item rows, prompt log-probs, embeddings)
without a new argument, and everything keyed by token ids (the query cache, prefix reuse)
is keyed by adapter too: a cached query of adapter A is never read for adapter B. Padding
(id 0) reads slot 0. The model splits a tagged id into (id, slot) before the embedding.

The update per token is ``(x @ A[slot]) @ B[slot]``, exact for any mix of slots in a row, in
one of two forms (``update_form``). Dense: every slot's ``x @ A[m]``, masked by the token's
one-hot slot, summed through B as two plain matmuls (``M * r * (in + out)`` multiply-adds a
token). Grouped (SGMV): the step's tokens sorted by slot once into blocks of one slot each,
within each data shard (``slot_routing``), each block multiplying only its slot's A and B
(one slot's ``r * (in + out)`` plus the blocks' padding and gathers, whatever M is).

A seq-cls head saved by the adapter (``modules_to_save: [score]``) is a stacked head
``[M, D, L]`` (slot 0: the base head); a work's label ids index its slot's outputs
(``slot * L + label``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from replicas.model.config import ModelConfig
from replicas.model.slot_routing import SlotRoute, dense_delta, grouped_delta, route_slots

Array = jax.Array
Params = dict[str, Any]

# Target -> (Hugging Face module name, its block ("attn" or "mlp"), input and output einsum
# letters of our layout: d hidden, h heads (k kv heads for k/v), e head dim, f MLP width).
TARGETS: dict[str, tuple[str, str, str, str]] = {
    "q": ("q_proj", "attn", "d", "he"),
    "k": ("k_proj", "attn", "d", "he"),
    "v": ("v_proj", "attn", "d", "he"),
    "o": ("o_proj", "attn", "he", "d"),
    "gate": ("gate_proj", "mlp", "d", "f"),
    "up": ("up_proj", "mlp", "d", "f"),
    "down": ("down_proj", "mlp", "f", "d"),
}
# Slots from which "auto" groups tokens by slot (model.slot_routing) instead of running every
# slot's update on every token, by the platform jax runs on (``jax.default_backend()``).
# Measured with loadtest.bench_lora (Qwen3-0.6B's width, rank 16, calls timed in turn):
# - cpu (2-core EPYC, the engine): a tie at 9 slots (0.85x vs 0.84x base), grouped 1.20x dense
#   at 33; fewer slots were not measured and keep the dense form, whose cost shrinks with them;
# - tpu (v6e, projected from compiled executables): grouped 0.94x base vs dense 0.79x at 9;
# - gpu (H200): dense wins at 9 slots (0.76-0.80x base vs grouped 0.67-0.75x) and ties at
#   33 (0.66-0.68x both), so "auto" never groups there (docs/benchmarks.md, "LoRA").
# A platform not listed takes the cpu threshold (docs/serving.md, "LoRA").
GROUPED_FROM_SLOTS = {"cpu": 9, "tpu": 9, "gpu": 10**9}
_IN_AXES = {"d": ("embed",), "he": ("heads", "head_dim"), "f": ("mlp",)}


def _axes(target: str, letters: str) -> tuple[str, ...]:
    """A target's in or out axes, by ``TARGETS``' letters (k and v: the kv heads)."""
    return (
        ("kv_heads", "head_dim") if target in ("k", "v") and letters == "he" else _IN_AXES[letters]
    )


def lora_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """Logical axes of ``params["lora"]``: every target's A ``[layers, M, *in, r]`` and B
    ``[layers, M, r, *out]``, sharded like the base matrix on the model axis (heads,
    kv_heads, mlp), and a linear score head's per-slot copy ``[M, D, L]``."""
    tree: dict[str, Any] = {"layers": {}}
    for target, (_, _, inputs, outputs) in TARGETS.items():
        tree["layers"][target] = {
            "a": ("layers", "lora_slots", *_axes(target, inputs), "lora_rank"),
            "b": ("layers", "lora_slots", "lora_rank", *_axes(target, outputs)),
        }
    if has_head_slots(config):
        tree["head"] = {"score": ("lora_slots", "embed", "labels")}
    return tree


def has_head_slots(config: ModelConfig) -> bool:
    """A linear score head is stacked per slot (an adapter may bring its own)."""
    return config.head is not None and config.head.kind == "linear"


def lora_shapes(config: ModelConfig, slots: int, rank: int) -> dict[str, Any]:
    """The shape of every leaf of ``lora_logical_axes``."""
    sizes = {
        "embed": config.hidden_size,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "mlp": config.intermediate_size,
        "layers": config.num_layers,
        "lora_slots": slots,
        "lora_rank": rank,
    }
    if config.head is not None:
        sizes["labels"] = config.head.num_labels
    return jax.tree_util.tree_map(
        lambda axes: tuple(sizes[name] for name in axes),
        lora_logical_axes(config),
        is_leaf=lambda node: isinstance(node, tuple),
    )


def split_tagged(params: Params, tokens: Array, vocab: int) -> tuple[Array, Array | None]:
    """Tagged token ids [..., T] -> (ids, slots), both [..., T]; no LoRA: (tokens, None)."""
    if "lora" not in params:
        return tokens, None
    return tokens % vocab, tokens // vocab


def untag(params: Params, tokens: Array, vocab: int) -> Array:
    """The plain token ids of (possibly tagged) ``tokens`` (prompt log-prob targets)."""
    return split_tagged(params, tokens, vocab)[0]


def update_form(choice: str, slots: int, platform: str | None = None) -> str:
    """The form the update runs in: ``choice`` ("dense", "grouped"), or for "auto" grouped
    from ``GROUPED_FROM_SLOTS[platform]`` slots on (the dense form's cost grows with the
    slots); ``platform`` defaults to jax's default backend."""
    if choice == "auto":
        platform = platform or jax.default_backend()
        threshold = GROUPED_FROM_SLOTS.get(platform, GROUPED_FROM_SLOTS["cpu"])
        return "grouped" if slots >= threshold else "dense"
    if choice not in ("dense", "grouped"):
        raise ValueError(f"lora_update: {choice!r} is not auto, dense or grouped")
    return choice


def layer_inputs(
    params: Params, slots: Array | None, groups: int, choice: str = "auto"
) -> tuple[Any, Any]:
    """(the per-layer stacks to scan beside the layers, how the tokens reach their slots:
    a ``SlotRoute`` within ``groups`` groups of rows (fewer where they do not divide the
    rows) or one-hot slots [B, T, M], per ``update_form``); (None, None) without LoRA.
    Computed once a step: every layer reuses it."""
    if slots is None:
        return None, None
    stacks = params["lora"]["layers"]
    first_a = next(iter(stacks.values()))["a"]  # [layers, M, *in, r]
    count = first_a.shape[1]
    if update_form(choice, count) == "dense":
        return stacks, jax.nn.one_hot(slots, count, dtype=first_a.dtype)
    return stacks, route_slots(slots, count, math.gcd(slots.shape[0], groups))


def with_delta(base: Array, x: Array, target: str, lora: tuple[Params, Any] | None) -> Array:
    """``base`` (the projection of ``x [B, T, *in]``, ``[B, T, *out]``) plus its low-rank
    update when ``lora`` (one layer's stacks, how the tokens reach their slots:
    ``layer_inputs``' second) is set and allocates ``target``: a ``[M, *in, r]``, b
    ``[M, r, *out]``."""
    if lora is None or target not in lora[0]:
        return base
    stacks, slots = lora
    _, _, inputs, outputs = TARGETS[target]
    a, b = stacks[target]["a"], stacks[target]["b"]
    if isinstance(slots, SlotRoute):
        delta = grouped_delta(x, a, b, slots, inputs, outputs)
    else:
        delta = dense_delta(x, a, b, slots, inputs, outputs)
    return base + delta.astype(base.dtype)


def head_slot_outputs(params: Params, hidden: Array) -> Array:
    """A stacked linear head: hidden [..., D] -> every slot's outputs flattened
    ``[..., M * L]`` float32 (label ``slot * L + j`` is slot's output j)."""
    score = params["lora"]["head"]["score"].astype(jnp.float32)  # [M, D, L]
    out = jnp.einsum("...d,mdl->...ml", hidden.astype(jnp.float32), score)
    return out.reshape(*out.shape[:-2], -1)
