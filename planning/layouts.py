"""The ways one TPU slice can be cut into scoring replicas.

A layout is how many chips one replica holds (1, 2 or 4 of a host's chips, or whole hosts),
the ``[data, model]`` mesh over them, and so how many replicas a slice holds. A replica of
several hosts is a host group (``hosts_per_replica``); a replica of part of a host shares the
host with others (``host_resources: {TPU: chips}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """One way to serve a slice."""

    chips_per_replica: int
    """Chips one replica's mesh holds."""
    hosts_per_replica: int
    """Hosts (TPU VMs, JAX processes) one replica spans; 1 for a replica within a host."""
    mesh: tuple[int, int]
    """The replica's ``[data, model]`` mesh; ``data * model == chips_per_replica``."""
    replicas_per_slice: int
    """Replicas the slice holds in this layout, every chip in one of them."""

    @property
    def name(self) -> str:
        return (
            f"{self.chips_per_replica} chip(s) x {self.replicas_per_slice}, mesh {list(self.mesh)}"
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def replica_sizes(chips: int, hosts: int) -> list[int]:
    """Chips per replica: each divisor of a host's chips, then each whole number of hosts
    that divides the slice's hosts."""
    per_host = chips // hosts
    return sorted({*divisors(per_host), *(per_host * h for h in divisors(hosts))})


def enumerate_layouts(chips: int, hosts: int) -> list[Layout]:
    """Every layout of a slice of ``chips`` chips on ``hosts`` hosts: each replica size with
    each ``[data, model]`` factorisation of it."""
    per_host = chips // hosts
    layouts = []
    for size in replica_sizes(chips, hosts):
        for model in divisors(size):
            layouts.append(
                Layout(size, max(1, size // per_host), (size // model, model), chips // size)
            )
    return layouts


def replica_devices(devices: Sequence[Any], layout: Layout) -> list[Any]:
    """The devices one replica of ``layout`` would hold, from a topology of exactly its
    hosts (``replica_shape``): its chips in process order (a replica within a host takes
    the first chips of host 0)."""
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return ordered[: layout.chips_per_replica]


def smaller_shapes(shape: str) -> list[str]:
    """Topologies inside ``shape`` (``"4x4"``), largest first, by halving one dimension at
    a time: ``4x4`` -> ``2x4``, ``4x2``, then ``2x2``, ``1x4``, ``4x1``, ..."""
    frontier, seen, order = [tuple(int(n) for n in shape.split("x"))], set(), []
    while frontier:
        dims = frontier.pop(0)
        for axis, n in enumerate(dims):
            if n % 2 == 0:
                half = (*dims[:axis], n // 2, *dims[axis + 1 :])
                if half not in seen:
                    seen.add(half)
                    order.append(half)
                    frontier.append(half)
    return ["x".join(str(n) for n in dims) for dims in order]


def replica_shape(shape: str, chips: int) -> list[str]:
    """Topologies of ``chips`` chips inside the slice ``shape``, squarest first: a replica
    is compiled for the devices of its own hosts. (libtpu refuses a computation over some of
    a topology's devices whose ids are not 0..n-1: host 0 of a v6e:4x4 holds ids 0, 1, 4, 5.)"""
    fitting = [s for s in smaller_shapes(shape) if _chips(s) == chips]
    return sorted(fitting, key=lambda s: max(int(n) for n in s.split("x")))  # squarest first


def _chips(shape: str) -> int:
    total = 1
    for n in shape.split("x"):
        total *= int(n)
    return total


def parse_mesh(text: str) -> tuple[int, int]:
    """``"1,4"`` -> ``(1, 4)``; a ValueError names ``--mesh``."""
    try:
        data, model = (int(n) for n in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh: expected DATA,MODEL such as 1,4, got {text!r}") from None
    if data < 1 or model < 1:
        raise ValueError(f"--mesh: both axes must be >= 1, got {text!r}")
    return data, model
