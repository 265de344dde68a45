"""Batch scoring on the real SmolLM2-135M-Instruct equals the /v1/score route and
transformers (fp32).

The pipeline's stages in this process (tokenize -> engine -> scores, as Ray Data's actors run
them) over shuffled text rows of two queries, multi-item on, at two rows per engine call and
all rows in one (one run of each, shared by the tests): each row's log-probabilities equal
what ``ScoringService.score`` (the route's code) answers for it with the same engine, within
1e-5, and what transformers' ``AutoModelForCausalLM`` on the same GGUF weights gives the row
scored alone, within 1e-4 (transformers' copy of the GGUF: conftest's session fixture).
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
from batch.score_stage import ITEM_IDS, QUERY_IDS, EngineScore, Tokenize, finish
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import SMOLLM2_LAYERS, assert_fp32_close

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"
QUERIES = ("The capital of France is", "My favourite city:")
ITEMS = ("", " Paris", " the city of light", " Berlin")
SETTINGS = ReplicaSettings.from_keys(model=MODEL, multi_item_scoring_delimiter=0)
Run = tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[int]]]


@pytest.fixture(scope="module")
def engine(smollm2_loaded: Any) -> ScoringEngine:
    from cluster.mesh import build_mesh

    loaded, mesh = smollm2_loaded, build_mesh((1, 1))
    return ScoringEngine(loaded.model, loaded.params, mesh, SETTINGS, MODEL)


@pytest.fixture(scope="module")
def batched(engine: ScoringEngine) -> dict[int, Run]:
    """Rows per engine call -> the shuffled source rows, the stages' output rows, and each
    row's token ids as the stages scored them (id -> query ids + the item's ids)."""
    columns = ScoreColumns(LABELS)
    tokenize, score = Tokenize(SETTINGS, columns), EngineScore.around(engine, columns)
    runs = {}
    for rows_per_call in (2, 8):
        rows = [
            {"id": f"{q}-{i}", "query": query, "item": item}
            for q, query in enumerate(QUERIES)
            for i, item in enumerate(ITEMS)
        ]
        random.Random(rows_per_call).shuffle(rows)
        table = tokenize(pa.Table.from_pylist(rows))
        calls = [table.slice(at, rows_per_call) for at in range(0, len(rows), rows_per_call)]
        out = pa.concat_tables([finish(score(call), False) for call in calls]).to_pylist()
        ids = {r["id"]: r[QUERY_IDS] + r[ITEM_IDS][0] for r in table.to_pylist()}
        runs[rows_per_call] = rows, out, ids
    return runs


@pytest.mark.deep
@pytest.mark.parametrize("rows_per_call", [2, 8])
def test_batch_rows_equal_the_route_on_smollm2(
    engine: ScoringEngine, batched: dict[int, Run], rows_per_call: int
) -> None:
    columns = ScoreColumns(LABELS)
    rows, out, _ = batched[rows_per_call]
    service = ScoringService.from_settings(SETTINGS)

    async def backend(work: Any) -> Any:
        return engine.score_batch([work])[0]

    for row, source in zip(out, rows, strict=True):
        body = asyncio.run(service.score(row_payload(source, columns), backend))
        assert row["id"] == source["id"] and row["error"] is None
        assert_fp32_close(np.log(row["scores"]), np.log(body["scores"]), SMOLLM2_LAYERS)


def test_batch_rows_equal_transformers_on_smollm2(
    batched: dict[int, Run], smollm2_transformers: Any
) -> None:
    """Each row's label log-probs, at both batch sizes, against transformers fp32 on the same
    GGUF weights scoring the row alone (the query's and the item's token ids as the stages
    tokenized them, the labels after the last): within 1e-4, the bound against transformers
    of docs/semantics.md, "The float32 floor" (30 fp32 layers in two implementations; the
    rows agree with the route within 1e-5 above)."""
    import torch

    model, reference = smollm2_transformers, {}
    _, _, token_ids = batched[2]
    for row_id, ids in token_ids.items():
        with torch.inference_mode():
            logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        reference[row_id] = torch.log_softmax(logits, -1)[list(LABELS)].numpy()  # [labels]
    worst = 0.0
    for _, out, _ in batched.values():
        for row in out:
            ours = np.log(np.asarray(row["scores"]))[0]  # one item: [labels]
            worst = max(worst, float(np.abs(ours - reference[row["id"]]).max()))
    print(f"\n[batch] SmolLM2 rows, worst |label log-prob - transformers|: {worst:.2g}")
    assert len(reference) == len(QUERIES) * len(ITEMS)
    assert worst <= 1e-4
