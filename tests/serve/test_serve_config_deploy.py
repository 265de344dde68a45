"""serve_config.yaml deployed the way `serve run serve_config.yaml` deploys it (a declarative
config through the Serve controller), with the real engine on the tiny Llama.

Also the operations it enables: a ``user_config`` change of batching settings is applied to
the running replica without a reload; a change that needs a reload is refused, naming it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from ray import serve

from replicas.serving.deployment import ScoringReplica
from tests.support.serve_support import (  # noqa: F401
    RAY_SERVE,
    ServeCluster,
    app_status,
    replica_stats,
    serve_cluster,
    wait_for,
)

pytestmark = [pytest.mark.slow, RAY_SERVE]

CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
PAYLOAD = {"query": "The capital of France is", "items": ["", " Paris"], "label_token_ids": [1, 2]}


def tiny_config(model_dir: Path) -> dict[str, Any]:
    """The file as shipped, pointed at the tiny model with small buckets and CPU shares."""
    config = yaml.safe_load(CONFIG.read_text())
    for key in ("http_options", "proxy_location"):  # the test cluster's proxy is already up
        config.pop(key)
    (app,) = config["applications"]
    app["args"].update(
        model=str(model_dir),
        token_buckets=[16, 64, 128],
        item_token_buckets=[16, 64, 128],
        batch_buckets=[1, 4],
        max_items_per_request=8,
        max_multi_item_seq_len=128,
        warmup_shapes=[[8, 1, 1, 4]],  # limit_to_warmup (shipped): also each full step
        completion_warmup_shapes=[[16, 2, 8, 1]],
        warmup_batch_sizes=[1, 4],
        compilation_cache_dir=None,
        host_resources={"CPU": 0.1},
    )
    for deployment in app["deployments"]:
        if "ray_actor_options" in deployment:
            deployment["ray_actor_options"]["num_cpus"] = 0.1
    return config


def replica_deployment(config: dict[str, Any]) -> dict[str, Any]:
    (app,) = config["applications"]
    return next(d for d in app["deployments"] if d["name"] == ScoringReplica.name)


@pytest.fixture(scope="module")
def deployed(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[tuple[Any, Any]]:  # noqa: F811
    config = tiny_config(tiny_llama_dir)
    serve_cluster.deploy_config(config, "scorejax", "/health")
    yield serve_cluster, config


def test_the_shipped_config_serves_multi_item_scores(deployed: tuple[Any, Any]) -> None:
    cluster, _ = deployed
    with cluster.client() as http:
        model = http.get("/v1/models").json()["data"][0]
        assert model["multi_item_scoring_delimiter"] == 0
        response = http.post("/v1/score", json=PAYLOAD)
    assert response.status_code == 200, response.text
    scores = np.array(response.json()["scores"])
    assert scores.shape == (2, 2) and np.all((scores > 0) & (scores < 1))


def test_batching_changes_apply_to_the_running_replica(deployed: tuple[Any, Any]) -> None:
    cluster, config = deployed
    with cluster.client() as http:
        assert http.post("/v1/score", json=PAYLOAD).status_code == 200
    before = replica_stats("scorejax")
    changed = copy.deepcopy(config)
    replica_deployment(changed)["user_config"] = {"max_batch_size": 4, "batch_wait_timeout_s": 0.02}
    cluster.deploy_config(changed, "scorejax", "/health")
    wait_for(lambda: replica_stats("scorejax")["max_batch_size"] == 4, 60, "reconfigure")
    after = replica_stats("scorejax")
    assert after["batch_wait_timeout_s"] == 0.02
    assert after["requests"] >= before["requests"] > 0  # same replica: no reload, no restart


def test_a_reload_only_change_is_refused_naming_the_setting(deployed: tuple[Any, Any]) -> None:
    _, config = deployed
    bad = copy.deepcopy(config)
    replica_deployment(bad)["user_config"] = {"dtype": "bfloat16"}
    replica_deployment(bad)["max_constructor_retry_count"] = 1  # fail on the first try
    client = serve.context._get_global_client()
    from ray.serve.schema import ServeDeploySchema

    client.deploy_apps(ServeDeploySchema.model_validate(bad), _blocking=False)
    wait_for(lambda: app_status("scorejax") == "DEPLOY_FAILED", 120, "the update to fail")
    message = serve.status().applications["scorejax"].deployments[ScoringReplica.name].message
    assert "dtype: changing it needs a model reload" in message
    # Rolling back is deploying the previous file again (docs/serving.md); not repeated
    # here: it is the fixture's own deploy, and a replica start is the suite's costliest step.
