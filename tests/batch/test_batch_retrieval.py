"""``python -m batch embed`` and ``rerank`` on a late-interaction (ColBERT) and a sparse
(SPLADE) model answer as sentence-transformers does (tests/support/retrieval_helpers.py: tiny
random models, the library's own values on CPU in float32), within 1e-5: ``embed`` writes
each row's scored token vectors (``encode_query`` / ``encode_document``: a document's
skiplist tokens left out) or its sparse vector, ``rerank`` each (query, document) row's
MaxSim or sparse dot product (``model.similarity``). In this process: the stages, both
roles, a refused row. On the session's Ray cluster: each command writes every id once.

On a hybrid model (a tiny BGE-M3, tests/support/bge_m3_helpers.py), in this process:
``embed`` writes each row's dense vector, multi-vector and lexical weights from one pass,
``rerank`` each row's ``colbert+sparse+dense`` score, as FlagEmbedding's formulas compute
them within 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml

from app.service import ScoringService
from batch.embed_stage import EmbedColumns, EmbedEngine, EmbedPrepare, embed_output, finish_embed
from batch.modes import mode_named
from batch.rerank_stage import RerankColumns, RerankPrepare
from batch.stages import finish_rows
from batch.works import WORK_COLUMNS, EngineWorks
from tests.support.bge_m3_helpers import m3_encode, m3_scores, save_bge_m3
from tests.support.embed_helpers import embed_settings
from tests.support.retrieval_helpers import (
    colbert_scores,
    colbert_vectors,
    save_colbert,
    save_splade,
    splade_scores,
    splade_vectors,
)
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

TOL = 1e-5
CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
SHAPES = {"token_buckets": (256,), "item_token_buckets": (64, 256), "item_tokens_per_step": 256}
TEXTS = [
    "alpha river . blue stone",
    "what is the red cloud",
    "seven . gamma delta and the river of stone",
    "zebra beta",
    "the blue river . " * 30,  # past a ColBERT document's 100 tokens: cut; SPLADE: 120
]
QUERIES = ["what is the river", "blue stone"]
DOCUMENTS = ["the river runs . to the stone", "red cloud and blue", "gamma . delta"]


@pytest.fixture(scope="module", params=["late", "sparse"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(kind, directory, settings, service, engine) of one tiny model."""
    from replicas.engine.scoring_engine import ScoringEngine

    root = tmp_path_factory.mktemp(request.param)
    save = save_colbert if request.param == "late" else save_splade
    directory = save(root / request.param)
    settings = embed_settings(directory, **SHAPES)
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings, warm=True)
    return request.param, directory, settings, service, engine


def expected_vectors(kind: str, directory: Path, texts: list[str], role: str) -> list[Any]:
    if kind == "late":
        return colbert_vectors(directory, texts, role)
    return splade_vectors(directory, texts, role)


def assert_row_equal(kind: str, row: dict[str, Any], expected: Any, vocab: int) -> None:
    if kind == "late":
        got = np.asarray(row["embedding"], np.float32)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
        return
    indices, values = row["sparse_indices"], row["sparse_values"]
    assert indices == sorted(indices) and len(indices) == len(values)
    got, want = np.zeros(vocab), np.zeros(vocab)
    got[indices] = values
    want[list(expected)] = list(expected.values())
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("role", ["document", "query"])
def test_embed_rows_equal_the_library(model: Any, role: str) -> None:
    """Each row's vectors as the library encodes its text in ``role``; an empty row is the
    route's 400, and a row past a sparse model's 120 tokens too (no ``--truncate``)."""
    kind, directory, settings, service, engine = model
    rows = [{"id": f"t{n}", "text": text} for n, text in enumerate([*TEXTS, ""])]
    columns = EmbedColumns(input_type=role)
    output = embed_output(settings, columns)
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    table = finish_embed(EmbedEngine.around(engine, output)(prepared))
    assert list(output.outputs) == (
        ["embedding"] if kind == "late" else ["sparse_indices", "sparse_values"]
    )
    if kind == "late":
        inner = pa.list_(pa.float32(), engine.info.pooling.dimension)
        assert table.schema.field("embedding").type == pa.list_(inner)
    else:
        assert table.schema.field("sparse_indices").type == pa.list_(pa.int32())
        assert table.schema.field("sparse_values").type == pa.list_(pa.float32())
    assert not [c for c in table.column_names if c.startswith("_sj_")]
    out = table.to_pylist()
    refused = {"": "empty_input"} | ({TEXTS[-1]: "sequence_too_long"} if kind == "sparse" else {})
    served = [row for row in out if row["text"] not in refused]
    for row in out:
        if row["text"] in refused:
            assert row["error"] == refused[row["text"]]
            assert all(row[name] is None for name in output.outputs)
    expected = expected_vectors(kind, directory, [row["text"] for row in served], role)
    vocab = engine.info.pooling.dimension
    for row, want in zip(served, expected, strict=True):
        assert row["error"] is None
        assert_row_equal(kind, row, want, vocab)
    if kind == "late" and role == "document":  # "." is the skiplist's: left out
        assert (
            len(served[0]["embedding"]) == len(expected[0]) == 7
        )  # [CLS] the alpha river blue stone [SEP]


def test_sparse_truncate_and_the_refused_options(model: Any) -> None:
    """``--truncate END`` cuts a sparse row as /embed_sparse's ``truncate``; the options of
    other kinds are refused before a row is read."""
    from replicas.settings import SettingsError

    kind, directory, settings, service, engine = model
    refused = [EmbedColumns(dimensions=8), EmbedColumns(types=("int8",))]
    refused += [EmbedColumns(parts=("dense",))]  # --outputs: a hybrid model's
    if kind == "late":
        refused += [EmbedColumns(truncate="END"), EmbedColumns(prompt_name="query")]
    else:
        refused += [EmbedColumns(truncate="CHUNK")]
    for columns in refused:
        with pytest.raises(SettingsError):
            embed_output(settings, columns)
    if kind == "late":
        return
    columns = EmbedColumns(truncate="END")
    output = embed_output(settings, columns)
    rows = [{"id": "long", "text": TEXTS[-1]}]
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    (row,) = finish_embed(EmbedEngine.around(engine, output)(prepared)).to_pylist()
    assert row["error"] is None and len(row["sparse_indices"]) > 0
    from sentence_transformers import SparseEncoder

    library = SparseEncoder(str(directory), device="cpu")
    vector = library.encode_document([TEXTS[-1]], convert_to_sparse_tensor=True).coalesce()
    want = dict(zip(vector.indices()[1].tolist(), vector.values().tolist(), strict=True))
    assert_row_equal(kind, row, want, engine.info.pooling.dimension)


def test_rerank_rows_equal_the_library(model: Any) -> None:
    """Each (query, document) row's relevance: the library's MaxSim or sparse dot product of
    the query's ``encode_query`` and the document's ``encode_document``."""
    kind, directory, settings, service, engine = model
    rows = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate(QUERIES)
        for d, document in enumerate(DOCUMENTS)
    ]
    rows.append({"id": "empty", "query": "", "document": DOCUMENTS[0]})
    mode, columns = mode_named("rerank"), RerankColumns()
    prepared = RerankPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    results = mode.payload(settings, columns)
    scored = EngineWorks.around(engine, results)(prepared)
    out = finish_rows(scored, "relevance", WORK_COLUMNS, None).to_pylist()
    assert out[-1]["error"] is not None and out[-1]["relevance"] is None
    scores = colbert_scores if kind == "late" else splade_scores
    for q, query in enumerate(QUERIES):
        want = scores(directory, query, DOCUMENTS)
        got = [row["relevance"] for row in out if row["query"] == query]
        assert all(row["error"] is None for row in out[q * 3 : q * 3 + 3])
        np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(directory, settings, service, engine) of a tiny BGE-M3, its heads converted."""
    from replicas.checkpoints.convert_pt import convert
    from replicas.engine.scoring_engine import ScoringEngine

    directory = save_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")
    convert(directory)
    settings = embed_settings(directory, **SHAPES)
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings, warm=True)
    assert engine.info.kind == "hybrid"
    return directory, settings, service, engine


def test_hybrid_embed_writes_the_three_outputs_of_one_pass(m3: Any) -> None:
    """``embedding`` (the dense vector), ``token_embeddings`` (the multi-vector) and the
    lexical weights of each row, as FlagEmbedding's ``encode``; an empty row and one past
    the model's 120 tokens are refusals, null in every column; ``--outputs`` picks parts and
    the dense model's options are refused."""
    from replicas.settings import SettingsError

    directory, settings, service, engine = m3
    for refused in (EmbedColumns(dimensions=8), EmbedColumns(truncate="CHUNK")):
        with pytest.raises(SettingsError):
            embed_output(settings, refused)
    rows = [{"id": f"t{n}", "text": text} for n, text in enumerate([*TEXTS, ""])]
    columns = EmbedColumns()
    output = embed_output(settings, columns)
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    table = finish_embed(EmbedEngine.around(engine, output)(prepared))
    names = ["embedding", "token_embeddings", "sparse_indices", "sparse_values"]
    assert list(output.outputs) == names
    head = engine.info.pooling
    colbert = head.hybrid.colbert_dimension
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), head.dimension)
    inner = pa.list_(pa.float32(), colbert)
    assert table.schema.field("token_embeddings").type == pa.list_(inner)
    assert table.schema.field("sparse_indices").type == pa.list_(pa.int32())
    out = table.to_pylist()
    refused = {"": "empty_input", TEXTS[-1]: "sequence_too_long"}
    for row in out:
        if row["text"] in refused:
            assert row["error"] == refused[row["text"]]
            assert all(row[name] is None for name in names)
    served = [row for row in out if row["text"] not in refused]
    reference = m3_encode(directory, [row["text"] for row in served])
    for n, row in enumerate(served):
        assert row["error"] is None
        np.testing.assert_allclose(row["embedding"], reference["dense"][n], atol=TOL, rtol=0)
        tokens = np.asarray(row["token_embeddings"], np.float32)
        np.testing.assert_allclose(tokens, reference["colbert"][n], atol=TOL, rtol=0)
        lexical = reference["lexical"][n]
        assert row["sparse_indices"] == sorted(lexical)
        want = [lexical[i] for i in sorted(lexical)]
        np.testing.assert_allclose(row["sparse_values"], want, atol=TOL, rtol=0)
    columns = EmbedColumns(parts=("sparse",))
    output = embed_output(settings, columns)
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows[:1]))
    (row,) = finish_embed(EmbedEngine.around(engine, output)(prepared)).to_pylist()
    assert list(output.outputs) == ["sparse_indices", "sparse_values"]
    assert "embedding" not in row and "token_embeddings" not in row
    assert row["sparse_indices"] == out[0]["sparse_indices"]


def test_hybrid_rerank_equals_compute_score(m3: Any) -> None:
    """Each (query, document) row's relevance: ``compute_score``'s ``colbert+sparse+dense``
    (0.4, 0.2, 0.4), as /v1/rerank answers it."""
    directory, settings, service, engine = m3
    rows = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate(QUERIES)
        for d, document in enumerate(DOCUMENTS)
    ]
    rows.append({"id": "empty", "query": "", "document": DOCUMENTS[0]})
    mode, columns = mode_named("rerank"), RerankColumns()
    prepared = RerankPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    scored = EngineWorks.around(engine, mode.payload(settings, columns))(prepared)
    out = finish_rows(scored, "relevance", WORK_COLUMNS, None).to_pylist()
    assert out[-1]["error"] is not None and out[-1]["relevance"] is None
    for query in QUERIES:
        got = [row["relevance"] for row in out if row["query"] == query]
        np.testing.assert_allclose(got, m3_scores(directory, query, DOCUMENTS), atol=TOL, rtol=0)


def job_config(directory: Path, path: Path) -> Path:
    """The shipped serve config with the tiny model, small buckets, no warm-up."""
    config = yaml.safe_load(CONFIG.read_text())
    (app,) = config["applications"]
    app["args"].update(
        model=str(directory),
        token_buckets=list(SHAPES["token_buckets"]),
        item_token_buckets=list(SHAPES["item_token_buckets"]),
        item_tokens_per_step=SHAPES["item_tokens_per_step"],
        batch_buckets=[1],
        max_items_per_request=64,
        query_cache_bytes=0,
        warmup_shapes=[],
        completion_warmup_shapes=[],
        limit_to_warmup=False,
        compilation_cache_dir=None,
        host_resources={"CPU": 0.25},
    )
    path.write_text(yaml.safe_dump(config))
    return path


def written(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("*.json*")) for line in f.open()]


@pytest.mark.slow
@RAY_SERVE
@pytest.mark.parametrize(
    "model", ["late", pytest.param("sparse", marks=pytest.mark.deep)], indirect=True
)  # the sparse job: a second angle on the same command (make test-deep)
def test_the_commands_write_each_row_once(
    serve_cluster: ServeCluster,  # noqa: F811
    model: Any,
    tmp_path: Path,
) -> None:
    """``python -m batch embed --input-type query`` and ``rerank`` on the cluster: every id
    once, the values the library's."""
    from batch.__main__ import main

    kind, directory, _, _, engine = model
    config = job_config(directory, tmp_path / "serve_config.yaml")
    texts = TEXTS[:4]
    source = tmp_path / "texts.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"t{n}", "text": t}) + "\n" for n, t in enumerate(texts))
    )
    common = ["--config", str(config), "--output-format", "jsonl", "--batch-size", "2"]
    argv = ["embed", "--input", str(source), "--output", str(tmp_path / "embed")]
    assert main([*argv, *common, "--input-type", "query"]) == 0
    out = written(tmp_path / "embed")
    assert sorted(row["id"] for row in out) == [f"t{n}" for n in range(len(texts))]
    expected = dict(zip(texts, expected_vectors(kind, directory, texts, "query"), strict=True))
    for row in out:
        assert_row_equal(kind, row, expected[row["text"]], engine.info.pooling.dimension)
    pairs = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate(QUERIES)
        for d, document in enumerate(DOCUMENTS)
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in pairs))
    argv = ["rerank", "--input", str(source), "--output", str(tmp_path / "rerank")]
    assert main([*argv, *common]) == 0
    out = {row["id"]: row for row in written(tmp_path / "rerank")}
    assert len(written(tmp_path / "rerank")) == len(out) == len(pairs)
    scores = colbert_scores if kind == "late" else splade_scores
    for q, query in enumerate(QUERIES):
        got = [out[f"{q}-{d}"]["relevance"] for d in range(len(DOCUMENTS))]
        np.testing.assert_allclose(got, scores(directory, query, DOCUMENTS), atol=TOL, rtol=TOL)
