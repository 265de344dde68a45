"""Device meshes with named axes (``data``, ``model``) built from a config."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "model")


class MeshConfigError(ValueError):
    """mesh_shape does not fit the visible devices."""


def build_mesh(mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, model) mesh over the first data*model visible devices.

    Raises MeshConfigError naming ``mesh_shape`` when there are too few devices.
    """
    if len(mesh_shape) != len(MESH_AXES) or any(int(n) < 1 for n in mesh_shape):
        raise MeshConfigError(f"mesh_shape: expected [data, model] >= 1, got {list(mesh_shape)}")
    devices = list(jax.devices() if devices is None else devices)
    needed = int(np.prod(mesh_shape))
    if needed > len(devices):
        raise MeshConfigError(
            f"mesh_shape: {list(mesh_shape)} needs {needed} devices, {len(devices)} visible"
        )
    grid = np.asarray(devices[:needed], dtype=object).reshape(tuple(int(n) for n in mesh_shape))
    return Mesh(grid, MESH_AXES)
