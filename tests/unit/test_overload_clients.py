"""The overload tool's client kinds (loadtest/overload_clients.py) against a stdlib HTTP
server on loopback that refuses as scorejax does (503, the envelope, Retry-After, timing
headers): each kind sends every body once, at its arrival, and reads what came back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtest.overload import failed, issue_body, row, summary
from loadtest.overload_clients import CLIENT_KINDS, Plan, encoded, run_client


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
    plan = Plan(url, encoded([issue_body(16)] * 12), rate=200.0, timeout_s=10.0)
    sent = run_client(kind, plan, procs=2)
    assert len(sent.outcomes) == 12 and sent.client_cpu_s >= 0
    assert {(o.status, o.reason, o.retry_after) for o in sent.outcomes} == {
        (503, "overloaded", "2")
    }
    assert {o.total_s for o in sent.outcomes} == {0.007}
    assert all(0 <= o.sent_s < 5 for o in sent.outcomes)  # seconds into the run
    result = {"client": kind, **summary(list(sent.outcomes), 200.0, 1.0), "client_cpu_s": 0.0}
    assert result["overloaded_503"] == result["overloaded_with_retry_after"] == 12
    assert not failed(result) and row(result)[4] == "12 (12)"


def test_arrivals_are_seeded_poisson_at_the_rate() -> None:
    plan = Plan("http://127.0.0.1:1", encoded([{}] * 2000), rate=40.0, timeout_s=1.0)
    moments = plan.arrivals()
    assert moments == plan.arrivals() and moments[0] == 0.0
    assert 45 < moments[-1] < 55  # 2000 arrivals at 40/s: about 50 s


def test_a_request_that_gets_no_answer_is_an_outcome_of_status_0() -> None:
    plan = Plan("http://127.0.0.1:9", encoded([{}]), rate=10.0, timeout_s=1.0)  # discard port
    (outcome,) = run_client("connection", plan, procs=1).outcomes
    assert outcome.status == 0 and outcome.reason.startswith("client_")
    assert failed(summary([outcome], 10.0, 1.0) | {"client": "connection"})
