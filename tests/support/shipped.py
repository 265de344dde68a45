"""serve_config.yaml as shipped, read once for the tests that start from it: its scoring
app's ``args``, ``ReplicaSettings`` from them with only what a test names changed, and the
whole file with only ``model`` changed as a test cluster deploys it (``shipped_config``)."""

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


def shipped_config(model_dir: str | Path) -> dict[str, Any]:
    """The file as shipped with only ``model`` changed, for ``ServeCluster.deploy_config``: no
    persistent compile cache (the suite leaves the user's alone), CPU shares the test cluster
    has, and the test cluster's own proxy (its ``http_options`` and ``proxy_location`` out)."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    for key in ("http_options", "proxy_location"):  # the test cluster's proxy is already up
        config.pop(key)
    (app,) = config["applications"]
    app["args"].update(
        model=str(model_dir), compilation_cache_dir=None, host_resources={"CPU": 0.1}
    )
    for deployment in app["deployments"]:
        if "ray_actor_options" in deployment:
            deployment["ray_actor_options"]["num_cpus"] = 0.1
    return config
