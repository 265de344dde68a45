"""Tokens grouped by adapter slot (SGMV's layout), so each token's low-rank update multiplies
only its own slot's A and B, whatever the mix of slots in a step.

A step's tokens ``[B, T]`` are split into ``groups`` (the mesh's data axis: no token leaves
its data shard), and within a group sorted by slot into blocks of ``block`` tokens, each
slot's run padded to whole blocks, so every block holds one slot. The update then gathers one
A and one B per block (``[blocks, *in, r]``) and runs two batched matmuls; per token it costs
one slot's ``r * (in + out)`` multiply-adds, not ``max_loras + 1`` slots' as the dense one-hot
form (``dense_delta``, the reference the tests hold it to) does.

Shapes are static: ``places = N + min(M, N) * (block - 1)`` rounded up to a block (N tokens
of a group, M slots) covers any mix, the padding bound being one part-filled block per slot.
The route is computed once a step, outside the scan over layers.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

MIN_BLOCK, MAX_BLOCK = 16, 256
# A block's cost: its padding (at most a block per slot: M * block tokens' updates) against
# one gathered A and B per block (~N / block + M of them); block ~ sqrt(GATHER_WEIGHT * N / M)
# balances them. GATHER_WEIGHT from probe timings of one projection on a 2-core CPU (blocks
# of 16-128 at 9-65 slots over 320 and 2048 tokens). A block is also at least N / M tokens,
# so a step gathers at most ~2M slots' A and B (the dense form reads each of the M once):
# on a step bound by bytes the gathers stay within twice the dense form's weight reads.
GATHER_WEIGHT = 32


class SlotRoute(NamedTuple):
    """Where each token of a group sits once grouped by slot (G groups, N tokens each,
    P places in blocks of one slot)."""

    source: Array  # [G, P] int32: the token at each place; N = an empty place (zeros)
    place: Array  # [G, N] int32: each token's place
    block_slot: Array  # [G, P // block] int32: each block's slot (0 past the last run)


def block_size(tokens: int, slots: int) -> int:
    """Tokens per block for a group of ``tokens`` over ``slots`` slots: the power of two
    nearest ``sqrt(GATHER_WEIGHT * tokens / slots)`` or ``tokens / slots``, the larger,
    within [MIN_BLOCK, MAX_BLOCK]."""
    target = max(math.sqrt(GATHER_WEIGHT * tokens / slots), tokens / slots)
    return min(MAX_BLOCK, max(MIN_BLOCK, 1 << round(math.log2(max(target, 1.0)))))


def places(tokens: int, slots: int, block: int) -> int:
    """Places a group needs for any mix: every token, plus one part-filled block per slot
    that can occur, rounded up to whole blocks."""
    padded = tokens + min(slots, tokens) * (block - 1)
    return math.ceil(padded / block) * block


def route_slots(slots: Array, count: int, groups: int, block: int | None = None) -> SlotRoute:
    """``slots`` [B, T] (each token's slot, < ``count``) -> the route of ``groups`` groups
    of B / groups rows (``groups`` must divide B), in blocks of ``block`` tokens
    (``block_size``'s when None)."""
    flat = slots.reshape(groups, -1).astype(jnp.int32)  # [G, N]
    tokens = flat.shape[1]
    block = block or block_size(tokens, count)
    size = places(tokens, count, block)

    def one_group(group: Array) -> tuple[Array, Array, Array]:  # [N]
        counts = jnp.bincount(group, length=count)  # [M]
        runs = -(-counts // block) * block  # [M]: each slot's run, whole blocks
        run_start = jnp.cumsum(runs) - runs  # [M]
        order = jnp.argsort(group, stable=True)  # [N]: tokens by slot
        by_slot = group[order]
        rank = jnp.arange(tokens) - (jnp.cumsum(counts) - counts)[by_slot]  # [N]
        at = run_start[by_slot] + rank  # [N]: place of the token order[i]
        place = jnp.zeros(tokens, jnp.int32).at[order].set(at)
        source = jnp.full(size, tokens, jnp.int32).at[at].set(order)
        first = jnp.arange(size // block) * block  # [P // block]
        slot = jnp.searchsorted(jnp.cumsum(runs), first, side="right")
        return source, place, jnp.where(slot < count, slot, 0).astype(jnp.int32)

    return SlotRoute(*jax.vmap(one_group)(flat))


def grouped_delta(x: Array, a: Array, b: Array, route: SlotRoute, ins: str, outs: str) -> Array:
    """The low-rank update of ``x`` [B, T, *in] (``ins``: its einsum letters after T) through
    ``a`` [M, *in, r] and ``b`` [M, r, *out] (``outs``), each token through its own slot's
    pair -> [B, T, *out]."""
    groups, size = route.source.shape
    lead, in_shape = x.shape[: x.ndim - len(ins)], x.shape[x.ndim - len(ins) :]
    flat = x.reshape(groups, -1, *in_shape)  # [G, N, *in]
    empty = jnp.zeros((groups, 1, *in_shape), x.dtype)
    padded = jnp.concatenate([flat, empty], axis=1)  # [G, N + 1, *in]
    grouped = jax.vmap(lambda rows, at: rows[at])(padded, route.source)  # [G, P, *in]
    blocks = route.block_slot.shape[1]
    grouped = grouped.reshape(groups, blocks, size // blocks, *in_shape)
    low = jnp.einsum(f"gnt{ins},gn{ins}r->gntr", grouped, a[route.block_slot])
    out = jnp.einsum(f"gntr,gnr{outs}->gnt{outs}", low, b[route.block_slot])
    out = out.reshape(groups, size, *out.shape[3:])  # [G, P, *out]
    back = jax.vmap(lambda rows, at: rows[at])(out, route.place)  # [G, N, *out]
    return back.reshape(*lead, *back.shape[2:])


def dense_delta(x: Array, a: Array, b: Array, onehot: Array, ins: str, outs: str) -> Array:
    """Every slot's update for every token, masked by its one-hot slot ``onehot`` [..., T, M]:
    ``M * r * (in + out)`` multiply-adds a token, as two plain matmuls (the form few slots
    run fastest in, and the reference ``grouped_delta`` is tested against)."""
    per_slot = jnp.einsum(f"...t{ins},m{ins}r->...tmr", x, a)  # [..., T, M, r]
    return jnp.einsum(f"...tmr,mr{outs}->...t{outs}", per_slot * onehot[..., None], b)
