"""``rerank`` and ``loglik`` with ``--engine serve``: the rows go through an app deployed on
the session's Ray cluster (the ingress's ``score_work``, several calls in flight per caller
actor) and each row equals what the local engine stage gives it (semantics 17).

The tiny random Llama and the shipped serve_config.yaml pointed at it (tests/batch/test_batch.py's
config): rerank by the config's query_likelihood, through ``python -m batch rerank``; loglik
through ``batch.loglik_dataset``; and ``score_work`` itself, which checks a work again.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from app.service import ScoringService
from batch.__main__ import main
from batch.loglik_stage import CONTINUATION, LoglikColumns, LoglikPrepare, loglik_columns
from batch.pipeline import EngineOptions, loglik_dataset, settings_from_config
from batch.rerank_stage import RerankColumns, RerankPrepare, relevance_columns
from replicas.contract import ScoreWork
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings
from tests.batch.test_batch import DOCUMENTS, QUERIES, config_file, in_process, written_rows  # noqa: F401
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.deep, RAY_SERVE]

APP = "batch-modes"


@pytest.fixture(scope="module")
def settings(config_file: Path) -> ReplicaSettings:  # noqa: F811
    return settings_from_config(config_file)


@pytest.fixture(scope="module")
def app_name(serve_cluster: ServeCluster, settings: ReplicaSettings) -> str:  # noqa: F811
    from app.builder import scoring_app

    ingress = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}
    serve_cluster.deploy(scoring_app(settings, ingress_options=ingress), APP, None)
    return APP


@pytest.fixture(scope="module")
def local(settings: ReplicaSettings) -> tuple[Any, ScoringService]:
    """An engine and the route's service of the same settings, in this process."""
    from replicas.engine.scoring_engine import ScoringEngine

    return ScoringEngine.from_settings(settings), ScoringService.from_settings(settings)


def rerank_rows() -> list[dict[str, Any]]:
    rows = [
        {"id": f"{q}-{d}", "query": query, "document": document}
        for q, query in enumerate([*QUERIES[:2], ""])
        for d, document in enumerate(DOCUMENTS)
    ]
    random.Random(11).shuffle(rows)
    return rows


def loglik_rows() -> list[dict[str, Any]]:
    rows = [
        {"id": f"{c}-{k}", "context": context, "continuation": continuation}
        for c, context in enumerate(QUERIES)
        for k, continuation in enumerate((" Paris", " honey and wax", ",", ""))
    ]
    random.Random(13).shuffle(rows)
    return rows


def test_the_rerank_command_through_the_app_writes_what_the_local_engine_gives(
    app_name: str,
    config_file: Path,  # noqa: F811
    local: tuple[Any, ScoringService],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m batch rerank --engine serve``: 4 rows per call, 2 calls in flight."""
    rows = rerank_rows()
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["rerank", "--input", str(source), "--output", str(tmp_path / "out")]
    argv += ["--config", str(config_file), "--output-format", "jsonl", "--batch-size", "4"]
    assert main([*argv, "--engine", "serve", "--app", app_name, "--max-in-flight", "2"]) == 0
    written = {row["id"]: row for row in written_rows(tmp_path / "out")}
    engine, service = local
    stage = in_process(
        RerankPrepare.around(service, RerankColumns()), engine, relevance_columns, "relevance"
    )
    table = pa.Table.from_pylist(rows)  # the job's calls of 4 rows (the same shapes)
    calls = [stage(table.slice(at, 4)) for at in range(0, len(rows), 4)]
    want = {row["id"]: row for row in pa.concat_tables(calls).to_pylist()}
    assert sorted(written) == sorted(want), "every id exactly once"
    for key, row in want.items():
        assert written[key]["error"] == row["error"]
        if row["relevance"] is None:
            assert written[key]["relevance"] is None
        else:
            assert_fp32_close(np.log(written[key]["relevance"]), np.log(row["relevance"]))
    assert {row["error"] for row in want.values()} == {None, "invalid_request"}
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["rows"], summary["items"], summary["errors"]) == (12, 8, {"invalid_request": 4})


def test_loglik_through_the_app_equals_the_local_engine(
    app_name: str, settings: ReplicaSettings, local: tuple[Any, ScoringService]
) -> None:
    """``loglik_dataset`` with ``engine="serve"``: one call of every row (one compiled shape,
    the local stage's too)."""
    import ray.data

    rows = loglik_rows()
    options = EngineOptions(batch_size=len(rows), engine="serve", app=app_name)
    served = loglik_dataset(ray.data.from_items(rows), settings, LoglikColumns(), options)
    got = {row["id"]: row for row in served.take_all()}
    engine, service = local
    prepare = LoglikPrepare.around(service, LoglikColumns())
    stage = in_process(prepare, engine, loglik_columns, "logprob", (CONTINUATION,))
    want = {row["id"]: row for row in stage(pa.Table.from_pylist(rows)).to_pylist()}
    assert sorted(got) == sorted(want), "every id exactly once"
    for key, row in want.items():
        assert (got[key]["error"], got[key]["is_greedy"]) == (row["error"], row["is_greedy"])
        if row["logprob"] is not None:
            assert_fp32_close(got[key]["logprob"], row["logprob"])
    assert sum(row["error"] == "empty_prompt" for row in got.values()) == len(QUERIES)


def test_score_work_checks_a_work_again_and_answers_as_the_engine(
    app_name: str, settings: ReplicaSettings, local: tuple[Any, ScoringService]
) -> None:
    from ray import serve

    handle = serve.get_app_handle(app_name)
    engine, service = local
    work = ScoreWork((504, 3575, 282), ((4649,), (314, 12)), (7042, 4528))
    answer = handle.score_work.remote(work).result(timeout_s=120)
    assert_fp32_close(answer, engine.score_batch([work])[0])
    vocab = service.info.vocab_size
    with pytest.raises(ScoringError) as refused:
        handle.score_work.remote(ScoreWork((504, vocab), ((5,),), (7042,))).result(timeout_s=60)
    assert (refused.value.status_code, refused.value.reason) == (400, "token_id_exceeds_vocab")
