"""serve_config.yaml as shipped, with only ``model`` changed, starts for every kind of model
scorejax serves (score head, encoder embedding, cross-encoder, late interaction, sparse; the
shipped model's own kind, a causal LM, and a decoder embedder are deployed on the shipped
``args`` over Serve and HTTP in tests/serve/test_serve_config_deploy.py and
tests/serve/test_serve_embed.py) (issue 43: a ``Qwen3ForSequenceClassification`` crashed
every replica at start-up with ``KeyError: 'lm_head'`` from the completions warm-up, and its
ingress refused the shipped ``rerank_method``).

For each kind, the shipped ``args`` with ``model`` pointed at a transformers-saved tiny
checkpoint (and ``compilation_cache_dir`` at a temporary folder, so the suite leaves the
user's cache alone) go through what a deployment does before it reports healthy: the
ingress's service and the replica's engine build from them, and the engine warms up every
shipped shape (``ScoringEngine.from_settings``). Then each route the kind serves answers
through the two, and a route it cannot serve answers a 400 naming it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.service import ScoringService
from replicas.engine.scoring_engine import ScoringEngine
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings
from tests.support.head_helpers import save_tiny_head
from tests.support.shipped import shipped_settings

pytestmark = pytest.mark.slow


def served(settings: ReplicaSettings) -> tuple[ScoringService, Any]:
    """The ingress's service and a backend that scores on the warmed engine."""
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings, warm=True)
    assert engine.stats().compile_count > 0

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    return service, backend


def test_a_score_head_model_starts_and_serves_on_the_shipped_config(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    model = tmp_path / "qwen3-seqcls-3"
    save_tiny_head("qwen3-seqcls-3", model, vocab_size=49152)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(model)
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    body = {"query": "Is this good?", "items": ["yes it is", ""]}
    scores = asyncio.run(service.score(body, backend))["scores"]
    assert np.asarray(scores).shape == (2, 3)
    data = asyncio.run(service.classify_timed({"input": ["good", "bad"]}, backend))[0]["data"]
    assert [len(entry["probs"]) for entry in data] == [3, 3]
    assert service.reranker is None  # three labels: no relevance to rank by (docs/models.md)
    with pytest.raises(ScoringError, match="/v1/completions") as refused:
        asyncio.run(service.complete_timed({"prompt": "x", "echo": True}, backend))
    assert refused.value.status_code == 400


def test_a_bert_embedder_starts_and_serves_on_the_shipped_config(tmp_path: Path) -> None:
    from tests.support.encoder_helpers import save_bert_embedder

    model = save_bert_embedder(tmp_path / "bert-cls", "cls")
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    assert service.models_body()["data"][0]["kind"] == "embedding"
    body = asyncio.run(service.embed_timed({"input": ["alpha beta", "river"]}, backend))[0]
    assert [len(row["embedding"]) for row in body["data"]] == [32, 32]
    ranked = asyncio.run(service.rerank_timed({"query": "blue", "documents": ["a", "b"]}, backend))
    assert len(ranked[0]["results"]) == 2
    with pytest.raises(ScoringError, match="/v1/completions") as refused:
        asyncio.run(service.complete_timed({"prompt": "x", "echo": True}, backend))
    assert refused.value.status_code == 400 and "embedding" in refused.value.message


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_an_encoder_cross_encoder_starts_and_serves_on_the_shipped_config(
    family: str, tmp_path: Path
) -> None:
    from tests.support.encoder_helpers import save_bert_cross_encoder

    model = save_bert_cross_encoder(tmp_path / f"{family}-ce", family=family)
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    assert service.models_body()["data"][0]["kind"] == "cross_encoder"
    ranked = asyncio.run(service.rerank_timed({"query": "blue", "documents": ["a", "b"]}, backend))
    assert len(ranked[0]["results"]) == 2
    scores = asyncio.run(service.score({"query": "a", "items": ["b", "c"]}, backend))["scores"]
    assert np.asarray(scores).shape == (2, 1)
    with pytest.raises(ScoringError, match="/v1/embeddings") as refused:
        asyncio.run(service.embed_timed({"input": ["a"]}, backend))
    assert refused.value.status_code == 400 and "cross_encoder" in refused.value.message


def test_a_colbert_starts_and_serves_on_the_shipped_config(tmp_path: Path) -> None:
    from app.workloads import WORKLOAD_NAMED
    from tests.support.retrieval_helpers import save_colbert

    model = save_colbert(tmp_path / "colbert")
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    assert service.models_body()["data"][0]["kind"] == "late_interaction"
    body = {"input": ["alpha beta", "river"], "input_type": "query"}
    pooled = asyncio.run(service.answer(WORKLOAD_NAMED["pooling"], body, backend))[0]["data"]
    assert [np.asarray(row["data"]).shape for row in pooled] == [(12, 16), (12, 16)]
    ranked = asyncio.run(service.rerank_timed({"query": "blue", "documents": ["a", "b"]}, backend))
    assert len(ranked[0]["results"]) == 2
    scores = asyncio.run(service.score({"query": "a", "items": ["b", "c"]}, backend))["scores"]
    assert np.asarray(scores).shape == (2, 1)
    with pytest.raises(ScoringError, match="/v1/embeddings") as refused:
        asyncio.run(service.embed_timed({"input": ["a"]}, backend))
    assert refused.value.status_code == 400 and "late_interaction" in refused.value.message


def test_a_splade_starts_and_serves_on_the_shipped_config(tmp_path: Path) -> None:
    from app.workloads import WORKLOAD_NAMED
    from tests.support.retrieval_helpers import save_splade

    model = save_splade(tmp_path / "splade")
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    assert service.models_body()["data"][0]["kind"] == "sparse"
    body = {"inputs": ["alpha beta", "river"]}
    weights = asyncio.run(service.answer(WORKLOAD_NAMED["embed_sparse"], body, backend))[0]
    assert len(weights) == 2 and all(weights)
    ranked = asyncio.run(service.rerank_timed({"query": "blue", "documents": ["a", "b"]}, backend))
    assert len(ranked[0]["results"]) == 2
    scores = asyncio.run(service.score({"query": "a", "items": ["b", "c"]}, backend))["scores"]
    assert np.asarray(scores).shape == (2, 1)
    with pytest.raises(ScoringError, match="/pooling") as refused:
        asyncio.run(service.answer(WORKLOAD_NAMED["pooling"], {"input": "a"}, backend))
    assert refused.value.status_code == 400 and "sparse" in refused.value.message


def test_a_bge_m3_starts_and_serves_on_the_shipped_config(tmp_path: Path) -> None:
    from app.workloads import WORKLOAD_NAMED
    from replicas.checkpoints.convert_pt import convert
    from tests.support.bge_m3_helpers import save_bge_m3

    model = save_bge_m3(tmp_path / "bge-m3")
    convert(model)
    service, backend = served(
        shipped_settings(model, compilation_cache_dir=str(tmp_path / "cache"))
    )
    card = service.models_body()["data"][0]
    assert card["kind"] == "hybrid" and card["outputs"] == ["vector", "tokens", "sparse"]
    answers = {
        "embeddings": {"input": ["alpha beta"]},
        "pooling": {"input": ["alpha beta"]},
        "embed_sparse": {"inputs": ["alpha beta"]},
    }
    for name, body in answers.items():
        assert asyncio.run(service.answer(WORKLOAD_NAMED[name], body, backend))[0]
    ranked = asyncio.run(service.rerank_timed({"query": "blue", "documents": ["a", "b"]}, backend))
    assert len(ranked[0]["results"]) == 2
    with pytest.raises(ScoringError, match="/v1/completions") as refused:
        asyncio.run(service.answer(WORKLOAD_NAMED["completions"], {"prompt": "a"}, backend))
    assert refused.value.status_code == 400 and "hybrid" in refused.value.message
