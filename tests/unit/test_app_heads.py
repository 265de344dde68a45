"""The ingress on a score-head model (semantics 18) without Ray: /v1/score rows from head
logits, /v1/classify, rerank with a head, /v1/models and the refusals, each a 400 with its
reason. The backend answers logit[i, j] = 0.3 * (j + 1) * (len(query) + len(item_i)) - 2."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, softmax

from app.completions import Completions
from app.openapi import score_request_schema
from app.rerank import reranker_for
from app.service import ScoringService
from replicas.contract import ModelInfo, ScoreHead, ScoreWork, ScoringLimits
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings, SettingsError

VOCAB = 49152
THREE = ScoreHead("linear", 3, ("neg", "neu", "pos"))
ONE = ScoreHead("linear", 1, ("LABEL_0",))


def logits_of(work: ScoreWork) -> np.ndarray:
    rows = [
        [0.3 * (j + 1) * (len(work.query_ids) + len(item)) - 2.0 for j in work.label_ids]
        for item in work.item_ids
    ]
    return np.asarray(rows, np.float32).reshape(len(work.item_ids), len(work.label_ids))


class Backend:
    def __init__(self) -> None:
        self.works: list[ScoreWork] = []

    async def __call__(self, work: ScoreWork) -> np.ndarray:
        self.works.append(work)
        return logits_of(work)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source(tiny_llama_dir))


def service_for(tokenizer: Any, head: ScoreHead | None, **settings: Any) -> ScoringService:
    info = ModelInfo("heads", VOCAB, 0, ScoringLimits(8, 256), head)
    reranker = reranker_for(ReplicaSettings.from_keys(**settings).http, tokenizer, head)
    return ScoringService(info=info, tokenizer=tokenizer, clock=lambda: 7.0, reranker=reranker)


def refused(call: Any) -> dict[str, Any]:
    with pytest.raises(ScoringError) as caught:
        asyncio.run(call)
    assert caught.value.status_code == 400
    return caught.value.body


def test_score_rows_are_head_logits_softmax_or_sigmoid(tokenizer: Any) -> None:
    backend, three, one = Backend(), service_for(tokenizer, THREE), service_for(tokenizer, ONE)
    body = {"query": "Is this good?", "items": ["yes it is", "no", ""]}
    raw = asyncio.run(three.score(body, backend))["scores"]
    (work,) = backend.works
    assert work.label_ids == (0, 1, 2) and not work.item_first
    np.testing.assert_allclose(raw, logits_of(work), rtol=1e-6)
    soft = asyncio.run(three.score({**body, "apply_softmax": True}, backend))["scores"]
    np.testing.assert_allclose(soft, softmax(logits_of(work), axis=1), rtol=1e-6)
    sig = asyncio.run(one.score({**body, "apply_softmax": True}, backend))["scores"]
    expected = expit(logits_of(backend.works[-1]))
    np.testing.assert_allclose(sig, expected, rtol=1e-6)
    assert len({round(row[0], 6) for row in sig}) == 3  # not SGLang's constant 1.0


def test_label_token_ids_given_to_a_head_model_is_refused_by_name(tokenizer: Any) -> None:
    backend = Backend()
    payload = {"query": "q", "items": ["a"], "label_token_ids": [1]}
    error = refused(service_for(tokenizer, THREE).score(payload, backend))
    assert (error["reason"], error["param"]) == ("label_token_ids_with_head", "label_token_ids")
    assert not backend.works
    error = refused(service_for(tokenizer, None).score({"query": "q", "items": ["a"]}, backend))
    assert error["reason"] == "empty_label_token_ids"


@pytest.mark.parametrize(
    ("problem_type", "activation"),
    [
        (None, lambda x: softmax(x, axis=1)),
        ("single_label_classification", lambda x: softmax(x, axis=1)),
        ("multi_label_classification", expit),
        ("regression", lambda x: x),
    ],
)
def test_classify_applies_the_configs_activation(tokenizer: Any, problem_type, activation) -> None:
    head = ScoreHead("linear", 3, ("neg", "neu", "pos"), problem_type)
    backend, service = Backend(), service_for(tokenizer, head)
    texts = ["a short one", "a somewhat longer text than that", "mid length"]
    body = asyncio.run(service.classify_timed({"input": texts}, backend))[0]
    logits = np.concatenate([logits_of(work) for work in backend.works])
    assert [w.item_ids for w in backend.works] == [((),)] * 3  # each input is one row
    probs = activation(logits.astype(np.float64))
    assert body["object"] == "list" and body["model"] == "heads" and body["created"] == 7
    assert [entry["index"] for entry in body["data"]] == [0, 1, 2]
    for entry, row in zip(body["data"], probs, strict=True):
        np.testing.assert_allclose(entry["probs"], row, rtol=1e-6)
        assert entry["label"] == head.id2label[int(np.argmax(row))]
        assert entry["num_classes"] == 3
    tokens = sum(len(w.query_ids) for w in backend.works)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "total_tokens": tokens,
    }
    raw = asyncio.run(service.classify_timed({"input": "a", "activation": False}, backend))[0]
    expected = logits_of(backend.works[-1])[0]
    np.testing.assert_allclose(raw["data"][0]["probs"], expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("head", "payload", "reason"),
    [
        (None, {"input": "x"}, "no_score_head"),
        (THREE, {"input": 3}, "invalid_request"),
        (THREE, {"input": ["x"], "extra": 1}, "invalid_request"),
        (THREE, {"input": ["x"] * 9}, "too_many_items"),
        (THREE, {"input": ["x", ["a", "b"]]}, "invalid_request"),  # pairs: cross-encoders only
        (THREE, {"input": "x " * 300}, "sequence_too_long"),
    ],
)
def test_classify_refusals(tokenizer: Any, head, payload, reason) -> None:
    backend = Backend()
    error = refused(service_for(tokenizer, head).classify_timed(payload, backend))
    assert error["reason"] == reason
    assert not backend.works


def test_completions_on_a_head_model_are_refused(tokenizer: Any) -> None:
    info = ModelInfo("heads", VOCAB, 0, ScoringLimits(), THREE)
    service = ScoringService(info, tokenizer, completions=Completions(tokenizer, info))
    error = refused(service.complete_timed({"prompt": "x", "echo": True}, Backend()))
    assert error["reason"] == "no_lm_head"


def test_rerank_head_is_the_sigmoid_of_the_logit(tokenizer: Any) -> None:
    backend, service = Backend(), service_for(tokenizer, ONE, rerank_method="head")
    documents = ["short", "a much longer document about something", "mid-size doc"]
    body = asyncio.run(service.rerank_timed({"query": "q?", "documents": documents}, backend))[0]
    (work,) = backend.works
    assert work.label_ids == (0,) and len(work.item_ids) == 3  # documents are items
    relevance = expit(logits_of(work)[:, 0].astype(np.float64))
    assert [r["index"] for r in body["results"]] == list(np.argsort(-relevance))
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(relevance[result["index"]], rel=1e-9)
    default = service_for(tokenizer, ONE).reranker  # a one-label head ranks by default
    assert default is not None and default.method == "head"
    assert service_for(tokenizer, THREE).reranker is None
    # The shipped config's query_likelihood, with only `model` changed to a head model
    # (issue 43): ignored with a log line, the head ranks.
    for method in ("query_likelihood", "yes_no"):
        shipped = service_for(tokenizer, ONE, rerank_method=method).reranker
        assert shipped is not None and shipped.method == "head"
        assert service_for(tokenizer, THREE, rerank_method=method).reranker is None


@pytest.mark.parametrize(
    ("head", "settings", "named"),
    [
        (None, {"rerank_method": "head"}, "score head"),
        (THREE, {"rerank_method": "head"}, "one-label"),
    ],
)
def test_wrong_rerank_method_for_the_model_stops_start_up(tokenizer, head, settings, named):
    with pytest.raises(SettingsError, match=named):
        service_for(tokenizer, head, **settings)


def test_models_and_openapi_say_how_the_model_scores(tokenizer: Any) -> None:
    card = service_for(tokenizer, THREE).models_body()["data"][0]
    assert (card["scoring"], card["num_labels"]) == ("head", 3)
    assert card["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
    card = service_for(tokenizer, None).models_body()["data"][0]
    assert (card["scoring"], card["num_labels"], card["id2label"]) == ("label_tokens", None, None)
    head_info = ModelInfo("heads", VOCAB, 0, ScoringLimits(), THREE)
    assert "label_token_ids" not in score_request_schema(head_info)["properties"]
    causal = score_request_schema(ModelInfo("lm", VOCAB, 0, ScoringLimits()))
    assert "label_token_ids" in causal["required"]
    assert causal["properties"]["label_token_ids"]["minItems"] == 1


def test_the_openapi_document_lists_only_the_routes_the_models_kind_serves(tokenizer: Any) -> None:
    """Issue 43: schemathesis found /v1/classify's schema looser than its checks (on a causal
    LM every body is a 400). A causal LM's document has no /v1/classify, a head model's no
    /v1/completions, and ClassifyRequest states the item limit and the model name."""
    from app.http import build_api

    async def health() -> None:
        return None

    for head, present, absent in ((None, "/v1/completions", "/v1/classify"),
                                  (THREE, "/v1/classify", "/v1/completions")):  # fmt: skip
        service = service_for(tokenizer, head)
        document = build_api(service, Backend(), health).openapi()
        assert present in document["paths"] and absent not in document["paths"]
        assert "/v1/score" in document["paths"]
    classify = document["components"]["schemas"]["ClassifyRequest"]["properties"]
    assert classify["input"]["anyOf"][1]["maxItems"] == 8  # ScoringLimits(8, ...)
    assert classify["input"]["anyOf"][1]["items"]["type"] == "string"  # no pairs here
    assert classify["model"]["anyOf"][0] == {"const": "heads"}


def classify_bodies() -> Any:
    """(route, body) pairs for /v1/classify: valid-shaped, one field broken, arbitrary."""
    from hypothesis import strategies as st

    from loadtest.fuzz_strategies import to

    text = st.text(max_size=40)
    valid = st.fixed_dictionaries(
        {"input": st.one_of(text, st.lists(text, max_size=20))},
        optional={"activation": st.booleans(), "model": st.sampled_from(["fuzz-head", "x"])},
    )
    junk = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=8,
    )
    broken = st.builds(lambda body, key, value: {**body, key: value}, valid, text, junk)
    return to("/v1/classify", st.one_of(valid, broken, junk))


def test_fuzzed_bodies_on_a_head_model_get_no_5xx_and_agree_with_its_schema() -> None:
    from loadtest.fuzz import Tally, generators, in_process, run_strategy
    from tests.unit.test_app_fuzz import CharTokenizer

    head = ScoreHead("linear", 2, ("a", "b"), "multi_label_classification")
    info = ModelInfo("fuzz-head", VOCAB, 0, ScoringLimits(16, 256, 256), head)
    service = ScoringService(info=info, tokenizer=CharTokenizer(), clock=lambda: 0.0)
    runners, tallies = generators(), []
    with in_process(service) as (target, backend):
        for name in ("schemathesis: positive", "schemathesis: negative", "fixed cases + mutations"):
            tallies.append(Tally(name))
            runners[name](target, tallies[-1], 30, 0)
        classify = Tally("classify")
        run_strategy(target, classify, classify_bodies(), 60, 0)
    assert all(tally.server_errors == 0 for tally in [*tallies, classify])
    assert all(tally.disagreements == 0 for tally in tallies)
    assert tallies[0].count(200, 300) >= 15  # bodies without labels reach the head
    assert classify.count(200, 300) >= 5 and classify.count(400, 500) >= 5
    assert backend.calls > 0
