"""The placement section: a replica's device mesh, the hosts it spans and the Ray resources,
placement strategy and labels each host takes (cluster/host_group.py, cluster/slice_group.py).
Jax-free."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from replicas.settings.common import SettingsError, check_choice

PLACEMENT_STRATEGIES = ("SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK")
TPU_SLICE = re.compile(r"(?P<generation>v\d+[a-z]*):(?P<topology>\d+(x\d+){1,2})")


@dataclass(frozen=True)
class PlacementSettings:
    """Where a replica runs: its mesh, hosts and their Ray resources."""

    mesh_shape: tuple[int, int] = (1, 1)
    """(data, model) devices of the replica's mesh; with host groups its product is hosts x
    devices per host."""
    hosts_per_replica: int = 1
    """Host groups (cluster/host_group.py): one replica spans this many hosts (JAX processes),
    each in its own placement-group bundle of ``host_resources``; the mesh spans them all."""
    host_resources: tuple[tuple[str, float], ...] = (("CPU", 1.0),)
    """Resources of each host of a replica, in Ray's bundle form ({"CPU": 1}, {"TPU": 4}):
    the replica actor's own and, with hosts_per_replica > 1, every bundle's."""
    placement_group_strategy: str = "SPREAD"
    """SPREAD also runs a group on one machine; STRICT_SPREAD puts each host on its own node."""
    host_label_selector: tuple[tuple[str, str], ...] = ()
    """Ray node labels every host must carry (a label selector on each bundle), e.g.
    {"ray.io/tpu-pod-type": "v6e-16"} or a slice's "ray.io/tpu-slice-name" to pin a group."""
    host_timeout_s: float = 300.0
    """A host that does not finish a step (or answer a ping) within this is dead."""
    host_compile_timeout_s: float = 600.0
    """Added to a step's limit for each signature it plans to compile (the warm-up's step, a
    request whose signature nothing compiled yet; an item-stream step's own prefix step
    compiles with it): a compile is work, not a stall."""
    tpu_slice: str | None = None
    """"generation:topology" of the TPU slice one replica takes whole, e.g. "v6e:4x4": with
    hosts_per_replica > 1 the replica reserves every host of one free slice through Ray's TPU
    slice placement (cluster/slice_group.py) instead of a Serve placement group, so a group
    never straddles slices. Unset: the placement-group path (CPU, GPU, one host)."""

    def __post_init__(self) -> None:
        if len(self.mesh_shape) != 2 or any(int(n) < 1 for n in self.mesh_shape):
            raise SettingsError(f"mesh_shape: must be [data, model] >= 1, got {self.mesh_shape}")
        if isinstance(self.hosts_per_replica, bool) or not 1 <= self.hosts_per_replica <= 64:
            raise SettingsError(
                f"hosts_per_replica: must be an int in [1, 64], got {self.hosts_per_replica!r}"
            )
        check_choice(
            "placement_group_strategy", self.placement_group_strategy, PLACEMENT_STRATEGIES
        )
        resources = dict(self.host_resources)
        if not resources or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float) or v < 0
            for k, v in resources.items()
        ):
            raise SettingsError(
                f"host_resources: must map resource names to amounts >= 0, got {resources}"
            )
        labels = dict(self.host_label_selector)
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in labels.items()):
            raise SettingsError(
                f"host_label_selector: must map label names to strings, got {labels}"
            )
        for name in ("host_timeout_s", "host_compile_timeout_s"):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.tpu_slice is not None:
            self._check_tpu_slice(resources)

    def _check_tpu_slice(self, resources: dict[str, float]) -> None:
        match = TPU_SLICE.fullmatch(str(self.tpu_slice))
        if not match:
            raise SettingsError(
                f"tpu_slice: expected generation:topology such as v6e:4x4, got {self.tpu_slice!r}"
            )
        chips_per_host = resources.get("TPU", 0)
        if chips_per_host <= 0:
            raise SettingsError(
                f"tpu_slice: {self.tpu_slice} needs host_resources with TPU chips per host, "
                f"got {resources}"
            )
        chips = math.prod(int(n) for n in match["topology"].split("x"))
        hosts = max(1, int(chips // chips_per_host))
        if hosts != self.hosts_per_replica:
            raise SettingsError(
                f"tpu_slice: a {self.tpu_slice} slice is {hosts} host(s) of "
                f"host_resources TPU {chips_per_host:g}, but hosts_per_replica is "
                f"{self.hosts_per_replica}; a replica takes a whole slice"
            )

    @property
    def host_bundle(self) -> dict[str, float]:
        """One host's placement-group bundle (Ray's resource names)."""
        return dict(self.host_resources)
