"""Fuzzing the embedding routes in-process (semantics 20): on an embedding model, valid bodies
of /v1/embeddings, /embeddings, /v2/embed and cosine /v1/score and /v1/rerank get a 200, a
body with one field broken a 400 with a reason, arbitrary JSON or bytes never a 5xx; the
CheckingBackend answers 500 to any work a replica should never see (loadtest/fuzz_strategies.py).
On a causal LM every embedding route is a 400 naming the route. The refusals peers' tests
found (a Matryoshka cut the model was not trained for, an input_type Cohere does not
define), the model card's Matryoshka sizes and /v2/embed's token counts, in-process too."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from app.completions import Completions
from app.schema import ModelList
from app.service import ScoringService
from loadtest.fuzz import Target, in_process
from loadtest.fuzz_server import CheckingBackend, in_process_app
from loadtest.fuzz_strategies import arbitrary_routes, broken_routes, valid_routes
from replicas.contract import ModelInfo, PoolingHead, ScoringLimits
from tests.support.http_support import Reply, ask

VOCAB = 4096
DIMENSION = 32
POOLING = PoolingHead(
    "lasttoken", True, DIMENSION, prompts=(("query", "q: "),), max_seq_length=64, matryoshka=()
)  # any Matryoshka size: the valid bodies cut to any of 1..DIMENSION
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


def embedder_app(matryoshka: tuple[int, ...] | None) -> Any:
    """The ingress on INFO with Matryoshka sizes ``matryoshka`` (PoolingHead.matryoshka)."""
    pooling = dataclasses.replace(POOLING, matryoshka=matryoshka)
    info = dataclasses.replace(INFO, pooling=pooling)
    return in_process_app(service(info), CheckingBackend(info))


def post(api: Any, path: str, body: Any) -> Reply:
    return ask(api, "POST", path, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("matryoshka", "taken", "refused"),
    [
        (None, (DIMENSION,), (1, 8, 16, DIMENSION - 1)),  # not trained for a cut
        ((8, 16), (8, 16, DIMENSION), (1, 12, 17, DIMENSION - 1)),  # those sizes
        ((), (1, 8, 12, DIMENSION), ()),  # any size
    ],
)
def test_a_cut_the_model_was_not_trained_for_is_a_400_naming_the_field(
    matryoshka: tuple[int, ...] | None, taken: tuple[int, ...], refused: tuple[int, ...]
) -> None:
    """vLLM's and SGLang's rule (test_matryoshka_embedding_invalid_dimensions): a model
    without declared Matryoshka sizes is not cut silently; the whole dimension cuts nothing."""
    api = embedder_app(matryoshka)
    for size in (*taken, *refused):
        for path, body in (
            ("/v1/embeddings", {"input": ["ab", "c"], "dimensions": size}),
            ("/v2/embed", {"texts": ["ab", "c"], "output_dimension": size}),
        ):
            reply = post(api, path, body)
            param = "dimensions" if path == "/v1/embeddings" else "output_dimension"
            if size in taken:
                assert reply.status == 200, (size, reply.body)
                continue
            assert reply.status == 400, (size, path)
            assert reply.body["reason"] == "dimensions_not_supported", reply.body
            assert reply.body["param"] == param and param in reply.body["message"]
    for path, field in (("/v1/embeddings", "dimensions"), ("/v2/embed", "output_dimension")):
        body = {"input" if path == "/v1/embeddings" else "texts": ["a"], field: DIMENSION + 1}
        assert post(api, path, body).body["reason"] == "invalid_dimensions"  # as before


@pytest.mark.parametrize(
    ("matryoshka", "card"),
    [
        (None, {"is_matryoshka": False, "matryoshka_dimensions": None}),
        ((8, 16), {"is_matryoshka": True, "matryoshka_dimensions": [8, 16, DIMENSION]}),
        ((), {"is_matryoshka": True, "matryoshka_dimensions": None}),
    ],
)
def test_the_model_card_says_which_sizes_the_vector_may_be_cut_to(
    matryoshka: tuple[int, ...] | None, card: dict[str, Any]
) -> None:
    body = ask(embedder_app(matryoshka), "GET", "/v1/models").body
    ModelList.model_validate(body)
    assert {key: body["data"][0][key] for key in card} == card


def test_an_input_type_cohere_does_not_define_is_a_400_naming_it() -> None:
    api = embedder_app(None)
    for kind in ("search_query", "search_document", "classification", "clustering", "image"):
        assert post(api, "/v2/embed", {"texts": ["a"], "input_type": kind}).status == 200, kind
    for kind in ("search_everything", "query", "SEARCH_QUERY", ""):
        reply = post(api, "/v2/embed", {"texts": ["a"], "input_type": kind})
        assert (reply.status, reply.body["reason"]) == (400, "invalid_request"), kind
        assert reply.body["param"] == "input_type" and "input_type" in reply.body["message"]


def test_v2_embed_meta_counts_the_tokens_as_cohere_and_rerank_do() -> None:
    reply = post(embedder_app(None), "/v2/embed", {"texts": ["abc", "de"]})
    assert reply.status == 200, reply.body
    meta = reply.body["meta"]  # one token per character, no special tokens
    assert meta["tokens"] == {"input_tokens": 5} and meta["billed_units"] == {"input_tokens": 5}
