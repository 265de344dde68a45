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
    steps = engine.stats()["steps"]
    together = relevance(served, DOCS)
    assert engine.stats()["steps"] - steps >= 2, "the documents fit one step: not a test"
    alone = [relevance(served, [doc])[0] for doc in DOCS]
    assert_fp32_close(together, alone)
    assert len(set(np.round(together, 6))) > 1  # the scores tell documents apart


def test_the_order_of_the_documents_does_not_change_their_scores(served) -> None:
    order = [4, 2, 0, 5, 3, 1]
    shuffled = relevance(served, [DOCS[i] for i in order])
    together = relevance(served, DOCS)
    assert_fp32_close(shuffled, [together[i] for i in order])
