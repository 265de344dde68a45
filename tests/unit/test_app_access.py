"""API keys and request logs (semantics 13) on the Ray-free HTTP routing (app/http.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from app.access import key_matches, load_api_keys
from app.http import ACCESS_LOG, build_api
from replicas.contract import ScoreWork
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import fake_logprobs
from tests.support.http_support import ask as ask_api
from tests.unit.test_app_http import SERVICE

KEYS = frozenset({"sk-first", "sk-second"})
DISTINCTIVE = "zebra quokka seventeen"
BODY = json.dumps({"query": DISTINCTIVE, "items": ["ab"], "label_token_ids": [3]}).encode()


def ask(path: str, authorization: str | None, request_id: str | None = None, method="POST"):
    works: list[ScoreWork] = []

    async def backend(work: ScoreWork) -> np.ndarray:
        works.append(work)
        return fake_logprobs(work)

    async def health() -> None:
        return None

    headers = {"authorization": authorization, "x-request-id": request_id}
    headers = {name: value for name, value in headers.items() if value is not None}
    api = build_api(SERVICE, backend, health, keys=KEYS)
    reply = ask_api(api, method, path, BODY if method == "POST" else b"", headers)
    return reply, works


@pytest.mark.parametrize("authorization", [None, "Bearer sk-wrong", "sk-first", "Basic sk-first"])
def test_v1_routes_need_a_valid_bearer_key(authorization: str | None) -> None:
    reply, works = ask("/v1/score", authorization)
    assert reply.status == 401 and works == []  # never reaches a replica
    assert (reply.body["reason"], reply.body["type"]) == ("unauthorized", "AuthenticationError")
    assert reply.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("key", sorted(KEYS))
def test_any_configured_key_is_accepted(key: str) -> None:
    reply, works = ask("/v1/score", f"Bearer {key}")
    assert reply.status == 200 and len(works) == 1
    assert ask("/v1/models", f"bearer {key}", method="GET")[0].status == 200


def test_retrieving_a_model_by_id_needs_a_key_as_the_list_does() -> None:
    for path in ("/v1/models", "/v1/models/m", "/v1/models/unknown"):
        reply, _ = ask(path, None, method="GET")
        assert (reply.status, reply.body["reason"]) == (401, "unauthorized"), path
    assert ask("/v1/models/m", "Bearer sk-first", method="GET")[0].body["id"] == "m"
    assert ask("/v1/models/unknown", "Bearer sk-first", method="GET")[0].status == 404


def test_health_and_the_openapi_document_stay_open() -> None:
    assert ask("/health", None, method="GET")[0].status == 200
    assert ask("/openapi.json", None, method="GET")[0].status == 200


def test_key_comparison_checks_every_key() -> None:
    assert key_matches("sk-second", KEYS) and not key_matches("sk-secon", KEYS)
    assert not key_matches("", KEYS)


def test_keys_come_from_a_named_variable_or_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# team keys\nsk-a\nsk-b, sk-c  # rotated 2026-11\n")
    settings = ReplicaSettings.from_keys(api_keys_env="SCOREJAX_KEYS", api_keys_file=str(keys_file))
    keys = load_api_keys(settings.http, {"SCOREJAX_KEYS": "sk-env"})
    assert keys == {"sk-env", "sk-a", "sk-b", "sk-c"}
    assert load_api_keys(ReplicaSettings().http, {}) == frozenset()  # none configured: no auth


def test_a_configured_source_without_keys_fails_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="api_keys_env: environment variable 'NOPE'"):
        load_api_keys(ReplicaSettings.from_keys(api_keys_env="NOPE").http, {})
    with pytest.raises(SettingsError, match=r"api_keys_file: .* is not a readable file"):
        load_api_keys(ReplicaSettings.from_keys(api_keys_file=str(tmp_path / "missing")).http, {})
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(SettingsError, match=r"api_keys_file: .* holds no key"):
        load_api_keys(ReplicaSettings.from_keys(api_keys_file=str(tmp_path / "empty")).http, {})


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_logs_carry_the_request_id_and_timing_never_the_content() -> None:
    records = Records()
    loggers = [logging.getLogger(name) for name in (ACCESS_LOG, "app")]
    levels = [log.level for log in loggers]
    for log in loggers:  # every app logger at DEBUG: content must not appear at any level
        log.addHandler(records)
        log.setLevel(logging.DEBUG)
    try:
        ok, _ = ask("/v1/score", "Bearer sk-first", request_id="client-42")
        refused, _ = ask("/v1/score", None)
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.removeHandler(records)
            log.setLevel(level)
    assert ok.headers["x-request-id"] == "client-42"
    assert len(refused.headers["x-request-id"]) == 32  # generated
    lines = [r.getMessage() for r in records.records if r.levelno >= logging.INFO]
    assert any("client-42" in line and "-> 200" in line and " ms" in line for line in lines)
    assert any("-> 401 unauthorized" in line for line in lines)
    for record in records.records:
        assert "zebra" not in record.getMessage() and "sk-first" not in record.getMessage()


def test_a_request_id_that_could_forge_log_lines_is_replaced() -> None:
    reply, _ = ask("/v1/score", "Bearer sk-first", request_id="x\n-> 200 forged")
    assert reply.headers["x-request-id"] != "x\n-> 200 forged"
