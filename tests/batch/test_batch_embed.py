"""``python -m batch embed``'s stages equal /v1/embeddings (semantics 17, 20), in this process
on the session's tiny Qwen3 embedding engine: the CPU stage (the route's own preparation,
its prompt) -> the engine stage on token ids only, rows packed by length -> finish; each row's
``embedding`` (a fixed-size list of float32) equals the route's vector for the same text,
with ``--dimensions`` and ``--prompt-name``, and a bad row gets the route's 400 reason."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from app.service import ScoringService
from batch.embed_stage import EmbedColumns, EmbedEngine, EmbedOutput, EmbedPrepare, finish_embed
from tests.support.embed_helpers import embed_settings, texts_of

VARIANT = "qwen3-last"


@pytest.fixture(scope="module")
def local(embedding_dirs: dict, embedding_engine: Any) -> tuple[Any, ScoringService]:
    settings = embed_settings(embedding_dirs[VARIANT])
    return embedding_engine(VARIANT), ScoringService.from_settings(settings)


@pytest.mark.parametrize(
    ("prompt_name", "dimensions", "types"),
    [(None, None, ()), ("query", 16, ("int8", "ubinary", "binary", "uint8", "base64", "float"))],
)
def test_embed_rows_equal_what_v1_embeddings_answers(local, prompt_name, dimensions, types) -> None:
    engine, service = local
    texts = [*texts_of(31, 20, longest=300), "", "alpha river " * 400]
    rows = [{"id": f"t{n}", "text": text} for n, text in enumerate(texts)]
    random.Random(3).shuffle(rows)
    columns = EmbedColumns(prompt_name=prompt_name, dimensions=dimensions, types=types)
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    output = EmbedOutput(dimensions, types)
    table = finish_embed(EmbedEngine.around(engine, output)(prepared), None)
    width = dimensions or engine.info.pooling.dimension
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), width)
    assert "_sj_embed_ids" not in table.column_names

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    out = table.to_pylist()
    refused = {"": "empty_input", texts[-1]: "sequence_too_long"}
    for row in out:
        if row["text"] in refused:
            assert (row["error"], row["embedding"]) == (refused[row["text"]], None)
    served = [row for row in out if row["text"] not in refused]
    payload: dict[str, Any] = {"input": [row["text"] for row in served]}
    payload |= {"prompt_name": prompt_name} if prompt_name else {}
    payload |= {"dimensions": dimensions} if dimensions else {}
    body, _ = asyncio.run(service.embed_timed(payload, backend))  # one request, every text
    vectors = [entry["embedding"] for entry in body["data"]]
    np.testing.assert_allclose([row["embedding"] for row in served], vectors, atol=1e-5)
    assert all(row["error"] is None for row in served)
    assert [c for c in table.column_names if c.startswith("embedding")] == list(columns.outputs)
    if types:  # each type as sentence-transformers quantizes the row's own vector
        from sentence_transformers.util.quantization import quantize_embeddings

        mine = np.asarray([row["embedding"] for row in served], np.float32)
        ranges = np.stack([np.full(16, -1.0), np.full(16, 1.0)]).astype(np.float32)
        for kind in ("int8", "uint8", "binary", "ubinary"):
            expected = quantize_embeddings(mine, kind, ranges=ranges)
            np.testing.assert_array_equal([row[f"embedding_{kind}"] for row in served], expected)
        assert all(row[f"embedding_{k}"] is None for row in out if row["error"] for k in types)


@pytest.mark.parametrize("truncate", ["CHUNK", "START"])
def test_truncate_rows_equal_what_v1_embeddings_answers(local, truncate) -> None:
    """``--truncate``: a row past the limit (512) cut or chunked as the route cuts or chunks
    it; CHUNK rows packed with their chunks among other rows."""
    engine, service = local
    texts = [*texts_of(32, 6, longest=200), "alpha river " * 700, "seven blue " * 400]
    rows = [{"id": f"t{n}", "text": text} for n, text in enumerate(texts)]
    columns = EmbedColumns(truncate=truncate)
    prepared = EmbedPrepare.around(service, columns)(pa.Table.from_pylist(rows))
    output = EmbedOutput(chunked=truncate == "CHUNK")
    table = finish_embed(EmbedEngine.around(engine, output)(prepared), None).to_pylist()

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    body, _ = asyncio.run(service.embed_timed({"input": texts, "truncate": truncate}, backend))
    vectors = {text: entry["embedding"] for text, entry in zip(texts, body["data"], strict=True)}
    assert all(row["error"] is None for row in table)
    for row in table:
        np.testing.assert_allclose(row["embedding"], vectors[row["text"]], atol=1e-5, rtol=0)


def test_the_command_and_its_refusals(tiny_llama_dir, embedding_dirs: dict) -> None:
    from batch.__main__ import parser
    from batch.pipeline import embed_dataset
    from replicas.settings import ReplicaSettings, SettingsError

    args = parser().parse_args(
        ["embed", "--input", "t.jsonl", "--output", "out", "--prompt-name", "query",
         "--dimensions", "16", "--input-column", "body", "--embedding-types", "int8,binary",
         "--truncate", "CHUNK"]
    )  # fmt: skip
    assert (args.mode, args.prompt_name, args.dimensions, args.input_column) == (
        "embed", "query", 16, "body",
    )  # fmt: skip
    assert (args.embedding_types, args.truncate) == (("int8", "binary"), "CHUNK")
    with pytest.raises(SystemExit):
        parser().parse_args(["embed", "--input", "t", "--output", "o", "--embedding-types", "int4"])
    with pytest.raises(SettingsError, match="not an embedding model"):
        embed_dataset(None, ReplicaSettings.from_keys(model=str(tiny_llama_dir)), EmbedColumns())
    with pytest.raises(SettingsError, match="--dimensions"):
        settings = embed_settings(embedding_dirs[VARIANT])
        embed_dataset(None, settings, EmbedColumns(dimensions=65))
    with pytest.raises(SettingsError, match=r"--dimensions: 8 is not one of .* Matryoshka"):
        embed_dataset(None, settings, EmbedColumns(dimensions=8))  # as the route refuses it
