"""A host group on a whole TPU slice, reserved when the replica starts (``tpu_slice``).

The replica actor is only a driver: ``cluster.slice_group.SliceGroup`` reserves every host of
one free slice and starts the group's leader in bundle 0, where a ``GroupEngine`` starts the
followers in the other bundles (``replicas/engine/group_engine.py``). This engine forwards the
replica's calls to that leader; a host that dies or stalls ends the call with
``EngineUnavailable``, and the health check fails so Serve replaces the replica, whose
placement groups (and so its hosts) go with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cluster.host_group import HostGroupError
from cluster.slice_group import SliceGroup, slice_names
from replicas.answers import Answer
from replicas.contract import ModelInfo, ScoreWork
from replicas.engine_contract import EngineStats, refuse_adapter_change
from replicas.errors import EngineUnavailable
from replicas.settings import ReplicaSettings

LEADER_FACTORY = "replicas.engine.group_engine:GroupEngine.from_settings"


class SliceEngine:
    """The replica's engine when its host group is a reserved TPU slice."""

    def __init__(self, group: SliceGroup) -> None:
        self._group = group
        self._info: ModelInfo = group.call("info")

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> SliceEngine:
        assert settings.placement.tpu_slice is not None
        group = SliceGroup.start(
            settings.placement.tpu_slice,
            settings.placement.host_bundle,
            LEADER_FACTORY,
            settings,
            settings.placement.host_timeout_s,
        )
        return cls(group)

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def compile_count(self) -> int:
        return int(self._call("compile_count"))

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Answer]:
        return self._call("score_batch", list(works), bounded_by_leader=True)

    def check_health(self) -> None:
        self._call("check_health")

    def stats(self) -> EngineStats:
        names = tuple(slice_names(self._group.placement_group))
        return dataclasses.replace(self._call("stats"), tpu_slice=names)

    def wait_for_background_compiles(self, timeout_s: float = 600.0) -> bool:
        return bool(self._call("wait_for_background_compiles", timeout_s, bounded_by_leader=True))

    def load_adapter(self, name: str, path: str) -> None:
        """A slice's host group loads LoRA adapters only at start (``lora_adapters``)."""
        raise refuse_adapter_change("a TPU slice's engine")

    def unload_adapter(self, name: str) -> None:
        raise refuse_adapter_change("a TPU slice's engine")

    def close(self) -> None:
        """Give the slice back now (else it goes with the replica actor)."""
        self._group.shutdown()

    def _call(self, method: str, *args: Any, bounded_by_leader: bool = False) -> Any:
        try:
            return self._group.call(method, *args, bounded_by_leader=bounded_by_leader)
        except HostGroupError as error:
            raise EngineUnavailable(f"host group: {error}") from None
