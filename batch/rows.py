"""A dataset row's values as Python (``plain``: the one Arrow/NumPy-to-Python conversion of
the batch package) and the /v1/score request a ``score`` row stands for (``row_payload``).

Jax-free and Ray-free: the CPU stages run it. ``batch.score_stage.Tokenize`` prepares the
payload with ``app.service.ScoringService.prepare``, so a row gets exactly the work (or the
error) that the same row sent to ``/v1/score`` gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ScoreColumns:
    """Which input columns hold what, and the request fields every row shares."""

    label_token_ids: tuple[int, ...]
    query: str = "query"
    item: str = "item"
    id: str = "id"
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None  # a LoRA adapter every row runs with (--model; None: the base)


def plain(value: Any) -> Any:
    """Arrow/NumPy values (arrays of ids, nested arrays of items) as Python lists and scalars."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def is_one_item(item: Any) -> bool:
    """A string or a list of token ids is one item; a list of those is a multi-item row."""
    return isinstance(item, str) or (
        isinstance(item, list)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        and bool(item)
    )


def row_payload(row: Mapping[str, Any], columns: ScoreColumns) -> dict[str, Any]:
    """The /v1/score body of one row: its query, its item(s) and the shared fields."""
    item = plain(row.get(columns.item))
    items = [item] if is_one_item(item) else item
    return {
        "query": plain(row.get(columns.query)),
        "items": items,
        "label_token_ids": list(columns.label_token_ids),
        "apply_softmax": columns.apply_softmax,
        "item_first": columns.item_first,
        "model": columns.model,
    }
