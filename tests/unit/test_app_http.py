"""HTTP routing of the ingress without Ray: routes, methods, body limits, health, OpenAPI."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bodies import read_limited
from app.http import build_api, relative_path
from app.schema import ModelCard, ModelList
from app.service import ScoringService
from loadtest.fuzz_strategies import json_values
from replicas.contract import ModelInfo, ScoredWork, ScoreWork, ScoringLimits
from replicas.errors import Reason, ScoringError
from tests.support.fake_engine import fake_logprobs
from tests.support.http_support import Reply, ask


class WordTokenizer:
    """One token per character (id = code point % 1000 + 1); enough for routing tests."""

    def __call__(self, text: Any, *, add_special_tokens: bool = True) -> dict[str, Any]:
        def encode(value: str) -> list[int]:
            return [ord(c) % 1000 + 1 for c in value]

        ids = [encode(t) for t in text] if isinstance(text, list) else encode(text)
        return {"input_ids": ids}


SERVICE = ScoringService(
    info=ModelInfo("m", 2000, None, ScoringLimits(4, 64)),
    tokenizer=WordTokenizer(),
    clock=lambda: 0.0,
)


def call(
    method: str,
    path: str,
    body: bytes = b"",
    healthy: bool = True,
) -> tuple[Reply, list[ScoreWork]]:
    works: list[ScoreWork] = []

    async def backend(work: ScoreWork) -> np.ndarray:
        works.append(work)
        return fake_logprobs(work)

    async def health() -> None:
        if not healthy:
            raise ScoringError(Reason.UNAVAILABLE, "down", None, 503)

    reply = ask(build_api(SERVICE, backend, health), method, path, body)
    return reply, works


FUZZ_WORKS: list[ScoreWork] = []  # what the fuzzed bodies' app passed its backend


@functools.cache
def fuzz_api() -> Any:
    """``call``'s app, built once for the fuzz test's examples (building it is most of a
    request's cost); the test empties ``FUZZ_WORKS`` before each body."""

    async def backend(work: ScoreWork) -> np.ndarray:
        FUZZ_WORKS.append(work)
        return fake_logprobs(work)

    async def health() -> None:
        return None

    return build_api(SERVICE, backend, health)


def test_score_route() -> None:
    body = json.dumps({"query": "ab", "items": ["c"], "label_token_ids": [3]}).encode()
    reply, works = call("POST", "/v1/score", body)
    assert reply.status == 200
    assert reply.body["scores"] == [[pytest.approx(np.exp(-3 - 0.3))]]
    assert len(works) == 1


@pytest.mark.parametrize(
    "body", [b"{", b"[1]", b'{"query": "a", "items": ["b"], "label_token_ids": [1], "x": 1}']
)
def test_malformed_bodies_are_400_and_reach_no_replica(body: bytes) -> None:
    reply, works = call("POST", "/v1/score", body)
    assert reply.status == 400
    assert reply.body["object"] == "error"
    assert works == []


def test_unknown_route_is_404_envelope() -> None:
    reply, _ = call("GET", "/v2/score")
    assert (reply.status, reply.body["reason"], reply.body["type"]) == (
        404,
        "not_found",
        "NotFoundError",
    )


def test_wrong_method_is_405_with_allow() -> None:
    reply, works = call("GET", "/v1/score")
    assert reply.status == 405
    assert reply.headers["Allow"] == "POST" and "x-request-id" in reply.headers
    assert works == []
    assert call("POST", "/health")[0].status == 405


def test_models_route_describes_the_model() -> None:
    reply, _ = call("GET", "/v1/models")
    assert reply.status == 200
    (card,) = reply.body["data"]
    assert card["id"] == "m"
    assert card["vocab_size"] == 2000
    assert card["max_items_per_request"] == 4
    assert card["rerank_chunking"] is None and card["max_input_tokens"] is None  # no reranker
    ModelList.model_validate(reply.body)  # strict: the published fields, no other


def test_stats_come_from_the_stats_source_and_are_404_without_one() -> None:
    async def stats() -> dict:
        return {"compile_count": 3}

    async def health() -> None:
        return None

    async def backend(work: ScoreWork) -> np.ndarray:
        raise AssertionError("stats must not score")

    reply = ask(build_api(SERVICE, backend, health, stats), "GET", "/v1/stats")
    assert (reply.status, reply.body) == (200, {"compile_count": 3})
    assert call("GET", "/v1/stats")[0].status == 404


def test_health_reflects_the_backend() -> None:
    assert call("GET", "/health")[0].status == 200
    reply, _ = call("GET", "/health", healthy=False)
    assert (reply.status, reply.body["reason"]) == (503, "unavailable")


def test_unexpected_errors_are_500_envelopes() -> None:
    async def explode(work: ScoreWork) -> np.ndarray:
        raise KeyError("bug")

    async def health() -> None:
        return None

    body = json.dumps({"query": "a", "items": ["b"], "label_token_ids": [1]}).encode()
    reply = ask(build_api(SERVICE, explode, health), "POST", "/v1/score", body)
    assert (reply.status, reply.body["reason"]) == (500, "internal_error")


def test_openapi_describes_request_and_response() -> None:
    reply, _ = call("GET", "/openapi.json")
    document = reply.body
    assert document["openapi"].startswith("3.")
    post = document["paths"]["/v1/score"]["post"]
    assert set(post["responses"]) >= {"200", "400"}
    schemas = document["components"]["schemas"]
    request = schemas["ScoreRequest"]
    assert set(request["properties"]) == {
        "query",
        "items",
        "label_token_ids",
        "apply_softmax",
        "item_first",
        "model",
    }
    assert set(request["required"]) == {"query", "items", "label_token_ids"}
    assert request["additionalProperties"] is False
    assert set(schemas["ScoreResponse"]["properties"]) == {
        "object",
        "model",
        "scores",
        "usage",
        "created",
    }
    assert "reason" in schemas["ErrorResponse"]["properties"]
    # Every $ref points at a schema the document defines.
    refs = set(_refs(document))
    assert refs and all(ref.split("/")[-1] in schemas for ref in refs)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if "$ref" in node else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_body_limit() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"x" * 10

    assert asyncio.run(read_limited(chunks(), limit=50)) == b"x" * 50
    with pytest.raises(ScoringError) as caught:
        asyncio.run(read_limited(chunks(), limit=49))
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/v1/score", "", "/v1/score"),
        ("/v1/score/", "", "/v1/score"),
        ("/app/v1/score", "/app", "/v1/score"),
        ("/app", "/app", "/"),
        ("/health", "/", "/health"),
    ],
)
def test_relative_path(path: str, root: str, expected: str) -> None:
    assert relative_path(path, root) == expected


field_names = st.sampled_from(
    ["query", "items", "label_token_ids", "apply_softmax", "item_first", "model", "other"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.dictionaries(field_names, json_values, max_size=7),
        st.fixed_dictionaries(
            {
                "query": st.one_of(
                    st.text(max_size=10), st.lists(st.integers(-5, 2100), max_size=5)
                ),
                "items": st.lists(
                    st.one_of(st.text(max_size=5), st.lists(st.integers(-5, 2100), max_size=4)),
                    max_size=6,
                ),
                "label_token_ids": st.lists(st.integers(-5, 2100), max_size=4),
            }
        ),
    )
)
def test_fuzzed_bodies_get_200_or_a_400_envelope(payload: Any) -> None:
    FUZZ_WORKS.clear()
    reply = ask(fuzz_api(), "POST", "/v1/score", json.dumps(payload).encode())
    works = list(FUZZ_WORKS)
    assert reply.status in (200, 400), reply.body
    if reply.status == 400:
        assert reply.body["object"] == "error" and reply.body["code"] == 400
        assert works == []
    else:
        assert len(reply.body["scores"]) == len(payload["items"])


def test_a_scored_request_says_where_its_time_went_in_tei_headers() -> None:
    body = json.dumps({"query": "ab", "items": ["c", "d"], "label_token_ids": [3]}).encode()

    async def backend(work: ScoreWork) -> ScoredWork:
        await asyncio.sleep(0.3)  # waiting for a step: everything but the step is queue time
        return ScoredWork(fake_logprobs(work), inference_s=0.25)

    async def health() -> None:
        return None

    reply = ask(build_api(SERVICE, backend, health), "POST", "/v1/score", body)
    times = {name: int(reply.headers[f"x-{name}-time"]) for name in TIMED}
    assert times["inference"] == 250
    assert 30 <= times["queue"] <= 200  # 300 ms waited - 250 ms of step, plus scheduling
    assert times["total"] >= times["tokenization"] + times["queue"] + times["inference"] - 2
    assert len(reply.body["scores"]) == 2


def test_a_refusal_or_a_bare_array_gets_only_the_times_the_ingress_knows() -> None:
    refused, _ = call("POST", "/v1/score", b"{")
    assert "x-total-time" in refused.headers and "x-inference-time" not in refused.headers
    body = json.dumps({"query": "ab", "items": ["c"], "label_token_ids": [3]}).encode()
    bare, _ = call("POST", "/v1/score", body)  # a backend answering an array: no step time
    assert {"x-total-time", "x-tokenization-time"} <= set(bare.headers)
    assert "x-inference-time" not in bare.headers and "x-queue-time" not in bare.headers


TIMED = ("tokenization", "queue", "inference", "total")


class CountingTokenizer(WordTokenizer):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: Any, *, add_special_tokens: bool = True) -> dict[str, Any]:
        self.calls += 1
        return super().__call__(text, add_special_tokens=add_special_tokens)


def test_the_replicas_refusal_is_the_answer_and_bad_input_never_reaches_them() -> None:
    # Admission is the replica's alone (app.ingress._call_replica): the ingress relays its
    # 503 and Retry-After as the envelope; a body that breaks a rule is refused before any
    # work is sent.
    tokenizer = CountingTokenizer()
    service = ScoringService(SERVICE.info, tokenizer, clock=lambda: 0.0)
    works: list[ScoreWork] = []

    async def overloaded(work: ScoreWork) -> np.ndarray:
        works.append(work)
        raise ScoringError(Reason.OVERLOADED, "scoring replica overloaded", None, 503, 7)

    async def health() -> None:
        return None

    app = build_api(service, overloaded, health)
    good = json.dumps({"query": "ab", "items": ["c"], "label_token_ids": [1]}).encode()
    reply = ask(app, "POST", "/v1/score", good)
    assert reply.status == 503 and reply.body["reason"] == "overloaded"
    assert reply.headers["retry-after"] == "7" and len(works) == 1
    bad = json.dumps({"query": "ab", "items": ["c"], "label_token_ids": []}).encode()
    assert ask(app, "POST", "/v1/score", bad).body["reason"] == "empty_label_token_ids"
    assert ask(app, "POST", "/v1/score", b"{").status == 400
    assert len(works) == 1


def test_adapter_routes_without_lora_slots_are_unoffered_404s_naming_max_loras() -> None:
    body = json.dumps({"lora_name": "ranker", "lora_path": "/nowhere"}).encode()
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        reply, works = call("POST", path, body)
        assert reply.status == 404 and "max_loras" in reply.body["message"], path
        assert works == []
    document, _ = call("GET", "/openapi.json")
    assert not {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} & set(document.body["paths"])


def test_a_model_is_retrieved_by_id_as_the_list_shows_it_and_an_unknown_id_is_a_404() -> None:
    # OpenAI's client.models.retrieve(id): GET /v1/models/{id}, the base model or an adapter
    info = dataclasses.replace(SERVICE.info, name="org/m", adapters=("ranker",))
    service = dataclasses.replace(SERVICE, info=info)

    async def health() -> None:
        return None

    api = build_api(service, _no_replica, health)
    listed = {card["id"]: card for card in ask(api, "GET", "/v1/models").body["data"]}
    for name in ("org/m", "ranker"):
        reply = ask(api, "GET", f"/v1/models/{name}")
        assert (reply.status, reply.body) == (200, listed[name]), name
        ModelCard.model_validate(reply.body)
    assert ask(api, "GET", "/v1/models/ranker").body["parent"] == "org/m"
    for unknown in ("m", "org", "ranker2", "org/m/x"):
        reply = ask(api, "GET", f"/v1/models/{unknown}")
        assert reply.status == 404, unknown
        assert (reply.body["reason"], reply.body["type"]) == ("model_not_found", "NotFoundError")
        assert reply.body["param"] == "model" and repr(unknown) in reply.body["message"]


async def _no_replica(work: Any) -> Any:
    raise AssertionError("no work may reach a replica")


@pytest.mark.parametrize("echo", [True, False])
def test_zero_logprobs_give_each_position_the_chosen_tokens_entry_alone(echo: bool) -> None:
    """OpenAI's and vLLM's legacy completions (vLLM's test_zero_logprobs,
    test_echo_logprob_completion[0]): ``logprobs: 0`` gives each position's ``top_logprobs``
    the chosen token (the prompt's, or the greedy one) with its log-prob; the first echoed
    token's stays null. The fake replica's top ids (1, 2, ...) are never the prompt's."""
    from app.completions import Completions
    from loadtest.fuzz_server import CheckingBackend, in_process_app
    from tests.unit.test_app_fuzz import INFO, CharTokenizer

    tokenizer = CharTokenizer()
    service = ScoringService(INFO, tokenizer, lambda: 0.0, completions=Completions(tokenizer, INFO))
    api = in_process_app(service, CheckingBackend(INFO))
    body = {"prompt": "wxyz", "echo": echo, "logprobs": 0, "max_tokens": 1}
    reply = ask(api, "POST", "/v1/completions", json.dumps(body).encode())
    assert reply.status == 200, reply.body
    logprobs = reply.body["choices"][0]["logprobs"]
    tokens, values, tops = logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]
    assert tokens == ([*"wxyz", "\x01"] if echo else ["\x01"])  # the greedy token: id 1
    expected = [{token: value} for token, value in zip(tokens, values, strict=True)]
    if echo:
        assert values[0] is None and tops[0] is None
        expected[0] = None
    assert tops == expected
    assert tops[-1] == {"\x01": -1.0} and all(v == pytest.approx(-0.1) for v in values[1:-1])
    two = ask(api, "POST", "/v1/completions", json.dumps({**body, "logprobs": 2}).encode())
    top_two = two.body["choices"][0]["logprobs"]["top_logprobs"]  # logprobs > 0: the top k
    assert top_two[-1] == {"\x01": -1.0, "\x02": -2.0}
