"""The bottom layer: meshes, the sharding table, host groups, TPU topologies, manifests.

``mesh`` (the ``(data, model)`` mesh), ``sharding`` (the one logical-axis table), ``host_group``
(one replica over several JAX processes), ``slice_group`` (a host group on a whole TPU slice
it reserves), ``niceness`` (Ray worker priority), ``tpu_topology``
(compile-only TPU devices and chip figures), ``config_variant`` and ``manifests/`` (KubeRay).
Imports nothing else of scorejax.
"""

from pathlib import Path

MANIFESTS = Path(__file__).resolve().parent / "manifests"
