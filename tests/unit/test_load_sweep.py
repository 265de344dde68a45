"""The load driver (loadtest.drive) and its sweep preset (loadtest.presets): the arrival
schedule, the bodies, the tally, and one short sweep against an in-process fake /v1/score
(uvicorn in a thread on a loopback port). No Ray; a few seconds.

The fake server decides by ``query[0] % 10``: 0-1 -> 503 overloaded with Retry-After, 2 -> 500,
3 -> answers after HANG_S (past the client's time-out), otherwise 200 after DELAY_S. The plan
is seeded, so the test knows every count in advance.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadtest.drive import Load, Outcome, arrivals, tally
from loadtest.harness import LABELS, run_workload
from loadtest.presets import ID_RANGE, Shape, id_range_problem, score_payload, sweep_plan
from loadtest.workloads import workload
from tests.support.serve_support import wait_for

DELAY_S = 0.05
HANG_S = 4.0  # margins wide enough for a CPU at load average 20+ (a send late, a 50 ms answer slow)
TIMEOUT_S = 2.0
RATES = (16.0, 32.0)
DURATION_S = 0.75
SHAPE = Shape(query_tokens=7, items=3, item_tokens=4)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    envelope = {"object": "error", "message": reason, "type": "Error", "param": None}
    return JSONResponse(
        {**envelope, "code": status, "reason": reason}, status_code=status, headers=headers
    )


Received = list[tuple[float, dict[str, Any]]]  # (time.monotonic() at arrival, body)


def fake_app(received: Received) -> Starlette:
    async def score(request: Request) -> JSONResponse:
        body = await request.json()
        received.append((time.monotonic(), body))
        key = body["query"][0] % 10
        if key < 2:
            return _error(503, "overloaded", {"Retry-After": "1"})
        if key == 2:
            return _error(500, "internal")
        await asyncio.sleep(HANG_S if key == 3 else DELAY_S)
        labels = body["label_token_ids"]
        scores = [[-0.5 * len(item)] * len(labels) for item in body["items"]]
        return JSONResponse({"object": "scoring", "model": "fake", "scores": scores})

    async def models(request: Request) -> JSONResponse:
        card = {"id": "fake", "vocab_size": 49152, "multi_item_scoring_delimiter": 0}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    return Starlette(
        routes=[
            Route("/v1/score", score, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )


@dataclass(frozen=True)
class SweepRun:
    code: int
    out: Path
    stdout: str
    received: Received
    plan: list[tuple[Load, tuple[dict[str, Any], ...]]]


@pytest.fixture(scope="module")
def fake_server() -> Iterator[tuple[str, Received]]:
    received: Received = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(fake_app(received), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 10, "the fake server")
    yield url, received
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def sweep_run(
    fake_server: tuple[str, Received], tmp_path_factory: pytest.TempPathFactory
) -> SweepRun:
    url, received = fake_server
    out = tmp_path_factory.mktemp("sweep") / "run"
    argv = [
        *("--url", url, "--rates", ",".join(map(str, RATES)), "--duration-s", str(DURATION_S)),
        *("--query-tokens", "7", "--items", "3", "--item-tokens", "4", "--seed", "3"),
        *("--timeout-s", str(TIMEOUT_S), "--warmup", "0", "--out", str(out)),
        *("--plots", str(out)),
    ]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = run_workload(workload("sweep"), argv)
    plan = sweep_plan(RATES, DURATION_S, SHAPE, seed=3, timeout_s=TIMEOUT_S)
    return SweepRun(code, out, stdout.getvalue(), received, plan)


def expected_counts(payloads: tuple[dict[str, Any], ...]) -> dict[str, int]:
    keys = [payload["query"][0] % 10 for payload in payloads]
    return {
        "status_503": sum(k < 2 for k in keys),
        "status_other": sum(k == 2 for k in keys),
        "client_timeouts": sum(k == 3 for k in keys),
        "status_200": sum(k > 3 for k in keys),
    }


def test_arrivals_are_seeded_poisson() -> None:
    rate, duration = 4.0, 5000.0
    times = arrivals(Load(rate=rate, seconds=duration, seed=1))
    assert times == arrivals(Load(rate=rate, seconds=duration, seed=1))
    assert times != arrivals(Load(rate=rate, seconds=duration, seed=2))
    assert times == sorted(times) and times[0] > 0 and times[-1] < duration
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(1 / rate, rel=0.05)  # exponential: sd = mean
    assert abs(len(times) - rate * duration) < 4 * math.sqrt(rate * duration)
    # 2000 arrivals at 40/s: about 50 s; fixed gaps: exactly 1/rate; a burst: all at once
    assert 45 < arrivals(Load(rate=40.0, seed=2), 2000)[-1] < 55
    assert arrivals(Load(rate=4.0, arrivals="fixed"), 3) == [0.25, 0.5, 0.75]
    assert arrivals(Load(rate=math.inf), 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrivals(Load(rate=1.0))  # neither a count nor a time bound


def test_body_has_exact_token_counts_in_the_safe_range() -> None:
    payload = score_payload(random.Random(0), Shape(query_tokens=120, items=10, item_tokens=20))
    assert len(payload["query"]) == 120
    assert [len(item) for item in payload["items"]] == [20] * 10
    assert payload["label_token_ids"] == list(LABELS)
    ids = [*payload["query"], *(t for item in payload["items"] for t in item)]
    assert all(ID_RANGE[0] <= t < ID_RANGE[1] for t in ids)
    assert len(set(ids)) > 100  # random, not one repeated id


def test_plan_is_reproducible_per_seed() -> None:
    first, again = sweep_plan((0.5, 2.0), 60.0, SHAPE), sweep_plan((0.5, 2.0), 60.0, SHAPE)
    assert first == again
    assert [load.rate for load, _ in first] == [0.5, 2.0]
    assert all(len(arrivals(load)) == len(bodies) for load, bodies in first)
    other = sweep_plan((0.5, 2.0), 60.0, SHAPE, seed=1)
    assert arrivals(other[1][0]) != arrivals(first[1][0])


def test_id_range_is_checked_against_the_model_card() -> None:
    assert id_range_problem({"vocab_size": 49152, "multi_item_scoring_delimiter": 0}) is None
    assert id_range_problem({}) is None
    assert "vocabulary" in (id_range_problem({"vocab_size": 10000}) or "")
    assert "delimiter" in (id_range_problem({"multi_item_scoring_delimiter": 5000}) or "")


def test_tally_by_hand() -> None:
    outcomes = [
        Outcome(200, 1.0, queue_s=0.5, sent_s=0.0),
        Outcome(200, 3.0, queue_s=1.5, sent_s=2.0, late_s=0.25),
        Outcome(503, 0.1, "overloaded", "1", total_s=0.01, sent_s=3.0),
        Outcome(0, 7.0, "client_timeout", sent_s=3.0),
    ]
    row = tally(outcomes, "0.5", 0.5, items=10)
    assert (row.requests, row.wall_s, row.achieved_rps, row.items_per_s) == (4, 10.0, 0.2, 2.0)
    assert (row.status_200, row.status_503, row.status_other, row.client_errors) == (2, 1, 0, 1)
    assert row.reasons_503 == {"overloaded": 1} and row.retry_after_503 == 1
    assert (row.p50_s, row.p99_s, row.p50_503_s, row.client_timeouts) == (3.0, 3.0, 0.1, 1)
    assert (row.p99_503_ingress_s, row.p50_queue_s, row.max_s) == (0.01, 1.5, 3.0)
    assert row.max_late_s == 0.25 and not row.clean  # a request got no answer
    assert tally(outcomes[:3]).clean and not tally([Outcome(503, 0.1, "overloaded")]).clean
    assert math.isnan(tally([], items=10).p50_s) and tally([]).plain()["p50_s"] is None


def test_url_must_be_loopback() -> None:
    with pytest.raises(SystemExit):
        run_workload(workload("sweep"), ["--url", "http://10.1.2.3:8000"])


def test_sweep_counts_match_the_plan(sweep_run: SweepRun) -> None:
    rows = json.loads((sweep_run.out / "sweep.json").read_text())["figures"]["tallies"]
    assert [row["offered_rps"] for row in rows] == list(RATES)
    for row, (load, payloads) in zip(rows, sweep_run.plan, strict=True):
        expected, offsets = load.rate * DURATION_S, arrivals(load)
        assert row["requests"] == len(offsets) == len(payloads)
        assert abs(row["requests"] - expected) <= 4 * math.sqrt(expected) + 1
        assert {key: row[key] for key in expected_counts(payloads)} == expected_counts(payloads)
        total = row["status_200"] + row["status_503"] + row["status_other"]
        assert total + row["client_errors"] == row["requests"]
        assert row["client_errors"] == row["client_timeouts"]
        assert row["reasons_503"] == (
            {"overloaded": row["status_503"]} if row["status_503"] else {}
        )
        assert row["retry_after_503"] == row["status_503"]
        assert row["other_statuses"] == (
            {"500 internal": row["status_other"]} if row["status_other"] else {}
        )
        assert row["items_per_s"] == pytest.approx(row["status_200"] * 3 / row["wall_s"])
        assert row["wall_s"] >= offsets[-1] - offsets[0]
    for key in ("status_200", "status_503", "status_other", "client_timeouts"):
        assert sum(row[key] for row in rows) > 0, f"the seed exercises no {key}"
    assert sweep_run.code == 1  # 500s and time-outs are failures


def test_sweep_latencies_are_ordered(sweep_run: SweepRun) -> None:
    rows = json.loads((sweep_run.out / "sweep.json").read_text())["figures"]["tallies"]
    for row in rows:
        assert DELAY_S <= row["p50_s"] <= row["p90_s"] <= row["p99_s"] < HANG_S
        assert row["p50_503_s"] <= row["p90_503_s"] <= row["p99_503_s"]


def test_server_got_exact_bodies_open_loop(sweep_run: SweepRun) -> None:
    sent = [json.dumps(p) for _, payloads in sweep_run.plan for p in payloads]
    assert sorted(json.dumps(body) for _, body in sweep_run.received) == sorted(sent)


def client_seconds(body: dict[str, Any]) -> float:
    """How long the client waits for the fake server's answer to ``body`` (at least)."""
    key = body["query"][0] % 10
    return 0.0 if key < 3 else TIMEOUT_S if key == 3 else DELAY_S


def test_sweep_is_open_loop_and_rates_do_not_overlap(sweep_run: SweepRun) -> None:
    first, second = (
        [(at, body) for at, body in sweep_run.received if body in payloads]
        for _, payloads in sweep_run.plan
    )
    # The next rate starts only once every request of the previous one is answered. Times
    # are the server's arrivals, and a time-out runs from the client's send, earlier by a
    # send's latency (tenths of a second at load average 10+), so the bound allows
    # TIMEOUT_S / 2 of it: a sweep that did not wait for its time-outs would start the next
    # rate right after DURATION_S, a whole TIMEOUT_S earlier than this bound.
    assert any(client_seconds(body) == TIMEOUT_S for _, body in first)  # a time-out to wait
    first_done = max(at + client_seconds(body) for at, body in first)
    assert min(at for at, _ in second) >= first_done - TIMEOUT_S / 2
    # Sent on schedule, not behind outstanding requests (a time-out takes TIMEOUT_S).
    rows = json.loads((sweep_run.out / "sweep.json").read_text())["figures"]["tallies"]
    assert all(row["max_late_s"] < TIMEOUT_S for row in rows)


def test_sweep_writes_its_result_plots_and_table(sweep_run: SweepRun) -> None:
    settings = json.loads((sweep_run.out / "sweep.json").read_text())["settings"]
    assert settings["url"].startswith("http://127.0.0.1:")
    assert (settings["query_tokens"], settings["items"], settings["item_tokens"]) == (7, 3, 4)
    for name in ("latency.png", "throughput.png"):
        assert (sweep_run.out / name).read_bytes().startswith(PNG_MAGIC)
    table = [line for line in sweep_run.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| offered req/s |") and len(table) == 2 + len(RATES)
    assert [line.split("|")[1].strip() for line in table[2:]] == ["16", "32"]
