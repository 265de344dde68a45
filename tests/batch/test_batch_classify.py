"""``python -m batch classify``'s stages equal /v1/classify (semantics 17, 18).

A tiny random 3-label Qwen3 sequence classifier (transformers ``save_pretrained``) under the
shipped serve_config.yaml's settings (tests/batch/test_batch.py's small buckets). In this process:
the CPU stage (the route's ``prepare_classify``) -> the engine stage on token ids only ->
finish, against the route's code (``ScoringService.classify_timed``) on the same engine, row
by row, with and without the activation; a model without a head is refused by name.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml

from app.service import ScoringService
from batch.classify_stage import ClassifyColumns, ClassifyPrepare, ClassifyResults
from batch.pipeline import classify_dataset, settings_from_config
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings, SettingsError
from tests.batch.test_batch import QUERIES, in_process, tiny_config
from tests.support.fp32 import assert_fp32_close
from tests.support.head_helpers import save_tiny_head

pytestmark = pytest.mark.slow

TEXTS = (*QUERIES, "", "Paris", "A longer text of several words about the sky and rain")


@pytest.fixture(scope="module")
def head_settings(
    tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> ReplicaSettings:
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("tiny-qwen3-seqcls-3")
    save_tiny_head("qwen3-seqcls-3", directory, vocab_size=49152)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(directory)
    config = tiny_config(directory)
    config["applications"][0]["args"]["rerank_method"] = "yes_no"  # no rerank on 3 labels
    path = directory / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return settings_from_config(path)


@pytest.fixture(scope="module")
def local(head_settings: ReplicaSettings) -> tuple[Any, ScoringService]:
    from replicas.engine.scoring_engine import ScoringEngine

    return ScoringEngine.from_settings(head_settings), ScoringService.from_settings(head_settings)


@pytest.mark.parametrize("activation", [True, False])
def test_classify_rows_equal_what_v1_classify_answers(
    local: tuple[Any, ScoringService], activation: bool
) -> None:
    engine, service = local
    assert service.info.head is not None
    columns = ClassifyColumns(activation=activation)
    results = ClassifyResults(service.info.head, activation)
    stage = in_process(ClassifyPrepare.around(service, columns), engine, results, "probs")
    rows = [{"id": f"t{n}", "input": text} for n, text in enumerate(TEXTS)]
    random.Random(7).shuffle(rows)
    out = stage(pa.Table.from_pylist(rows)).to_pylist()

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    for row, source in zip(out, rows, strict=True):
        payload = {"input": source["input"], "activation": activation}
        try:
            body, _ = asyncio.run(service.classify_timed(payload, backend))
        except ScoringError as error:
            assert (row["error"], row["probs"], row["label"]) == (error.reason.value, None, None)
            continue
        (want,) = body["data"]
        assert row["error"] is None and row["label"] == want["label"]
        if activation:  # probabilities: compared as log-probs, the small ones too
            assert_fp32_close(np.log(row["probs"]), np.log(want["probs"]))
        else:  # the head's raw logits, negative ones included
            assert_fp32_close(row["probs"], want["probs"])
    assert {row["error"] for row in out} == {None, "empty_query"}  # "": no tokens


def test_classify_on_a_model_without_a_head_is_refused_by_name(tiny_llama_dir: Path) -> None:
    settings = settings_from_config().replace(model=str(tiny_llama_dir))
    with pytest.raises(SettingsError, match=r"model: .* has no score head"):
        classify_dataset(None, settings, ClassifyColumns())  # type: ignore[arg-type]
