"""``python -m cluster.config_variant``: the shipped serve_config.yaml as a host group.

Prints serve_config.yaml with ``hosts_per_replica``, ``mesh_shape`` and ``host_resources``
changed and, for a CPU demo, ``JAX_NUM_CPU_DEVICES`` in the app's runtime env, so one 2-core
machine can run a 2-host replica (docs/cluster.md):

    python -m cluster.config_variant --hosts 2 --mesh 1,4 --cpu-devices 2 --host-cpus 0.5 \\
        > /tmp/two-hosts.yaml && .venv/bin/serve run /tmp/two-hosts.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

SHIPPED = Path(__file__).resolve().parents[1] / "serve_config.yaml"


def host_group_variant(
    hosts: int,
    mesh: tuple[int, int],
    host_cpus: float,
    cpu_devices: int | None = None,
    config: Path = SHIPPED,
) -> dict[str, Any]:
    """The config at ``config`` as ``hosts`` hosts of ``host_cpus`` CPUs on one ``mesh``."""
    data = yaml.safe_load(config.read_text())
    (app,) = data["applications"]
    app["args"].update(
        hosts_per_replica=hosts, mesh_shape=list(mesh), host_resources={"CPU": host_cpus}
    )
    if cpu_devices:
        app.setdefault("runtime_env", {}).setdefault("env_vars", {})["JAX_NUM_CPU_DEVICES"] = str(
            cpu_devices
        )
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--mesh", default="1,4", help="data,model")
    parser.add_argument("--host-cpus", type=float, default=0.5)
    parser.add_argument("--cpu-devices", type=int, default=None, help="JAX CPU devices per host")
    args = parser.parse_args(argv)
    data, model = (int(n) for n in args.mesh.split(","))
    variant = host_group_variant(args.hosts, (data, model), args.host_cpus, args.cpu_devices)
    yaml.safe_dump(variant, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
