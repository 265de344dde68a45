"""Fuzzing the embedding routes in-process (semantics 20): on an embedding model, valid bodies
of /v1/embeddings, /embeddings, /v2/embed and cosine /v1/score and /v1/rerank get a 200, a
body with one field broken a 400 with a reason, arbitrary JSON or bytes never a 5xx; the
CheckingBackend answers 500 to any work a replica should never see (loadtest/fuzz_embed.py).
On a causal LM every embedding route is a 400 naming the route."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from app.completions import Completions
from app.service import ScoringService
from loadtest.fuzz import Target, in_process
from loadtest.fuzz_embed import arbitrary_routes, broken_routes, valid_routes
from replicas.contract import ModelInfo, PoolingHead, ScoringLimits

VOCAB = 4096
DIMENSION = 32
POOLING = PoolingHead("lasttoken", True, DIMENSION, prompts=(("query", "q: "),), max_seq_length=64)
INFO = ModelInfo("fuzz-embedder", VOCAB, None, ScoringLimits(8, 256, 256), pooling=POOLING)


class CharTokenizer:
    """One token per character (id = code point % vocab), no special tokens."""

    eos_token, bos_token, pad_token, unk_token, chat_template = None, None, None, None, None
    all_special_ids: tuple[int, ...] = ()

    def __call__(self, text: Any, *, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        keep = kwargs.get("max_length") if kwargs.get("truncation") else None

        def ids(value: str) -> list[int]:
            return [ord(char) % VOCAB for char in value][:keep]

        return {"input_ids": [ids(t) for t in text] if isinstance(text, list) else ids(text)}


def service(info: ModelInfo = INFO) -> ScoringService:
    tokenizer = CharTokenizer()
    return ScoringService(info, tokenizer, lambda: 0.0, completions=Completions(tokenizer, info))


def send(
    target: Target, strategy: st.SearchStrategy[tuple[str, bytes]], count: int
) -> list[tuple[str, int, str | None]]:
    answers: list[tuple[str, int, str | None]] = []

    @settings(max_examples=count, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @seed(0)
    @given(strategy)
    def post(pair: tuple[str, bytes]) -> None:
        path, body = pair
        status, reason = target.post(body, path)
        answers.append((path, status, reason))

    post()
    return answers


@pytest.fixture(scope="module")
def target() -> Any:
    with in_process(service()) as (target, backend):
        yield target, backend


def test_valid_bodies_are_answered(target) -> None:
    client, backend = target
    answers = send(client, valid_routes(client.served, DIMENSION), 60)
    assert [a for a in answers if a[1] != 200] == []
    assert backend.calls >= 40  # items: [] answers without a call


def refused_as_documented(answer: tuple[str, int, str | None]) -> bool:
    """A 400 with a reason, or (a ``model`` the server does not serve) a 404
    ``model_not_found`` (semantics 21)."""
    _, status, reason = answer
    return (status == 400 and bool(reason)) or (status, reason) == (404, "model_not_found")


def test_one_broken_field_is_a_4xx_with_a_reason(target) -> None:
    client, _ = target
    answers = send(client, broken_routes(client.served, DIMENSION), 60)
    assert [a for a in answers if not refused_as_documented(a)] == []


def test_arbitrary_bodies_never_get_a_5xx(target) -> None:
    client, _ = target
    answers = send(client, arbitrary_routes(), 80)
    assert [a for a in answers if a[1] >= 500 or a[1] == 0] == []


def test_a_causal_lm_answers_every_embedding_route_with_a_400() -> None:
    causal = ModelInfo("fuzz-lm", VOCAB, None, ScoringLimits(8, 256, 256))
    with in_process(service(causal)) as (client, backend):
        for path in ("/v1/embeddings", "/embeddings"):
            assert client.post(b'{"input": "abc"}', path) == (400, "unsupported_for_model")
        assert client.post(b'{"texts": ["abc"]}', "/v2/embed") == (400, "unsupported_for_model")
        assert backend.calls == 0
