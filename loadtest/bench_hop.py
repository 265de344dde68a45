"""Benchmark: where a small request's time goes between the client and the engine (issue 61).

    python -m loadtest run hop --url http://127.0.0.1:8000 [--repeats 40] [--no-floor]

Against a running ``make serve`` (the shipped serve_config.yaml), on this machine, idle
between requests (``--pause`` seconds, so each one meets an idle server), every probe once a
round in a shuffled order:

1. The routes: ``GET /v1/models`` (client, Serve's proxy, an ingress replica, answered
   there), ``GET /health`` (plus one handle call to the scoring replica, ``describe``) and the
   small request, ``POST /v1/score`` (a 9-token query, items ``""`` and ``" not"``, 3 labels).
   Beside them Ray Serve's own floor (loadtest.hop_floor, deployed on the same cluster and
   proxy unless ``--no-floor``): a FastAPI ingress answering a constant, and one awaiting a
   handle call to a deployment that returns its argument.
2. The small request split by the ingress's timing headers, per request then the medians:
   the client and Serve's proxy (the client's time less ``x-total-time``), the ingress's own
   work (``x-total-time`` less tokenization, queue and inference), tokenization, the queue
   (the handle call, the replica's admission and batching, the step thread) and inference (the
   engine call as the replica times it); the hop is all but inference.
3. The ingress's code alone: the same request to the ingress's FastAPI app in this process
   (``httpx.ASGITransport``), its replica answering at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from typing import Any

import httpx
import numpy as np

from loadtest.harness import LABELS, Option, Result, Run, Workload, col, table, timed_together

QUERY = "Is Paris the capital of France? Answer:"  # loadtest.bench_small's small request
ITEMS = ["", " not"]
SMALL = {"query": QUERY, "items": ITEMS, "label_token_ids": list(LABELS)}
HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def split(replies: list[tuple[float, httpx.Headers]]) -> dict[str, float]:
    """Median ms of each part of the small request's time (module docstring, 2.)."""
    parts: dict[str, list[float]] = {k: [] for k in ("client", "proxy", "ingress", "tok", "queue",
                                                     "inference", "hop")}  # fmt: skip
    for seconds, headers in replies:
        total, tok, queue, inference = (float(headers[name]) for name in HEADERS)
        client = seconds * 1e3
        parts["client"].append(client)
        parts["proxy"].append(client - total)
        parts["ingress"].append(total - tok - queue - inference)
        parts["tok"].append(tok)
        parts["queue"].append(queue)
        parts["inference"].append(inference)
        parts["hop"].append(client - inference)
    return {k: statistics.median(v) for k, v in parts.items()}


def in_process_ingress(repeats: int) -> dict[str, float]:
    """Median ms of ``/v1/models`` and the small request to the ingress's FastAPI app in this
    process, its replica answering at once (the shipped settings' tokenizer)."""
    from app.http import ACCESS_LOG, build_api
    from app.service import ScoringService
    from loadtest.bench_common import shipped_settings
    from replicas.contract import ScoredWork

    async def replica(work: Any) -> ScoredWork:
        shape = (len(work.item_ids), len(work.label_ids))
        return ScoredWork(np.full(shape, -1.0, np.float32), 0.0, True)

    async def healthy() -> None:
        return None

    logging.getLogger(ACCESS_LOG).setLevel(logging.WARNING)  # a line per request otherwise
    service = ScoringService.from_settings(shipped_settings(), None)
    api = build_api(service, replica, healthy, set_request_id=False)

    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://ingress")
    ok = lambda reply: loop.run_until_complete(reply).raise_for_status()  # noqa: E731
    calls = {
        "models": lambda: ok(client.get("/v1/models")),
        "score": lambda: ok(client.post("/v1/score", json=SMALL)),
    }
    try:  # each request one turn of the loop (its turn timed with it)
        return {name: s * 1e3 for name, s in timed_together(calls, repeats, warm=5).items()}
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


def served(url: str, repeats: int, pause_s: float, floor: bool) -> dict[str, Any]:
    """Median ms of each route over HTTP, and the small request's replies (for ``split``)."""
    replies: list[tuple[float, httpx.Headers]] = []
    with httpx.Client(base_url=url, timeout=60) as client:

        def small() -> None:
            start = time.perf_counter()
            reply = client.post("/v1/score", json=SMALL).raise_for_status()
            replies.append((time.perf_counter() - start, reply.headers))

        calls = {
            "models": lambda: client.get("/v1/models").raise_for_status(),
            "health": lambda: client.get("/health").raise_for_status(),
            "score": small,
        }
        if floor:
            calls["floor constant"] = lambda: client.get("/hop-floor/constant").raise_for_status()
            calls["floor handle"] = lambda: client.get("/hop-floor/handle").raise_for_status()
        seconds = timed_together(calls, repeats, warm=3, shuffle=True, pause_s=pause_s)
    routes = {name: s * 1e3 for name, s in seconds.items()}
    return {"routes": routes, "split": split(replies[-repeats:])}


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    if not o.url:
        raise SystemExit("hop: --url (a running make serve) is required")
    if o.floor:
        import ray

        from loadtest.hop_floor import deploy_floor

        run.say("deploying Serve's floor app beside the server")
        ray.init(address="auto", log_to_driver=False)
        deploy_floor()
    try:
        run.say("the routes over HTTP")
        over_http = served(o.url, o.repeats, o.pause, o.floor)
    finally:
        if o.floor:
            from loadtest.hop_floor import delete_floor

            delete_floor()
    run.say("the ingress in this process")
    local = in_process_ingress(max(o.repeats, 100))
    return [report(o, run, over_http, local)]


ROUTES = (
    ("models", "`GET /v1/models`", "client, Serve's proxy, an ingress replica (answers)"),
    ("health", "`GET /health`", "the same, plus a handle call to the scoring replica"),
    ("score", "`POST /v1/score`, the small request", "everything: the engine step too"),
    ("floor constant", "Serve alone: an ingress answering a constant", "client, proxy, ingress"),
    ("floor handle", "Serve alone: the same awaiting one handle call", "plus one handle hop"),
)
PARTS = (
    ("proxy", "the client and Serve's proxy (client less `x-total-time`)"),
    ("ingress", "the ingress's own work: frame, validation, work, JSON (the rest of the total)"),
    ("tok", "tokenization (`x-tokenization-time`)"),
    ("queue", "the handle call, admission, batching, the step thread (`x-queue-time`)"),
    ("inference", "the engine call as the replica times it (`x-inference-time`)"),
    ("hop", "the hop: all but inference"),
    ("client", "the request, as the client times it"),
)


def report(o: argparse.Namespace, run: Run, over_http: dict, local: dict) -> Result:
    routes = over_http["routes"]
    route_rows = [(label, crosses, routes.get(key)) for key, label, crosses in ROUTES]
    part_rows = [(label, over_http["split"][key]) for key, label in PARTS]
    local_rows = [
        ("`GET /v1/models`", local["models"]),
        ("`POST /v1/score`, the small request", local["score"]),
    ]
    text = [col("route", left=True), col("crosses", left=True), col("median ms", ".1f")]
    tables = [
        table(text, route_rows, title="Routes over HTTP, medians in turn"),
        table([col("part", left=True), col("median ms", ".1f")], part_rows,
              title="The small request's time by its timing headers (whole ms each)"),
        table([col("route", left=True), col("median ms", ".2f")], local_rows,
              title="The ingress's code alone: its FastAPI app in process, the replica instant"),
    ]  # fmt: skip
    notes = [
        f"against `make serve` (shipped serve_config.yaml, SmolLM2-135M-Instruct, float32) at "
        f"{o.url}; {o.repeats} shuffled rounds, each request after {o.pause} s idle",
        "Serve's floor app (loadtest.hop_floor) deployed on the same cluster and proxy"
        if o.floor
        else "Serve's floor app not deployed (--no-floor)",
    ]
    figures = {"routes_ms": routes, "split_ms": over_http["split"], "in_process_ms": local}
    title = "A small request's hop: client to engine and back (issue 61)"
    return run.result(title, tables, key="hop", notes=notes, figures=figures)


WORKLOAD = Workload(
    options=(
        Option("--repeats", 40),
        Option("--pause", 0.05, "idle seconds before each request"),
        Option("--no-floor", True, "do not deploy Serve's floor app beside the server"),
    ),
    measure=measure,
    url=True,
)
