"""The embedding routes over in-process HTTP (app.http, no Ray) on a warm engine of the
tiny Qwen3 sentence-transformers directory (semantics 20): OpenAI's /v1/embeddings (float and
base64, prompts, Matryoshka, token ids, truncation), Cohere's /v2/embed, cosine /v1/score and
/v1/rerank, /v1/models' kind, the routes the kind refuses, and 400s with reasons; the same
routes on the directory saved with a chat template (its text rendered through it, as
sentence-transformers 6.2 does)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from app.http import build_api
from app.schema import ModelList
from app.service import ScoringService
from tests.support.embed_helpers import (
    QUERY_PROMPT,
    chunk_reference,
    embed_settings,
    reference_vectors,
    st_model,
    texts_of,
)
from tests.support.http_support import Reply, ask

TOL = 1e-5
VARIANT = "qwen3-last"


@pytest.fixture(scope="module")
def served(embedding_dirs: dict, embedding_engine: Any) -> tuple[Any, Any]:
    engine = embedding_engine(VARIANT)
    service = ScoringService.from_settings(embed_settings(embedding_dirs[VARIANT]))

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    async def health() -> None:
        return None

    return build_api(service, backend, health), embedding_dirs[VARIANT]


def post(api: Any, path: str, body: Any) -> Reply:
    return ask(api, "POST", path, json.dumps(body).encode())


def refused(reply: Reply, reason: str) -> str:
    assert reply.status == 400, reply.body
    assert reply.body["reason"] == reason, reply.body
    return reply.body["message"]


def vectors_of(reply: Reply) -> np.ndarray:
    assert reply.status == 200, reply.body
    return np.asarray([row["embedding"] for row in reply.body["data"]], np.float32)


def test_embeddings_equal_sentence_transformers_float_and_base64(served) -> None:
    api, directory = served
    texts = texts_of(11, 8, longest=80)
    reference = reference_vectors(directory, texts)
    reply = post(api, "/v1/embeddings", {"input": texts})
    np.testing.assert_allclose(vectors_of(reply), reference, atol=TOL, rtol=0)
    assert reply.body["object"] == "list" and reply.body["data"][3]["index"] == 3
    assert reply.body["usage"]["prompt_tokens"] > len(texts)
    encoded = post(api, "/embeddings", {"input": texts, "encoding_format": "base64"}).body
    decoded = [np.frombuffer(base64.b64decode(r["embedding"]), "<f4") for r in encoded["data"]]
    np.testing.assert_array_equal(np.asarray(decoded), vectors_of(reply))
    single = vectors_of(post(api, "/v1/embeddings", {"input": texts[2]}))
    np.testing.assert_allclose(single[0], reference[2], atol=TOL, rtol=0)


def test_prompts_dimensions_and_token_ids(served) -> None:
    api, directory = served
    texts = texts_of(12, 3, longest=30)
    query = reference_vectors(directory, texts, prompt_name="query")
    named = vectors_of(post(api, "/v1/embeddings", {"input": texts, "prompt_name": "query"}))
    np.testing.assert_allclose(named, query, atol=TOL, rtol=0)
    given = {"input": texts, "instruction": QUERY_PROMPT}
    np.testing.assert_allclose(vectors_of(post(api, "/v1/embeddings", given)), query, atol=TOL)
    cut = vectors_of(post(api, "/v1/embeddings", {"input": texts, "dimensions": 16}))
    truncated = reference_vectors(directory, texts, truncate_dim=16)
    expected = truncated / np.linalg.norm(truncated, axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=TOL, rtol=0)
    ids = [[5, 6, 7, 8], [9, 10]]
    as_lists = vectors_of(post(api, "/v1/embeddings", {"input": ids}))
    as_one = vectors_of(post(api, "/v1/embeddings", {"input": ids[0]}))
    np.testing.assert_allclose(as_one[0], as_lists[0], atol=1e-6, rtol=0)
    truncated_ids = {"input": [ids[0] * 200], "truncate_prompt_tokens": 4}
    np.testing.assert_allclose(
        vectors_of(post(api, "/v1/embeddings", truncated_ids)), as_one, atol=1e-6
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"input": ""}, "empty_input"),
        ({"input": []}, "empty_input"),
        ({"input": [[1, 2], []]}, "empty_input"),
        ({"input": ["a", ""]}, "empty_input"),
        ({"input": [-1]}, "negative_token_id"),
        ({"input": [[1 << 40]]}, "token_id_exceeds_vocab"),
        ({"input": ["a", 1]}, "invalid_request"),
        ({"input": "a", "extra": 1}, "invalid_request"),
        ({"input": "a", "dimensions": 0}, "invalid_dimensions"),
        ({"input": "a", "dimensions": 65}, "invalid_dimensions"),
        ({"input": "a", "dimensions": 8}, "dimensions_not_supported"),  # not declared
        ({"input": "a", "encoding_format": "int8"}, "invalid_request"),
        ({"input": "a", "prompt_name": "nope"}, "unknown_prompt"),
        ({"input": [1, 2], "prompt_name": "query"}, "invalid_request"),
        ({"input": [[1] * 600]}, "sequence_too_long"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "invalid_request"),
        ({"input": "a", "truncate": "MIDDLE"}, "invalid_request"),
        ({"input": [[1] * 600], "truncate": "NONE"}, "sequence_too_long"),
        ({"input": [[1] * 512 * 64 + [1]], "truncate": "CHUNK"}, "too_many_items"),
        ({"input": ["a"] * 65}, "too_many_items"),
        ([1, 2], "invalid_request"),
    ],
)
def test_bad_bodies_get_a_400_with_a_reason(served, body, reason) -> None:
    api, _ = served
    refused(post(api, "/v1/embeddings", body), reason)


class LongestText:
    """A tokenizer that notes the longest text it was handed."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer, self.longest = tokenizer, 0

    def __call__(self, text: Any, **kwargs: Any) -> Any:
        texts = text if isinstance(text, list) else [text]
        self.longest = max([self.longest, *(len(t) for t in texts if isinstance(t, str))])
        return self._tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def test_a_huge_text_is_cut_before_it_is_tokenized(
    embedding_dirs: dict, embedding_engine: Any
) -> None:
    # Refused, and cut to 8 tokens, without the whole 1,000,000 characters ever tokenized.
    service = ScoringService.from_settings(embed_settings(embedding_dirs[VARIANT]))
    spy = LongestText(service.tokenizer)
    engine = embedding_engine(VARIANT)
    huge = "word " * 200_000

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    async def health() -> None:
        return None

    api = build_api(dataclasses.replace(service, tokenizer=spy), backend, health)
    refused(post(api, "/v1/embeddings", {"input": huge}), "sequence_too_long")
    kept = post(api, "/v1/embeddings", {"input": huge, "truncate_prompt_tokens": 8})
    assert kept.status == 200 and kept.body["usage"]["prompt_tokens"] == 8
    assert 0 < spy.longest < len(huge) // 20  # a cut: (limit + 1) * CHARS_PER_TOKEN characters


def test_the_directory_declares_its_matryoshka_sizes(served) -> None:
    """config.json's ``matryoshka_dimensions`` (vLLM's key; tests/support/embed_helpers.py):
    /v1/models lists them and the whole dimension, the whole vector is encode's, and another
    size is a 400 naming the field and the sizes."""
    api, directory = served
    card = ask(api, "GET", "/v1/models").body["data"][0]
    assert (card["is_matryoshka"], card["matryoshka_dimensions"]) == (True, [16, 32, 64])
    texts = texts_of(15, 2, longest=30)
    whole = vectors_of(post(api, "/v1/embeddings", {"input": texts, "dimensions": 64}))
    np.testing.assert_allclose(whole, reference_vectors(directory, texts), atol=TOL, rtol=0)
    for path, body, param in (
        ("/v1/embeddings", {"input": texts, "dimensions": 8}, "dimensions"),
        ("/v2/embed", {"texts": texts, "output_dimension": 24}, "output_dimension"),
    ):
        message = refused(post(api, path, body), "dimensions_not_supported")
        assert param in message and "(16, 32, 64)" in message, message


def test_cohere_v2_embed(served) -> None:
    api, directory = served
    texts = texts_of(13, 3, longest=30)
    reply = post(
        api,
        "/v2/embed",
        {"texts": texts, "input_type": "search_query", "embedding_types": ["float"]},
    )
    assert reply.status == 200, reply.body
    query = reference_vectors(directory, texts, prompt_name="query")
    np.testing.assert_allclose(reply.body["embeddings"]["float"], query, atol=TOL, rtol=0)
    assert reply.body["response_type"] == "embeddings_by_type"
    meta = reply.body["meta"]  # Cohere's and vLLM's: the tokens embedded
    assert meta["tokens"] == meta["billed_units"] and meta["tokens"]["input_tokens"] > len(texts)
    for bad, reason in (
        ({"embedding_types": ["int4"]}, "embedding_types.0"),
        ({"embedding_types": []}, "embedding_types"),
        ({"output_dimension": 10_000}, "output_dimension"),
        ({"input_type": "search_everything"}, "input_type"),  # not one of Cohere's
    ):
        message = refused(
            post(api, "/v2/embed", {"texts": texts, **bad}),
            "invalid_" + ("dimensions" if "output_dimension" in bad else "request"),
        )
        assert reason in message, message


def test_cohere_truncate_start_embeds_the_longest_tail_that_fits(served) -> None:
    """START: the text from its first token start (ascending) whose input, the query prompt
    in front and the special tokens, fits max_seq_length (sentence-transformers' tokenizer,
    searched one offset at a time); END: sentence-transformers' own cut."""
    api, directory = served
    model = st_model(str(directory))
    words = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "blue")
    text = " ".join(words[(n * n) % 9] for n in range(560))  # ~560 tokens, past the 512 limit
    starts = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = model.tokenizer
    fits = next(
        start
        for start, _ in starts["offset_mapping"]
        if len(tokens(QUERY_PROMPT + text[start:])["input_ids"]) <= model.max_seq_length
    )
    assert fits > 0, "the text must overflow"
    references = reference_vectors(directory, [text[fits:], text], prompt_name="query")
    for truncate, reference in zip(("START", "END"), references, strict=True):
        body = {"texts": [text], "input_type": "search_query", "truncate": truncate}
        reply = post(api, "/v2/embed", body)
        assert reply.status == 200, reply.body
        np.testing.assert_allclose(reply.body["embeddings"]["float"], [reference], atol=TOL, rtol=0)


def test_truncate_chunk_folds_a_long_input_on_both_routes(served) -> None:
    """CHUNK (scorejax's truncate value, app.embed_chunks): the long text as the engine
    embeds its chunks, folded (the last chunk's vector: last-token pooling); the short one
    as encode embeds it; the same on /v2/embed, for token ids, and usage counts every token."""
    api, directory = served
    words = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "blue")
    long_text = " ".join(words[(n * n) % 9] for n in range(1200))
    texts = [long_text, "seven blue clouds"]
    reply = post(api, "/v1/embeddings", {"input": texts, "truncate": "CHUNK"})
    vectors = vectors_of(reply)
    model = st_model(str(directory))
    ids = model.tokenizer(long_text)["input_ids"]
    chunks = [tuple(ids[i : i + 512]) for i in range(0, len(ids), 512)]
    last = chunk_reference(directory, chunks, "lasttoken")
    np.testing.assert_allclose(vectors[0], last, atol=TOL, rtol=0)
    np.testing.assert_allclose(vectors[1], reference_vectors(directory, texts[1:])[0], atol=TOL)
    assert reply.body["usage"]["prompt_tokens"] == len(ids) + len(
        model.tokenizer(texts[1]).input_ids
    )
    cohere = post(api, "/v2/embed", {"texts": texts, "truncate": "CHUNK"})
    assert cohere.status == 200, cohere.body
    np.testing.assert_allclose(cohere.body["embeddings"]["float"], vectors, atol=TOL, rtol=0)
    as_ids = vectors_of(post(api, "/v1/embeddings", {"input": ids, "truncate": "CHUNK"}))
    np.testing.assert_allclose(as_ids[0], vectors[0], atol=TOL, rtol=0)
    refused(post(api, "/v1/embeddings", {"input": texts}), "sequence_too_long")
    both = {"input": [long_text], "truncate": "CHUNK", "truncate_prompt_tokens": 8}
    assert post(api, "/v1/embeddings", both).body["usage"]["prompt_tokens"] == 8  # kept: fits


def test_score_and_rerank_are_cosines_with_the_query_embedded_once(served) -> None:
    api, directory = served
    query, docs = "alpha river", ["alpha river stone", "blue cloud", "seven gamma"]
    q = reference_vectors(directory, [query], prompt_name="query")[0]
    d = reference_vectors(directory, docs)
    expected = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    reply = post(api, "/v1/score", {"query": query, "items": docs})
    assert reply.status == 200, reply.body
    np.testing.assert_allclose(np.asarray(reply.body["scores"])[:, 0], expected, atol=TOL)
    ranked = post(api, "/v1/rerank", {"query": query, "documents": docs, "return_documents": True})
    assert ranked.status == 200, ranked.body
    order = [r["index"] for r in ranked.body["results"]]
    assert order == list(np.argsort(-expected))
    np.testing.assert_allclose(
        ranked.body["results"][0]["relevance_score"], expected.max(), atol=TOL
    )
    assert post(api, "/v1/score", {"query": query, "items": []}).body["scores"] == []
    refused(
        post(api, "/v1/score", {"query": query, "items": docs, "label_token_ids": [1]}),
        "label_token_ids_with_head",
    )


def test_a_chunked_rerank_ranks_by_the_mean_of_its_chunks_cosines(served) -> None:
    """Semantics 24 on an embedding model: each chunk's cosine with the query."""
    api, directory = served
    query, document = "alpha river", "blue cloud seven gamma. alpha river stone and more words"
    spans_asked: dict[str, Any] = {"mode": "enabled", "threshold": -2}
    body = {"query": query, "documents": [document], "chunk_tokens": 4, "max_chunks_per_doc": 4,
            "chunk_aggregation": "mean", "relevant_spans": spans_asked}  # fmt: skip
    reply = post(api, "/v1/rerank", body)
    assert reply.status == 400 and reply.body["param"].startswith("relevant_spans")  # [-1, 1]
    spans_asked["threshold"] = -1.0
    (result,) = post(api, "/v1/rerank", body).body["results"]
    spans = sorted(result["relevant_spans"], key=lambda s: s["start"])
    chunks = [document[s["start"] : s["end"]] for s in spans]
    q = reference_vectors(directory, [query], prompt_name="query")[0]
    d = reference_vectors(directory, chunks)
    expected = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    assert len(chunks) >= 2 and [s["score"] for s in spans] == pytest.approx(expected, abs=TOL)
    assert result["relevance_score"] == pytest.approx(expected.mean(), abs=TOL)


def test_models_say_the_kind_and_other_routes_are_refused_by_name(served) -> None:
    api, _ = served
    models = ask(api, "GET", "/v1/models").body
    ModelList.model_validate(models)
    (card,) = models["data"]
    assert (card["scoring"], card["rerank_method"]) == ("cosine", "cosine")
    assert (card["kind"], card["pooling"], card["dimension"]) == ("embedding", "lasttoken", 64)
    assert card["input_format"] == "text" and card["max_input_tokens"] == 512
    chunking = {"max_chunks_per_doc": 1, "chunk_tokens": 512, "chunk_overlap": 0}
    assert card["rerank_chunking"] == {**chunking, "chunk_aggregation": "max"}
    message = refused(
        post(api, "/v1/completions", {"prompt": "x", "echo": True}), "unsupported_for_model"
    )
    assert "/v1/completions" in message and "embedding" in message
    refused(post(api, "/v1/classify", {"input": "x"}), "unsupported_for_model")
    paths = ask(api, "GET", "/openapi.json").body["paths"]
    assert "/v1/embeddings" in paths and "/v2/embed" in paths and "/v1/completions" not in paths


def test_a_causal_lm_refuses_the_embedding_routes(tiny_llama_dir) -> None:
    from replicas.settings import ReplicaSettings

    service = ScoringService.from_settings(ReplicaSettings.from_keys(model=str(tiny_llama_dir)))

    async def backend(work: Any) -> Any:
        raise AssertionError("no work reaches a replica")

    async def health() -> None:
        return None

    api = build_api(service, backend, health)
    message = refused(post(api, "/v1/embeddings", {"input": "x"}), "unsupported_for_model")
    assert "causal_lm" in message and "/v1/embeddings" in message
    refused(post(api, "/v2/embed", {"texts": ["x"]}), "unsupported_for_model")
    card = ask(api, "GET", "/v1/models").body["data"][0]
    assert (card["kind"], card["input_format"]) == ("causal_lm", None)
    assert "/v1/embeddings" not in ask(api, "GET", "/openapi.json").body["paths"]


def test_a_chat_template_model_over_http(chat_embedding_dirs: dict, embedding_engine: Any) -> None:
    """The Qwen3 directory saved with its tokenizer's chat template, on the engine of the same
    weights: /v1/embeddings (a prompt, Matryoshka, an input cut at max_seq_length), /v2/embed
    and cosine /v1/score and /v1/rerank equal ``encode``; /v1/models names the format."""
    directory, engine = chat_embedding_dirs[VARIANT], embedding_engine(VARIANT)
    service = ScoringService.from_settings(embed_settings(directory))

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    async def health() -> None:
        return None

    api = build_api(service, backend, health)
    card = ask(api, "GET", "/v1/models").body["data"][0]
    assert card["input_format"] == "chat_template"
    texts = [*texts_of(14, 3, longest=30), "seven blue " * 60]
    query = reference_vectors(directory, texts, prompt_name="query")
    body = {"input": texts, "prompt_name": "query", "truncate_prompt_tokens": 64}
    np.testing.assert_allclose(vectors_of(post(api, "/v1/embeddings", body)), query, atol=TOL)
    cut = vectors_of(post(api, "/v1/embeddings", {"input": texts[:3], "dimensions": 16}))
    truncated = reference_vectors(directory, texts[:3], truncate_dim=16)
    expected = truncated / np.linalg.norm(truncated, axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=TOL, rtol=0)
    cohere = post(api, "/v2/embed", {"texts": texts, "input_type": "search_query"})
    np.testing.assert_allclose(cohere.body["embeddings"]["float"], query, atol=TOL, rtol=0)
    docs = texts[:3]
    d = reference_vectors(directory, docs)
    scored = post(api, "/v1/score", {"query": texts[3][:200], "items": docs})
    q = reference_vectors(directory, [texts[3][:200]], prompt_name="query")[0]
    cosine = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    np.testing.assert_allclose(np.asarray(scored.body["scores"])[:, 0], cosine, atol=TOL)
    ranked = post(api, "/v1/rerank", {"query": texts[3][:200], "documents": docs})
    assert [r["index"] for r in ranked.body["results"]] == list(np.argsort(-cosine))
