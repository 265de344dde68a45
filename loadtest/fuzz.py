"""Malformed and hostile bodies against the in-process ingress or a running server: every one
must get a 4xx, never a 5xx (``make fuzz``).

    python -m loadtest run fuzz --count 10000 [--seed 0] [--config serve_config.yaml] [--url URL]

Generators (``loadtest.fuzz_strategies``): the fixed hostile cases and seeded mutations of
``fuzz_bodies``, three Hypothesis strategies, and schemathesis driven from the
server's own ``/openapi.json`` (positive: bodies the document accepts; negative: bodies it
rejects), shared out over ``--count``. In process, the real validation and tokenizer of
``--config``'s model answer, the replicas replaced by a checking backend
(``loadtest.fuzz_server``). Every answer is also checked against that document
(``Agreement``): a body the document accepts must be a 200 unless it breaks a rule JSON
Schema cannot state, and a body it rejects must not be a 200. Prints a table of answers by
generator and status; exits non-zero on any 5xx or any answer that disagrees.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from app.http import ACCESS_LOG
from app.service import ScoringService
from app.validation import parse_json
from loadtest.bench_common import SERVE_CONFIG, config_settings
from loadtest.fuzz_server import CheckingBackend, in_process_app
from loadtest.fuzz_strategies import (
    Served,
    arbitrary_bodies,
    completion_bodies,
    encode,
    fuzz_bodies,
    near_valid_bodies,
    near_valid_completions,
    tokenizer_route_bodies,
    valid_bodies,
)
from loadtest.harness import Workload, col, loopback_url
from loadtest.harness import table as markdown_table
from replicas.errors import ScoringError

JSON = {"content-type": "application/json"}
# Rules the document cannot state (tokenization, the packed-length sum): a schema-valid body
# may still get these 400s.
CLIENT_TIMEOUT_S = 300  # the shipped proxy's request_timeout_s: the server answers by then
UNSTATED = frozenset(
    {
        "empty_query",
        "empty_input",
        "delimiter_in_content",
        "sequence_too_long",
        "too_many_tokens",
        "too_many_chunks",
        "invalid_chunking",
    }
)
SAMPLES = 5  # offending bodies kept per generator, for the report


@dataclass
class Tally:
    """Answers to one generator's bodies."""

    generator: str
    statuses: Counter[int] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    disagreements: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, body: bytes, status: int, reason: str | None, disagrees: bool) -> None:
        self.statuses[status] += 1
        if reason:
            self.reasons[reason] += 1
        self.disagreements += disagrees
        if (disagrees or status >= 500 or status == 0) and len(self.samples) < SAMPLES:
            self.samples.append(f"{status} {reason}: {body[:300]!r}")

    @property
    def bodies(self) -> int:
        return sum(self.statuses.values())

    def count(self, low: int, high: int) -> int:
        return sum(n for status, n in self.statuses.items() if low <= status < high)

    @property
    def server_errors(self) -> int:
        """5xx answers, and requests that got no answer at all (status 0)."""
        return self.count(500, 600) + self.statuses[0]


class Agreement:
    """Does an answer agree with the published ScoreRequest schema?"""

    def __init__(self, document: dict[str, Any]) -> None:
        root = {"components": document["components"], "$ref": "#/components/schemas/ScoreRequest"}
        self._validator = jsonschema.Draft202012Validator(root)

    def schema_accepts(self, payload: Any) -> bool:
        """Valid by the schema, and no rule the schema cannot state about JSON itself is broken:
        no text that is not valid Unicode (a whole number written ``2.0`` is the integer 2 to
        both)."""
        return self._validator.is_valid(payload) and _plain(payload)

    def disagrees(self, body: bytes, status: int, reason: str | None) -> bool:
        if status >= 500 or status == 0:
            return False  # counted as a server error instead
        try:
            payload = parse_json(body)
        except ScoringError:
            return status == 200
        if self.schema_accepts(payload):
            return status != 200 and reason not in UNSTATED
        return status == 200


def _plain(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, legal as a JSON escape
            return False
        return True
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_plain(key) and _plain(item) for key, item in value.items())
    return True


@dataclass
class Target:
    """Where bodies go: an httpx client (in-process: Starlette's TestClient), the server's own
    OpenAPI document and /v1/models, and the schemathesis schema loaded from that document."""

    client: httpx.Client
    schema: Any
    call_kwargs: dict[str, Any]
    document: dict[str, Any] = field(init=False)
    served: Served = field(init=False)
    agreement: Agreement = field(init=False)

    def __post_init__(self) -> None:
        self.document = self.client.get("/openapi.json").json()
        self.served = Served.from_models_body(self.client.get("/v1/models").json())
        self.agreement = Agreement(self.document)

    def post(self, body: bytes, path: str = "/v1/score") -> tuple[int, str | None]:
        try:
            response = self.client.post(path, content=body, headers=JSON)
        except httpx.HTTPError:
            return 0, None
        return response.status_code, _reason(response.content)

    def replica_requests(self) -> int | None:
        """The scoring replica's request counter (GET /v1/stats), if it answers."""
        response = self.client.get("/v1/stats")
        return response.json().get("requests") if response.status_code == 200 else None

    def healthy(self) -> bool:
        return self.client.get("/health").status_code == 200


def _reason(content: bytes) -> str | None:
    try:
        body = json.loads(content)
    except ValueError:
        return None
    return body.get("reason") if isinstance(body, dict) else None


@contextmanager
def in_process(
    service: ScoringService, backend: CheckingBackend | None = None
) -> Iterator[tuple[Target, CheckingBackend]]:
    """The ingress's HTTP app on ``service`` with a CheckingBackend (by default one that
    checks against ``service.info``), reached over ASGI."""
    from starlette.testclient import TestClient

    backend = CheckingBackend(service.info) if backend is None else backend
    app = in_process_app(service, backend)
    with quiet_access_log(), TestClient(app, raise_server_exceptions=False) as client:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        yield Target(client, schema, {}), backend


@contextmanager
def over_http(url: str) -> Iterator[Target]:
    """A running server at ``url``."""
    with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        # schemathesis sends its own cases: the same patience (its default gives up sooner
        # than a valid 1000-item body takes on 2 CPU cores).
        yield Target(client, schema, {"base_url": url, "timeout": CLIENT_TIMEOUT_S})


@contextmanager
def quiet_access_log() -> Iterator[None]:
    """One INFO line per request is noise for 10,000 requests; errors still show."""
    logger = logging.getLogger(ACCESS_LOG)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def drive(strategy: st.SearchStrategy[Any], count: int, at: int, each: Callable) -> None:
    """Call ``each`` on ``count`` examples drawn from ``strategy`` (Hypothesis, seeded with
    ``at``; nothing written into the repository)."""
    if count <= 0:
        return
    quiet = settings(max_examples=count, database=None, deadline=None,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    quiet(seed(at)(given(strategy)(each)))()


def post_checked(target: Target, tally: Tally, body: bytes, path: str = "/v1/score") -> None:
    """Post one body, tally its answer and whether the published schema agrees with it
    (/v1/score only: the schema states its rules, not the other routes')."""
    status, reason = target.post(body, path)
    checked = path == "/v1/score" and target.agreement.disagrees(body, status, reason)
    shown = body if path == "/v1/score" else path.encode() + b" " + body
    tally.add(shown, status, reason, checked)


def run_strategy(
    target: Target, tally: Tally, strategy: st.SearchStrategy[bytes], count: int, at: int
) -> None:
    """Post ``count`` bodies drawn from ``strategy`` (Hypothesis, seeded with ``at``)."""
    drive(strategy, count, at, lambda body: post_checked(target, tally, body))


def run_routes(
    target: Target,
    tally: Tally,
    strategy: st.SearchStrategy[tuple[str, bytes]],
    count: int,
    at: int,
) -> None:
    """Post ``count`` (route, body) pairs. Only 5xx and no-answer count against the server:
    the published schema states /v1/score's rules, not these routes'."""  # fmt: skip
    drive(strategy, count, at, lambda pair: post_checked(target, tally, pair[1], pair[0]))


def run_schemathesis(
    target: Target, tally: Tally, mode: GenerationMode, count: int, at: int
) -> None:
    """``count`` schemathesis cases for POST /v1/score, sent by schemathesis itself."""
    if count <= 0:
        return

    def send(case: Any) -> None:
        try:
            response = case.call(**target.call_kwargs)
        except Exception as error:  # no answer: counted with the server errors
            tally.add(repr(case.body).encode(), 0, type(error).__name__, False)
            return
        body = response.request.body or b""
        body = body.encode() if isinstance(body, str) else body
        status, reason = response.status_code, _reason(response.content)
        tally.add(body, status, reason, target.agreement.disagrees(body, status, reason))

    strategy = target.schema["/v1/score"]["POST"].as_strategy(generation_mode=mode)
    drive(strategy, count, at, send)


Runner = Callable[[Target, Tally, int, int], None]


def generators() -> dict[str, Runner]:
    """Every generator, by the name the table shows."""

    def fixed(target: Target, tally: Tally, count: int, at: int) -> None:
        for body in fuzz_bodies(count, at)[:count]:
            post_checked(target, tally, body)

    def strategy(make: Callable[[Served], st.SearchStrategy[bytes]]) -> Runner:
        return lambda target, tally, count, at: run_strategy(
            target, tally, make(target.served), count, at
        )

    def cases(mode: GenerationMode) -> Runner:
        return lambda target, tally, count, at: run_schemathesis(target, tally, mode, count, at)

    def routes(make: Callable[[Served], st.SearchStrategy[tuple[str, bytes]]]) -> Runner:
        return lambda target, tally, count, at: run_routes(
            target, tally, make(target.served), count, at
        )

    def completions(make: Callable[[Served], st.SearchStrategy[Any]]) -> Runner:
        return routes(lambda s: make(s).map(lambda body: ("/v1/completions", encode(body))))

    return {
        "fixed cases + mutations": fixed,
        "hypothesis: valid-shaped": strategy(lambda s: valid_bodies(s).map(encode)),
        "hypothesis: one field broken": strategy(lambda s: near_valid_bodies(s).map(encode)),
        "hypothesis: arbitrary JSON/bytes": strategy(lambda s: arbitrary_bodies()),
        "schemathesis: positive": cases(GenerationMode.POSITIVE),
        "schemathesis: negative": cases(GenerationMode.NEGATIVE),
        "completions: valid-shaped": completions(completion_bodies),
        "completions: one field broken": completions(near_valid_completions),
        "completions, tokenize: arbitrary": routes(lambda s: tokenizer_route_bodies()),
    }


def split(count: int, parts: int) -> list[int]:
    """``count`` bodies shared out as evenly as possible, the first parts taking the rest."""
    return [count // parts + (i < count % parts) for i in range(parts)]


def run_all(target: Target, count: int, at: int = 0) -> list[Tally]:
    runners = generators()
    tallies = []
    for (name, runner), share in zip(runners.items(), split(count, len(runners)), strict=True):
        tally = Tally(name)
        runner(target, tally, share, at)
        tallies.append(tally)
    return tallies


def table(tallies: list[Tally]) -> str:
    """A markdown table: generator, bodies, 2xx, 4xx, 5xx, disagreements with the schema."""
    rows = [(t.generator, t.bodies, t.count(200, 300), t.count(400, 500), t.server_errors,
             t.disagreements) for t in tallies]  # fmt: skip
    total = ("total", *(sum(row[i] for row in rows) for i in range(1, 6)))
    counts = ("bodies", "2xx", "4xx", "5xx", "answers the schema disagrees with")
    columns = [col("generator", left=True), *(col(name, "d") for name in counts)]
    return markdown_table(columns, [*rows, total]).markdown()


def _service(config: Path) -> ScoringService:
    """The ingress's service for the first application of ``config`` (its model's tokenizer)."""
    return ScoringService.from_settings(config_settings(config))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fuzz POST /v1/score, /v1/completions, /tokenize and /detokenize."
    )
    parser.add_argument("--count", type=int, default=600, help="bodies in all (default 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=SERVE_CONFIG, help="in-process model")
    parser.add_argument("--url", help="a running server (loopback) instead of in-process")
    args = parser.parse_args(argv)
    try:
        args.url = args.url and loopback_url(args.url)
    except ValueError as error:
        parser.error(f"--url: {error}")
    start = time.perf_counter()

    def report(target: Target) -> tuple[int, int]:
        before = target.replica_requests()
        tallies = run_all(target, args.count, args.seed)
        after = target.replica_requests()
        print(table(tallies))
        reasons = sum((tally.reasons for tally in tallies), Counter())
        print("error reasons:", ", ".join(f"{name} {n}" for name, n in reasons.most_common()))
        for tally in tallies:
            for sample in tally.samples:
                print(f"  {tally.generator}: {sample}")
        if before is not None and after is not None:
            state = "restarted" if after < before else "no restart seen"  # a new one counts from 0
            print(f"replica requests (GET /v1/stats) {before} -> {after}: {state}")
        print(f"healthy after: {target.healthy()}; {time.perf_counter() - start:.0f} s")
        errors = sum(t.server_errors for t in tallies)
        return errors, sum(t.disagreements for t in tallies)

    if args.url:
        with over_http(args.url.rstrip("/")) as target:
            errors, disagreements = report(target)
    else:
        print(f"loading the tokenizer of {args.config.name}'s model ...", flush=True)
        with in_process(_service(args.config)) as (target, backend):
            errors, disagreements = report(target)
            print(f"reached the (checking) replica: {backend.calls} requests")
    return 0 if errors == 0 and disagreements == 0 else 1


# A tool with its own flags (tests call ``main``): the runner hands it the command line.
WORKLOAD = Workload(main=main)
