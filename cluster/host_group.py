"""Host groups: one scoring replica as several JAX processes ("hosts") on one global mesh.

The replica actor is the leader, JAX process 0. It starts ``hosts - 1`` follower actors in its
own placement group (bundle ``i`` for process ``i``; Serve reserves the group per replica from
the deployment's ``placement_group_bundles``), bootstraps ``jax.distributed`` with the
coordinator on its own node, and from then on every host runs the same calls in the same
order: ``step(method, args, local)`` numbers the call, sends it to every follower, runs
``local`` on the leader and waits for all of them, each within ``timeout_s`` (or the longer
limit the caller gives a step that compiles). A follower that sees a gap in the numbering
fails loudly. A host that dies or stalls breaks the group for good: every later call raises
``HostGroupError`` at once, and the replica's health check reports it, so Serve replaces the
replica and its placement group (followers are owned by the leader and die with it).

Knows nothing of scoring: the followers build their target from a ``"module:attribute"``
factory path, so this layer imports no model code.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger(__name__)
T = TypeVar("T")
HEARTBEAT_S = 10  # jax.distributed: a host silent this long is dead to the others


class HostGroupError(RuntimeError):
    """A host of the group died, did not answer in time, or went out of step."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def initialize_host(coordinator: str, num_hosts: int, process_id: int, timeout_s: float) -> None:
    """Join the group's ``jax.distributed`` job; before anything touches a jax device.

    CPU collectives go through gloo; platforms with their own collectives (TPU ICI, NCCL)
    ignore that setting. Every value is passed explicitly, so no cluster auto-detection runs.
    """
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_hosts,
        process_id,
        initialization_timeout=max(int(timeout_s), 1),
        heartbeat_timeout_seconds=HEARTBEAT_S,
    )


def host_identity(process_id: int) -> dict[str, Any]:
    """Which process and node a host is (for stats and operators)."""
    return {"process": process_id, "node": ray.util.get_node_ip_address(), "pid": os.getpid()}


def load_factory(path: str) -> Callable[..., Any]:
    """``"module:attribute"`` -> the attribute (a class or a function); the attribute may
    be dotted (``"module:Class.from_settings"``)."""
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target


def actor_resources(bundle: Mapping[str, float]) -> dict[str, Any]:
    """``ray_actor_options`` that take exactly one bundle of Ray resource names."""
    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0)}
    return {**options, "resources": rest} if rest else options


def check_placement_fits(
    num_hosts: int, bundle: Mapping[str, float], strategy: str, nodes: Sequence[Mapping]
) -> None:
    """Fail start-up, naming the settings, when the live ``nodes`` (``ray.nodes()``) cannot
    hold a group (its placement group would wait forever): no node holds one bundle, or
    STRICT_SPREAD asks for more nodes than hold one. Nodes an autoscaler has not started yet
    are not counted."""
    totals = [node.get("Resources", {}) for node in nodes if node.get("Alive")]
    fitting = sum(all(t.get(k, 0) >= v for k, v in bundle.items()) for t in totals)
    if not fitting:
        raise HostGroupError(
            f"host_resources: {dict(bundle)} fits no node of this Ray cluster "
            f"(node resources: {totals})"
        )
    if strategy == "STRICT_SPREAD" and fitting < num_hosts:
        raise HostGroupError(
            f"hosts_per_replica: {num_hosts} hosts with placement_group_strategy: STRICT_SPREAD "
            f"need {num_hosts} nodes that each hold host_resources {dict(bundle)}; this cluster "
            f"has {fitting}"
        )


@ray.remote(max_restarts=0, max_concurrency=2)  # a ping is answered while a step runs
class FollowerHost:
    """JAX process ``i`` of a host group: builds its target, then runs numbered steps."""

    def __init__(self) -> None:
        self._target: Any = None
        self._step = 0

    def start(
        self,
        coordinator: str,
        num_hosts: int,
        process_id: int,
        factory: str,
        settings: Any,
        timeout_s: float,
    ) -> dict[str, Any]:
        initialize_host(coordinator, num_hosts, process_id, timeout_s)
        self._target = load_factory(factory)(settings)
        return host_identity(process_id)

    def step(self, number: int, method: str, args: tuple[Any, ...]) -> Any:
        if number != self._step + 1:
            raise HostGroupError(f"follower out of step: got step {number} after {self._step}")
        self._step = number
        return getattr(self._target, method)(*args)

    def ping(self) -> int:
        return self._step


class HostGroup:
    """The leader's side of a host group of ``num_hosts`` hosts, each one ``bundle``."""

    def __init__(self, num_hosts: int, bundle: Mapping[str, float], timeout_s: float) -> None:
        group = get_current_placement_group()
        if group is None:
            raise HostGroupError(
                f"hosts_per_replica: {num_hosts} hosts need the replica to run in a placement "
                "group (the app builder derives placement_group_bundles from this setting)"
            )
        self._timeout_s = timeout_s
        self._number = 0
        self._broken = ""
        self.members: list[dict[str, Any]] = []  # host_identity of every host, once started
        self._local = concurrent.futures.ThreadPoolExecutor(1, "scorejax-host-step")
        self._followers = [
            FollowerHost.options(
                **actor_resources(bundle),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=index
                ),
            ).remote()
            for index in range(1, num_hosts)
        ]

    @property
    def num_hosts(self) -> int:
        return len(self._followers) + 1

    def start(self, factory: str, settings: Any, local: Callable[[], T]) -> T:
        """Bootstrap jax.distributed on every host, build every follower's target from
        ``factory(settings)`` and the leader's with ``local()``, all at once."""
        coordinator = f"{ray.util.get_node_ip_address()}:{free_port()}"
        hosts, timeout = self.num_hosts, self._timeout_s
        refs = [
            follower.start.remote(coordinator, hosts, index, factory, settings, timeout)
            for index, follower in enumerate(self._followers, start=1)
        ]
        initialize_host(coordinator, hosts, 0, timeout)
        result = local()
        self.members = [host_identity(0), *self._wait(refs, "start-up")]
        return result

    def step(
        self,
        method: str,
        args: tuple[Any, ...],
        local: Callable[[], T],
        timeout_s: float | None = None,
    ) -> tuple[T, list]:
        """Run ``method(*args)`` on every follower and ``local()`` on the leader as step n,
        each host within ``timeout_s`` (unset: the group's); returns the leader's result and
        the followers' replies."""
        if self._broken:
            raise HostGroupError(self._broken)
        limit = self._timeout_s if timeout_s is None else timeout_s
        self._number += 1
        label = f"step {self._number} ({method})"
        refs = [f.step.remote(self._number, method, args) for f in self._followers]
        future = self._local.submit(local)
        try:
            result = future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            self._break(f"{label}: the leader did not finish within {limit:g} s")
        except Exception as error:  # hosts may have diverged: never step this group again
            self._break(f"{label}: the leader failed: {error!r}")
        replies = self._wait(refs, label, limit)
        return result, replies

    def check(self) -> None:
        """Raise HostGroupError unless every follower answers a ping in time."""
        if self._broken:
            raise HostGroupError(self._broken)
        self._wait([f.ping.remote() for f in self._followers], "health check")

    def fail(self, reason: str) -> None:
        """Break the group (hosts went out of step); raises HostGroupError."""
        self._break(reason)

    def _wait(self, refs: Sequence[Any], label: str, timeout_s: float | None = None) -> list:
        limit = self._timeout_s if timeout_s is None else timeout_s
        try:
            return ray.get(list(refs), timeout=limit)
        except ray.exceptions.GetTimeoutError:
            self._break(f"{label}: a follower host did not answer within {limit:g} s")
        except ray.exceptions.RayError as error:
            self._break(f"{label}: a follower host failed: {error}")
        raise AssertionError("unreachable")

    def _break(self, reason: str) -> None:
        self._broken = reason
        logger.error("host group broken: %s", reason)
        raise HostGroupError(reason)
