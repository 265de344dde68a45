"""Send generated /v1/score bodies to the in-process ingress or a running server; count answers.

Generators: the fixed hostile cases and seeded mutations of ``loadtest.fuzz_cases``, three
Hypothesis strategies (``loadtest.fuzz_strategies``) and schemathesis driven from the
server's own ``/openapi.json`` (positive: bodies the document accepts; negative: bodies it
rejects). Every answer is also checked against that document (``Agreement``): a body the
document accepts must be a 200 unless it breaks a rule JSON Schema cannot state, and a body
it rejects must not be a 200.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
from loadtest.fuzz_cases import fuzz_bodies
from loadtest.fuzz_server import CheckingBackend, in_process_app
from loadtest.fuzz_strategies import (
    Served,
    arbitrary_bodies,
    completion_bodies,
    encode,
    near_valid_bodies,
    near_valid_completions,
    tokenizer_route_bodies,
    valid_bodies,
)
from replicas.errors import ScoringError

JSON = {"content-type": "application/json"}
# Rules the document cannot state (tokenization, the packed-length sum): a schema-valid body
# may still get these 400s.
CLIENT_TIMEOUT_S = 300  # the shipped proxy's request_timeout_s: the server answers by then
UNSTATED = frozenset(
    {"empty_query", "empty_input", "delimiter_in_content", "sequence_too_long", "too_many_tokens"}
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


def _settings(count: int) -> settings:
    return settings(
        max_examples=count,
        database=None,  # nothing written into the repository
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def run_strategy(
    target: Target, tally: Tally, strategy: st.SearchStrategy[bytes], count: int, at: int
) -> None:
    """Post ``count`` bodies drawn from ``strategy`` (Hypothesis, seeded with ``at``)."""
    if count <= 0:
        return

    @_settings(count)
    @seed(at)
    @given(strategy)
    def send(body: bytes) -> None:
        status, reason = target.post(body)
        tally.add(body, status, reason, target.agreement.disagrees(body, status, reason))

    send()


def run_routes(
    target: Target,
    tally: Tally,
    strategy: st.SearchStrategy[tuple[str, bytes]],
    count: int,
    at: int,
) -> None:
    """Post ``count`` (route, body) pairs. Only 5xx and no-answer count against the server:
    the published schema states /v1/score's rules, not these routes'."""
    if count <= 0:
        return

    @_settings(count)
    @seed(at)
    @given(strategy)
    def send(pair: tuple[str, bytes]) -> None:
        path, body = pair
        status, reason = target.post(body, path)
        tally.add(path.encode() + b" " + body, status, reason, False)

    send()


def run_schemathesis(
    target: Target, tally: Tally, mode: GenerationMode, count: int, at: int
) -> None:
    """``count`` schemathesis cases for POST /v1/score, sent by schemathesis itself."""
    if count <= 0:
        return
    strategy = target.schema["/v1/score"]["POST"].as_strategy(generation_mode=mode)

    @_settings(count)
    @seed(at)
    @given(strategy)
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

    send()


Runner = Callable[[Target, Tally, int, int], None]


def generators() -> dict[str, Runner]:
    """Every generator, by the name the table shows."""

    def fixed(target: Target, tally: Tally, count: int, at: int) -> None:
        for body in fuzz_bodies(count, at)[:count]:
            status, reason = target.post(body)
            tally.add(body, status, reason, target.agreement.disagrees(body, status, reason))

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
    lines = [
        "| generator | bodies | 2xx | 4xx | 5xx | answers the schema disagrees with |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = [(t.generator, t.bodies, t.count(200, 300), t.count(400, 500), t.server_errors,
             t.disagreements) for t in tallies]  # fmt: skip
    total = ("total", *(sum(row[i] for row in rows) for i in range(1, 6)))
    for row in [*rows, total]:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)
