"""/v1/rerank on the real engine (the tiny random-weight Llama with the SmolLM2 tokenizer, no
Ray), both rerank methods: documents spread over several steps, and any order, score as each
document alone does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.service import ScoringService
from replicas.contract import PromptWork, ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close

QUERY = "Which city is the capital of France?"
DOCS = [
    "Paris is the capital and largest city of France.",
    "Bananas are an excellent source of potassium.",
    "The Eiffel Tower stands on the Champ de Mars in Paris.",
    "Berlin is the capital of Germany.",
    "Lyon is known for its cuisine.",
    "The Seine flows through Paris.",
]


@pytest.fixture(scope="module", params=["yes_no", "query_likelihood"])
def served(request: Any, tiny_llama_dir: Path) -> tuple[ScoringService, ScoringEngine]:
    settings = ReplicaSettings.from_keys(
        rerank_method=request.param,
        model=str(tiny_llama_dir),
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 64, 128),
        item_token_buckets=(16, 64, 128),
        # yes_no's rendered documents are ~35 tokens, query_likelihood's prompts ~20: one
        # and three per step
        item_tokens_per_step=64,
        batch_buckets=(1,),
        max_multi_item_seq_len=512,
        warmup_shapes=(),
        background_compile=False,
    )
    engine = ScoringEngine.from_settings(settings, warm=False)
    return ScoringService.from_settings(settings), engine


def relevance(served: tuple[ScoringService, ScoringEngine], documents: list[str]) -> list[float]:
    """Relevance by document index, and how many engine steps the request took."""
    service, engine = served

    async def backend(work: ScoreWork | PromptWork) -> Any:
        return engine.score_batch([work])[0]

    body, _ = asyncio.run(service.rerank_timed({"query": QUERY, "documents": documents}, backend))
    by_index: dict[int, Any] = {r["index"]: r["relevance_score"] for r in body["results"]}
    return [by_index[i] for i in range(len(documents))]


def test_documents_over_several_steps_score_as_each_document_alone(served) -> None:
    _, engine = served
    steps = engine.stats().steps
    together = relevance(served, DOCS)
    assert engine.stats().steps - steps >= 2, "the documents fit one step: not a test"
    alone = [relevance(served, [doc])[0] for doc in DOCS]
    assert_fp32_close(together, alone)
    assert len(set(np.round(together, 6))) > 1  # the scores tell documents apart


def test_the_order_of_the_documents_does_not_change_their_scores(served) -> None:
    order = [4, 2, 0, 5, 3, 1]
    shuffled = relevance(served, [DOCS[i] for i in order])
    together = relevance(served, DOCS)
    assert_fp32_close(shuffled, [together[i] for i in order])


def test_a_chunk_scores_as_its_text_sent_alone(served) -> None:
    """Semantics 24: a long document's chunks are items behind the query; each chunk's span
    score equals its text ranked as a document of its own, and the document's relevance is
    its best chunk's."""
    service, engine = served

    async def backend(work: ScoreWork | PromptWork) -> Any:
        return engine.score_batch([work])[0]

    document = " ".join(DOCS)
    spans = {"mode": "enabled", "threshold": 0.0}
    body = {"query": QUERY, "documents": [DOCS[1], document], "max_chunks_per_doc": 8,
            "chunk_tokens": 12, "relevant_spans": spans}  # fmt: skip
    answer, _ = asyncio.run(service.rerank_timed(body, backend))
    results = {r["index"]: r for r in answer["results"]}
    listed = results[1]["relevant_spans"]
    assert len(listed) >= 3 and results[0]["relevant_spans"][0]["end"] == len(DOCS[1])
    alone = relevance(served, [document[s["start"] : s["end"]] for s in listed])
    assert_fp32_close([s["score"] for s in listed], alone)
    assert results[1]["relevance_score"] == max(s["score"] for s in listed)
