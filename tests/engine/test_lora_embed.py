"""LoRA adapters on an embedding model (semantics 20, 21): a request names its adapter by
``model`` on /v1/embeddings, /v2/embed, and the cosine /v1/score and /v1/rerank; the vectors
equal sentence-transformers' ``encode`` with the same peft adapter loaded
(``SentenceTransformer.load_adapter``); one step mixes the adapter and the base, each input as
it is alone; an unknown name is a 404 that never reaches a replica; `python -m batch embed
--model` runs its rows with the adapter.

The adapter is peft's, made on the tiny Qwen3 embedder's bare ``Qwen3Model`` (q, v, down; rank
4), the way sentence-transformers' ``add_adapter`` trains one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.embeddings import cosines
from app.service import ScoringService
from replicas.contract import EmbedWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.errors import ScoringError
from tests.support.embed_helpers import QUERY_PROMPT, embed_settings, reference_vectors, texts_of
from tests.support.lora_helpers import save_embedding_adapter

TOL = 1e-5  # tiny models: docs/semantics.md, "The float32 floor"
VARIANT = "qwen3-last"


@pytest.fixture(scope="module")
def tuned(embedding_dirs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny Qwen3 embedder with one adapter, ``tuned``: its service and engine."""
    directory: Path = embedding_dirs[VARIANT]
    adapter = save_embedding_adapter(
        directory.parent / f"{directory.name}-hf", tmp_path_factory.mktemp("embed-lora") / "tuned",
        seed=5, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
    )  # fmt: skip
    settings = embed_settings(
        directory, max_loras=1, max_lora_rank=4, lora_adapters=(("tuned", str(adapter)),),
        background_compile=False,
    )  # fmt: skip
    return {
        "directory": directory, "adapter": adapter,
        "service": ScoringService.from_settings(settings),
        "engine": ScoringEngine.from_settings(settings, warm=False),
    }  # fmt: skip


def peft_vectors(tuned: dict, texts: list[str], prompt_name: str | None = None) -> np.ndarray:
    """sentence-transformers' ``encode`` with the adapter loaded through peft."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tuned["directory"]), device="cpu", local_files_only=True)
    model.load_adapter(str(tuned["adapter"]))
    vectors = model.encode(texts, prompt_name=prompt_name, convert_to_numpy=True)
    return np.asarray(vectors, np.float32)


def backend(engine: ScoringEngine, seen: list) -> Callable[[Any], Any]:
    """A replica stand-in that records each work and answers with the real engine."""

    async def call(work: Any) -> Any:
        seen.append(work)
        return engine.score_batch([work])[0]

    return call


def test_embeddings_name_the_adapter_and_equal_sentence_transformers_with_peft(tuned):
    service: ScoringService = tuned["service"]
    texts = texts_of(11, 6, longest=64)
    want = peft_vectors(tuned, texts)
    base = reference_vectors(tuned["directory"], texts)
    assert np.abs(want - base).max() > 1e-3  # the adapter changes every vector
    for model, expected in (("tuned", want), (service.info.name, base), (None, base)):
        seen: list = []
        body = {"input": texts} | ({} if model is None else {"model": model})
        answer, _ = asyncio.run(service.embed_timed(body, backend(tuned["engine"], seen)))
        got = np.array([row["embedding"] for row in answer["data"]], np.float32)
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0, err_msg=str(model))
        assert [work.adapter for work in seen] == ["tuned" if model == "tuned" else None]
        assert answer["model"] == (model or service.info.name)
    cohere, _ = asyncio.run(
        service.embed_timed(
            {"texts": texts, "model": "tuned"}, backend(tuned["engine"], []), cohere=True
        )
    )
    np.testing.assert_allclose(cohere["embeddings"]["float"], want, atol=TOL, rtol=0)


def test_one_step_mixes_the_adapter_and_the_base_each_as_alone(tuned):
    engine: ScoringEngine = tuned["engine"]
    inputs = tuned["service"].embedder.text_work(texts_of(12, 5, longest=48), None).inputs
    works = [EmbedWork(inputs, adapter="tuned"), EmbedWork(inputs)]
    alone = [engine.score_batch([work])[0] for work in works]
    steps = engine.stats().steps
    mixed = engine.score_batch(works)
    assert engine.stats().steps == steps + 1  # one step holds both adapters' inputs
    for got, want in zip(mixed, alone, strict=True):
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    assert np.abs(mixed[0] - mixed[1]).max() > 1e-3


def test_cosine_score_and_rerank_run_with_the_adapter(tuned):
    service: ScoringService = tuned["service"]
    query, items = "river stone", texts_of(13, 3, longest=32)
    vectors = peft_vectors(tuned, [QUERY_PROMPT + query, *items])
    want = cosines(vectors[0], vectors[1:])
    engine = tuned["engine"]
    body = {"query": query, "items": items, "model": "tuned"}
    scored = asyncio.run(service.score(body, backend(engine, [])))
    np.testing.assert_allclose([row[0] for row in scored["scores"]], want, atol=TOL, rtol=0)
    assert scored["model"] == "tuned"
    body = {"query": query, "documents": items, "model": "tuned"}
    ranked, _ = asyncio.run(service.rerank_timed(body, backend(engine, [])))
    relevance = {row["index"]: row["relevance_score"] for row in ranked["results"]}
    np.testing.assert_allclose([relevance[i] for i in range(3)], want, atol=TOL, rtol=0)
    assert ranked["model"] == "tuned"


def test_an_unknown_model_on_the_embedding_routes_is_a_404_that_reaches_no_replica(tuned):
    service: ScoringService = tuned["service"]
    seen: list = []
    for call in (
        service.embed_timed({"input": "a", "model": "nope"}, backend(tuned["engine"], seen)),
        service.score(
            {"query": "a", "items": ["b"], "model": "nope"}, backend(tuned["engine"], seen)
        ),
    ):
        with pytest.raises(ScoringError) as caught:
            asyncio.run(call)
        assert caught.value.status_code == 404 and caught.value.body["reason"] == "model_not_found"
    assert not seen


def test_a_batch_embed_job_runs_its_rows_with_the_model_it_names(tuned):
    """``python -m batch embed --model tuned``: the engine stage packs the rows into works
    that carry the adapter."""
    import pyarrow as pa

    from batch.embed_stage import EmbedColumns, EmbedEngine, EmbedPrepare

    texts = texts_of(14, 4, longest=40)
    rows = pa.Table.from_pylist([{"id": i, "text": text} for i, text in enumerate(texts)])
    prepared = EmbedPrepare.around(tuned["service"], EmbedColumns())(rows)
    out = EmbedEngine.around(tuned["engine"], adapter="tuned")(prepared)
    got = np.array(out.column("embedding").to_pylist(), np.float32)
    np.testing.assert_allclose(got, peft_vectors(tuned, texts), atol=TOL, rtol=0)
