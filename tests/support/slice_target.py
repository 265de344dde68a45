"""Targets a slice group's leader builds in ``tests/serve/test_slice_placement.py``."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def own_labels() -> dict[str, str]:
    node = ray.get_runtime_context().get_node_id()
    return next(n.get("Labels", {}) for n in ray.nodes() if n["NodeID"] == node)


node_labels = ray.remote(num_cpus=0)(own_labels)


class HostProbe:
    """What a GroupEngine does at start, without a model: it finds its placement group and
    runs one task in each other bundle; ``slices`` is every host's slice name, its own first."""

    def __init__(self, settings: Any) -> None:
        group = get_current_placement_group()
        refs = [
            node_labels.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, index)
            ).remote()
            for index in range(1, settings.placement.hosts_per_replica)
        ]
        labels = [own_labels(), *ray.get(refs)]
        self.slices = [host.get("ray.io/tpu-slice-name") for host in labels]
