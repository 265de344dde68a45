"""cluster/manifests/jobs: the KubeRay RayJob that runs ``python -m batch score`` on a TPU slice.

Its entrypoint parses with the command's own parser; its ``--config`` is the planner-written
RayService manifest of the same slice and model, whose settings the engine actors take; it
starts one engine actor per replica of that layout, and they fill the slice's chips exactly on
hosts of its pod type; and its cluster is that RayService's cluster.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from batch.__main__ import parser
from batch.pipeline import engine_remote_args, settings_from_config

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "cluster" / "manifests" / "jobs").glob("*.yaml"))
IMAGE_ROOT = "/app/"  # where the image holds this repository (the manifest's header)


def test_every_rayjob_runs_the_batch_command_on_its_planned_layout() -> None:
    assert JOBS
    for path in JOBS:
        job = yaml.safe_load(path.read_text())
        assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
        spec = job["spec"]
        words = shlex.split(spec["entrypoint"])
        assert words[:3] == ["python", "-m", "batch"]
        args = parser().parse_args(words[3:])
        assert args.mode == "score" and args.checkpoint and args.input_format
        assert args.config.as_posix().startswith(IMAGE_ROOT)
        service_path = ROOT / args.config.as_posix().removeprefix(IMAGE_ROOT)
        service = yaml.safe_load(service_path.read_text())
        assert service["kind"] == "RayService"
        assert spec["rayClusterSpec"] == service["spec"]["rayClusterConfig"]

        settings = settings_from_config(service_path)
        assert settings.placement.hosts_per_replica == 1  # --engine local: one actor per replica
        actor = engine_remote_args(settings)
        (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
        (container,) = workers["template"]["spec"]["containers"]
        chips_per_host = int(container["resources"]["limits"]["google.com/tpu"])
        slice_chips = chips_per_host * workers["numOfHosts"] * workers["replicas"]
        assert args.replicas * actor["resources"]["TPU"] == slice_chips
        assert chips_per_host % actor["resources"]["TPU"] == 0  # a replica within one host
        topology = workers["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
        chips = topology_chips(topology)
        assert actor["label_selector"] == {"ray.io/tpu-pod-type": f"v6e-{chips}"}
        assert spec["shutdownAfterJobFinishes"] is True


def topology_chips(topology: str) -> int:
    """``"4x4"`` -> 16."""
    product = 1
    for side in topology.split("x"):
        product *= int(side)
    return product
