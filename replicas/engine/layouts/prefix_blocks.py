"""Prefix keys/values on the data shard that reads them, never on every chip.

A prefix step computes B queries with B split over ``data``: query b lands on data block
``b // (B / G)`` (G data shards), its keys/values split over ``model`` by kv heads as the
logical-axis table says. Each query's entry keeps the pieces the chips of its block hold,
device by device (``PrefixEntry.keys``: device -> ``[layers, 1, T, K/M, Dh]``), so the query
cache holds an entry once per replica, on the chips of one block. An item-stream step's
prefix input ``[layers, B, T, K, Dh]`` (B over ``data``) is assembled on each chip from the
entries its own rows read; an entry cached on another block is moved chip to chip (same
model column) when one process holds both, else computed again on the block that reads it
(``moves_between_blocks``): a host group whose data axis crosses hosts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from cluster.sharding import named_sharding
from replicas.model.protocol import DecoderModel

Array = jax.Array
KV_AXES = (None, "batch", None, "kv_heads", None)  # [layers, B, T, K, Dh]
LAST_AXES = ("batch", None)  # [B, D]


@dataclass(frozen=True)
class PrefixEntry:
    """One query's keys/values ``[layers, 1, T, K, Dh]`` and last hidden state ``[1, D]``
    (the score of an empty item), as pieces on the chips of data block ``block`` that this
    process holds. ``length`` real tokens of ``width``; ``nbytes``: the whole entry's size."""

    keys: dict[Any, Array]
    values: dict[Any, Array]
    last: dict[Any, Array]
    length: int
    width: int
    block: int
    nbytes: int


def mesh_position(mesh: Mesh) -> dict[Any, tuple[int, int]]:
    """Device -> (data block, model column)."""
    grid = np.asarray(mesh.devices)
    return {grid[g, m]: (g, m) for g in range(grid.shape[0]) for m in range(grid.shape[1])}


def moves_between_blocks(mesh: Mesh) -> bool:
    """Whether one process holds each model column whole, so an entry can move between data
    blocks chip to chip (always true in one process)."""
    grid = np.asarray(mesh.devices)
    return all(len({d.process_index for d in grid[:, m]}) == 1 for m in range(grid.shape[1]))


@partial(jax.jit, static_argnums=1)
def _rows(block: Array, axis: int) -> tuple[Array, ...]:
    """Every row of ``block`` along ``axis`` (that dim 1 each), cut in one executable: a row
    at a time took an eager dispatch each, 192 a 64-query prefix step (-38% items/s on an
    H100, where each is a kernel launch)."""
    return tuple(jax.lax.slice_in_dim(block, i, i + 1, axis=axis) for i in range(block.shape[axis]))


def row_pieces(array: Array, axis: int, rows: Collection[int]) -> dict[int, dict[Any, Array]]:
    """Each wanted row b of a batch-sharded array -> {device: its piece, batch dim 1}."""
    out: dict[int, dict[Any, Array]] = {b: {} for b in rows}
    for shard in array.addressable_shards:
        start = shard.index[axis].start or 0
        wanted = [b for b in rows if 0 <= b - start < shard.data.shape[axis]]
        if not wanted:
            continue
        cut = _rows(shard.data, axis)
        for b in wanted:
            out[b][shard.device] = cut[b - start]
    return out


def split_entries(
    mesh: Mesh, keys: Array, values: Array, lasts: Array, lengths: Mapping[int, int]
) -> dict[int, PrefixEntry]:
    """A prefix step's outputs (keys, values ``[layers, B, T, K, Dh]``, lasts ``[B, D]``,
    B over ``data``) -> an entry for each real query ``b`` (``lengths``: b -> its real
    tokens), left where it is."""
    batch, width = keys.shape[1], keys.shape[2]
    per_block = batch // mesh.shape["data"]
    key_pieces = row_pieces(keys, 1, lengths.keys())
    value_pieces = row_pieces(values, 1, lengths.keys())
    last_pieces = row_pieces(lasts, 0, lengths.keys())
    size = int((keys.nbytes + values.nbytes + lasts.nbytes) // batch)
    pieces = {b: (key_pieces[b], value_pieces[b], last_pieces[b]) for b in lengths}
    return {b: PrefixEntry(*pieces[b], n, width, b // per_block, size) for b, n in lengths.items()}


def fit_width(piece: Array, width: int) -> Array:
    """Keys or values ``[layers, 1, T, K, Dh]`` cut or zero-padded to ``width`` tokens."""
    have = piece.shape[2]
    if have >= width:
        return piece[:, :, :width]
    return jnp.pad(piece, [(0, 0), (0, 0), (0, width - have), (0, 0), (0, 0)])


def _piece(
    entry: PrefixEntry | None, name: str, device: Any, grid: Any, column: int, zeros: Any
) -> Array:
    """``entry``'s keys, values or last on ``device``: its own piece, moved from the chip
    of the same model column in the entry's block, or ``zeros`` for a padding row."""
    if entry is None:
        return zeros
    pieces = getattr(entry, name)
    if device in pieces:
        return pieces[device]
    return jax.device_put(pieces[grid[entry.block, column]], device)


def assemble(
    mesh: Mesh, entries: Sequence[PrefixEntry | None], model: DecoderModel, width: int
) -> tuple[Array, Array, Array]:
    """Keys, values ``[layers, B, T, K, Dh]`` and lasts ``[B, D]`` (B over ``data``) of a
    step whose row r reads ``entries[r]`` (None: a padding row, zeros)."""
    c, batch = model.config, len(entries)
    layers, head_dim, hidden = c.num_layers, c.head_dim, c.hidden_size
    full_kv = (layers, batch, width, c.num_kv_heads, head_dim)
    kv = named_sharding(KV_AXES, full_kv, mesh)
    last = named_sharding(LAST_AXES, (batch, hidden), mesh)
    grid, position = np.asarray(mesh.devices), mesh_position(mesh)
    per_block = batch // grid.shape[0]
    blocks: dict[str, list[Array]] = {"keys": [], "values": [], "last": []}
    piece_kv = (layers, 1, width, kv.shard_shape(full_kv)[3], head_dim)
    for device in kv.addressable_devices_indices_map(full_kv):
        g, m = position[device]
        rows = entries[g * per_block : (g + 1) * per_block]
        for name, shape in (("keys", piece_kv), ("values", piece_kv), ("last", (1, hidden))):
            zeros = jnp.zeros(shape, model.dtype, device=device) if None in rows else None
            parts = [_piece(e, name, device, grid, m, zeros) for e in rows]
            blocks[name].append(jnp.concatenate(parts, axis=1 if name != "last" else 0))
    return (
        jax.make_array_from_single_device_arrays(full_kv, kv, blocks["keys"]),
        jax.make_array_from_single_device_arrays(full_kv, kv, blocks["values"]),
        jax.make_array_from_single_device_arrays((batch, hidden), last, blocks["last"]),
    )
