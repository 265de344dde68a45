"""A BERT cross-encoder (``BertForSequenceClassification`` saved by sentence-transformers'
``CrossEncoder``, one label, sigmoid; and an ``XLMRobertaForSequenceClassification``: no
token types, positions from pad + 1, its classifier's own names) answers /v1/rerank and
/v1/score (no labels) as ``CrossEncoder.predict`` scores each (query, document) pair, and
/v1/classify as it scores each single text and each pair [text, text_pair] (three labels:
softmaxed, as ``apply_softmax``),
float32 within 1e-5, however the pairs of a step are packed (a
``ModernBertForSequenceClassification`` too: 3 layers, global and local, a window of +-4
positions, mean pooling); /v1/models says
``cross_encoder`` and the routes it cannot serve answer a 400 naming the route and the kind
(tests/support/encoder_helpers.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.schema import ModelList
from app.service import ScoringService
from replicas.errors import ScoringError
from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import save_bert_cross_encoder, sentences

TOL = 1e-5


@pytest.fixture(scope="module", params=["bert", "xlm_roberta", "modernbert"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, ScoringService, Any, Any]:
    from replicas.engine.scoring_engine import ScoringEngine

    root = tmp_path_factory.mktemp("ce")
    pooling = "mean" if request.param == "modernbert" else "cls"  # ModernBERT: mean pooling
    directory = save_bert_cross_encoder(root / request.param, family=request.param, pooling=pooling)
    settings = embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
    )  # fmt: skip
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings, warm=True)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    return directory, service, backend, engine


@functools.lru_cache(maxsize=4)
def _cross_encoder(directory: Path) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(directory), device="cpu", local_files_only=True)


def predicted(directory: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """``CrossEncoder.predict`` of ``pairs`` in float32 (its activation applied)."""
    scores = _cross_encoder(directory).predict(pairs, convert_to_numpy=True)
    return np.asarray(scores, np.float32)


def predicted_texts(directory: Path, texts: list[str], **options: Any) -> np.ndarray:
    """``CrossEncoder.predict(text)`` of each text alone, ``[texts, num_labels]``."""
    model = _cross_encoder(directory)
    rows = [model.predict(text, convert_to_numpy=True, **options) for text in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), -1)


def classified(service: ScoringService, backend: Any, body: dict[str, Any]) -> np.ndarray:
    data = asyncio.run(service.classify_timed(body, backend))[0]["data"]
    assert [entry["index"] for entry in data] == list(range(len(data)))
    return np.asarray([entry["probs"] for entry in data])


@pytest.mark.parametrize("served", ["bert", "xlm_roberta"], indirect=True)  # suite budget
def test_classify_equals_cross_encoder_predict_on_single_texts_and_pairs(served) -> None:
    import torch

    directory, service, backend, _ = served
    texts = ["blue river", "", *sentences(3, 5, longest=60)]
    reference = predicted_texts(directory, texts)
    body = asyncio.run(service.classify_timed({"input": texts}, backend))[0]
    assert {entry["label"] for entry in body["data"]} == {"LABEL_0"}
    assert {entry["num_classes"] for entry in body["data"]} == {1}
    tokens = sum(len(service.tokenizer(t)["input_ids"]) for t in texts)
    assert body["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0,
                             "total_tokens": tokens}  # fmt: skip
    probs = np.asarray([entry["probs"] for entry in body["data"]])
    np.testing.assert_allclose(probs, reference, atol=TOL, rtol=0)
    alone = classified(service, backend, {"input": texts[2]})  # a string: one row, alone
    np.testing.assert_allclose(alone, reference[2:3], atol=TOL, rtol=0)
    raw = classified(service, backend, {"input": texts, "activation": False})
    logits = predicted_texts(directory, texts, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(raw, logits, atol=TOL, rtol=0)
    assert asyncio.run(service.classify_timed({"input": []}, backend))[0]["data"] == []
    pairs = [("what is blue", texts[3]), (texts[4], "red stone")]  # pairs mixed with texts
    mixed = classified(service, backend, {"input": [texts[2], *map(list, pairs), texts[5]]})
    np.testing.assert_allclose(mixed[[0, 3]], reference[[2, 5]], atol=TOL, rtol=0)
    np.testing.assert_allclose(mixed[1:3, 0], predicted(directory, pairs), atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScoringService, Any, Any]:
    from replicas.engine.scoring_engine import ScoringEngine

    directory = save_bert_cross_encoder(tmp_path_factory.mktemp("ce3") / "bert3", num_labels=3)
    settings = embed_settings(directory, token_buckets=(128,), item_token_buckets=(64,),
                              item_tokens_per_step=128)  # fmt: skip
    engine = ScoringEngine.from_settings(settings, warm=True)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    return directory, ScoringService.from_settings(settings), backend


def test_classify_on_three_labels_softmaxes_as_predict_apply_softmax(three_labels) -> None:
    directory, service, backend = three_labels
    texts = sentences(4, 6, longest=40)
    reference = predicted_texts(directory, texts, apply_softmax=True)
    data = asyncio.run(service.classify_timed({"input": texts}, backend))[0]["data"]
    probs = np.asarray([entry["probs"] for entry in data])
    np.testing.assert_allclose(probs, reference, atol=TOL, rtol=0)
    assert [entry["label"] for entry in data] == [f"LABEL_{int(i)}" for i in probs.argmax(1)]
    raw = classified(service, backend, {"input": texts, "activation": False})
    np.testing.assert_allclose(raw, predicted_texts(directory, texts), atol=TOL, rtol=0)
    with pytest.raises(ScoringError, match="/v1/rerank") as refused:  # no relevance to rank by
        asyncio.run(service.rerank_timed({"query": "a", "documents": ["b"]}, backend))
    assert refused.value.status_code == 400


def test_rerank_and_score_equal_cross_encoder_predict(served) -> None:
    directory, service, backend, _ = served
    query, documents = "what is the blue river", sentences(5, 20, longest=80)
    reference = predicted(directory, [(query, doc) for doc in documents])
    body = asyncio.run(service.rerank_timed({"query": query, "documents": documents}, backend))[0]
    relevance = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([relevance[i] for i in range(20)], reference, atol=TOL, rtol=0)
    assert [r["index"] for r in body["results"]] == list(np.argsort(-reference, kind="stable"))
    scores = asyncio.run(service.score({"query": query, "items": documents[:3]}, backend))
    np.testing.assert_allclose(np.asarray(scores["scores"])[:, 0], reference[:3], atol=TOL, rtol=0)
    for i in (0, 7):  # alone in its step
        (alone,) = asyncio.run(service.score({"query": query, "items": [documents[i]]}, backend))[
            "scores"
        ]
        np.testing.assert_allclose(alone[0], reference[i], atol=TOL, rtol=0)


@pytest.mark.parametrize("served", ["bert"], indirect=True)
def test_rerank_cuts_documents_to_max_tokens_per_doc_and_refuses_an_instruction(served) -> None:
    """``max_tokens_per_doc`` cuts each document as the decoder rerankers do (its first
    tokens, decoded), then the pair scores as ``predict`` scores the cut pair; an
    ``instruction`` has no meaning for a cross-encoder and is refused naming it."""
    directory, service, backend, _ = served
    query, documents = "what is the blue river", sentences(6, 4, longest=60)
    tokenizer = service.tokenizer
    cut = [
        tokenizer.decode(tokenizer(d, add_special_tokens=False)["input_ids"][:3]) for d in documents
    ]
    assert cut != documents  # the documents are longer than 3 tokens
    body = {"query": query, "documents": documents, "max_tokens_per_doc": 3}
    answer = asyncio.run(service.rerank_timed(body, backend))[0]
    relevance = {r["index"]: r["relevance_score"] for r in answer["results"]}
    reference = predicted(directory, [(query, doc) for doc in cut])
    np.testing.assert_allclose([relevance[i] for i in range(4)], reference, atol=TOL, rtol=0)
    with pytest.raises(ScoringError, match=r"^instruction: ") as refused:
        asyncio.run(service.rerank_timed({**body, "instruction": "find rivers"}, backend))
    assert refused.value.status_code == 400 and refused.value.param == "instruction"


def test_the_kind_is_cross_encoder_and_other_routes_refuse_it(served) -> None:
    _, service, backend, _ = served
    assert service.models_body()["data"][0]["kind"] == "cross_encoder"
    for route, call in (
        ("/v1/embeddings", service.embed_timed({"input": ["a"]}, backend)),
        ("/v1/completions", service.complete_timed({"prompt": "x", "echo": True}, backend)),
    ):
        with pytest.raises(ScoringError, match=route) as refused:
            asyncio.run(call)
        assert refused.value.status_code == 400 and "cross_encoder" in refused.value.message
    with pytest.raises(ScoringError, match="label_token_ids"):
        asyncio.run(service.score({"query": "a", "items": ["b"], "label_token_ids": [1]}, backend))


@pytest.mark.parametrize("served", ["bert"], indirect=True)  # the app is the family's
def test_http_routes_models_and_openapi_of_a_cross_encoder(served) -> None:
    from app.http import build_api
    from tests.support.http_support import ask

    directory, service, backend, _ = served

    async def health() -> None:
        return None

    api = build_api(service, backend, health)
    body = json.dumps({"query": "what is blue", "documents": ["blue river", "red stone"]})
    reply = ask(api, "POST", "/v1/rerank", body.encode())
    assert reply.status == 200, reply.body
    reference = predicted(
        directory, [("what is blue", "blue river"), ("what is blue", "red stone")]
    )
    got = {r["index"]: r["relevance_score"] for r in reply.body["results"]}
    np.testing.assert_allclose([got[0], got[1]], reference, atol=TOL, rtol=0)
    models = ask(api, "GET", "/v1/models").body
    ModelList.model_validate(models)  # the published card holds a cross-encoder's too
    assert models["data"][0]["kind"] == "cross_encoder"
    assert models["data"][0]["rerank_chunking"]["max_chunks_per_doc"] == 1
    paths = ask(api, "GET", "/openapi.json").body["paths"]
    assert "/v1/rerank" in paths and "/v1/score" in paths and "/v1/classify" in paths
    assert not {"/v1/embeddings", "/v1/completions"} & set(paths)
    reply = ask(api, "POST", "/v1/classify", json.dumps({"input": ["blue river"]}).encode())
    assert reply.status == 200, reply.body
    (entry,) = reply.body["data"]
    reference = predicted_texts(directory, ["blue river"])[0]
    np.testing.assert_allclose(entry["probs"], reference, atol=TOL, rtol=0)
    pair = {"input": [["what is blue", "blue river"]]}
    reply = ask(api, "POST", "/v1/classify", json.dumps(pair).encode())
    assert reply.status == 200, reply.body
    reference = predicted(directory, [("what is blue", "blue river")])
    np.testing.assert_allclose(reply.body["data"][0]["probs"], reference, atol=TOL, rtol=0)
    for bad in ([["a"]], [["a", "b", "c"]], [["a", 1]]):  # a pair is two texts
        reply = ask(api, "POST", "/v1/classify", json.dumps({"input": bad}).encode())
        assert reply.status == 400, reply.body
    schema = ask(api, "GET", "/openapi.json").body["components"]["schemas"]["ClassifyRequest"]
    pair_schema = schema["properties"]["input"]["anyOf"][1]["items"]["anyOf"][1]
    assert (pair_schema["minItems"], pair_schema["maxItems"]) == (2, 2)
    refused = ask(api, "POST", "/v1/embeddings", json.dumps({"input": "a"}).encode())
    assert refused.status == 400 and refused.body["reason"] == "unsupported_for_model"
    assert (
        "/v1/embeddings" in refused.body["message"] and "cross_encoder" in refused.body["message"]
    )


def test_batch_rerank_and_classify_rows_score_as_predict(served) -> None:
    """``python -m batch rerank`` and ``classify``'s stages in this process (the route's own
    preparation -> the engine stage on token ids only, every row's pairs in one EmbedWork ->
    finish): a row's relevance is ``predict((query, document))`` (chunked: its best chunk,
    as the route answers it), a classify row's probs ``predict(text)``; the modes a
    cross-encoder does not run are refused naming the model before a row is read."""
    import pyarrow as pa

    from batch.classify_stage import ClassifyColumns, ClassifyPrepare
    from batch.modes import MODES
    from batch.pipeline import CROSS_ENCODER_MODES, mode_dataset
    from batch.rerank_stage import RerankColumns, RerankPrepare
    from replicas.settings import ReplicaSettings, SettingsError
    from tests.batch.test_batch import in_process

    directory, service, backend, engine = served
    settings = ReplicaSettings.from_keys(model=str(directory))
    modes = {mode.name: mode for mode in MODES}
    query, documents = "what is the blue river", [*sentences(11, 7, longest=60), ""]
    rows = pa.Table.from_pylist([{"id": f"d{n}", "query": query, "document": d}
                                 for n, d in enumerate(documents)])  # fmt: skip
    for columns in (RerankColumns(), RerankColumns(max_chunks_per_doc=4, chunk_tokens=8)):
        results = modes["rerank"].payload(settings, columns)
        stage = in_process(RerankPrepare.around(service, columns), engine, results, "relevance")
        relevance = [row["relevance"] for row in stage(rows).to_pylist()]
        body = {"query": query, "documents": documents, **columns.chunking()}
        answer = asyncio.run(service.rerank_timed(body, backend))[0]["results"]
        by_route = [r["relevance_score"] for r in sorted(answer, key=lambda r: r["index"])]
        np.testing.assert_allclose(relevance, by_route, atol=TOL, rtol=0)
    np.testing.assert_allclose(relevance[-1], predicted(directory, [(query, "")])[0], atol=TOL)
    texts = pa.Table.from_pylist([{"id": f"t{n}", "input": t} for n, t in enumerate(documents)])
    columns = ClassifyColumns()
    results = modes["classify"].payload(settings, columns)
    stage = in_process(ClassifyPrepare.around(service, columns), engine, results, "probs")
    probs = [row["probs"] for row in stage(texts).to_pylist()]
    np.testing.assert_allclose(probs, predicted_texts(directory, documents), atol=TOL, rtol=0)
    for mode in MODES:
        if mode.name not in CROSS_ENCODER_MODES:
            refused = rf"is a cross-encoder; python -m batch {mode.name} does not run one"
            with pytest.raises(SettingsError, match=refused):
                mode_dataset(None, settings, mode, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("served", ["bert"], indirect=True)
def test_rerank_chunks_score_as_predict_on_each_chunk(served) -> None:
    """Semantics 24 on a cross-encoder: a chunked document ranks by its best chunk, each
    chunk scored as ``predict((query, chunk))``."""
    directory, service, backend, _ = served
    query, (document,) = "what is the blue river", sentences(9, 1, longest=80)
    body = {"query": query, "documents": [document], "chunk_tokens": 8, "max_chunks_per_doc": 6,
            "relevant_spans": {"mode": "enabled", "threshold": 0.0}}  # fmt: skip
    (result,) = asyncio.run(service.rerank_timed(body, backend))[0]["results"]
    spans = result["relevant_spans"]
    assert len(spans) >= 2
    reference = predicted(directory, [(query, document[s["start"] : s["end"]]) for s in spans])
    np.testing.assert_allclose([s["score"] for s in spans], reference, atol=TOL, rtol=0)
    np.testing.assert_allclose(result["relevance_score"], reference.max(), atol=TOL, rtol=0)
