"""Malformed and hostile bodies against the in-process ingress or a running server: every one
must get a 4xx, never a 5xx (``make fuzz``).

    python -m loadtest run fuzz --count 10000 [--seed 0] [--config serve_config.yaml] [--url URL]

Generators (``loadtest.fuzz_strategies``): the fixed hostile cases and seeded mutations of
``fuzz_bodies``, Hypothesis strategies, and schemathesis driven from the server's own
``/openapi.json`` (positive: bodies the document accepts; negative: bodies it rejects), shared
out over ``--count``. In process, the real validation and tokenizer of ``--config``'s model
answer, the replicas replaced by a checking backend (``loadtest.fuzz_server``). Every answer
to /v1/score is also checked against that document (``Agreement``): a body it accepts must be
a 200 unless it breaks a rule JSON Schema cannot state, and a body it rejects must not be a
200. Fails (exit 1) on any 5xx or any answer that disagrees.
"""

from __future__ import annotations

import argparse
import json
import logging
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
    FIELDS,
    Drawn,
    Served,
    arbitrary,
    completion_bodies,
    fuzz_bodies,
    near_valid_bodies,
    near_valid_completions,
    to,
    tokenizer_route_bodies,
    valid_bodies,
)
from loadtest.harness import JSON_HEADERS, TOOL_RESULTS, Option, Result, Run, Table, Workload, col
from loadtest.harness import table as make_table
from replicas.errors import ScoringError

SCORE = "/v1/score"
CLIENT_TIMEOUT_S = 300  # the shipped proxy's request_timeout_s: the server answers by then
# Rules the document cannot state (tokenization, the packed-length sum): a schema-valid body
# may still get these 400s.
UNSTATED = frozenset({"empty_query", "empty_input", "delimiter_in_content", "sequence_too_long",
                      "too_many_tokens", "too_many_chunks", "invalid_chunking"})  # fmt: skip
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
        self.reasons.update([reason] if reason else [])
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
        """Valid by the schema, and all its text valid Unicode (a lone surrogate is legal as a
        JSON escape, not as text; a whole number written ``2.0`` is the integer 2 to both)."""
        try:
            json.dumps(payload, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            return False
        return self._validator.is_valid(payload)

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


@dataclass(frozen=True)
class Target:
    """Where bodies go: an httpx client (in process: Starlette's TestClient), the schemathesis
    schema of the server's own OpenAPI document, and what /v1/models and that document say."""

    client: httpx.Client
    schema: Any
    call_kwargs: dict[str, Any]
    served: Served
    agreement: Agreement

    @classmethod
    def of(cls, client: httpx.Client, schema: Any, **call_kwargs: Any) -> Target:
        served = Served.from_models_body(client.get("/v1/models").json())
        agreement = Agreement(client.get("/openapi.json").json())
        return cls(client, schema, call_kwargs, served, agreement)

    def post(self, body: bytes, path: str = SCORE) -> tuple[int, str | None]:
        try:
            response = self.client.post(path, content=body, headers=JSON_HEADERS)
        except httpx.HTTPError:
            return 0, None
        return response.status_code, _reason(response.content)

    def replica_requests(self) -> int | None:
        """The scoring replica's request counter (GET /v1/stats), if it answers."""
        response = self.client.get("/v1/stats")
        return response.json().get("requests") if response.status_code == 200 else None


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
        yield Target.of(client, schemathesis.openapi.from_asgi("/openapi.json", app)), backend


@contextmanager
def over_http(url: str) -> Iterator[Target]:
    """A running server at ``url``; schemathesis sends its own cases with the same patience
    (its default gives up sooner than a valid 1000-item body takes on 2 CPU cores)."""
    with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        yield Target.of(client, schema, base_url=url, timeout=CLIENT_TIMEOUT_S)


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


def run_strategy(target: Target, tally: Tally, strategy: Drawn, count: int, at: int) -> None:
    """Post ``count`` (route, body) pairs drawn from ``strategy`` (Hypothesis, seeded with
    ``at``; nothing written into the repository)."""
    _examples(strategy, count, at, lambda pair: post_checked(target, tally, *pair))


def _examples(strategy: st.SearchStrategy[Any], count: int, at: int, each: Callable) -> None:
    if count > 0:
        quiet = settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
                         suppress_health_check=list(HealthCheck))  # fmt: skip
        quiet(seed(at)(given(strategy)(each)))()


def post_checked(target: Target, tally: Tally, path: str, body: bytes) -> None:
    """Post one body, tally its answer and whether the published schema agrees with it
    (/v1/score only: the schema states its rules, not the other routes')."""
    status, reason = target.post(body, path)
    checked = path == SCORE and target.agreement.disagrees(body, status, reason)
    tally.add(body if path == SCORE else path.encode() + b" " + body, status, reason, checked)


def run_schemathesis(
    target: Target, tally: Tally, mode: GenerationMode, count: int, at: int
) -> None:
    """``count`` schemathesis cases for POST /v1/score, sent by schemathesis itself."""

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

    _examples(target.schema[SCORE]["POST"].as_strategy(generation_mode=mode), count, at, send)


Runner = Callable[[Target, Tally, int, int], None]


def generators() -> dict[str, Runner]:
    """Every generator, by the name the table shows."""

    def fixed(target: Target, tally: Tally, count: int, at: int) -> None:
        for body in fuzz_bodies(count, at)[:count]:
            post_checked(target, tally, SCORE, body)

    def drawn(make: Callable[[Served], Drawn]) -> Runner:
        return lambda target, tally, n, at: run_strategy(target, tally, make(target.served), n, at)

    def cases(mode: GenerationMode) -> Runner:
        return lambda target, tally, n, at: run_schemathesis(target, tally, mode, n, at)

    def at(route: str, make: Callable[[Served], st.SearchStrategy[Any]]) -> Runner:
        return drawn(lambda served: to(route, make(served)))

    completions = "/v1/completions"
    return {
        "fixed cases + mutations": fixed,
        "hypothesis: valid-shaped": at(SCORE, valid_bodies),
        "hypothesis: one field broken": at(SCORE, near_valid_bodies),
        "hypothesis: arbitrary JSON/bytes": at(SCORE, lambda _: arbitrary(FIELDS, len(FIELDS) + 1)),
        "schemathesis: positive": cases(GenerationMode.POSITIVE),
        "schemathesis: negative": cases(GenerationMode.NEGATIVE),
        "completions: valid-shaped": at(completions, completion_bodies),
        "completions: one field broken": at(completions, near_valid_completions),
        "completions, tokenize: arbitrary": drawn(lambda _: tokenizer_route_bodies()),
    }


def split(count: int, parts: int) -> list[int]:
    """``count`` bodies shared out as evenly as possible, the first parts taking the rest."""
    return [count // parts + (i < count % parts) for i in range(parts)]


def run_all(target: Target, count: int, at: int = 0) -> list[Tally]:
    runners = generators()
    tallies = [Tally(name) for name in runners]
    for tally, runner, share in zip(tallies, runners.values(), split(count, len(runners)),
                                    strict=True):  # fmt: skip
        runner(target, tally, share, at)
    return tallies


def table(tallies: list[Tally]) -> Table:
    """Generator, bodies, 2xx, 4xx, 5xx, disagreements with the schema; a total row."""
    rows = [(t.generator, t.bodies, t.count(200, 300), t.count(400, 500), t.server_errors,
             t.disagreements) for t in tallies]  # fmt: skip
    total = ("total", *(sum(row[i] for row in rows) for i in range(1, 6)))
    counts = ("bodies", "2xx", "4xx", "5xx", "answers the schema disagrees with")
    columns = [col("generator", left=True), *(col(name, "d") for name in counts)]
    return make_table(columns, [*rows, total])


def _service(config: Path) -> ScoringService:
    """The ingress's service for the first application of ``config`` (its model's tokenizer)."""
    return ScoringService.from_settings(config_settings(config))


def fuzzed(target: Target, o: argparse.Namespace, run: Run) -> Result:
    before = target.replica_requests()
    tallies = run_all(target, o.count, o.seed)
    after = target.replica_requests()
    reasons = sum((tally.reasons for tally in tallies), Counter())
    run.say("error reasons: " + ", ".join(f"{name} {n}" for name, n in reasons.most_common()))
    samples = [f"{tally.generator}: {sample}" for tally in tallies for sample in tally.samples]
    for sample in samples:
        run.say(sample)
    healthy = target.client.get("/health").status_code == 200
    restarted = None if None in (before, after) else after < before  # a new one counts from 0
    run.say(f"replica requests (GET /v1/stats) {before} -> {after}; healthy after: {healthy}")
    failed = any(t.server_errors or t.disagreements for t in tallies)
    figures = {"failed": failed, "reasons": dict(reasons), "samples": samples, "healthy": healthy,
               "replica_requests": [before, after], "restarted": restarted}  # fmt: skip
    where = o.url or f"in process, {o.config.name}'s tokenizer"
    return run.result(f"Fuzzed bodies, {where}", [table(tallies)], figures=figures)


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    if o.url:
        with over_http(o.url) as target:
            return [fuzzed(target, o, run)]
    run.say(f"loading the tokenizer of {o.config.name}'s model ...")
    with in_process(_service(o.config)) as (target, _):
        return [fuzzed(target, o, run)]


WORKLOAD = Workload(
    options=(
        Option("--count", 600, "bodies in all"),
        Option("--seed", 0),
        Option("--config", SERVE_CONFIG, "in-process model (without --url)"),
    ),
    measure=measure,
    url=True,
    out=TOOL_RESULTS,
)
