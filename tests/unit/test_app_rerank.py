"""/v1/rerank without Ray: the template, validation, ordering and its equality with /v1/score
of the same prompts (the real SmolLM2 tokenizer; a fake replica with hand-checkable scores)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from app.http import build_api
from app.query_likelihood import LikelihoodTemplate
from app.rerank import Reranker, RerankTemplate, reranker_for
from app.service import ScoringService
from replicas.contract import ModelInfo, PromptLogprobs, PromptWork, ScoreWork, ScoringLimits
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import fake_logprobs
from tests.support.http_support import ask

DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "France: Paris.", "x"]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer: Any) -> Any:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def service(tokenizer: Any) -> ScoringService:
    info = ModelInfo("smollm2", 49152, 0, ScoringLimits(8, 4096, 1024))
    reranker = reranker_for(ReplicaSettings().http, tokenizer)
    return ScoringService(info=info, tokenizer=tokenizer, clock=lambda: 0.0, reranker=reranker)


async def backend(work: ScoreWork) -> np.ndarray:
    return fake_logprobs(work)


async def health_ok() -> None:
    return None


def rerank(service: ScoringService, **payload: Any) -> dict[str, Any]:
    body, _ = asyncio.run(service.rerank_timed(payload, backend))
    return body


def test_relevance_is_p_yes_of_the_same_prompts_scored_through_v1_score(service, tokenizer):
    body = rerank(service, query="capital of France", documents=DOCS, return_documents=True)
    template = RerankTemplate()
    yes, no = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in ("yes", "no"))
    prompt = template.query.format(instruction=template.instruction, query="capital of France")
    items = [template.document.format(document=d) for d in DOCS]
    scored = asyncio.run(
        service.score(
            {"query": prompt, "items": items, "label_token_ids": [yes, no], "apply_softmax": True},
            backend,
        )
    )
    expected = [row[0] for row in scored["scores"]]
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    for result in results:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-6)
        assert result["document"] == {"text": DOCS[result["index"]]}
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert body["usage"]["prompt_tokens"] == scored["usage"]["prompt_tokens"]


def test_top_n_keeps_the_best_and_documents_may_be_objects(service):
    full = rerank(service, query="q", documents=DOCS)
    objects = [{"text": d} for d in DOCS]
    top = rerank(service, query="q", documents=objects, top_n=2)
    assert top["results"] == full["results"][:2] and "document" not in top["results"][0]
    assert rerank(service, query="q", documents=[])["results"] == []


def test_max_tokens_per_doc_cuts_each_document(service, tokenizer):
    long = "one two three four five six seven eight"
    cut = tokenizer.decode(tokenizer(long, add_special_tokens=False)["input_ids"][:3])
    assert (
        rerank(service, query="q", documents=[long], max_tokens_per_doc=3)["results"]
        == (rerank(service, query="q", documents=[cut])["results"])
    )


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": "a"}, "documents"),
        ({"query": "q", "documents": [1]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "rank_fields": ["x"]}, "rank_fields"),
        ({"query": "q", "documents": ["a<|endoftext|>"]}, "documents"),  # the delimiter
        ({"query": "q", "documents": ["a"] * 9}, "items"),  # max_items_per_request 8
    ],
)
def test_bad_requests_are_400s_naming_the_field(service, payload, param):
    with pytest.raises(ScoringError) as error:
        rerank(service, **payload)
    assert error.value.status_code == 400 and error.value.param == param


def test_an_unknown_model_is_a_404_naming_the_field(service):
    """Semantics 21: ``model`` names the served model or one of its LoRA adapters."""
    with pytest.raises(ScoringError) as error:
        rerank(service, query="q", documents=["a"], model="other")
    assert error.value.status_code == 404 and error.value.param == "model"


def test_the_http_routes_and_a_model_without_a_template(service):
    body = json.dumps({"query": "q", "documents": DOCS[:2]}).encode()

    async def health() -> None:
        return None

    api = build_api(service, backend, health)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        reply = ask(api, "POST", path, body)
        assert reply.status == 200 and len(reply.body["results"]) == 2
    bare = ScoringService(info=service.info, tokenizer=service.tokenizer)
    reply = ask(build_api(bare, backend, health), "POST", "/v1/rerank", body)
    assert reply.status == 404 and "rerank_template" in reply.body["message"]


def test_a_wrong_template_stops_start_up_naming_the_setting(tokenizer):
    with pytest.raises(SettingsError, match="rerank_template: unknown key 'answer'"):
        Reranker.build((("answer", "yes"),), tokenizer)
    with pytest.raises(SettingsError, match=r"rerank_template.document: must contain \{document\}"):
        Reranker.build((("document", "no placeholder"),), tokenizer)
    with pytest.raises(SettingsError, match=r"rerank_template\.yes: 'certainly yes' is 3 tokens"):
        Reranker.build((("yes", "certainly yes"),), tokenizer)
    settings = ReplicaSettings.from_mapping({"rerank_template": {"yes": "Yes", "no": "No"}})
    assert reranker_for(settings.http, tokenizer).template.yes == "Yes"


def test_the_answer_is_what_the_published_document_says(service):
    from app.schema import RerankResponse

    body = rerank(service, query="q", documents=DOCS, return_documents=True, top_n=3)
    RerankResponse.model_validate(body)  # strict: no field beyond the published ones
    document = build_api(service, backend, health_ok).openapi()
    assert "RerankRequest" in document["components"]["schemas"]
    paths = document["paths"]
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/RerankRequest"}


def fake_prompt_answer(prompt: tuple[int, ...]) -> PromptLogprobs:
    """Hand-checkable prompt log-probs: token t scores -(t % 7 + 1) / 10 wherever it stands."""
    logprobs = np.array([np.nan] + [-(t % 7 + 1) / 10 for t in prompt[1:]], np.float32)
    top = np.zeros((len(prompt) + 1, 1))
    return PromptLogprobs(logprobs, top.astype(np.int32), top.astype(np.float32))


async def prompt_backend(work: PromptWork) -> list[PromptLogprobs]:
    return [fake_prompt_answer(prompt) for prompt in work.prompts]


@pytest.fixture(scope="module")
def likelihood(tokenizer: Any) -> ScoringService:
    info = ModelInfo("smollm2", 49152, 0, ScoringLimits(8, 4096, 1024))
    settings = ReplicaSettings.from_keys(rerank_method="query_likelihood")
    reranker = reranker_for(settings.http, tokenizer)
    return ScoringService(info=info, tokenizer=tokenizer, clock=lambda: 0.0, reranker=reranker)


def test_query_likelihood_is_the_exp_of_the_querys_mean_token_log_prob(likelihood, tokenizer):
    query = "capital of France"
    body, _ = asyncio.run(
        likelihood.rerank_timed({"query": query, "documents": DOCS}, prompt_backend)
    )
    template = LikelihoodTemplate()
    scored = tokenizer(" " + query, add_special_tokens=False)["input_ids"]
    mean = np.mean([-(t % 7 + 1) / 10 for t in scored])  # the fake's log-probs of the query
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(np.exp(mean), abs=1e-6)
    documents = [template.document.format(document=d) for d in DOCS]
    expected = sum(len(ids) for ids in tokenizer(documents)["input_ids"]) + 4 * len(scored)
    assert body["usage"]["total_tokens"] == expected


def test_query_likelihood_scores_only_the_query_after_each_document(likelihood, tokenizer):
    seen: list[PromptWork] = []

    async def recording(work: PromptWork) -> list[PromptLogprobs]:
        seen.append(work)
        return await prompt_backend(work)

    asyncio.run(likelihood.rerank_timed({"query": "bees", "documents": DOCS[:2]}, recording))
    (work,) = seen
    query = tokenizer(" bees", add_special_tokens=False)["input_ids"]
    assert work.scored_tail == len(query) and not work.keep_lone_prefixes
    for prompt, document in zip(work.prompts, DOCS[:2], strict=True):
        opening = tokenizer(LikelihoodTemplate().document.format(document=document))
        assert list(prompt) == opening["input_ids"] + query


def test_a_wrong_query_likelihood_template_stops_start_up_naming_the_setting(tokenizer):
    with pytest.raises(SettingsError, match="rerank_template: unknown key 'yes' for rerank_method"):
        Reranker.build((("yes", "yes"),), tokenizer, "query_likelihood")
    with pytest.raises(SettingsError, match=r"rerank_template.query: must contain \{query\}"):
        Reranker.build((("query", "no slot"),), tokenizer, "query_likelihood")
    settings = ReplicaSettings.from_mapping(
        {"rerank_method": "query_likelihood", "rerank_template": {"document": "{document} Q:"}}
    )
    assert reranker_for(settings.http, tokenizer).method == "query_likelihood"
