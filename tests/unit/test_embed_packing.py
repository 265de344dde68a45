"""The embedding layout's packer (replicas.engine.layouts.embed_packing): every input placed
once, in rows within their limit, and an encoder's plan computing no more tokens than
first-fit (a ColBERT query beside its documents the case that moved it)."""

from __future__ import annotations

import numpy as np
import pytest

from replicas.engine.layouts.embed_packing import EmbedPacking, Piece
from replicas.settings.engine import bucket_ladder

BUCKETS = tuple(bucket_ladder(16, 8192))


def pieces_of(lengths: list[int]) -> list[Piece]:
    return [Piece(0, i, tuple([5] * n), 0) for i, n in enumerate(lengths)]


def computed(steps: list) -> int:
    return sum(dims.batch * dims.tokens for dims, _ in steps)


def placed(steps: list) -> list[int]:
    return sorted(piece.index for _, rows in steps for row in rows for piece in row)


def test_a_query_beside_its_documents_joins_the_row_it_pads_least() -> None:
    packing = EmbedPacking(1024, BUCKETS, (1,), encoder=True)  # 4 rows of 256 a step
    documents = [187, 186, 185, 170, 170, 170, 170, 150]  # buckets 192, 176 and 160
    alone = packing.plan(pieces_of(documents))
    lengths = [32, *documents]
    steps = packing.plan(pieces_of(lengths))
    first_fit = packing.steps(packing.rows(pieces_of(lengths)))
    assert placed(steps) == list(range(len(lengths)))
    assert computed(alone) == 4 * 192 + 4 * 176
    # first-fit: 187 + 32 = 219 pads the first step's 4 rows to 224
    assert computed(first_fit) == 4 * 224 + 4 * 176
    # least padding: 150 + 32 = 182 sorts into the first step, which is 192 anyway
    assert computed(steps) == computed(alone)


@pytest.mark.parametrize("encoder", [True, False])
def test_every_input_is_placed_once_within_its_rows_limit(encoder: bool) -> None:
    packing = EmbedPacking(2048, BUCKETS, (1,), encoder=encoder)
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = [int(n) for n in rng.integers(1, 600, rng.integers(1, 80))]
        steps = packing.plan(pieces_of(lengths))
        assert placed(steps) == list(range(len(lengths)))
        for dims, rows in steps:
            assert len(rows) <= dims.batch
            for row in rows:
                longest = max(len(p.tokens) for p in row)
                assert sum(len(p.tokens) for p in row) <= min(
                    dims.tokens, packing.row_limit(longest)
                )
        first_fit = packing.steps(packing.rows(pieces_of(lengths)))
        assert computed(steps) <= computed(first_fit)
