"""The load driver's presets end to end (load, burst, first_minute, overload) against an
in-process fake server (uvicorn in a thread on a loopback port: /v1/score answers 200 to a
body with items, 400 to anything else; /v1/stats counts its answers), soak with this
process standing in for the Ray workers, and soak's mix of bodies. No Ray; a few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadtest import soak
from loadtest.client import RetryingClient
from loadtest.harness import run_workload
from loadtest.soak import Mix
from loadtest.soak_verdict import KINDS
from loadtest.workloads import workload
from tests.support.serve_support import wait_for


def fake_app(counters: dict[str, int]) -> Starlette:
    refused: set[str] = set()

    async def score(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
            items = body["items"]
            assert isinstance(items, list) and items
        except (ValueError, KeyError, TypeError, AssertionError, RecursionError):
            return JSONResponse({"reason": "invalid_request"}, status_code=400)
        if body.get("refuse_first") and body["query"] not in refused:  # the retrying client's
            refused.add(body["query"])
            return JSONResponse(
                {"reason": "overloaded"}, status_code=503, headers={"retry-after": "0"}
            )
        await asyncio.sleep(0.01)
        counters["steps"] += 1
        counters["useful_tokens"] += len(items)
        counters["computed_tokens"] += 2 * len(items)
        scores = [[0.5, 0.5] for _ in items]
        return JSONResponse({"scores": scores}, headers={"x-queue-time": "3"})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse({**counters, "compile_count": 0, "queued_works": 0})

    async def models(request: Request) -> JSONResponse:
        card = {"id": "fake", "vocab_size": 49152, "multi_item_scoring_delimiter": 0}
        return JSONResponse({"data": [card]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    return Starlette(
        routes=[
            Route("/v1/score", score, methods=["POST"]),
            Route("/v1/stats", stats),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    counters = {"steps": 0, "useful_tokens": 0, "computed_tokens": 0}
    server = uvicorn.Server(uvicorn.Config(fake_app(counters), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 10, "the fake server")
    yield url
    server.should_exit = True
    thread.join(10)
    sock.close()


def run(name: str, url: str, out: Path, *argv: str) -> tuple[int, dict]:
    """Run preset ``name``; its exit code and its one result's figures."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = run_workload(workload(name), ["--url", url, "--out", str(out), *argv])
    (path,) = out.glob("*.json")
    return code, json.loads(path.read_text())["figures"]


def test_load_counts_its_requests_and_the_fuzz_refusals(url: str, tmp_path: Path) -> None:
    code, figures = run("load", url, tmp_path, "--requests", "20", "--concurrency", "4",
                        "--fuzz", "30")  # fmt: skip
    loaded, fuzz = figures["tallies"]
    assert code == 0 and not figures["failed"]
    assert (loaded["requests"], loaded["status_200"], loaded["p50_queue_s"]) == (20, 20, 0.003)
    assert fuzz["requests"] == 30 and figures["fuzz_5xx_or_no_answer"] == 0


def test_burst_sends_every_small_request_at_once(url: str, tmp_path: Path) -> None:
    code, figures = run("burst", url, tmp_path, "--burst", "6")
    large, burst = figures["tallies"]
    assert code == 0 and figures["all_200"] and (large["requests"], burst["requests"]) == (1, 6)
    assert burst["max_late_s"] < 0.5 and figures["burst_steps"] >= 6


def test_first_minute_reads_the_stats_after_each_request(url: str, tmp_path: Path) -> None:
    code, figures = run("first_minute", url, tmp_path, "--seconds", "0.5")
    assert code == 0 and figures["requests"] >= 2
    assert figures["padding"] == pytest.approx(2.0)  # the fake computes twice what is useful


def test_overload_measures_capacity_then_each_client_kind(url: str, tmp_path: Path) -> None:
    code, figures = run("overload", url, tmp_path, "--capacity-requests", "4", "--requests",
                        "6", "--rate", "30", "--procs", "2")  # fmt: skip
    assert code == 0 and figures["capacity_rps"] > 0 and figures["healthy_after"]
    assert [t["label"] for t in figures["tallies"]] == ["pooled", "connection", "processes"]
    assert all(t["status_200"] == 6 and t["client_cpu_s"] >= 0 for t in figures["tallies"])


def test_soak_mix_names_each_bodys_kind_in_order() -> None:
    mix = Mix(0, 49152)
    bodies = [mix.body(i) for i in range(60)]
    assert len(mix.kinds) == 60 and set(mix.kinds) == set(KINDS)
    assert all(
        isinstance(b, bytes) == (k == "invalid") for b, k in zip(bodies, mix.kinds, strict=True)
    )
    pooled = Mix(0, 49152, pool=3)
    assert len({json.dumps(pooled.body(i), default=str) for i in range(30)}) <= 3


def test_soak_samples_its_workers_while_its_clients_run(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = [psutil.Process()]  # this process stands in for the Ray workers
    monkeypatch.setattr(soak, "serving_raylet", lambda port: None)
    monkeypatch.setattr(
        soak, "find_workers", lambda raylet: {"replica": me, "ingress": me, "proxy": []}
    )
    code, figures = run("soak", url, tmp_path, "--minutes", "0.05", "--sample-s", "1",
                        "--warmup-s", "0", "--clients", "2", "--no-fill-cache")  # fmt: skip
    (counted,) = figures["tallies"]
    assert figures["unexpected"] == {} and figures["healthy_after"]
    assert figures["requests"] == counted["requests"] == sum(figures["by_kind"].values()) > 0
    assert len(figures["samples"]) >= 2 and figures["samples"][-1]["done"] == figures["requests"]
    assert code == (1 if figures["failed"] else 0)


def test_the_retrying_client_sends_each_refused_body_again(url: str) -> None:
    bodies = [json.dumps({"query": f"q{i}", "items": ["a"], "refuse_first": i % 2}).encode()
              for i in range(8)]  # fmt: skip
    client = RetryingClient(url, concurrency=3)
    wall, retried = client.run(bodies)
    assert retried == 4 and wall > 0
    with pytest.raises(RuntimeError, match="HTTP 400"):
        client.run([b"{}"])
