"""Ray worker niceness: Serve's processes must not yield the CPU to every other process.

Ray starts its worker processes (Serve's proxy, the ingress and the scoring replicas) at
niceness 15 unless the cluster is started with ``RAY_worker_niceness=0``. Linux then gives a
niceness-0 process about 28 times their CPU share (weights 1024 against 36), so anything else
on the host (a load generator, a build, a neighbour) takes their cores first. Measured on the
2-core machine (docs/operations.md, "A busy neighbour"): two busy-looping
processes made a replica's request take 12-22 s instead of 0.8 s at niceness 15, and 2 s at
niceness 0. ``make serve`` and the cluster manifests start Ray with the variable; the ingress
and the replica warn at start-up when they run niced anyway.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
NICENESS_ENV = "RAY_worker_niceness"  # read by Ray's raylet when the cluster starts


def worker_niceness() -> int:
    """This process's niceness (0 is the default priority; higher yields the CPU)."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def niceness_warning(role: str) -> str | None:
    """A start-up warning for ``role`` when this process runs niced, else None."""
    niceness = worker_niceness()
    if niceness <= 0:
        return None
    return (
        f"the {role} runs at niceness {niceness} (Ray's worker default): any other busy "
        f"process on this host takes its CPU first, and steps can run 10-20x slower; start "
        f"the Ray cluster with {NICENESS_ENV}=0 in its environment (make serve does)"
    )


def warn_if_niced(role: str, log: logging.Logger) -> None:
    """Log ``niceness_warning(role)`` when there is one (the ingress and replica start-up)."""
    warning = niceness_warning(role)
    if warning:
        log.warning(warning)


def set_thread_niceness(niceness: int) -> None:
    """Lower the calling thread's priority to ``niceness`` (Linux niceness is per thread;
    raising it needs no privilege). Threads it starts inherit it."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)


def thread_niceness(native_id: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, native_id)


def start_compute_niced(niceness: int, start: Callable[[], T]) -> T:
    """``start()`` (what creates the compute runtime's thread pools: jax's backend) run in a
    thread of its own at ``niceness``, so every thread the runtime starts there inherits it,
    while this thread, the event loop's, keeps its own. A replica's step then yields the CPU
    to the processes that answer requests (Serve's proxy, the ingress) whenever they need it,
    and takes every cycle they leave. Run here when ``niceness`` <= this thread's."""
    if niceness <= thread_niceness(threading.get_native_id()):
        return start()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            set_thread_niceness(niceness)
            outcome.append(start())
        except BaseException as error:  # re-raised in the caller
            failure.append(error)

    thread = threading.Thread(target=run, name="scorejax-niced-start")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
