"""The narrow contract between the CPU ingress and the scoring replicas.

Jax-free on purpose: the ingress (``app/``) imports this module, and nothing here may pull in
jax. Token ids only cross this boundary; text never reaches a replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ITEMS_PER_REQUEST = 128
DEFAULT_MAX_MULTI_ITEM_SEQ_LEN = 8192


@dataclass(frozen=True)
class ScoreWork:
    """One scoring request in token space.

    The score row of item i is the next-token log-probability of each label after
    ``query_ids + item_ids[i]`` (``item_ids[i] + query_ids`` when ``item_first``).
    """

    query_ids: tuple[int, ...]
    item_ids: tuple[tuple[int, ...], ...]
    label_ids: tuple[int, ...]
    item_first: bool = False
    # Wall-clock time (time.time()) after which nobody waits for the answer: the replica
    # drops the work instead of scoring it (semantics 12). None: no deadline.
    deadline: float | None = None

    @property
    def num_items(self) -> int:
        return len(self.item_ids)


@dataclass(frozen=True)
class ScoredWork:
    """A replica's answer to one ScoreWork: log-probabilities ``[n_items, n_labels]``
    (float32) and the seconds of the engine step that scored them (shared with the other
    requests batched into that step; several steps add up)."""

    scores: Any
    inference_s: float


@dataclass(frozen=True)
class ScoringLimits:
    """Request limits shared by the ingress (400s) and the engine (exceptions)."""

    max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST
    max_multi_item_seq_len: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
    # The longest query, item or single-item row one step holds.
    max_row_tokens: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN

    def __post_init__(self) -> None:
        if self.max_items_per_request < 1:
            raise ValueError(
                f"max_items_per_request must be >= 1, got {self.max_items_per_request}"
            )
        if self.max_multi_item_seq_len < 2:
            raise ValueError(
                f"max_multi_item_seq_len must be >= 2, got {self.max_multi_item_seq_len}"
            )


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs to know about the model a replica serves."""

    name: str
    vocab_size: int
    multi_item_scoring_delimiter: int | None
    limits: ScoringLimits


def packed_length(query_len: int, item_lens: Sequence[int]) -> int:
    """Length of RFC-008's packed multi-item sequence ``query<d>item1<d>...itemN<d>``.

    This is the length that ``max_multi_item_seq_len`` bounds, whatever layout computes it.
    """
    return query_len + 1 + sum(length + 1 for length in item_lens)


def longest_row(query_len: int, item_lens: Sequence[int]) -> int:
    """Length of the longest single-item row ``query + item``."""
    return query_len + max(item_lens, default=0)


CALL_OVERHEAD_TOKENS = 32  # a call's fixed cost (routing, a batch slot, unpacking), in tokens


def work_cost(work: ScoreWork, multi_item: bool) -> int:
    """What admission counts for ``work`` (semantics 16): the tokens a replica computes for
    it (the query once when its items share it as a prefix, else once per item row) plus a
    call's fixed cost."""
    items = sum(len(item) for item in work.item_ids)
    if multi_item and not work.item_first:
        return CALL_OVERHEAD_TOKENS + len(work.query_ids) + items
    return CALL_OVERHEAD_TOKENS + items + len(work.query_ids) * work.num_items


class ScoringLimitError(ValueError):
    """A request breaks a configured limit; ``reason`` is the machine-readable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EngineUnavailable(RuntimeError):
    """The engine cannot score now (a host of its group died or stalled); the request is
    answered 503 ``unavailable`` and the replica reports itself unhealthy."""

    reason = "unavailable"


def check_limits(work: ScoreWork, limits: ScoringLimits, multi_item: bool) -> None:
    """Raise ScoringLimitError if ``work`` breaks ``limits``; used on both sides of the handle."""
    if work.num_items > limits.max_items_per_request:
        raise ScoringLimitError(
            "too_many_items",
            f"{work.num_items} items exceed max_items_per_request={limits.max_items_per_request}",
        )
    item_lens = [len(item) for item in work.item_ids]
    shared = multi_item and not work.item_first
    length = (
        packed_length(len(work.query_ids), item_lens)
        if shared
        else longest_row(len(work.query_ids), item_lens)
    )
    if length > limits.max_multi_item_seq_len:
        raise ScoringLimitError(
            "sequence_too_long",
            f"sequence length {length} exceeds max_multi_item_seq_len="
            f"{limits.max_multi_item_seq_len}",
        )
    row = max([len(work.query_ids), *item_lens]) if shared else length
    if row > limits.max_row_tokens:
        what = "query or item" if shared else "query + item row"
        raise ScoringLimitError(
            "sequence_too_long",
            f"a {what} of {row} tokens exceeds the longest row a step holds "
            f"({limits.max_row_tokens} tokens)",
        )
