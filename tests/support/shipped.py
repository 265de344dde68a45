"""serve_config.yaml as shipped, read once for the tests that start from it: its scoring
app's ``args``, and ``ReplicaSettings`` from them with only what a test names changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIG = ROOT / "serve_config.yaml"


def shipped_args(name: str = "serve_config.yaml") -> dict[str, Any]:
    """The scoring app's ``args`` of ``name`` (a serve config at the repository's root)."""
    (app,) = yaml.safe_load((ROOT / name).read_text())["applications"]
    return dict(app["args"])


def shipped_settings(model: str | Path, **changes: Any) -> Any:
    """``ReplicaSettings`` from the shipped ``args`` with ``model`` and ``changes`` over them."""
    from replicas.settings import ReplicaSettings

    return ReplicaSettings.from_mapping({**shipped_args(), "model": str(model), **changes})
