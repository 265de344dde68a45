"""A request picks its LoRA adapter by ``model`` (semantics 21) at the ingress: /v1/score
through the real engine equals transformers + peft for the adapter and the base; rerank,
classify and completions hand the adapter to the replica; an unknown name is a 404
``model_not_found`` that never reaches a replica; /v1/models lists each adapter with the
base as its ``parent``; batch jobs run their rows with the adapter ``--model`` names
(tests/engine/test_lora_embed.py: adapters on an embedding model)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.classify import prepare_classify
from app.service import ScoringService
from replicas.contract import ModelInfo, ScoreHead, ScoringLimits
from replicas.engine.scoring_engine import ScoringEngine
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close, fp32_bound
from tests.support.lora_helpers import peft_model, reference_scores, save_adapter

LABELS = [7042, 4528, 11452]


class Recorder:
    """Records the works a route hands to the replica; answers with the real engine."""

    def __init__(self, engine: ScoringEngine | None = None) -> None:
        self.engine, self.works = engine, []

    async def __call__(self, work: Any) -> Any:
        self.works.append(work)
        if self.engine is None:
            raise AssertionError("this route should not reach a replica here")
        return self.engine.score_batch([work])[0]


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny Llama with SmolLM2's tokenizer, one adapter, its ingress and engine."""
    root = tmp_path_factory.mktemp("lora-routes")
    adapter = save_adapter(
        tiny_llama_dir, root / "ranker", seed=9, r=4, lora_alpha=8,
        target_modules=["q_proj", "v_proj", "down_proj"],
    )  # fmt: skip
    settings = ReplicaSettings.from_keys(
        model=str(tiny_llama_dir),
        token_buckets=(16, 32),
        item_token_buckets=(16, 32),
        background_compile=False,
        multi_item_scoring_delimiter=0,
        rerank_method="query_likelihood",
        max_loras=1,
        max_lora_rank=4,
        lora_adapters=(("ranker", str(adapter)),),
    )
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings, warm=False)
    return {
        "service": service, "engine": engine, "base": tiny_llama_dir, "adapter": adapter,
        "settings": settings,
    }  # fmt: skip


def _refused(call: Any) -> ScoringError:
    with pytest.raises(ScoringError) as caught:
        asyncio.run(call)
    return caught.value


def test_score_picks_the_adapter_by_model_and_equals_peft(served):
    service: ScoringService = served["service"]
    base_name = service.info.name
    assert service.info.adapters == served["engine"].info.adapters == ("ranker",)
    body = {"query": "The capital of France is", "items": [" Paris", "", " a city"]}
    body |= {"label_token_ids": LABELS}
    tokenized = service.prepare(body).tokenized
    rows = [list(tokenized.query_ids + item) for item in tokenized.item_ids]
    for model, adapter in ((None, None), (base_name, None), ("ranker", served["adapter"])):
        recorder = Recorder(served["engine"])
        answer = asyncio.run(service.score({**body, "model": model}, recorder))
        assert [work.adapter for work in recorder.works] == [None if adapter is None else model]
        reference = reference_scores(peft_model(served["base"], adapter), rows, LABELS)
        assert np.abs(np.log(np.asarray(answer["scores"])) - reference).max() <= 1e-4, model
        assert answer["model"] == (base_name if adapter is None else model)


@pytest.mark.parametrize("route", ["score", "rerank", "complete"])
def test_an_unknown_model_is_a_404_that_never_reaches_a_replica(served, route):
    bodies = {
        "score": {"query": "q", "items": ["a"], "label_token_ids": [1]},
        "rerank": {"query": "q", "documents": ["a", "b"]},
        "complete": {"prompt": "a b c", "echo": True, "max_tokens": 0},
    }
    recorder = Recorder()
    call = getattr(served["service"], f"{route}_timed" if route != "score" else route)
    error = _refused(call({**bodies[route], "model": "nope"}, recorder))
    assert error.status_code == 404 and error.body["reason"] == "model_not_found"
    assert error.body["type"] == "NotFoundError" and error.body["param"] == "model"
    assert "'ranker'" in error.message and not recorder.works


def test_rerank_and_completions_hand_the_adapter_to_the_replica(served):
    service: ScoringService = served["service"]
    for route, body in (
        ("rerank_timed", {"query": "q", "documents": ["a", "b"], "model": "ranker"}),
        ("complete_timed", {"prompt": "a b c", "echo": True, "max_tokens": 0, "model": "ranker"}),
    ):
        recorder = Recorder(served["engine"])
        answer, _ = asyncio.run(getattr(service, route)(body, recorder))
        assert [work.adapter for work in recorder.works] == ["ranker"], route
        assert answer["model"] == "ranker", route  # the adapter's name, echoed


def test_classify_carries_the_adapter(served):
    head = ScoreHead("linear", 2, ("no", "yes"))
    info = ModelInfo("heads", 49152, 0, ScoringLimits(), head, adapters=("tuned",))
    tokenizer = served["service"].tokenizer
    works = prepare_classify({"input": ["x", "y"], "model": "tuned"}, info, tokenizer).works
    assert [work.adapter for work in works] == ["tuned", "tuned"]
    with pytest.raises(ScoringError) as caught:
        prepare_classify({"input": "x", "model": "other"}, info, tokenizer)
    assert caught.value.status_code == 404


def test_models_lists_each_adapter_with_the_base_as_parent(served):
    service: ScoringService = served["service"]
    base, adapter = service.models_body()["data"]
    assert "parent" not in base
    assert adapter["id"] == "ranker" and adapter["parent"] == base["id"]
    assert {k: v for k, v in adapter.items() if k not in ("id", "parent")} == {
        k: v for k, v in base.items() if k != "id"
    }


def test_a_batch_score_job_runs_its_rows_with_the_model_it_names(served):
    """``python -m batch score --model ranker``: the CPU stage and the engine stage give each
    row the adapter (and its rows pack only with rows of the same adapter); an unknown name
    stops the job before it starts."""
    import pyarrow as pa

    from batch.__main__ import adapter_of
    from batch.rows import ScoreColumns
    from batch.score_stage import LOGPROBS, EngineScore, Tokenize
    from replicas.settings import SettingsError

    rows = pa.Table.from_pylist(
        [{"id": i, "query": "The capital of France is", "item": item}
         for i, item in enumerate([" Paris", " a city"])]
    )  # fmt: skip
    columns = ScoreColumns(label_token_ids=tuple(LABELS), model="ranker")
    tokenized = Tokenize(served["settings"], columns)(rows)
    scored = EngineScore.around(served["engine"], columns)(tokenized)
    prepared = served["service"].prepare({"query": "The capital of France is", "items": [" Paris",
        " a city"], "label_token_ids": LABELS}).tokenized  # fmt: skip
    reference = reference_scores(
        peft_model(served["base"], served["adapter"]),
        [list(prepared.query_ids + item) for item in prepared.item_ids],
        LABELS,
    )
    got = np.array([row[0] for row in scored.column(LOGPROBS).to_pylist()])
    assert np.abs(got - reference).max() <= 1e-4
    assert adapter_of("ranker", served["settings"]) == "ranker"
    assert adapter_of(None, served["settings"]) is None
    assert adapter_of(served["service"].info.name, served["settings"]) is None  # the base
    with pytest.raises(SettingsError, match="--model"):
        adapter_of("nope", served["settings"])


def test_batch_rerank_and_loglik_jobs_run_their_rows_with_the_model_they_name(served):
    """``python -m batch rerank|loglik --model ranker``: the engine stage runs every row's
    work with the adapter, packed (query_likelihood and loglik rows into one prompt work
    each), and each row equals its route's answer for ``model: ranker``, not the base's."""
    import pyarrow as pa

    from batch.loglik_stage import CONTINUATION, LoglikColumns, LoglikPrepare, loglik_columns
    from batch.rerank_stage import RerankColumns, RerankPrepare, relevance_columns
    from batch.works import EngineWorks, read_works

    service: ScoringService = served["service"]
    documents = ["Paris is the capital of France.", "Bananas are yellow."]
    rows = pa.Table.from_pylist(
        [{"id": i, "query": "capital of France", "document": d} for i, d in enumerate(documents)]
    )
    pairs = pa.Table.from_pylist(
        [{"id": i, "context": "The capital of France is", "continuation": c}
         for i, c in enumerate([" Paris", " a banana"])]
    )  # fmt: skip
    modes = (
        (rows, RerankPrepare, RerankColumns(), relevance_columns, "relevance"),
        (pairs, LoglikPrepare, LoglikColumns(), loglik_columns, "logprob"),
    )
    got: dict[tuple[str, str | None], list[float]] = {}
    prepared = {}
    for table, prepare, columns, results, output in modes:
        prepared[output] = prepare.around(service, columns)(table)
        for adapter in ("ranker", None):
            stage = EngineWorks.around(served["engine"], results, adapter=adapter)
            got[output, adapter] = stage(prepared[output]).column(output).to_pylist()
    body = {"query": "capital of France", "documents": documents, "model": "ranker"}
    answer, _ = asyncio.run(service.rerank_timed(body, Recorder(served["engine"])))
    route = {r["index"]: r["relevance_score"] for r in answer["results"]}
    assert_fp32_close(got["relevance", "ranker"], [route[0], route[1]], what="relevance")
    counts = prepared["logprob"].column(CONTINUATION).to_pylist()
    for row, (work, count) in enumerate(zip(read_works(prepared["logprob"]), counts, strict=True)):
        body = {"prompt": list(work.prompts[0]), "echo": True, "max_tokens": 0, "logprobs": 1}
        completed, _ = asyncio.run(
            service.complete_timed(body | {"model": "ranker"}, Recorder(served["engine"]))
        )
        tokens = np.asarray(completed["choices"][0]["logprobs"]["token_logprobs"][-count:])
        # A sum of per-token float32 differences: at most the sum of their floors.
        difference = abs(got["logprob", "ranker"][row] - tokens.sum())
        assert difference <= fp32_bound(tokens).sum(), (row, difference)
    # The adapter moves every answer (relevances near 2e-5 here: compared as logs).
    ratios = np.log(got["relevance", "ranker"]) - np.log(got["relevance", None])
    assert np.abs(ratios).max() > 1e-2
    assert np.abs(np.subtract(got["logprob", "ranker"], got["logprob", None])).max() > 1e-3
