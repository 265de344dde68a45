"""The Serve application: ScoreIngress (CPU) -> ScoringReplica (accelerator) handle.

``serve_config.yaml`` points its ``import_path`` at ``app.builder:build_app``; its ``args``
are ReplicaSettings keys. Settings are validated here, before any deployment starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
from ray.serve import Application

from app.ingress import ScoreIngress
from cluster.host_group import HostGroupError, actor_resources, check_placement_fits
from replicas.serving.adapter_registry import AdapterRegistry
from replicas.serving.deployment import ScoringReplica
from replicas.serving.setup import DEFAULT_ENGINE, coerce_settings
from replicas.settings import ReplicaSettings, SettingsError

APP_NAME = "scorejax"


def scoring_app(
    settings: ReplicaSettings | Mapping[str, Any],
    *,
    engine_factory: str = DEFAULT_ENGINE,
    replica_options: Mapping[str, Any] | None = None,
    ingress_options: Mapping[str, Any] | None = None,
) -> Application:
    """Bind both deployments; ``*_options`` are ``Deployment.options`` keyword arguments."""
    resolved = coerce_settings(settings)
    options = {**replica_placement(resolved), **dict(replica_options or {})}
    registry = None  # LoRA on: the adapters loaded at run time, shared (adapter_registry.py)
    if resolved.adapters.max_loras:
        registry = AdapterRegistry.bind(
            resolved.adapters.lora_adapters, resolved.adapters.max_loras
        )
    replica = ScoringReplica.options(**options).bind(resolved, engine_factory, registry)
    ingress = ScoreIngress.options(**dict(ingress_options or {}))
    return ingress.bind(replica, resolved, registry)


SLICE_DRIVER = {"num_cpus": 0.25}  # a replica that reserves its TPU slice at start holds no chip


def replica_placement(settings: ReplicaSettings) -> dict[str, Any]:
    """The replica's resources from ``host_resources`` (and ``host_label_selector``); with
    ``hosts_per_replica`` H > 1 also a placement group of H such bundles (bundle 0: the replica
    actor, the leader; bundles 1..H-1: its follower hosts), its strategy and labels. With H > 1
    and ``tpu_slice`` the replica is a driver that reserves a whole slice when it starts
    (``cluster/slice_group.py``): no placement group from Serve."""
    placement = settings.placement
    hosts = placement.hosts_per_replica
    if hosts > 1 and placement.tpu_slice:
        return {"ray_actor_options": dict(SLICE_DRIVER)}
    bundle, labels = placement.host_bundle, dict(placement.host_label_selector)
    if hosts == 1:  # else the bundles carry the labels
        selector = {"label_selector": labels} if labels else {}
        return {"ray_actor_options": actor_resources(bundle) | selector}
    strategy = placement.placement_group_strategy
    if ray.is_initialized():
        try:
            check_placement_fits(hosts, bundle, strategy, ray.nodes())
        except HostGroupError as error:
            raise SettingsError(str(error)) from None
    options: dict[str, Any] = {
        "ray_actor_options": actor_resources(bundle),
        "placement_group_bundles": [bundle] * hosts,
        "placement_group_strategy": strategy,
    }
    if labels:
        options["placement_group_bundle_label_selector"] = [labels] * hosts
    return options


def build_app(args: dict[str, Any]) -> Application:
    """Builder for ``import_path: app.builder:build_app``; ``args`` are ReplicaSettings keys."""
    return scoring_app(ReplicaSettings.from_mapping(args))
