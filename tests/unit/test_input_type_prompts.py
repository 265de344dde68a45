"""Cohere's input_type -> a model's sentence-transformers prompt (app/embeddings.py)."""

from __future__ import annotations

from app.embeddings import input_type_prompt
from replicas.contract import PoolingHead

# google/embeddinggemma-300m's prompt names (config_sentence_transformers.json), abridged
GEMMA = PoolingHead(
    "mean", True, 8,
    prompts=(("query", "task: search result | query: "), ("document", "title: none | text: "),
             ("Classification", "task: classification | query: "),
             ("Clustering", "task: clustering | query: ")),
)  # fmt: skip
E5 = PoolingHead("mean", True, 8, prompts=(("query", "query: "), ("passage", "passage: ")))


def test_each_input_type_finds_the_models_prompt_by_any_of_its_names() -> None:
    assert input_type_prompt(GEMMA, "search_query") == "task: search result | query: "
    assert input_type_prompt(GEMMA, "search_document") == "title: none | text: "
    assert input_type_prompt(GEMMA, "classification") == "task: classification | query: "
    assert input_type_prompt(GEMMA, "clustering") == "task: clustering | query: "
    assert input_type_prompt(E5, "search_document") == "passage: "


def test_no_input_type_or_no_such_prompt_means_no_prompt() -> None:
    assert input_type_prompt(GEMMA, None) is None
    assert input_type_prompt(E5, "classification") is None
