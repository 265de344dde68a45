"""Chunked rerank and relevant spans (semantics 24) without Ray: the real SmolLM2 tokenizer and
a fake replica whose P(yes) is high exactly when an item holds the needle's tokens, so where
the answer sits decides the ranking. The real engine's scores are compared in
tests/engine/test_rerank_engine.py, the Cohere SDKs in tests/serve/test_serve_http.py."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import numpy as np
import pytest

from app.chunks import ChunkOptions, chunk_documents
from app.http import build_api
from app.rerank import reranker_for
from app.service import ScoringService
from replicas.contract import ModelInfo, ScoreWork, ScoringLimits
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.http_support import ask

NEEDLE = " The treaty was signed in Zanzibar."
FILLER = " The weather report said clouds and some light rain over the hills."
# ~13 tokens per filler sentence: the needle sits past the first 64 tokens
LONG = FILLER * 8 + NEEDLE
SHORT = FILLER * 2
UNICODE = "Grüße aus Köln – 東京タワーは高い。 🙂 Ünïcödé façade naïve café " * 6


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer: Any) -> Any:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def service(tokenizer: Any) -> ScoringService:
    info = ModelInfo("smollm2", 49152, 0, ScoringLimits(16, 8192, 1024))
    settings = ReplicaSettings.from_keys(chunk_tokens=32)
    return ScoringService(
        info=info,
        tokenizer=tokenizer,
        clock=lambda: 0.0,
        reranker=reranker_for(settings.http, tokenizer),
        chunking=ChunkOptions.from_settings(settings.http),
    )


def needle_backend(tokenizer: Any) -> Any:
    zanzibar = tuple(tokenizer(" Zanzibar", add_special_tokens=False)["input_ids"])

    async def backend(work: ScoreWork) -> np.ndarray:
        rows = []
        for item in work.item_ids:
            text = tokenizer.decode(item)
            found = " Zanzibar" in text and len(zanzibar) > 0
            rows.append([-0.1, -3.0] if found else [-3.0 - len(item) / 1000, -0.1])  # yes, no
        return np.asarray(rows, np.float32)

    return backend


def rerank(service: ScoringService, **payload: Any) -> dict[str, Any]:
    backend = needle_backend(service.tokenizer)
    return asyncio.run(service.rerank_timed(payload, backend))[0]


def scores_by_index(body: dict[str, Any]) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in body["results"]}


def test_the_answer_past_the_first_chunk_ranks_first_with_chunking_not_with_truncation(service):
    documents = [SHORT, LONG, SHORT + " Clouds."]
    truncated = rerank(service, query="Where was the treaty signed?", documents=documents,
                       max_tokens_per_doc=32)  # fmt: skip
    assert truncated["results"][0]["index"] != 1
    chunked = rerank(service, query="Where was the treaty signed?", documents=documents,
                     max_chunks_per_doc=8, return_documents=True, top_n=2)  # fmt: skip
    assert chunked["results"][0]["index"] == 1
    assert len(chunked["results"]) == 2 and chunked["results"][0]["document"] == {"text": LONG}
    # usage counts every chunk scored: more tokens than the documents' first chunks alone
    assert chunked["usage"]["prompt_tokens"] > truncated["usage"]["prompt_tokens"]


def test_a_chunk_scores_as_its_text_sent_alone_and_spans_slice_the_document(service):
    query = "Where was the treaty signed?"
    for document in (LONG, UNICODE):
        body = rerank(service, query=query, documents=[document], max_chunks_per_doc=16,
                      relevant_spans={"mode": "enabled", "threshold": 0.0})  # fmt: skip
        (result,) = body["results"]
        spans = result["relevant_spans"]
        assert len(spans) > 2 and [s["score"] for s in spans] == sorted(
            (s["score"] for s in spans), reverse=True
        )
        assert result["relevance_score"] == spans[0]["score"]  # max over the chunks
        chunk_texts = [document[s["start"] : s["end"]] for s in spans]
        alone = scores_by_index(rerank(service, query=query, documents=chunk_texts))
        assert [alone[i] for i in range(len(spans))] == [s["score"] for s in spans]
        by_start = sorted(spans, key=lambda s: s["start"])
        assert by_start[0]["start"] == 0 and by_start[-1]["end"] == len(document)
        for before, after in itertools.pairwise(by_start):  # no text left out
            assert document[before["end"] : after["start"]].strip() == ""


def test_chunks_follow_the_tokenizers_offsets_in_codepoints(tokenizer):
    options = ChunkOptions(max_chunks=64, chunk_tokens=7, overlap=2)
    chunks = chunk_documents(tokenizer, [UNICODE, "x"], options, max_tokens=None)
    ids = tokenizer(UNICODE, add_special_tokens=False, return_offsets_mapping=True)
    offsets = ids["offset_mapping"]
    owned = zip(chunks.bounds, chunks.owners, strict=True)
    starts = [start for (start, _), doc in owned if doc == 0]
    step = options.chunk_tokens - options.overlap
    expected = [offsets[k][0] for k in range(step, len(offsets), step)]
    assert len(starts) > 5 and starts == [0, *expected[: len(starts) - 1]]
    for text, (start, end), doc in zip(chunks.texts, chunks.bounds, chunks.owners, strict=True):
        assert text == [UNICODE, "x"][doc][start:end]
    assert chunks.texts[-1] == "x" and chunks.owners[-1] == 1
    assert not any("\ufffd" in text for text in chunks.texts)  # never half a character


def test_mean_aggregation_spans_limits_and_the_max_chunks_cut(service):
    query = "Where was the treaty signed?"
    spans = {"mode": "enabled", "threshold": 0.0}
    listed = rerank(service, query=query, documents=[LONG], max_chunks_per_doc=16,
                    relevant_spans=spans)["results"][0]  # fmt: skip
    scores = [s["score"] for s in listed["relevant_spans"]]
    mean = rerank(service, query=query, documents=[LONG], max_chunks_per_doc=16,
                  chunk_aggregation="mean")["results"][0]  # fmt: skip
    assert mean["relevance_score"] == pytest.approx(np.mean(scores), abs=1e-12)
    assert "relevant_spans" not in mean
    few = rerank(service, query=query, documents=[LONG], relevant_spans={**spans, "max_spans": 2})
    assert few["results"][0]["relevant_spans"] == listed["relevant_spans"][:2]
    high = rerank(service, query=query, documents=[LONG], relevant_spans={"mode": "enabled"})
    assert [s["score"] for s in high["results"][0]["relevant_spans"]] == [
        s for s in scores if s >= 0.1
    ]
    first_two = rerank(service, query=query, documents=[LONG], max_chunks_per_doc=2)
    assert first_two["results"][0]["relevance_score"] < 0.5  # the needle is past 2 chunks


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens_per_doc": 0}, "max_tokens_per_doc"),
        ({"max_chunks_per_doc": 0}, "max_chunks_per_doc"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"chunk_overlap": -1}, "chunk_overlap"),
        ({"chunk_tokens": 4, "chunk_overlap": 4}, "chunk_overlap"),
        ({"chunk_aggregation": "median"}, "chunk_aggregation"),
        ({"relevant_spans": {"mode": "sometimes"}}, "relevant_spans"),
        ({"relevant_spans": {"mode": "enabled", "threshold": 2}}, "relevant_spans"),
        ({"max_chunks_per_doc": 64, "chunk_tokens": 4}, "max_chunks_per_doc"),  # > 16 items
    ],
)
def test_bad_chunking_values_are_400s_naming_the_field(service, fields, param):
    with pytest.raises(ScoringError) as error:
        rerank(service, query="q", documents=[LONG], **fields)
    assert error.value.status_code == 400 and error.value.param.startswith(param)
    if fields.get("max_chunks_per_doc") == 64:
        assert "max_items_per_request=16" in error.value.message


def test_the_http_answer_and_its_openapi_document(service):
    api = build_api(service, needle_backend(service.tokenizer), _healthy)
    body = {"query": "q", "documents": [LONG], "relevant_spans": {"mode": "enabled"}}
    reply = ask(api, "POST", "/v2/rerank", json.dumps(body).encode())
    assert reply.status == 200 and reply.body["results"][0]["relevant_spans"]
    assert reply.body["meta"]["billed_units"] == {"search_units": 1}
    schemas = api.openapi()["components"]["schemas"]
    request = schemas["RerankRequest"]["properties"]
    assert {"max_chunks_per_doc", "chunk_tokens", "chunk_overlap", "chunk_aggregation"} <= set(
        request
    )
    spans = schemas["RelevantSpans"]
    assert spans["additionalProperties"] is False and spans["required"] == ["mode"]
    assert spans["properties"]["mode"]["enum"] == ["enabled", "disabled"]
    assert request["chunk_aggregation"]["anyOf"][0]["enum"] == ["max", "mean"]


async def _healthy() -> None:
    return None


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"max_chunks_per_doc": 0}, "max_chunks_per_doc"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"chunk_overlap": 512}, "chunk_overlap"),
        ({"chunk_aggregation": "sum"}, "chunk_aggregation"),
    ],
)
def test_a_bad_chunking_setting_stops_start_up_naming_it(keys, named):
    with pytest.raises(SettingsError, match=f"^{named}: "):
        ReplicaSettings.from_keys(**keys)


def test_billing_counts_every_chunk_as_a_document(tokenizer):
    """Cohere's search units: one per 100 texts scored, a chunk counting as a document."""
    options = ChunkOptions(max_chunks=200, chunk_tokens=2)
    chunks = chunk_documents(tokenizer, [FILLER * 20], options, max_tokens=None)
    assert 100 < len(chunks.texts) <= 200 and chunks.search_units == 2
    assert chunk_documents(tokenizer, [SHORT], ChunkOptions(), None).search_units == 1
