"""An embedding model served for real (Ray Serve, HTTP, the engine; semantics 20) on the shipped
serve_config.yaml's ``args`` with only ``model`` changed: the tiny Qwen3 sentence-transformers
directory answers the OpenAI SDK's ``embeddings.create`` (float
and base64, as the SDK decodes it) and the Cohere SDK's ``embed`` with sentence-transformers'
vectors, and cosine /v1/score; ``python -m batch embed`` writes the same vectors for a file,
with its own engine actor and through the deployed app (``--engine serve``). One deployment
for the module."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from app.builder import scoring_app
from tests.support.embed_helpers import embed_settings, reference_vectors, texts_of
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401
from tests.support.shipped import SERVE_CONFIG, shipped_settings

pytestmark = [pytest.mark.slow, RAY_SERVE]

TOL = 1e-5
PREFIX = "/embed"
APP = "embed"


@pytest.fixture(scope="module")
def directory(embedding_dirs: dict) -> Path:
    return embedding_dirs["qwen3-last"]


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, directory: Path) -> Iterator[httpx.Client]:  # noqa: F811
    small = {"ray_actor_options": {"num_cpus": 0.1}}
    settings = shipped_settings(directory, compilation_cache_dir=None)  # the user's cache alone
    app = scoring_app(settings, replica_options=small, ingress_options=small)
    serve_cluster.deploy(app, APP, PREFIX)
    with serve_cluster.client() as http:
        http.base_url = http.base_url.join(PREFIX)
        yield http


def test_the_openai_and_cohere_sdks_embed_as_sentence_transformers(
    serve_cluster: ServeCluster,  # noqa: F811
    client: httpx.Client,
    directory: Path,
) -> None:
    import cohere
    import openai

    texts = texts_of(21, 6, longest=120)
    reference = reference_vectors(directory, texts)
    model = client.get("/v1/models").json()["data"][0]["id"]
    sdk = openai.OpenAI(api_key="unused", base_url=f"{serve_cluster.http_url}{PREFIX}/v1")
    floats = sdk.embeddings.create(model=model, input=texts, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in floats.data], reference, atol=TOL, rtol=0)
    decoded = sdk.embeddings.create(model=model, input=texts)  # the SDK asks for base64
    np.testing.assert_array_equal(
        np.asarray([d.embedding for d in decoded.data], np.float32),
        np.asarray([d.embedding for d in floats.data], np.float32),
    )
    assert floats.usage.prompt_tokens > len(texts)
    co = cohere.ClientV2(api_key="unused", base_url=f"{serve_cluster.http_url}{PREFIX}")
    queried = co.embed(
        texts=texts, model=model, input_type="search_query", embedding_types=["float"]
    )
    query = reference_vectors(directory, texts, prompt_name="query")
    np.testing.assert_allclose(queried.embeddings.float_, query, atol=TOL, rtol=0)
    assert_every_type_decodes(co, sdk, model, texts)
    scores = client.post("/v1/score", json={"query": texts[0], "items": texts[1:3]})
    assert scores.status_code == 200, scores.text
    cos = reference[1:3] @ query[0] / np.linalg.norm(reference[1:3], axis=1)
    np.testing.assert_allclose(np.asarray(scores.json()["scores"])[:, 0], cos, atol=TOL)


def test_rerank_answers_and_the_routes_of_other_kinds_name_the_kind(client: httpx.Client) -> None:
    ranked = client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2, ranked.text
    for route, body in (
        ("/v1/completions", {"prompt": "x", "echo": True}),
        ("/v1/classify", {"input": "a"}),
    ):
        refused = client.post(route, json=body)
        assert refused.status_code == 400 and route in refused.text, refused.text
        assert "embedding" in refused.json()["message"]


def assert_every_type_decodes(co: Any, sdk: Any, model: str, texts: list[str]) -> None:
    """The Cohere v2 SDK decodes every embedding type of one request (semantics 25), each as
    sentence-transformers' quantize_embeddings makes it of the cut float vector (default
    [-1, 1] ranges); the OpenAI SDK passes the extension through ``extra_body``."""
    from sentence_transformers.util.quantization import quantize_embeddings

    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    got = co.embed(
        texts=texts,
        model=model,
        input_type="clustering",
        embedding_types=types,
        output_dimension=16,
    )
    cut = np.asarray(got.embeddings.float_, np.float32)
    assert cut.shape == (len(texts), 16)
    ranges = np.stack([-np.ones(16), np.ones(16)])
    for kind in types[1:5]:
        expected = quantize_embeddings(cut, kind, ranges=ranges if "int8" in kind else None)
        np.testing.assert_array_equal(getattr(got.embeddings, kind), expected, err_msg=kind)
    decoded = [np.frombuffer(base64.b64decode(s), "<f4") for s in got.embeddings.base64]
    np.testing.assert_array_equal(decoded, cut)
    extended = sdk.embeddings.create(
        model=model, input=texts, dimensions=16, extra_body={"embedding_types": ["ubinary"]}
    )
    assert [d.model_extra["embeddings"]["ubinary"] for d in extended.data] == (
        got.embeddings.ubinary
    )


def embed_config(directory: Path, folder: Path) -> Path:
    """The shipped serve_config.yaml with the embedding model and ``embed_settings``'s
    shapes, no warm-up, a quarter CPU for the job's engine actor."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    (app,) = config["applications"]
    shapes = embed_settings(directory)
    app["args"].update(
        model=str(directory),
        token_buckets=list(shapes.engine.token_buckets),
        item_token_buckets=list(shapes.engine.item_token_buckets),
        item_tokens_per_step=shapes.engine.item_tokens_per_step,
        fused_step_tokens=shapes.engine.fused_step_tokens,
        batch_buckets=list(shapes.engine.batch_buckets),
        max_items_per_request=shapes.http.max_items_per_request,
        query_cache_bytes=0,
        warmup_shapes=[],
        completion_warmup_shapes=[],
        limit_to_warmup=False,
        compilation_cache_dir=None,
        host_resources={"CPU": 0.25},
    )
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def written(folder: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for f in sorted(folder.glob("*.json*")) for line in f.open()]
    return {row["id"]: row for row in rows}


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.deep), "serve"])
def test_the_embed_command_writes_sentence_transformers_vectors(
    client: httpx.Client,
    directory: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: str,
) -> None:
    """``python -m batch embed`` on Ray Data, 3 rows per engine call: its own engine actor
    (``local``) or the deployed app's (``serve``); every id once, an empty text refused."""
    from batch.__main__ import main

    texts = texts_of(9, 7, longest=60)
    rows = [{"id": f"t{n}", "text": text} for n, text in enumerate(texts)]
    rows.insert(3, {"id": "empty", "text": ""})
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["embed", "--input", str(source), "--output", str(tmp_path / "out")]
    argv += ["--config", str(embed_config(directory, tmp_path)), "--output-format", "jsonl"]
    assert main([*argv, "--batch-size", "3", "--engine", engine, "--app", APP]) == 0
    out = written(tmp_path / "out")
    assert sorted(out) == sorted(row["id"] for row in rows), "every id exactly once"
    assert (out["empty"]["error"], out["empty"]["embedding"]) == ("empty_input", None)
    vectors = [out[f"t{n}"]["embedding"] for n in range(len(texts))]
    np.testing.assert_allclose(vectors, reference_vectors(directory, texts), atol=TOL, rtol=0)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["rows"], summary["errors"]) == (len(rows), {"empty_input": 1})
