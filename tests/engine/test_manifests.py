"""cluster/manifests: KubeRay RayServices the layout planner wrote for the shipped app on TPU.

Each manifest is ``python -m planning.plan --emit`` output: ``planning.emit`` writes exactly it
for the layout and figures it states, and for the Qwen3-0.6B manifest a fresh planner run of
its header's command for its layout (the smallest covering signatures) writes the same
manifest and projects the same figures. Its serveConfigV2 must pass Ray's own Serve schema
with no key Ray would drop, build with our builder, and place: every bundle fits one TPU
worker pod's Ray resources, a host group is one whole slice, the mesh holds exactly the
replica's chips, and the label selector names the slice's pod type.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from app.builder import build_app, replica_placement
from cluster.niceness import NICENESS_ENV
from planning.emit import documents
from planning.plan import parse_args
from planning.serve_args import TPU_DROPPED, base_args
from replicas.settings import ReplicaSettings
from tests.support.background import Command
from tests.unit.test_serve_config import CONFIG, unknown_keys

ROOT = Path(__file__).resolve().parents[2]
# Last, after the Serve modules: the re-plan (about 370 CPU-s of TPU compiles) runs in the
# background all the while; run earlier, this module waited 110 s for it.
pytestmark = pytest.mark.after_serve
MANIFESTS = sorted((ROOT / "cluster" / "manifests").glob("*.yaml"))
TPU_KEYS = {
    "model",
    "dtype",
    "mesh_shape",
    "batch_buckets",
    "warmup_batch_sizes",
    "max_request_tokens",
    "host_resources",
    "hosts_per_replica",
    "placement_group_strategy",
    "host_label_selector",
    "tpu_slice",
    *TPU_DROPPED,  # the shipped args a TPU replica leaves at their defaults
}
COMMAND = re.compile(r"^# Written by the planner: python -m planning\.plan (?P<args>.+)$", re.M)
REQUESTS = re.compile(r"at (?P<n>\d+) requests per step")
REPLANNED = "rayservice-v6e-16-qwen3-0.6b.yaml"
FIGURES = re.compile(r"(?P<items>[\d.]+) items/s per slice, step latency (?P<ms>[\d.]+) ms")


def body(text: str) -> str:
    """The manifest after its header comments."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return "\n".join(lines[start:])


def figures(text: str) -> tuple[float, float]:
    match = FIGURES.search(text)
    assert match, "the header states no projected figures"
    return float(match["items"]), float(match["ms"])


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = yaml.safe_load(path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    return manifest, yaml.safe_load(manifest["spec"]["serveConfigV2"])


def worker_node(group: dict[str, Any]) -> dict[str, float]:
    """The Ray resources a TPU worker pod of this group starts with."""
    (container,) = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    return {"CPU": float(limits["cpu"]), "TPU": float(limits["google.com/tpu"])}


def without_outputs(args: list[str]) -> list[str]:
    """A planner command's options less the files it wrote and the layout filter."""
    kept = []
    for arg, previous in zip(args, [None, *args], strict=False):
        if arg not in ("--emit", "--emit-serve", "--mesh") and previous not in (
            "--emit",
            "--emit-serve",
            "--mesh",
        ):
            kept.append(arg)
    return kept


def stated_plan(path: Path) -> tuple[argparse.Namespace, dict[str, Any], dict[str, Any]]:
    """The planner options, meta and winner row a manifest's header and layout state."""
    text = path.read_text()
    command = COMMAND.search(text)["args"]
    options = parse_args(shlex.split(command))
    manifest, serve_config = load(path)
    args = serve_config["applications"][0]["args"]
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    hosts, chips = group["numOfHosts"], group["numOfHosts"] * worker_node(group)["TPU"]
    items, ms = figures(text)
    meta = {
        "topology": options.topology,
        "model": options.model,
        "slices": options.slices,
        "hosts": hosts,
        "chips": int(chips),
        "workload": list(options.workload),
        "command": f"python -m planning.plan {command}",
    }
    replica_chips = math.prod(args["mesh_shape"])
    row = {
        "chips_per_replica": replica_chips,
        "hosts_per_replica": args["hosts_per_replica"],
        "mesh": args["mesh_shape"],
        "replicas_per_slice": int(chips) // replica_chips,
        "items_per_s_per_slice": items,
        "step_latency_s": ms / 1e3,
        "requests_per_step": int(REQUESTS.search(text)["n"]),
    }
    return options, meta, row


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_is_the_planners_output_for_the_layout_it_states(path: Path) -> None:
    options, meta, row = stated_plan(path)
    assert options.emit == f"cluster/manifests/{path.name}"
    _, manifest = documents(meta, row, base_args(None), options.served_model)
    assert manifest == path.read_text()


def background_commands(folder: Path) -> dict[str, Command]:
    """The smallest manifest's planner command re-run for its own layout (no winner check),
    started in the background when collection ends (tests/support/background.py): compiling the 8B
    and 70B layouts again would take CI 5 more minutes (docs/cluster.md)."""
    path = ROOT / "cluster" / "manifests" / REPLANNED
    args = without_outputs(shlex.split(COMMAND.search(path.read_text())["args"]))
    mesh = ",".join(str(n) for n in load(path)[1]["applications"][0]["args"]["mesh_shape"])
    out = folder / path.name
    command = [sys.executable, "-m", "planning.plan", *args, "--mesh", mesh]
    # The figures and the body come from the projection; the layout's fit (two compiles of its
    # largest steps, 69 of the re-plan's 114 CPU-s) is the planner's, not the header's.
    command += ["--no-verify-winner", "--no-fit", "--emit", str(out)]
    return {"replan": Command(tuple(command), out)}


@pytest.fixture(scope="module")
def replanned(background: dict) -> tuple[Path, str]:
    done = background["replan"].result(timeout_s=900)
    assert done.returncode == 0, done.stdout
    return ROOT / "cluster" / "manifests" / REPLANNED, done.out.read_text()


@pytest.mark.deep
def test_a_fresh_planner_run_projects_the_figures_a_header_states(
    replanned: tuple[Path, str],
) -> None:
    path, fresh = replanned
    shipped = path.read_text()
    assert body(fresh) == body(shipped)
    items, ms = figures(shipped)
    fresh_items, fresh_ms = figures(fresh)
    assert fresh_items == pytest.approx(items, rel=0.01)
    assert fresh_ms == pytest.approx(ms, rel=0.01)


def test_manifests_cover_a_host_group_and_replicas_within_a_host() -> None:
    hosts = sorted(
        ReplicaSettings.from_mapping(
            load(p)[1]["applications"][0]["args"]
        ).placement.hosts_per_replica
        for p in MANIFESTS
    )
    assert len(hosts) == 3 and hosts[0] == 1 and hosts[-1] > 1


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
def test_every_replica_fits_a_worker_and_the_replicas_use_every_chip(path: Path) -> None:
    manifest, serve_config = load(path)
    (app,) = serve_config["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    node, hosts, slices = worker_node(group), group["numOfHosts"], group["replicas"]
    bundle = settings.placement.host_bundle
    assert all(node.get(name, 0) >= amount for name, amount in bundle.items()), bundle
    chips = math.prod(settings.placement.mesh_shape)
    assert chips == settings.placement.hosts_per_replica * bundle["TPU"]
    selector = group["template"]["spec"]["nodeSelector"]
    topology = selector["cloud.google.com/gke-tpu-topology"]
    slice_chips = math.prod(int(n) for n in topology.split("x"))
    assert slice_chips == hosts * node["TPU"]
    assert dict(settings.placement.host_label_selector) == {
        "ray.io/tpu-pod-type": f"v6e-{slice_chips}"
    }
    placement = replica_placement(settings)
    if settings.placement.hosts_per_replica > 1:  # a host group is a whole slice, reserved at start
        assert settings.placement.hosts_per_replica == hosts
        assert settings.placement.tpu_slice == f"v6e:{topology}"
        assert "placement_group_bundles" not in placement
    else:  # replicas tile a host
        assert node["TPU"] % bundle["TPU"] == 0
        assert placement["ray_actor_options"]["resources"]["TPU"] == bundle["TPU"]
    (replica,) = [d for d in app["deployments"] if d["name"] == "ScoringReplica"]
    assert replica["autoscaling_config"]["max_replicas"] * chips == slices * slice_chips


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_pod_starts_ray_with_worker_niceness_zero(path: Path) -> None:
    manifest, _ = load(path)
    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {item["name"]: item["value"] for item in container.get("env", [])}
            assert env.get(NICENESS_ENV) == "0", (path.name, container["name"])
