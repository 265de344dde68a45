"""The planner's winner as a KubeRay RayService manifest, or as a serve config.

The app is the shipped ``serve_config.yaml``'s with the TPU args
(``planning.serve_args.TPU_ARGS``) and the winner's layout over it: ``mesh_shape``,
``host_resources`` (the replica's chips of a host), ``hosts_per_replica`` and, for a host
group of a whole slice, ``tpu_slice`` (every host of one slice, through Ray's TPU slice
placement) and ``placement_group_strategy: STRICT_SPREAD``. The scoring replicas autoscale up
to what the slices hold. The header names the command that wrote the file and the winner's
projected figures (a projection, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from planning.serve_args import SERVE_CONFIG

GKE_ACCELERATORS = {
    "v6e": "tpu-v6e-slice",
    "v5e": "tpu-v5-lite-podslice",
    "v5p": "tpu-v5p-slice",
    "v4": "tpu-v4-podslice",
}
CORES_PER_CHIP = {"v4": 2, "v5p": 2}  # Ray's pod types count cores: v5p-8 is 4 chips
POD_CPUS = 8
REPLICA_CPUS_PER_HOST = 4  # the replicas of one host share these; the rest: Ray, the proxy


@dataclasses.dataclass(frozen=True)
class Slice:
    """The slice the manifest runs on."""

    generation: str
    """``v6e``, ``v5e``, ``v5p``, ``v4``."""
    shape: str
    """The topology, e.g. ``4x4``."""
    hosts: int
    """TPU VMs (Ray nodes) of one slice."""
    chips: int
    """Chips of one slice."""

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def pod_type(self) -> str:
        return f"{self.generation}-{self.chips * CORES_PER_CHIP.get(self.generation, 1)}"


def layout_args(row: dict[str, Any], tpu: Slice, served_model: str) -> dict[str, Any]:
    """The args a replica of the winner's layout changes."""
    hosts = row["hosts_per_replica"]
    chips = min(row["chips_per_replica"], tpu.chips_per_host)
    per_host = tpu.chips_per_host // chips
    args: dict[str, Any] = {
        "model": served_model,
        "mesh_shape": row["mesh"],
        "host_resources": {"TPU": chips, "CPU": max(1, REPLICA_CPUS_PER_HOST // per_host)},
        "hosts_per_replica": hosts,
        "placement_group_strategy": "STRICT_SPREAD" if hosts > 1 else "SPREAD",
        "host_label_selector": {"ray.io/tpu-pod-type": tpu.pod_type},
    }
    if hosts > 1 and hosts == tpu.hosts:  # a whole slice: pinned (cluster/slice_group.py)
        args["tpu_slice"] = f"{tpu.generation}:{tpu.shape}"
    return args


def serve_config(base: dict[str, Any], row: dict[str, Any], tpu: Slice, slices: int,
                 served_model: str) -> dict[str, Any]:  # fmt: skip
    """serve_config.yaml with the winner's app args and replica counts."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["http_options"]["host"] = "0.0.0.0"
    (app,) = config["applications"]
    app["args"] = base | layout_args(row, tpu, served_model)
    replicas = row["replicas_per_slice"] * slices
    for deployment in app["deployments"]:
        if deployment["name"] == "ScoringReplica":
            scaling = deployment["autoscaling_config"]
            scaling["min_replicas"] = min(replicas, max(1, slices))
            scaling["max_replicas"] = replicas
    return config


def rayservice(config: dict[str, Any], tpu: Slice, slices: int, name: str) -> dict[str, Any]:
    niceness = [{"name": "RAY_worker_niceness", "value": "0"}]  # cluster/niceness.py
    head = {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "2"},
        "template": {"spec": {"containers": [{
            "name": "ray-head", "image": "scorejax:latest", "env": niceness,
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                          "limits": {"cpu": "2", "memory": "8Gi"}},
            "ports": [{"containerPort": 6379, "name": "gcs"},
                      {"containerPort": 8265, "name": "dashboard"},
                      {"containerPort": 8000, "name": "serve"}],
        }]}},
    }  # fmt: skip
    pod = {"cpu": str(POD_CPUS), "memory": "64Gi", "google.com/tpu": str(tpu.chips_per_host)}
    workers = {
        "groupName": f"tpu-{tpu.pod_type}",
        "replicas": slices,
        "minReplicas": slices,
        "maxReplicas": slices,
        "numOfHosts": tpu.hosts,  # one Ray node per TPU VM of a slice
        "rayStartParams": {},
        "template": {"spec": {
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": GKE_ACCELERATORS[tpu.generation],
                "cloud.google.com/gke-tpu-topology": tpu.shape,
            },
            "containers": [{"name": "ray-worker", "image": "scorejax:latest", "env": niceness,
                            "resources": {"requests": pod, "limits": pod}}],
        }},
    }  # fmt: skip
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": dump(config),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "headGroupSpec": head,
                "workerGroupSpecs": [workers],
            },
        },
    }


class _Literal(str):
    """A string YAML writes as a ``|`` block."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> Any:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


def _flow_scalars(dumper: yaml.SafeDumper, value: list) -> Any:
    """A list of numbers or strings on one line (``[1, 16]``), others as blocks."""
    flat = all(isinstance(item, int | float | str) for item in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)


def dump(document: dict[str, Any]) -> str:
    dumper = type("Dumper", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})
    dumper.add_representer(_Literal, _literal)
    dumper.add_representer(list, _flow_scalars)
    spec = document.get("spec", {})
    if "serveConfigV2" in spec:
        spec["serveConfigV2"] = _Literal(spec["serveConfigV2"])
    return yaml.dump(document, Dumper=dumper, sort_keys=False, width=100)


def header(meta: dict[str, Any], row: dict[str, Any], tpu: Slice) -> str:
    query, items, item_tokens = meta["workload"]
    hosts = row["hosts_per_replica"]
    group = f"a host group of {hosts} hosts" if hosts > 1 else "within one host"
    return "\n".join([
        f"# scorejax serving {meta['model']} on {meta['slices']} TPU {tpu.pod_type} slice(s) "
        f"({tpu.hosts} host(s) x {tpu.chips_per_host} chips, topology {tpu.shape}).",
        f"# Written by the planner: {meta['command']}",
        f"# Layout: {row['chips_per_replica']} chip(s) per replica, {group}, mesh [data, model] "
        f"= {row['mesh']}, {row['replicas_per_slice']} replica(s) per slice.",
        f"# Projected for {meta['topology']} from compile-only executables and published chip "
        "figures, not measured:",
        f"#   {row['items_per_s_per_slice']:.1f} items/s per slice, step latency "
        f"{row['step_latency_s'] * 1e3:.4f} ms, at {row['requests_per_step']} requests per step",
        f"#   of a {query}-token query + {items} items of {item_tokens} tokens.",
        "# The app is the shipped serve_config.yaml's with the TPU args and this layout",
        "# (tests/engine/test_manifests.py re-plans it). The image is this repository installed",
        "# (`pip install .` plus the model files); replace `scorejax:latest`.",
        "",
    ])  # fmt: skip


def documents(meta: dict[str, Any], row: dict[str, Any], base: dict[str, Any],
              served_model: str | None = None) -> tuple[str, str]:  # fmt: skip
    """The winner's serve config and RayService manifest, each with its header."""
    generation, _, shape = meta["topology"].partition(":")
    tpu = Slice(generation, shape, meta["hosts"], meta["chips"])
    model = Path(meta["model"]).name
    config = serve_config(base, row, tpu, meta["slices"], served_model or f"/models/{model}")
    name = f"scorejax-{tpu.pod_type}-{model.lower().replace('.', '-')}"
    manifest = rayservice(config, tpu, meta["slices"], name)
    return header(meta, row, tpu) + dump(config), header(meta, row, tpu) + dump(manifest)


def write_outputs(options: argparse.Namespace, meta: dict[str, Any], row: dict[str, Any],
                  base: dict[str, Any]) -> None:  # fmt: skip
    serve, manifest = documents(meta, row, base, options.served_model)
    for path, text in ((options.emit_serve, serve), (options.emit, manifest)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
