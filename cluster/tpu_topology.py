"""TPU slices without the hardware: compile-only devices from libtpu, chip figures, hosts.

``jax.experimental.topologies.get_topology_desc`` gives the devices of a slice (every host's)
on a CPU machine when libtpu is present. The set-up installs libtpu beside the venv
(``.venv/libtpu``, compile-only) so that no other process of this project loads it;
``prepare_environment`` points JAX at it and keeps libtpu from probing for real TPUs. It must
run before ``jax`` is imported.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class ChipSpec:
    """Published per-chip figures: HBM bytes, dense bf16 FLOP/s, HBM bytes/s, and the
    chip's bidirectional inter-chip interconnect (ICI) bytes/s."""

    name: str
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    ici_bandwidth: float
    int8_peak_flops: float = 0.0
    """Dense int8 OP/s of the MXU (s8 x s8 -> s32); 0: no faster than ``peak_flops``."""

    @property
    def int8_peak(self) -> float:
        return max(self.int8_peak_flops, self.peak_flops)


# Keyed by the device_kind libtpu reports. Peaks: Google Cloud's TPU pages (v6e 918 bf16
# TFLOP/s, 1640 GB/s; v5e 197 TFLOP/s, 819 GB/s; v5p 459 TFLOP/s, 2765 GB/s; v4 275 TFLOP/s,
# 1228 GB/s). ICI, the same pages' "bidirectional inter-chip interconnect bandwidth (per
# chip)": v6e 800 GB/s, v5e 400 GB/s, v5p 1200 GB/s; v4 states none per chip, its pod's
# all-reduce bandwidth (1.1 PB/s over 4096 chips) gives 268 GB/s. int8, the same pages:
# v6e 1836 TOP/s, v5e 394 TOP/s, v5p 918 TOP/s (twice bf16); v4 none faster than bf16.
CHIPS: dict[str, ChipSpec] = {
    "TPU v6 lite": ChipSpec("v6e", 32 * GIB, 918e12, 1640e9, 800e9, 1836e12),
    "TPU v5 lite": ChipSpec("v5e", 16 * GIB, 197e12, 819e9, 400e9, 394e12),
    "TPU v5": ChipSpec("v5p", 95 * GIB, 459e12, 2765e9, 1200e9, 918e12),
    "TPU v4": ChipSpec("v4", 32 * GIB, 275e12, 1228e9, 268e9),
}


class TopologyError(ValueError):
    """The topology or libtpu cannot be used; the message names the option."""


def libtpu_path(explicit: str | None = None) -> Path:
    """libtpu.so: ``--libtpu``, else ``TPU_LIBRARY_PATH``, else the compile-only copy beside
    the venv (``<venv>/libtpu/libtpu/libtpu.so``), else an installed ``libtpu`` package."""
    candidates = [explicit, os.environ.get("TPU_LIBRARY_PATH")]
    candidates.append(str(Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"))
    for candidate in filter(None, candidates):
        if Path(candidate).is_file():
            return Path(candidate)
    try:
        import libtpu  # type: ignore[import-not-found]
    except ImportError:
        raise TopologyError(
            "--libtpu: no libtpu.so found (make venv installs a compile-only copy in "
            ".venv/libtpu; or pip install 'jax[tpu]')"
        ) from None
    return Path(libtpu.get_library_path())


def prepare_environment(topology: str, libtpu: str | None = None) -> None:
    """Compile-only TPU: host computations on CPU, libtpu at a known path, no probing for
    TPU metadata (the values below only name the slice; nothing is contacted)."""
    if "jax" in sys.modules:
        raise TopologyError("prepare_environment must run before jax is imported")
    generation, _, shape = topology.partition(":")
    chips = 1
    for n in shape.split("x"):
        chips *= int(n) if n.isdigit() else 1
    os.environ["TPU_LIBRARY_PATH"] = str(libtpu_path(libtpu))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{generation}-{chips}")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no chip to share
    # libtpu logs to /tmp/tpu_logs by default, which a Ray node on this machine tails into
    # its driver's output; the compile logs go elsewhere.
    os.environ.setdefault("TPU_LOG_DIR", os.path.join(tempfile.gettempdir(), "scorejax-tpu-check"))


def topology_devices(topology: str) -> list[Any]:
    """The compile-only devices of every host of ``topology`` (e.g. ``v6e:4x4``)."""
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as error:  # libtpu names what it did not understand
        raise TopologyError(f"--topology: libtpu does not know {topology!r}: {error}") from error
    return list(description.devices)


def chip_spec(devices: Sequence[Any]) -> ChipSpec:
    kind = devices[0].device_kind
    if kind not in CHIPS:
        raise TopologyError(f"--topology: no chip figures for device kind {kind!r}")
    return CHIPS[kind]


def host_count(devices: Sequence[Any]) -> int:
    return len({d.process_index for d in devices})


def default_mesh_shape(devices: Sequence[Any]) -> tuple[int, int]:
    """``[hosts, chips per host]``: the model axis inside a host (fast ICI), data across."""
    hosts = host_count(devices)
    return hosts, len(devices) // hosts


def axes_crossing_hosts(mesh: Any) -> list[str]:
    """Mesh axes along which neighbouring devices belong to different hosts."""
    import numpy as np

    process = np.vectorize(lambda d: d.process_index)(mesh.devices)
    crossing = []
    for axis, name in enumerate(mesh.axis_names):
        if mesh.devices.shape[axis] > 1 and (np.diff(process, axis=axis) != 0).any():
            crossing.append(name)
    return crossing
