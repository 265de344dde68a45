"""Batch scoring on the real SmolLM2-135M-Instruct equals the /v1/score route (fp32).

The pipeline's stages in this process (tokenize -> engine -> scores, as Ray Data's actors run
them) over shuffled text rows of two queries, multi-item on, at two rows per engine call and
all rows in one; each row's log-probabilities equal what ``ScoringService.score`` (the
route's code) answers for it with the same engine, within 1e-5. The engine itself is held
against transformers on these weights by tests/test_loading_smollm2.py and
tests/test_engine_smollm2.py (whose transformers figure for " Paris" this test checks too):
loading transformers' copy of the GGUF costs about 50 s, once per module that does it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from app.service import ScoringService
from batch.rows import ScoreColumns, row_payload
from batch.stages import EngineScore, Tokenize, finish
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"
QUERIES = ("The capital of France is", "My favourite city:")
ITEMS = ("", " Paris", " the city of light", " Berlin")


@pytest.mark.parametrize("rows_per_call", [2, 8])
def test_batch_rows_equal_the_route_on_smollm2(smollm2_loaded: Any, rows_per_call: int) -> None:
    from cluster.mesh import build_mesh

    settings = ReplicaSettings(model=MODEL, multi_item_scoring_delimiter=0)
    columns = ScoreColumns(LABELS)
    mesh = build_mesh((1, 1))
    engine = ScoringEngine(smollm2_loaded.model, smollm2_loaded.params, mesh, settings, MODEL)
    tokenize, score = Tokenize(settings, columns), EngineScore.around(engine, columns)
    rows = [
        {"id": f"{q}-{i}", "query": query, "item": item}
        for q, query in enumerate(QUERIES)
        for i, item in enumerate(ITEMS)
    ]
    random.Random(rows_per_call).shuffle(rows)
    table = tokenize(pa.Table.from_pylist(rows))
    calls = [table.slice(at, rows_per_call) for at in range(0, len(rows), rows_per_call)]
    out = pa.concat_tables([finish(score(call), False) for call in calls]).to_pylist()

    service = ScoringService.from_settings(settings)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    for row, source in zip(out, rows, strict=True):
        body = asyncio.run(service.score(row_payload(source, columns), backend))
        assert row["id"] == source["id"] and row["error"] is None
        np.testing.assert_allclose(np.log(row["scores"]), np.log(body["scores"]), atol=1e-5)
        if source["query"] == QUERIES[0] and source["item"] == "":
            # transformers: -0.2581 (tests/test_engine_smollm2.py)
            np.testing.assert_allclose(np.log(row["scores"][0][0]), -0.258, atol=2e-3)
