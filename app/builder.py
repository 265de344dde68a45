"""The Serve application: ScoreIngress (CPU) -> ScoringReplica (accelerator) handle.

``serve_config.yaml`` points its ``import_path`` at ``app.builder:build_app``; its ``args``
are ReplicaSettings keys. Settings are validated here, before any deployment starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.serve import Application

from app.ingress import ScoreIngress
from replicas.deployment import DEFAULT_ENGINE, ScoringReplica, coerce_settings
from replicas.settings import ReplicaSettings

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
    replica = ScoringReplica.options(**dict(replica_options or {})).bind(resolved, engine_factory)
    return ScoreIngress.options(**dict(ingress_options or {})).bind(replica, resolved)


def build_app(args: dict[str, Any]) -> Application:
    """Builder for ``import_path: app.builder:build_app``; ``args`` are ReplicaSettings keys."""
    return scoring_app(ReplicaSettings.from_mapping(args))
