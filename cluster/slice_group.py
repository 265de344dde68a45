"""Slice-pinned host groups: a replica's hosts are every host of one TPU slice.

A Serve placement group of H ``STRICT_SPREAD`` bundles may take hosts of two slices, whose
chips share no ICI. With ``tpu_slice`` set, the replica actor asks for no TPU and reserves a
slice at start, as Ray Serve LLM's TPU path does (``requires_deferred_placement_group``):
``ray.util.tpu.slice_placement_group`` claims a free slice's head resource
(``TPU-<pod type>-head``, held by worker 0 of each slice) to learn its name, then places one
bundle per host with the label selector ``ray.io/tpu-slice-name: <that slice>``. A group
waits for a whole free slice and never takes part of one. The head reservation is kept for
the group's life, so a waiting group takes the first slice any group frees.

``SliceGroup`` then starts the group's leader in bundle 0: an actor that builds its target from
a ``"module:attribute"`` factory (the scoring engine's host group, whose followers take
bundles 1..H-1 of the same placement group) and answers ``call(method, *args)``. The
placement groups fate-share with the replica actor that created them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster.host_group import HostGroupError, actor_resources, load_factory

logger = logging.getLogger(__name__)
POLL_S = 10.0  # how often a waiting group tries again, and logs that it waits


@dataclass(frozen=True)
class TpuSlice:
    """A slice type: ``v6e:4x4`` is generation ``v6e``, topology ``4x4``."""

    generation: str
    topology: str

    @classmethod
    def parse(cls, text: str) -> TpuSlice:
        generation, _, topology = text.partition(":")
        if not generation or not topology:
            raise ValueError(f"tpu_slice: expected generation:topology, got {text!r}")
        return cls(generation, topology)


def reserve_slice(tpu_slice: TpuSlice, bundle: Mapping[str, float], poll_s: float = POLL_S) -> Any:
    """A ``SlicePlacementGroup`` holding every host of one free slice (one ``bundle`` per
    host), once ready; waits, logging every ``poll_s``, while every slice is taken."""
    from ray.util.tpu import slice_placement_group

    started = time.monotonic()
    while True:
        try:
            reserved = slice_placement_group(
                tpu_slice.topology,
                tpu_slice.generation,
                resources_per_bundle=dict(bundle),
                strategy="STRICT_SPREAD",
                head_reservation_timeout_s=poll_s,
            )
        except TimeoutError:
            waited = time.monotonic() - started
            logger.warning("waiting %.0f s for a free %s slice", waited, tpu_slice.topology)
            continue
        if _wait_ready(reserved, tpu_slice, started, poll_s):
            return reserved


def _wait_ready(reserved: Any, tpu_slice: TpuSlice, started: float, poll_s: float) -> bool:
    """Wait for the slice's hosts; ``False`` (reservation dropped) if the placement group is
    removed meanwhile."""
    while True:
        ready, _ = ray.wait([reserved.placement_group.ready()], timeout=poll_s)
        if ready:
            try:
                ray.get(ready[0])
            except ray.exceptions.RayError:
                reserved.shutdown()
                return False
            return True
        waited = time.monotonic() - started
        logger.warning(
            "waiting %.0f s for the hosts of %s slice %s",
            waited,
            tpu_slice.topology,
            reserved.bundle_label_selector[0] if reserved.bundle_label_selector else "?",
        )


def slice_names(group: Any) -> list[str | None]:
    """Each bundle's node's ``ray.io/tpu-slice-name`` label (operators, tests)."""
    nodes = {n["NodeID"]: n.get("Labels", {}) for n in ray.nodes()}
    table = ray.util.placement_group_table(group)
    return [
        nodes.get(node, {}).get("ray.io/tpu-slice-name")
        for _, node in sorted(table["bundles_to_node_id"].items())
    ]


@ray.remote(max_restarts=0, max_concurrency=2)  # a health call is answered during a step
class GroupLeader:
    """Bundle 0 of a slice: builds its target from a factory path and runs its methods."""

    def __init__(self, factory: str, settings: Any) -> None:
        self._target = load_factory(factory)(settings)

    def ready(self) -> bool:
        return True

    def call(self, method: str, *args: Any) -> Any:
        attribute = getattr(self._target, method)
        return attribute(*args) if callable(attribute) else attribute


class SliceGroup:
    """One reserved slice and the leader actor in its bundle 0."""

    def __init__(self, reserved: Any, leader: Any, timeout_s: float) -> None:
        self._reserved = reserved
        self._leader = leader
        self._timeout_s = timeout_s

    @classmethod
    def start(
        cls, tpu_slice: str, bundle: Mapping[str, float], factory: str, settings: Any,
        timeout_s: float,
    ) -> SliceGroup:  # fmt: skip
        """Reserve a slice, start the leader there and wait for its target (model loading
        and warm-up included: no time limit beyond Serve's own)."""
        reserved = reserve_slice(TpuSlice.parse(tpu_slice), bundle)
        strategy = PlacementGroupSchedulingStrategy(
            reserved.placement_group, placement_group_bundle_index=0
        )
        leader = GroupLeader.options(**actor_resources(bundle), scheduling_strategy=strategy)
        group = cls(reserved, leader.remote(factory, settings), timeout_s)
        try:
            ray.get(group._leader.ready.remote())
        except ray.exceptions.RayError as error:
            group.shutdown()
            raise HostGroupError(f"the slice's leader host failed to start: {error}") from None
        return group

    @property
    def placement_group(self) -> Any:
        return self._reserved.placement_group

    def call(self, method: str, *args: Any, bounded_by_leader: bool = False) -> Any:
        """``method(*args)`` on the leader's target, within ``timeout_s``; a call the leader
        bounds itself (a group step, whose limit grows with what it compiles) is waited for
        until it answers or the leader dies (a stalled leader fails its health call)."""
        timeout = None if bounded_by_leader else self._timeout_s
        try:
            return ray.get(self._leader.call.remote(method, *args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise HostGroupError(
                f"{method}: the slice's leader host did not answer within {self._timeout_s} s"
            ) from None
        except ray.exceptions.RayActorError as error:
            raise HostGroupError(f"{method}: the slice's leader host died: {error}") from None

    def shutdown(self) -> None:
        """Stop the leader and give the slice back (its followers die with the leader)."""
        ray.kill(self._leader, no_restart=True)
        self._reserved.shutdown()
