"""The load driver's client kinds and closed loop (loadtest/drive.py) against a stdlib HTTP
server on loopback that refuses as scorejax does (503, the envelope, Retry-After, timing
headers): each kind sends every body once, at its arrival, and reads what came back; a
closed loop keeps its clients in flight, waits as a refusal says and stops at its bounds."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtest.drive import CLIENT_KINDS, Load, drive, tally, tally_table
from loadtest.overload import failed, issue_body


class Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        body = json.dumps({"object": "error", "reason": "overloaded", "code": 503}).encode()
        self.send_response(503)
        for name, value in (("retry-after", "2"), ("x-total-time", "7"), ("x-queue-time", "1")):
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("kind", CLIENT_KINDS)
def test_every_client_kind_sends_each_body_once_and_reads_the_refusal(kind: str, url: str) -> None:
    load = Load(rate=200.0, timeout_s=10.0, client=kind, procs=2)
    outcomes = asyncio.run(drive(url, load, [issue_body(16)] * 12))
    assert len(outcomes) == 12 and sorted(o.index for o in outcomes) == list(range(12))
    assert {(o.status, o.reason, o.retry_after) for o in outcomes} == {(503, "overloaded", "2")}
    assert {o.total_s for o in outcomes} == {0.007}
    assert all(0 <= o.sent_s < 5 for o in outcomes)  # seconds into the run
    result = tally(outcomes, kind, 200.0, 16)
    assert result.status_503 == result.retry_after_503 == 12
    assert result.p99_503_ingress_s == 0.007 and math.isnan(result.p50_s)
    assert not failed(result) and tally_table([result]).rows[0][3] == "12 (12)"


def test_a_request_that_gets_no_answer_is_an_outcome_of_status_0() -> None:
    load = Load(rate=10.0, timeout_s=1.0, client="connection")
    (outcome,) = asyncio.run(drive("http://127.0.0.1:9", load, [{}]))  # the discard port
    assert outcome.status == 0 and outcome.reason.startswith("client_")
    assert failed(tally([outcome]))


def test_a_polite_closed_loop_waits_each_refusals_retry_after(url: str) -> None:
    load = Load(clients=1, count=3, polite_s=0.2)  # Retry-After 2, capped at 0.2 s
    outcomes = asyncio.run(drive(url, load, lambda i: {"n": i}))
    assert [o.index for o in outcomes] == [0, 1, 2]
    assert outcomes[2].sent_s - outcomes[0].sent_s >= 0.4


def test_a_closed_loop_stops_at_its_seconds_and_reports_as_it_goes(url: str) -> None:
    seen: list = []
    load = Load(clients=2, seconds=0.5, polite_s=0.2)
    outcomes = asyncio.run(drive(url, load, lambda i: {"n": i}, into=seen))
    assert 2 <= len(outcomes) <= 8 and sorted(seen, key=lambda o: o.index) == outcomes
    assert max(o.sent_s for o in outcomes) < 0.6  # none sent after its seconds
