"""Batch scoring equals serving (semantics 17).

The tiny random Llama, the shipped serve_config.yaml pointed at it (small buckets, no
warm-up). Each row's expected answer is what the route's code (``ScoringService.score``,
``rerank_timed``, ``complete_timed``) answers for the same row with an engine of the same
settings: its scores, or its 400 reason. On the session's Ray cluster: a ``score`` job whose
engine actor dies and which stops half-way, resumed by ``python -m batch score`` (every id
once, as /v1/score); ``--engine serve`` through a deployed app; ``python -m batch rerank``.
In this process: the pipeline's stages at any batch size and row order, for item columns of
lists and token-id columns too, and the rerank (both methods) and loglik stages.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import ray.util
import yaml

from app.service import ScoringService
from batch.__main__ import main
from batch.job import TALLY_PREFIX, use_checkpoint
from batch.pipeline import EngineOptions, run_score_job, score_dataset, settings_from_config
from batch.rows import ScoreColumns, row_payload
from batch.score_stage import EngineScore, Tokenize, finish
from replicas.errors import ScoringError
from tests.support.batch_fault_engine import DIE_ENV, STOP_ENV
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
LABELS = (7042, 4528, 11452)
FAULTY = "tests.support.batch_fault_engine:FaultyEngine"
QUERIES = ("The capital of France is", "Bees make", "One two three four five six seven")


def text_rows() -> list[dict[str, Any]]:
    """Three queries of several one-item rows each, and a query that tokenizes to nothing."""
    items = [" Paris", " honey", "", " a long item of several tokens", " x", " rain"]
    out = [
        {"id": f"r{q}-{i}", "query": query, "item": item}
        for q, query in enumerate(QUERIES)
        for i, item in enumerate(items[: 4 + q])
    ]
    return [*out, {"id": "empty-query", "query": "", "item": " Paris"}]  # SmolLM2: no BOS


def list_rows() -> list[dict[str, Any]]:
    """An item column of lists: each row is one multi-item request."""
    return [
        {"id": "multi", "query": QUERIES[0], "item": [" Lyon", " Nice", ""]},
        {"id": "none", "query": QUERIES[1], "item": []},
        {"id": "many", "query": QUERIES[2], "item": [" a"] * 9},  # max_items_per_request 8
        {"id": "multi-2", "query": QUERIES[0], "item": [" Paris"]},
    ]


def token_rows() -> list[dict[str, Any]]:
    """Token-id columns (an item: a list of ids; a row: a list of items)."""
    return [
        {"id": "tokens", "query": [504, 3575, 282], "item": [[4649], [314, 12]]},
        {"id": "tokens-2", "query": [504, 3575, 282], "item": [[4649, 7]]},
        {"id": "delimiter", "query": [504, 3575], "item": [[0, 5]]},
        {"id": "vocab", "query": [504, 49152], "item": [[5]]},
    ]


def rows() -> list[dict[str, Any]]:
    return [*text_rows(), *list_rows(), *token_rows()]


def tiny_config(model_dir: Path) -> dict[str, Any]:
    """The shipped file with the tiny model, small buckets and CPU shares, no warm-up."""
    config = yaml.safe_load(CONFIG.read_text())
    (app,) = config["applications"]
    app["args"].update(
        model=str(model_dir),
        token_buckets=[16, 64],
        item_token_buckets=[16, 64],
        batch_buckets=[1, 4],
        max_items_per_request=8,
        max_multi_item_seq_len=128,
        warmup_shapes=[],
        completion_warmup_shapes=[],
        limit_to_warmup=False,
        compilation_cache_dir=None,
        host_resources={"CPU": 0.25},
    )
    return config


@pytest.fixture(scope="module")
def config_file(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batch-config") / "serve_config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tiny_llama_dir)))
    return path


@pytest.fixture(scope="module")
def expected(config_file: Path) -> dict[str, Any]:
    """Each row's /v1/score answer from the route's code and an engine of the same settings:
    its scores (apply_softmax false: exp of the log-probs), or its 400 reason."""
    from replicas.engine.scoring_engine import ScoringEngine

    settings = settings_from_config(config_file)
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    answers: dict[str, Any] = {}
    for row in rows():
        payload = row_payload(row, ScoreColumns(LABELS))
        try:
            answers[row["id"]] = asyncio.run(service.score(payload, backend))["scores"]
        except ScoringError as error:
            assert error.status_code == 400
            answers[row["id"]] = error.reason.value
    return answers


def assert_rows_equal(got: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert sorted(r["id"] for r in got) == sorted(expected), "every id exactly once"
    for row in got:
        want = expected[row["id"]]
        if isinstance(want, str):
            assert row["error"] == want, row
            assert row["scores"] is None and row["error_message"]
            continue
        assert row["error"] is None, row
        assert len(row["scores"]) == len(want)
        if want:  # log-probabilities within 1e-5
            assert_fp32_close(np.log(row["scores"]), np.log(want))


def test_the_fixture_rows_cover_every_case(expected: dict[str, Any]) -> None:
    reasons = {v for v in expected.values() if isinstance(v, str)}
    assert reasons == {
        "empty_query",
        "delimiter_in_content",
        "token_id_exceeds_vocab",
        "too_many_items",
    }
    assert expected["none"] == [] and len(expected["multi"]) == 3 and len(expected["tokens"]) == 2


def written_rows(folder: Path, files: set[Path] | None = None) -> list[dict[str, Any]]:
    files = set(folder.glob("*.json*")) if files is None else files
    return [json.loads(line) for f in sorted(files) for line in f.open()]


@pytest.mark.deep
def test_a_stopped_job_with_a_dead_actor_resumes_and_writes_what_v1_score_answers(
    serve_cluster: ServeCluster,  # noqa: F811
    config_file: Path,
    expected: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run 1 (batch.run_score_job, what the command runs, grouping on): its engine actor dies
    in its first batch (Ray Data restarts it and retries the batch), and once a block is
    written the job stops with an error. Run 2, ``python -m batch score`` with the same
    arguments, computes only the rows run 1 did not write; together they hold every id once,
    as /v1/score. The rows are shuffled: the job groups them by query itself."""
    source, out, checkpoint = tmp_path / "rows", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()
    text = text_rows()
    random.Random(2).shuffle(text)
    for n in range(4):  # four files of four rows
        lines = "".join(json.dumps(row) + "\n" for row in text[4 * n : 4 * n + 4])
        (source / f"part-{n}.jsonl").write_text(lines)
    settings, columns = settings_from_config(config_file), ScoreColumns(LABELS)
    faults = ((DIE_ENV, str(tmp_path / "died")), (STOP_ENV, str(checkpoint)))
    # Grouped into 16 shuffled blocks: the four group keys (three queries, the refused row)
    # land in four blocks, so each query's rows are one engine call of a task of their own.
    options = EngineOptions(batch_size=64, block_rows=1, engine_factory=FAULTY, engine_env=faults)
    try:
        with pytest.raises(Exception, match="injected stop"):
            run_score_job(
                str(source), str(out), settings, columns, options, "jsonl", None, str(checkpoint)
            )
        assert (tmp_path / "died").exists(), "the engine actor died in run 1"
        first_files = set(out.glob("*.json*"))
        labels = ",".join(map(str, LABELS))
        argv = ["score", "--input", str(source), "--output", str(out), "--labels", labels]
        argv += ["--config", str(config_file), "--output-format", "jsonl", "--batch-size", "4"]
        assert main([*argv, "--checkpoint", str(checkpoint)]) == 0
    finally:
        use_checkpoint(None, "id")
    written = written_rows(out)
    # Run 2 first deletes the files of blocks whose checkpoint run 1 had not committed.
    first = written_rows(out, first_files & set(out.glob("*.json*")))
    assert 0 < len(first) < len(text)
    assert_rows_equal(written, expected_of(text, expected))  # every id exactly once
    assert {"query", "item"} <= set(written[0]), "input columns are kept"
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    second = [row for row in written if row["id"] not in {r["id"] for r in first}]
    assert summary["rows"] == len(second) == len(text) - len(first)
    assert summary["items"] == sum(len(row["scores"] or []) for row in second)
    errors = [row["error"] for row in second if row["error"]]
    assert summary["errors"] == {reason: errors.count(reason) for reason in errors}
    assert summary["shuffle"]["rows"] == len(second) and summary["shuffle"]["bytes"] > 0


@pytest.fixture(scope="module")
def stages(config_file: Path) -> tuple[Tokenize, EngineScore]:
    """The pipeline's two stateful stages, in this process (what Ray Data's actors hold)."""
    settings = settings_from_config(config_file)
    return Tokenize(settings, ScoreColumns(LABELS)), EngineScore(
        settings, ScoreColumns(LABELS), None
    )


def staged(source: list[dict[str, Any]], stages: Any, batch_size: int) -> list[dict[str, Any]]:
    """``source`` through tokenize -> engine -> finish, ``batch_size`` rows per engine call."""
    tokenize, engine = stages
    table = pa.Table.from_pylist(source)
    batches = [table.slice(at, batch_size) for at in range(0, table.num_rows, batch_size)]
    return pa.concat_tables([finish(engine(tokenize(b)), False) for b in batches]).to_pylist()


@pytest.mark.parametrize("batch_size", [3, 64])
def test_any_batch_size_and_order_gives_the_same_rows(
    stages: Any, expected: dict[str, Any], batch_size: int
) -> None:
    source = text_rows()
    random.Random(batch_size).shuffle(source)
    assert_rows_equal(staged(source, stages, batch_size), expected_of(source, expected))


@pytest.mark.parametrize("source", [list_rows, token_rows])
def test_list_and_token_columns_give_the_same_rows(
    stages: Any, expected: dict[str, Any], source: Any
) -> None:
    assert_rows_equal(staged(source(), stages, 64), expected_of(source(), expected))


def expected_of(source: list[dict[str, Any]], expected: dict[str, Any]) -> dict[str, Any]:
    return {row["id"]: expected[row["id"]] for row in source}


@pytest.mark.deep
def test_engine_serve_scores_the_rows_through_a_running_app(
    serve_cluster: ServeCluster,  # noqa: F811
    config_file: Path,
    expected: dict[str, Any],
) -> None:
    """``--engine serve``: the same rows, grouped and packed the same way, through the app's
    handle; and Ray Data LLM's ServeDeploymentProcessor pointed at the same app
    (batch.data_llm: one row, one ``score_stream`` request) gives the same scores."""
    import ray.data

    from app.builder import scoring_app
    from batch.data_llm import processor

    settings = settings_from_config(config_file)
    ingress = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}
    serve_cluster.deploy(scoring_app(settings, ingress_options=ingress), "batch-serve", None)
    source = text_rows()
    random.Random(3).shuffle(source)
    options = EngineOptions(batch_size=5, engine="serve", app="batch-serve")
    scored = score_dataset(ray.data.from_items(source), settings, ScoreColumns(LABELS), options)
    assert_rows_equal(scored.take_all(), expected_of(source, expected))
    fields = {"query": "query", "items": "item"}
    llm = processor("score", fields, {"label_token_ids": list(LABELS)}, app="batch-serve")
    rows = [row | {"item": [row["item"]]} for row in source]  # /v1/score's items: a list
    got = llm(ray.data.from_items(rows)).take_all()
    answers = [{"id": r["id"], "scores": (r["response"] or {}).get("scores"), **r} for r in got]
    for row in answers:
        row["error_message"] = row["error_message"] or None
    assert_rows_equal(answers, expected_of(source, expected))


def in_process(
    prepare: Any, engine: Any, results: Any, result: str, helpers: tuple[str, ...] = ()
) -> Any:
    """A rerank or loglik job's stages in this process: prepare (CPU) -> the engine stage,
    which reads token ids only (the text columns are dropped before it) -> finish."""
    from batch.stages import finish_rows
    from batch.works import WORK_COLUMNS, EngineWorks

    scorer = EngineWorks.around(engine, results)

    def stage(batch: pa.Table) -> pa.Table:
        prepared = prepare(batch)
        texts = [c for c in batch.column_names if c != "id"]
        scored = scorer(prepared.drop_columns(texts))
        return finish_rows(scored, result, (*WORK_COLUMNS, *helpers), None)

    return stage


DOCUMENTS = ("Paris is in France.", "Bees make honey.", "", "The sky is blue over Paris.")


@pytest.mark.parametrize("method", ["query_likelihood", "yes_no"])
def test_rerank_rows_equal_what_v1_rerank_answers(config_file: Path, method: str) -> None:
    """``rerank``'s stage in this process, two calls of shuffled rows, against the route."""
    from batch.rerank_stage import RerankColumns, RerankPrepare, RerankResults, relevance_columns
    from replicas.engine.scoring_engine import ScoringEngine

    settings = settings_from_config(config_file).replace(rerank_method=method)
    if method == "yes_no":  # Qwen3-Reranker's template: a query part of about 100 tokens
        buckets = (16, 64, 256)
        settings = settings.replace(
            token_buckets=buckets, item_token_buckets=buckets, max_multi_item_seq_len=512
        )
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings)
    stage = in_process(
        RerankPrepare.around(service, RerankColumns()), engine, relevance_columns, "relevance"
    )
    rows = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate([*QUERIES[:2], ""])
        for d, document in enumerate(DOCUMENTS)
    ]
    random.Random(5).shuffle(rows)
    table = pa.Table.from_pylist(rows)
    out = pa.concat_tables([stage(table.slice(0, 6)), stage(table.slice(6))]).to_pylist()

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    # chunked (semantics 24): each row's chunks are items (prompts), folded by the mean
    chunking = {"max_chunks_per_doc": 4, "chunk_tokens": 3, "chunk_aggregation": "mean"}
    chunked = in_process(
        RerankPrepare.around(service, RerankColumns(**chunking)),  # type: ignore[arg-type]
        engine, RerankResults("mean"), "relevance",
    )(table).to_pylist()  # fmt: skip
    for row, source, fields in [
        *((row, source, {}) for row, source in zip(out, rows, strict=True)),
        *((row, source, chunking) for row, source in zip(chunked, rows, strict=True)),
    ]:
        payload = {"query": source["query"], "documents": [source["document"]], **fields}
        try:
            body, _ = asyncio.run(service.rerank_timed(payload, backend))
        except ScoringError as error:
            assert row["error"] == error.reason.value and row["relevance"] is None
            continue
        assert row["error"] is None
        assert_fp32_close(np.log(row["relevance"]), np.log(body["results"][0]["relevance_score"]))
    assert {r["error"] for r in out} >= {None, "invalid_request"}  # "" query: refused


def test_the_rerank_command_writes_what_v1_rerank_answers(
    serve_cluster: ServeCluster,  # noqa: F811
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m batch rerank`` on the cluster (the config's query_likelihood), vs the route."""
    from replicas.engine.scoring_engine import ScoringEngine

    rows = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate(QUERIES[:2])
        for d, document in enumerate(DOCUMENTS[:3])
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["rerank", "--input", str(source), "--output", str(tmp_path / "out")]
    assert main([*argv, "--config", str(config_file), "--output-format", "jsonl"]) == 0
    named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in named if n.startswith(TALLY_PREFIX)]  # the job's counts actor ended
    written = {row["id"]: row for row in written_rows(tmp_path / "out")}
    settings = settings_from_config(config_file)
    service, engine = ScoringService.from_settings(settings), ScoringEngine.from_settings(settings)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    assert sorted(written) == sorted(row["id"] for row in rows)
    for row in rows:
        payload = {"query": row["query"], "documents": [row["document"]]}
        body, _ = asyncio.run(service.rerank_timed(payload, backend))
        relevance = body["results"][0]["relevance_score"]
        assert_fp32_close(np.log(written[row["id"]]["relevance"]), np.log(relevance))
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["rows"], summary["items"], summary["errors"]) == (6, 6, {})


def test_loglik_rows_equal_what_v1_completions_echo_answers(config_file: Path) -> None:
    """``loglik``'s stage in this process, two calls of shuffled rows, against the route's
    echoed log-probs: the continuation's summed log-prob, and greedy as lm-eval reads it."""
    from batch.loglik_stage import CONTINUATION, LoglikColumns, LoglikPrepare, loglik_columns
    from replicas.engine.scoring_engine import ScoringEngine

    settings = settings_from_config(config_file)
    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings)
    prepare = LoglikPrepare.around(service, LoglikColumns())
    stage = in_process(prepare, engine, loglik_columns, "logprob", (CONTINUATION,))
    continuations = (" Paris", " honey and wax", ",", "")
    rows = [
        {"id": f"{c}-{k}", "context": context, "continuation": continuation}
        for c, context in enumerate(QUERIES)
        for k, continuation in enumerate(continuations)
    ]
    random.Random(9).shuffle(rows)
    table = pa.Table.from_pylist(rows)
    out = pa.concat_tables([stage(table.slice(0, 7)), stage(table.slice(7))]).to_pylist()

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    tokenizer = service.served_tokenizer().tokenizer
    for row, source in zip(out, rows, strict=True):
        if not source["continuation"]:
            assert row["error"] == "empty_prompt" and row["logprob"] is None
            continue
        n = len(tokenizer(source["continuation"], add_special_tokens=False)["input_ids"])
        payload = {"prompt": source["context"] + source["continuation"], "echo": True}
        body, _ = asyncio.run(
            service.complete_timed(payload | {"max_tokens": 0, "logprobs": 1}, backend)
        )
        logprobs = body["choices"][0]["logprobs"]
        assert_fp32_close(row["logprob"], sum(logprobs["token_logprobs"][-n:]))
        tops, tokens = logprobs["top_logprobs"][-n:], logprobs["tokens"][-n:]
        greedy = all(
            max(top, key=top.get) == token for top, token in zip(tops, tokens, strict=True)
        )
        assert row["is_greedy"] == greedy
