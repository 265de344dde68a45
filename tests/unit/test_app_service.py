"""The ingress's request path without Ray: rules, tokenization, usage and scores.

The backend is the fake engine: logprob = -(label % 7) - 0.1 * (len(query) + len(item)).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.service import ScoringService
from replicas.contract import ModelInfo, ScoreWork, ScoringLimits
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import fake_logprobs

QUERY = "The capital of France is"  # SmolLM2: [504, 3575, 282, 4649, 314], no BOS
QUERY_IDS = [504, 3575, 282, 4649, 314]
PARIS, LONDON, BERLIN = 7042, 4528, 11452
VOCAB = 49152


class Backend:
    """Records every work it is given and answers with the fake engine's arithmetic."""

    def __init__(self) -> None:
        self.works: list[ScoreWork] = []

    async def __call__(self, work: ScoreWork) -> np.ndarray:
        self.works.append(work)
        return fake_logprobs(work)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source(tiny_llama_dir))


def make_service(
    tokenizer: Any,
    delimiter: int | None = 0,
    max_items: int = 8,
    max_len: int = 64,
) -> ScoringService:
    info = ModelInfo("tiny", VOCAB, delimiter, ScoringLimits(max_items, max_len))
    return ScoringService(info=info, tokenizer=tokenizer, clock=lambda: 1234.9)


@pytest.fixture
def service(tokenizer: Any) -> ScoringService:
    return make_service(tokenizer)


def score(service: ScoringService, backend: Backend, **payload: Any) -> dict[str, Any]:
    return asyncio.run(service.score(payload, backend))


def rejection(service: ScoringService, **payload: Any) -> tuple[str, Backend]:
    backend = Backend()
    with pytest.raises(ScoringError) as caught:
        score(service, backend, **payload)
    assert caught.value.status_code == 400
    assert not backend.works, "a rejected request reached the replica"
    return caught.value.reason.value, backend


def test_text_request_scores_by_hand(service: ScoringService) -> None:
    backend = Backend()
    body = score(service, backend, query=QUERY, items=["", " Paris"], label_token_ids=[PARIS, 9])
    # len(query) = 5; "" adds 0 tokens, " Paris" adds 1. 7042 % 7 == 0, 9 % 7 == 2.
    expected = [[math.exp(-0.5), math.exp(-2.5)], [math.exp(-0.6), math.exp(-2.6)]]
    assert np.allclose(body["scores"], expected, rtol=1e-6)
    assert body["object"] == "scoring"
    assert body["model"] == "tiny"
    assert body["created"] == 1234
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 0, "total_tokens": 11}
    assert backend.works == [
        ScoreWork(tuple(QUERY_IDS), ((), (PARIS,)), (PARIS, 9), item_first=False)
    ]


def test_apply_softmax_normalizes_over_labels(service: ScoringService) -> None:
    body = score(
        service, Backend(), query=QUERY, items=[" a"], label_token_ids=[7, 8], apply_softmax=True
    )
    # Labels 7 and 8 differ by exactly 1 in logprob (7 % 7 = 0, 8 % 7 = 1).
    e = math.exp(1.0)
    assert np.allclose(body["scores"], [[e / (e + 1), 1 / (e + 1)]])


def test_text_and_token_inputs_are_identical(service: ScoringService, tokenizer: Any) -> None:
    items = [" Paris", " is a city", ""]
    text = score(service, Backend(), query=QUERY, items=items, label_token_ids=[PARIS, LONDON])
    item_ids = [tokenizer(item, add_special_tokens=False)["input_ids"] for item in items]
    tokens = score(
        service, Backend(), query=QUERY_IDS, items=item_ids, label_token_ids=[PARIS, LONDON]
    )
    assert text == tokens


def test_items_are_tokenized_alone_and_joined_as_ids(service: ScoringService) -> None:
    backend = Backend()
    score(service, backend, query="ab", items=["cd"], label_token_ids=[1])
    work = backend.works[0]
    assert work.item_ids[0] == tuple(service.tokenizer("cd", add_special_tokens=False)["input_ids"])


class BosTokenizer:
    """A tokenizer that adds BOS (id 1) with special tokens: one id per character + 100."""

    def __call__(self, text: Any, *, add_special_tokens: bool = True) -> dict[str, Any]:
        def encode(value: str) -> list[int]:
            return ([1] if add_special_tokens else []) + [100 + ord(c) % 50 for c in value]

        ids = [encode(t) for t in text] if isinstance(text, list) else encode(text)
        return {"input_ids": ids}


def test_query_gets_special_tokens_items_do_not() -> None:
    service = make_service(BosTokenizer(), delimiter=None)
    backend = Backend()
    score(service, backend, query="ab", items=["c", ""], label_token_ids=[1])
    work = backend.works[0]
    assert work.query_ids[0] == 1 and len(work.query_ids) == 3
    assert work.item_ids == ((100 + ord("c") % 50,), ())


def test_item_first_is_passed_to_the_replica(service: ScoringService) -> None:
    backend = Backend()
    score(service, backend, query=QUERY, items=["x"], label_token_ids=[1], item_first=True)
    assert backend.works[0].item_first is True


def test_empty_items_answer_empty_scores_without_the_replica(service: ScoringService) -> None:
    backend = Backend()
    body = score(service, backend, query=QUERY, items=[], label_token_ids=[PARIS])
    assert body["scores"] == []
    assert body["usage"]["prompt_tokens"] == 0
    assert backend.works == []


def test_empty_items_still_validate_labels(service: ScoringService) -> None:
    assert rejection(service, query=QUERY, items=[], label_token_ids=[])[0] == (
        "empty_label_token_ids"
    )


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"query": QUERY, "items": ["a"], "label_token_ids": []}, "empty_label_token_ids"),
        ({"query": QUERY, "items": ["a"], "label_token_ids": [-1]}, "negative_token_id"),
        ({"query": QUERY, "items": ["a"], "label_token_ids": [VOCAB]}, "token_id_exceeds_vocab"),
        ({"query": QUERY, "items": ["a"], "label_token_ids": [10**30]}, "token_id_exceeds_vocab"),
        ({"query": QUERY, "items": [[1]], "label_token_ids": [1]}, "mixed_input_types"),
        ({"query": [1], "items": ["a"], "label_token_ids": [1]}, "mixed_input_types"),
        ({"query": [1], "items": [[1], "a"], "label_token_ids": [1]}, "mixed_input_types"),
        ({"query": [1], "items": [[-5]], "label_token_ids": [1]}, "negative_token_id"),
        ({"query": [-1], "items": [[5]], "label_token_ids": [1]}, "negative_token_id"),
        ({"query": [1], "items": [[VOCAB]], "label_token_ids": [1]}, "token_id_exceeds_vocab"),
        ({"query": [10**30], "items": [[1]], "label_token_ids": [1]}, "token_id_exceeds_vocab"),
        ({"query": "", "items": ["a"], "label_token_ids": [1]}, "empty_query"),
        ({"query": [], "items": [[1]], "label_token_ids": [1]}, "empty_query"),
        ({"query": "q", "items": ["a"] * 9, "label_token_ids": [1]}, "too_many_items"),
        ({"query": "q", "items": ["x " * 70], "label_token_ids": [1]}, "sequence_too_long"),
        (
            {"query": "<|endoftext|>hi", "items": ["a"], "label_token_ids": [1]},
            "delimiter_in_content",
        ),
        (
            {"query": "q", "items": ["a<|endoftext|>"], "label_token_ids": [1]},
            "delimiter_in_content",
        ),
        ({"query": [5, 0], "items": [[1]], "label_token_ids": [1]}, "delimiter_in_content"),
        ({"query": [5], "items": [[1], [0]], "label_token_ids": [1]}, "delimiter_in_content"),
        ({"query": "\ud800", "items": ["a"], "label_token_ids": [1]}, "invalid_request"),
        ({"query": "q", "items": ["a"], "label_token_ids": ["1"]}, "invalid_request"),
    ],
)
def test_every_rule_rejects_before_the_replica(
    service: ScoringService, payload: dict[str, Any], reason: str
) -> None:
    assert rejection(service, **payload)[0] == reason


def test_delimiter_allowed_in_content_when_multi_item_is_off(tokenizer: Any) -> None:
    service = make_service(tokenizer, delimiter=None)
    body = score(service, Backend(), query=[5, 0], items=[[0]], label_token_ids=[1])
    assert len(body["scores"]) == 1


def test_packed_length_bounds_multi_item_only(tokenizer: Any) -> None:
    # 4 items of 10 tokens behind a 20-token query: packed 20+1+4*11 = 65 > 64, rows 30 <= 64.
    payload = {"query": [5] * 20, "items": [[6] * 10] * 4, "label_token_ids": [1]}
    assert rejection(make_service(tokenizer, delimiter=0), **payload)[0] == "sequence_too_long"
    single = make_service(tokenizer, delimiter=None)
    assert len(score(single, Backend(), **payload)["scores"]) == 4
    # item_first goes through the per-item path, bounded by the longest row.
    multi = make_service(tokenizer, delimiter=0)
    assert len(score(multi, Backend(), **payload, item_first=True)["scores"]) == 4


def test_model_name_may_be_given(service: ScoringService) -> None:
    body = score(service, Backend(), query="q", items=["a"], label_token_ids=[1], model="tiny")
    assert body["model"] == "tiny"


def test_wrong_shape_from_replica_is_a_500(service: ScoringService) -> None:
    async def broken(work: ScoreWork) -> np.ndarray:
        return np.zeros((1, 5), np.float32)

    with pytest.raises(ScoringError) as caught:
        asyncio.run(
            service.score({"query": "q", "items": ["a", "b"], "label_token_ids": [1]}, broken)
        )
    assert caught.value.status_code == 500


def test_from_settings_uses_the_model_vocab(tiny_llama_dir: Path) -> None:
    service = ScoringService.from_settings(
        ReplicaSettings.from_keys(model=str(tiny_llama_dir), multi_item_scoring_delimiter=0)
    )
    assert service.info.vocab_size == VOCAB
    assert service.info.multi_item_scoring_delimiter == 0
    assert service.info.name == tiny_llama_dir.name


def test_from_settings_rejects_a_delimiter_outside_the_vocab(tiny_llama_dir: Path) -> None:
    settings = ReplicaSettings.from_keys(
        model=str(tiny_llama_dir), multi_item_scoring_delimiter=VOCAB
    )
    with pytest.raises(SettingsError, match=r"^multi_item_scoring_delimiter: .*49152"):
        ScoringService.from_settings(settings)
