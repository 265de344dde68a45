"""The OpenAPI document is as strict as the validation, on every route (issue 57.3).

schemathesis generates bodies the published document allows, for every operation it lists,
and sends them to the ingress's HTTP app on the shipped serve_config.yaml with only ``model``
changed: the shipped model (SmolLM2), an embedding model, a score-head model, and a causal LM
that loads LoRA adapters at run time (``max_loras`` > 0, its load and unload routes over an
in-process registry and a replica stand-in that reads the adapter directory as the replica
does). Every answer is free of 5xx and conforms to the responses the document declares, and
every body the document allows is served (2xx), unless it names something that is not there
(a 404 for an unknown ``model``, adapter name or adapter directory: the name is the client's
choice, not a shape the schema could rule out) or breaks a rule the document lists as one
JSON Schema cannot state (``loadtest.fuzz.UNSTATED``: text that tokenizes to nothing, a
length only tokenization tells). A route the configuration cannot serve is
left out of the document. The replicas are the fuzzer's checking backend: this is the HTTP
edge's contract (tests/serve/test_serve_lora.py and the Serve tests run the real replicas).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from starlette.testclient import TestClient

from app.adapters import AdapterAdmin, LiveNames
from app.http import build_api
from app.service import ScoringService
from loadtest.fuzz import UNSTATED, quiet_access_log
from loadtest.fuzz_server import CheckingBackend
from replicas.checkpoints.adapters import read_adapter_config
from replicas.serving.adapter_registry import AdapterBook
from replicas.settings import ReplicaSettings
from tests.support.head_helpers import save_tiny_head
from tests.support.shipped import shipped_settings

pytestmark = pytest.mark.slow

CASES = 12  # positive cases per operation (suite time: 4 kinds x ~14 operations)
MISSING = {"model_not_found", "not_found"}  # a 404 for a name the client chose


class Remote:
    """A handle method's stand-in: ``remote(*args)`` awaits ``call``."""

    def __init__(self, call: Callable[..., Awaitable[Any]]) -> None:
        self.remote = call


class Registry:
    """The AdapterRegistry deployment's methods over one AdapterBook."""

    def __init__(self, book: AdapterBook) -> None:
        async def snapshot() -> tuple[int, dict[str, str]]:
            return book.snapshot()

        async def add(name: str, path: str) -> int:
            return book.add(name, path)

        async def remove(name: str) -> int:
            return book.remove(name)

        self.snapshot, self.add, self.remove = Remote(snapshot), Remote(add), Remote(remove)


class Replica:
    """The scoring replica's ``load_adapter``: reads the directory as the replica does, so
    a path with no directory is its ``not_found`` refusal."""

    def __init__(self) -> None:
        async def load_adapter(name: str, path: str) -> None:
            from replicas.checkpoints.name_map import AdapterNotFound
            from replicas.errors import Reason, ScoringError

            try:
                read_adapter_config(name, Path(path))
            except AdapterNotFound as error:
                raise ScoringError(Reason.NOT_FOUND, str(error)) from None

        self.load_adapter = Remote(load_adapter)


def app_of(settings: ReplicaSettings) -> Any:
    """The ingress's HTTP app as ScoreIngress builds it, over the checking backend."""
    live = (
        LiveNames(name for name, _ in settings.adapters.lora_adapters)
        if settings.adapters.max_loras
        else None
    )
    service = ScoringService.from_settings(settings, live)
    admin = None
    if live is not None:
        book = AdapterBook(settings.adapters.max_loras, dict(settings.adapters.lora_adapters))
        admin = AdapterAdmin(service.info.name, live, Replica(), Registry(book))

    async def health() -> None:
        return None

    backend = CheckingBackend(service.info)
    return build_api(service, backend, health, adapters=admin)


def positive_outcomes(app: Any, operation: Any) -> tuple[Counter, list[str]]:
    """Status counts of ``CASES`` positive cases, and what broke a check or was refused."""
    statuses: Counter = Counter()
    faults: list[str] = []
    strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)

    @settings(
        max_examples=CASES,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @seed(57)
    @given(strategy)
    def send(case: Any) -> None:
        response = case.call(app=app)
        statuses[response.status_code] += 1
        try:
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )
        except Exception as error:  # schemathesis' failure group
            faults.append(f"{operation.label}: {error}"[:600])
        reason = response.json().get("reason") if response.status_code >= 400 else None
        missing = response.status_code == 404 and reason in MISSING
        if response.status_code >= 300 and not missing and reason not in UNSTATED:
            faults.append(f"{operation.label} refused {case.body!r:.200}: {response.text:.300}")

    send()
    return statuses, faults


def conformance(app: Any) -> dict[str, Counter]:
    """Every operation of the app's document: its statuses; fails naming every fault."""
    import schemathesis

    with quiet_access_log(), TestClient(app):
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        results, faults = {}, []
        for result in schema.get_all_operations():
            operation = result.ok()
            results[operation.label], more = positive_outcomes(app, operation)
            faults += more
    assert not faults, "\n".join(faults[:10])
    return results


def test_the_shipped_config_serves_what_its_document_allows() -> None:
    from tests.conftest import SMOLLM2_GGUF, smollm2_package_dir

    results = conformance(app_of(shipped_settings(str(smollm2_package_dir() / SMOLLM2_GGUF))))
    assert results["POST /v1/score"][200] == CASES and "POST /v1/completions" in results
    # max_loras: 0: no adapter routes offered; the kind's refused routes left out too
    assert not any("lora_adapter" in label or "classify" in label for label in results)


def test_an_embedding_model_serves_what_its_document_allows(embedding_dirs: dict) -> None:
    results = conformance(app_of(shipped_settings(str(embedding_dirs["qwen3-last"]))))
    assert results["POST /v1/embeddings"][200] == CASES and "POST /v2/embed" in results
    assert not any("completions" in label for label in results)


def test_a_score_head_model_serves_what_its_document_allows(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    model = save_tiny_head("qwen3-seqcls-3", tmp_path / "head", vocab_size=49152)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(model)
    results = conformance(app_of(shipped_settings(str(model))))
    assert results["POST /v1/classify"][200] == CASES
    assert not any("completions" in label for label in results)


def test_adapters_loaded_at_run_time_are_described_as_checked(tiny_llama_dir: Path) -> None:
    app = app_of(shipped_settings(str(tiny_llama_dir), max_loras=2, max_lora_rank=8))
    results = conformance(app)
    assert results["POST /v1/score"][200] > 0  # a generated `model` is mostly a 404
    for route in ("POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter"):
        assert set(results[route]) == {404}  # no adapter at a generated path or name
    with TestClient(app) as client:
        document = client.get("/openapi.json").json()
        model = document["components"]["schemas"]["ScoreRequest"]["properties"]["model"]
        assert "model_not_found" in model["description"]
