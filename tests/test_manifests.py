"""cluster/manifests: KubeRay RayServices whose serveConfigV2 is the shipped app on TPU.

Each manifest's serveConfigV2 must pass Ray's own Serve schema with no key Ray would drop,
build with our builder, and place: every placement-group bundle fits one TPU worker pod's
Ray resources, a host group fits inside one slice, the mesh holds exactly the group's chips,
and the label selector names the slice's pod type.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from app.builder import build_app, replica_placement
from cluster.niceness import NICENESS_ENV
from replicas.settings import ReplicaSettings
from tests.test_serve_config import CONFIG, unknown_keys

MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "cluster" / "manifests").glob("*.yaml"))
TPU_KEYS = {
    "dtype",
    "mesh_shape",
    "batch_buckets",
    "warmup_batch_sizes",
    "max_request_tokens",
    "host_resources",
    "hosts_per_replica",
    "placement_group_strategy",
    "host_label_selector",
}


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = yaml.safe_load(path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    return manifest, yaml.safe_load(manifest["spec"]["serveConfigV2"])


def worker_node(group: dict[str, Any]) -> dict[str, float]:
    """The Ray resources a TPU worker pod of this group starts with."""
    (container,) = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    return {"CPU": float(limits["cpu"]), "TPU": float(limits["google.com/tpu"])}


def test_there_is_a_multi_host_slice_and_a_single_host_manifest() -> None:
    hosts = sorted(
        ReplicaSettings.from_mapping(load(p)[1]["applications"][0]["args"]).hosts_per_replica
        for p in MANIFESTS
    )
    assert hosts == [1, 4]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_serve_config_v2_passes_rays_schema_and_is_the_shipped_app(path: Path) -> None:
    _, serve_config = load(path)
    ServeDeploySchema.model_validate(serve_config)
    assert unknown_keys(serve_config, ServeDeploySchema) == []
    (app,) = serve_config["applications"]
    (shipped,) = yaml.safe_load(CONFIG.read_text())["applications"]
    assert app["import_path"] == shipped["import_path"]
    same = {k: v for k, v in app["args"].items() if k not in TPU_KEYS}
    assert same == {k: v for k, v in shipped["args"].items() if k not in TPU_KEYS}
    assert app["args"]["dtype"] == "bfloat16"
    assert build_app(app["args"]) is not None


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_bundle_fits_a_worker_and_a_group_fits_one_slice(path: Path) -> None:
    manifest, serve_config = load(path)
    settings = ReplicaSettings.from_mapping(serve_config["applications"][0]["args"])
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    node, hosts = worker_node(group), group["numOfHosts"]
    placement = replica_placement(settings)
    bundles = placement.get("placement_group_bundles", [settings.host_bundle])
    assert len(bundles) == settings.hosts_per_replica <= hosts  # one slice holds the group
    for bundle in bundles:
        assert all(node.get(name, 0) >= amount for name, amount in bundle.items()), bundle
    if settings.hosts_per_replica > 1:
        assert placement["placement_group_strategy"] == "STRICT_SPREAD"  # a host per TPU VM
    chips_per_host = settings.host_bundle["TPU"]
    assert math.prod(settings.mesh_shape) == settings.hosts_per_replica * chips_per_host
    topology = group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    slice_chips = math.prod(int(n) for n in topology.split("x"))
    assert slice_chips == hosts * node["TPU"]
    assert dict(settings.host_label_selector) == {"ray.io/tpu-pod-type": f"v6e-{slice_chips}"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_pod_starts_ray_with_worker_niceness_zero(path: Path) -> None:
    manifest, _ = load(path)
    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {item["name"]: item["value"] for item in container.get("env", [])}
            assert env.get(NICENESS_ENV) == "0", (path.name, container["name"])
