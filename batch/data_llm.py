"""A Ray Data LLM processor pointed at a running scorejax app (docs/batch.md, "Ray Data LLM").

``ray.data.llm.ServeDeploymentProcessorConfig`` sends each row to a Serve deployment's
method as one request dict and reads the answer as the first item of an async generator;
the app's ingress has such methods (``score_stream``, ``rerank_stream``,
``classify_stream``: app/ingress.py). ``processor`` builds one that fills each request from
row columns and gives each row ``response`` (the route's body), ``error`` and
``error_message`` (a 400's reason and message). No vLLM: the processor only calls the app's
handle. One row is one request, so rows are never grouped by query (``python -m batch``
does that); it fits a pipeline that already uses ``ray.data.llm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.workloads import WORKLOADS
from batch.rows import plain

# The ingress methods with a Ray Data LLM twin (``<name>_stream``, app.ingress).
METHODS = tuple(workload.name for workload in WORKLOADS if workload.stream)
INGRESS = "ScoreIngress"  # the app's ingress deployment (app.ingress)


def request_of(
    row: Mapping[str, Any], fields: Mapping[str, str], shared: Mapping[str, Any]
) -> dict:
    """A request's fields: ``fields`` (request field -> row column) from the row, plus
    ``shared`` (the same for every row: labels, ``apply_softmax``, ...)."""
    values = {field: row[column] for field, column in fields.items()}
    return {name: plain(value) for name, value in (values | dict(shared)).items()}


def processor(
    method: str,
    fields: Mapping[str, str],
    shared: Mapping[str, Any] | None = None,
    app: str = "scorejax",
    batch_size: int = 64,
    concurrency: int = 1,
    keep: tuple[str, ...] = ("id",),
    num_cpus: float = 0.25,
) -> Any:
    """A ``ray.data.llm`` Processor (``processor(ds)`` is the scored dataset): each row's
    ``method`` (score, rerank, classify) answer from the app ``app``; output: the ``keep``
    columns, ``response``, ``error``, ``error_message``. ``num_cpus``: each of its tasks and
    caller actors (they only wait on the app; Ray Data's default of 1 CPU each would hold
    the CPUs a small cluster's replicas need)."""
    from ray.data.llm import ServeDeploymentProcessorConfig, build_processor

    if method not in METHODS:
        raise ValueError(f"method: one of {METHODS}, got {method!r}")
    config = ServeDeploymentProcessorConfig(
        deployment_name=INGRESS, app_name=app, batch_size=batch_size, concurrency=concurrency
    )
    shared = dict(shared or {})

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        request = request_of(row, fields, shared)
        kept = {name: plain(row[name]) for name in keep}
        return kept | {"method": f"{method}_stream", "request_kwargs": request}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        names = (*keep, "response", "error", "error_message")
        return {name: row.get(name) for name in names}

    light = {"num_cpus": num_cpus}
    built = build_processor(
        config,
        preprocess=preprocess,
        postprocess=postprocess,
        preprocess_map_kwargs=light,
        postprocess_map_kwargs=light,
    )
    for stage in built.stages.values():  # the ServeDeploymentStage's caller actors
        stage.map_batches_kwargs = stage.map_batches_kwargs | light
    return built
