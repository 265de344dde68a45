"""loadtest.bench_batch's served runs: the shipped app on a Ray cluster of the bench's own, and
(b) ``batch --engine serve``, (c) one HTTP request per row, (c') one per query group.

The cluster is this process's private local one (``ray.init`` starts it, ``ray.shutdown``
ends it): other Ray clusters on the machine are never touched. The app is serve_config.yaml as
shipped, deployed through the Serve controller as ``serve run`` deploys it, on port 8000 when
that is free. Readiness is polled (GET /health), never slept for.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from loadtest.bench_batch_report import Rate, stat_rate, steady_items_per_s
from loadtest.bench_common import SERVE_CONFIG
from loadtest.client import Deadline, RetryingClient, Server, score_body
from loadtest.harness import LABELS, ROOT, timed_together

APP = "scorejax"
# Logical CPUs of the bench's cluster: the app holds 1.5 (the replica's 1, two ingresses'
# 0.25 each) and the batch job's tokenize, caller and score stages 0.25 each, so 2 would
# leave the job's last stage waiting; the machine's cores are shared either way.
SERVE_CLUSTER_CPUS = 4
CONCURRENCY = 4


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shipped_config(
    port: int, config: Path = SERVE_CONFIG, model: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """serve_config.yaml as ``serve.start``'s keyword arguments (its proxy and HTTP options,
    on ``port``) and the applications the controller deploys, ``model`` in place of the
    shipped one when given (the one setting a user changes to serve another model)."""
    text = yaml.safe_load(config.read_text())
    http = {**text.get("http_options", {}), "port": port}
    start = {"proxy_location": text.get("proxy_location"), "http_options": http}
    if model is not None:
        for app in text["applications"]:
            app["args"]["model"] = model
    return start, {"applications": text["applications"]}


@contextmanager
def local_cluster(num_cpus: int = 2, **extra: Any) -> Iterator[None]:
    """A new private local Ray cluster, never one `ray start` left running; shut down after.
    ``extra``: more of ``ray.init``'s arguments."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=512 * 1024**2, **extra)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


# Ray workers at niceness 0, as make serve starts Ray (cluster/niceness.py).
AS_SERVED = {"_system_config": {"worker_niceness": 0}}


@contextmanager
def serving(port: int = 8000, ready_timeout_s: float = 1800.0) -> Iterator[Callable[[str], str]]:
    """A private local Ray cluster for the shipped app: yields ``deploy(model)``, which
    (re)deploys the app serving ``model`` (None: the shipped one) on ``port`` when free and
    returns its URL once it answers /health; stops both after."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    port = port if port_is_free(port) else free_port()
    url = f"http://127.0.0.1:{port}"  # the shipped host; loopback either way
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started: list[bool] = []

    def deploy(model: str | None) -> str:
        start, apps = shipped_config(port, model=model)
        if started:
            serve.delete(APP)  # the last model's replica gone before the next loads
        else:
            serve.start(**start)
            started.append(True)
        client = serve.context._get_global_client()
        client.deploy_apps(ServeDeploySchema.model_validate(apps), _blocking=False)
        with Server(url, Deadline.after(ready_timeout_s + 60)) as server:
            server.wait_healthy(ready_timeout_s)
        return url

    with local_cluster(SERVE_CLUSTER_CPUS, runtime_env={"env_vars": env}, **AS_SERVED):
        try:
            yield deploy
        finally:
            serve.shutdown()


@contextmanager
def served_app(
    port: int = 8000, ready_timeout_s: float = 1800.0, model: str | None = None
) -> Iterator[str]:
    """The shipped app (serving ``model`` when given) on a private local Ray cluster
    (:func:`serving`); yields its URL; stops both after."""
    with serving(port, ready_timeout_s) as deploy:
        yield deploy(model)


def warm(url: str, bodies: Sequence[bytes]) -> None:
    """Untimed requests of each body's shape until its own signature is compiled (as
    loadtest.bench_serve warms), so the timed runs see the steady state."""
    with Server(url, Deadline.after(3600)) as server:
        for body in bodies:
            server.warm(body)


def stats(url: str) -> dict[str, Any]:
    with Server(url, Deadline.after(60)) as server:
        return server.stats()


def row_bodies(rows: Sequence[dict[str, Any]]) -> list[bytes]:
    """(c): one /v1/score body per row."""
    return [score_body(row["query"], [row["item"]]) for row in rows]


def group_bodies(rows: Sequence[dict[str, Any]]) -> list[bytes]:
    """(c'): one body per run of rows with the same query (rows sorted by query)."""
    bodies, at = [], 0
    while at < len(rows):
        end = at
        while end < len(rows) and rows[end]["query"] == rows[at]["query"]:
            end += 1
        bodies.append(score_body(rows[at]["query"], [row["item"] for row in rows[at:end]]))
        at = end
    return bodies


def http_rate(url: str, bodies: Sequence[bytes], items: int) -> Rate:
    """(c) or (c'): the bodies at concurrency 4, with the replica's counters around them."""
    client = RetryingClient(url, CONCURRENCY)
    try:
        before = stats(url)
        wall, retried = client.run(bodies)
        return stat_rate(items, wall, before, stats(url), retried_503=retried)
    finally:
        client.close()


def serve_batch_rate(url: str, rows: list[dict[str, Any]], settings: Any, batch_size: int) -> Rate:
    """(b): ``batch.score_dataset(..., EngineOptions(engine="serve"))`` on the app's cluster."""
    from batch.pipeline import EngineOptions

    before = stats(url)
    options = EngineOptions(batch_size=batch_size, engine="serve", app=APP)
    summary, marks, wall = timed_job(rows, settings, options)
    return stat_rate(
        summary.items,
        wall,
        before,
        stats(url),
        steady_items_per_s=steady_items_per_s(marks, wall),
        retried_503=summary.retried_503,
    )


def timed_job(rows: list[dict[str, Any]], settings: Any, options: Any) -> tuple[Any, list, float]:
    """``batch.score_dataset`` over ``rows`` with ``options``, consumed by the driver and
    timed once (harness.timed_together): the job's Summary (every row scored, else
    RuntimeError), each output block's arrival and the wall seconds from the first read to
    the last row."""
    import ray
    import ray.data

    from batch.grouping import shuffle_cost
    from batch.pipeline import score_dataset
    from batch.rows import ScoreColumns
    from batch.summary import Summary, Tally

    tally = ray.remote(Tally).options(num_cpus=0).remote()

    def job() -> tuple[Any, list]:
        source = ray.data.from_items(rows)
        ds = score_dataset(source, settings, ScoreColumns(LABELS), options, keep=(), tally=tally)
        return ds, arrivals(ds)

    timings = timed_together({"job": job}, 1, warm=0)
    (ds, marks), wall = timings.last["job"], timings["job"]
    summary = Summary.from_totals(ray.get(tally.totals.remote()) | shuffle_cost(ds), wall)
    check_complete(summary, len(rows))
    return summary, marks, wall


def arrivals(ds: Any) -> list[tuple[float, int]]:
    """Consume ``ds``: (arrival time, rows) of each output block as the driver gets it."""
    return [
        (time.perf_counter(), batch.num_rows)
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow")
    ]


def check_complete(summary: Any, rows: int) -> None:
    """Every row scored and none refused (the workload is valid), else RuntimeError."""
    if summary.rows != rows or summary.errors:
        raise RuntimeError(f"batch job: {summary.rows} of {rows} rows, errors {summary.errors}")
