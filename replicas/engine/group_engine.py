"""A scoring engine that spans a host group: one ``ScoringEngine`` per JAX process, in step.

Used by the replica deployment when ``hosts_per_replica`` > 1. The leader (the replica actor)
validates work, then every host runs the same ``score_batch`` on the same works at the same
step number (``cluster.host_group.HostGroup``); every step's executable spans the global mesh,
its outputs come back replicated, and the leader answers. Hosts resolve every step the same
way because the compiled signatures they may use change only at the same points: warm-up
compiles the leader's list on every host, a signature nothing covers compiles on every host
on the request path, and a background compile is published (usable) only once every host
reports holding it, at the start of the same step everywhere. A step's time limit is
``host_timeout_s`` plus ``host_compile_timeout_s`` per signature it compiles, so a slow
compile is not taken for a dead host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from cluster.host_group import HostGroup, HostGroupError
from replicas.answers import Answer
from replicas.contract import ModelInfo, ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.engine_contract import EngineStats, refuse_adapter_change
from replicas.errors import EngineUnavailable
from replicas.settings import PlacementSettings, ReplicaSettings, SettingsError

FOLLOWER_FACTORY = "replicas.engine:FollowerEngine"
Key = tuple[str, Any]


def check_mesh_spans_hosts(placement: PlacementSettings) -> None:
    """With several hosts the mesh must hold every device of every host, exactly."""
    needed = int(np.prod(placement.mesh_shape))
    devices, local = jax.device_count(), jax.local_device_count()
    if needed != devices:
        raise SettingsError(
            f"mesh_shape: {list(placement.mesh_shape)} holds {needed} devices, but "
            f"hosts_per_replica: {placement.hosts_per_replica} hosts x {local} devices per host "
            f"= {devices}; make their products equal"
        )


def _report(engine: ScoringEngine) -> dict[str, Any]:
    return {
        "held": engine.held_signatures(),
        "compile_count": engine.compile_count,
        "ran": engine.last_signatures,
    }


class FollowerEngine:
    """The target a follower host builds (``FOLLOWER_FACTORY``): its own engine, stepped."""

    def __init__(self, settings: ReplicaSettings) -> None:
        check_mesh_spans_hosts(settings.placement)
        self._engine = ScoringEngine.from_settings(settings, warm=False)

    def compile_keys(self, keys: Sequence[Key]) -> dict[str, Any]:
        self._engine.compile_keys(keys)
        return _report(self._engine)

    def score(self, works: Sequence[ScoreWork], publish: Sequence[Key]) -> dict[str, Any]:
        self._engine.publish(publish)
        self._engine.score_batch(works)  # the leader answers; the scores stay here
        return _report(self._engine)


class GroupEngine:
    """The leader's engine: what the replica deployment calls, for the whole group."""

    def __init__(self, group: HostGroup, engine: ScoringEngine) -> None:
        self._group = group
        self._engine = engine
        self._followers: list[dict[str, Any]] = []  # each follower's last report
        placement = engine.settings.placement
        self._step_s, self._compile_s = placement.host_timeout_s, placement.host_compile_timeout_s

    @classmethod
    def from_settings(cls, settings: ReplicaSettings) -> GroupEngine:
        """Start the followers, bootstrap jax.distributed, load the model on every host (each
        places only its own devices' shards) and compile the leader's warm-up list on all."""
        placement = settings.placement
        group = HostGroup(
            placement.hosts_per_replica, placement.host_bundle, placement.host_timeout_s
        )

        def leader_engine() -> ScoringEngine:
            check_mesh_spans_hosts(settings.placement)
            return ScoringEngine.from_settings(settings, warm=False)

        engine = group.start(FOLLOWER_FACTORY, settings, leader_engine)
        self = cls(group, engine)
        keys = engine.warmup_keys()
        _, self._followers = group.step(
            "compile_keys", (keys,), lambda: engine.compile_keys(keys), self._limit(len(keys))
        )
        return self

    @property
    def info(self) -> ModelInfo:
        return self._engine.info

    @property
    def compile_count(self) -> int:
        return self._engine.compile_count

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Answer]:
        for work in works:  # bad work is refused here, before any host steps
            self._engine.validate(work)
        publish = self._publishable()

        def local() -> list[np.ndarray]:
            self._engine.publish(publish)
            return self._engine.score_batch(works)

        limit = self._limit(len(self._to_compile(works, publish)))
        try:
            results, self._followers = self._group.step(
                "score", (list(works), publish), local, limit
            )
            self._check_in_step()
        except HostGroupError as error:
            raise EngineUnavailable(f"host group: {error}") from None
        return results

    def _check_in_step(self) -> None:
        """Every host must have run the leader's signatures, in its order."""
        ran = self._engine.last_signatures
        for process, report in enumerate(self._followers, start=1):
            if report["ran"] != ran:
                self._group.fail(f"host {process} ran {report['ran']}, the leader ran {ran}")

    def _limit(self, compiles: int) -> float:
        """A step's time limit when it compiles ``compiles`` signatures."""
        return self._step_s + compiles * self._compile_s

    def _to_compile(self, works: Sequence[ScoreWork], publish: Sequence[Key]) -> list[Key]:
        """The signatures scoring ``works`` will compile on the request path."""
        ready = set(publish)
        return [
            key
            for key in dict.fromkeys(self._engine.plan(works))
            if key not in ready and self._engine.compiles_now(*key)
        ]

    def _publishable(self) -> list[Key]:
        """Background compiles every host holds (the leader's order)."""
        held = [set(report["held"]) for report in self._followers]
        return [key for key in self._engine.held_signatures() if all(key in h for h in held)]

    def check_health(self) -> None:
        try:
            self._group.check()
        except HostGroupError as error:
            raise EngineUnavailable(f"host group: {error}") from None

    def stats(self) -> EngineStats:
        return dataclasses.replace(
            self._engine.stats(),
            hosts=self._group.num_hosts,
            host_members=tuple(self._group.members),
            host_compile_counts=(
                self._engine.compile_count,
                *(report["compile_count"] for report in self._followers),
            ),
        )

    def wait_for_background_compiles(self, timeout_s: float = 600.0) -> bool:
        return self._engine.wait_for_background_compiles(timeout_s)

    def load_adapter(self, name: str, path: str) -> None:
        """A host group loads LoRA adapters only at start (``lora_adapters``)."""
        raise refuse_adapter_change("a host group's engine")

    def unload_adapter(self, name: str) -> None:
        raise refuse_adapter_change("a host group's engine")
