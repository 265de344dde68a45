"""Helpers for tests against a real, in-process Ray Serve: start, deploy, poll, stop.

One small local Ray cluster per test session (``ray_serve_session`` in conftest.py: a start costs
about 15 s), used by one module at a time through ``serve_cluster``, which deletes every app the
module deployed when it ends. The modules that use it carry ``RAY_SERVE``; conftest.py runs them
after every other test, so the rest of the suite never sees a Ray cluster (``build_app`` checks
placement against one when it is up). Readiness is always polled, never slept for.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
RAY_SERVE = pytest.mark.ray_serve  # the modules of the session's cluster (conftest.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as error:  # a server that is still starting may refuse or reset
            last = error
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


@dataclass(frozen=True)
class ServeCluster:
    http_url: str
    metrics_url: str = ""  # the node's Prometheus endpoint (Ray's metrics export port)

    def client(self, timeout_s: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.http_url, timeout=timeout_s)

    def deploy(self, app: Any, name: str, route_prefix: str | None) -> Any:
        """``serve.run`` (returns once every replica is RUNNING), then poll HTTP health."""
        from ray import serve

        handle = serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
        if route_prefix is not None:
            prefix = route_prefix.rstrip("/")
            with self.client(10) as client:
                wait_for(
                    lambda: client.get(f"{prefix}/health").status_code == 200,
                    120,
                    f"{name} health",
                )
        return handle

    def deploy_many(self, apps: list[tuple[Any, str, str | None]]) -> None:
        """Several (app, name, route_prefix) at once (their replicas start side by side), then
        poll each routed one's HTTP health."""
        from ray import serve

        serve.run_many([serve.RunTarget(app, name, prefix) for app, name, prefix in apps])
        with self.client(10) as client:
            for _, name, prefix in apps:
                if prefix is not None:
                    path = f"{prefix.rstrip('/')}/health"
                    wait_for(lambda p=path: client.get(p).status_code == 200, 120, f"{name} health")

    def deploy_config(self, config: dict[str, Any], app_name: str, health_path: str) -> None:
        """Deploy a serve_config-style dict the way `serve run/deploy <file>` does."""
        from ray import serve
        from ray.serve.schema import ServeDeploySchema

        client = serve.context._get_global_client()
        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=False)
        with self.client(10) as http:
            wait_for(lambda: http.get(health_path).status_code == 200, 180, f"{app_name} health")
        wait_for(lambda: app_status(app_name) == "RUNNING", 60, f"{app_name} RUNNING")


def app_status(app_name: str) -> str | None:
    from ray import serve

    status = serve.status().applications.get(app_name)
    return None if status is None else status.status.value


# Each node's dashboard agent collects every Ray process's CPU and memory (psutil) for the
# dashboard every 5 s; nothing here reads them (the Prometheus test reads scorejax's own
# metrics, which the agent exports as they come). Every minute instead (docs/testing.md).
NODE_ENV = {"REPORTER_UPDATE_INTERVAL_MS": "60000"}


def worker_env() -> dict[str, str]:
    """What a test cluster's workers need beyond this process's environment: the repository
    on PYTHONPATH (first, once) and the hub off."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *(p for p in paths if p != str(ROOT))]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


SESSION_SYSTEM_CONFIG = {
    "worker_niceness": 0,  # as make serve starts Ray (cluster/niceness.py)
    # An idle worker is kept a minute, not a second: the suite's jobs and deployments come
    # one after another, and each worker Ray starts again is a Python process importing Ray.
    "idle_worker_killing_time_threshold_ms": 60_000,
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}


def start_cluster(num_cpus: int = 2) -> ServeCluster:
    """A local Ray cluster with Serve. Its workers get this process's environment (the run's
    XLA flags and compilation cache, conftest.py) with the repository on PYTHONPATH and the
    hub off: ``ray.init`` starts the raylet from this process and the raylet every worker.
    Not through a job ``runtime_env``: with one, each worker starts as ``setup_worker.py``, a
    Python process importing Ray that then executes the worker, 1-4 CPU-s more a worker."""
    import ray
    from ray import serve

    os.environ.update(worker_env(), **NODE_ENV)
    metrics_port = free_port()
    ray.init(
        address="local",  # a new cluster, never one another worker's test started here
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=metrics_port,
        _system_config=SESSION_SYSTEM_CONFIG,
    )
    # Ray's log monitor tails every worker's log files ten times a second to forward their
    # lines to a driver; with log_to_driver off it forwards nothing, and over a run it took
    # 36 CPU-s (docs/testing.md). Ray's own tests stop it the same way.
    ray._private.worker._global_node.kill_log_monitor()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    node_ip = ray.util.get_node_ip_address()
    return ServeCluster(f"http://127.0.0.1:{port}", f"http://{node_ip}:{metrics_port}/metrics")


def stop_cluster() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def delete_apps() -> None:
    """Delete every Serve application (blocking until its replicas are gone)."""
    from ray import serve

    for name in list(serve.status().applications):
        serve.delete(name)


@pytest.fixture(scope="module")
def serve_cluster(ray_serve_session: ServeCluster) -> Iterator[ServeCluster]:
    """The session's cluster for one module; the module's apps are deleted when it ends."""
    try:
        yield ray_serve_session
    finally:
        delete_apps()


def replica_stats(app_name: str) -> dict[str, Any]:
    from ray import serve

    handle = serve.get_deployment_handle("ScoringReplica", app_name)
    return handle.stats.remote().result(timeout_s=60)


def running_replicas(app_name: str, deployment: str = "ScoringReplica") -> int:
    from ray import serve

    status = serve.status().applications[app_name].deployments[deployment]
    return int(status.replica_states.get("RUNNING", 0))
