"""The warm-up section: the request shapes compiled at start-up, either stated as a workload
(query and item token ranges) from which ``derive_envelopes`` builds the envelopes, or as
envelopes written out; and whether the limits are what warm-up covers. Jax-free."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from replicas.settings.common import SettingsError, as_tuples

Shape = tuple[int, int, int, int]


@dataclass(frozen=True)
class WarmupWorkload:
    """The requests a deployment expects, as ranges; warm-up envelopes derive from it in
    tiers (``derive_envelopes``): short queries with short items up to long queries with
    the longest items, so short requests run on small signatures."""

    query_tokens: tuple[int, int]
    """[shortest, longest] query warmed, in tokens: the first tier's and the last's."""
    item_tokens: tuple[int, int]
    """[shortest, longest] item warmed: the first tier's items and the last tier's (e.g.
    rerank documents)."""
    labels: int = 1
    """The most label tokens a request scores (every tier's)."""
    items: int = 1
    """Items per request at the first tier; each further tier has ``ratio`` times more, up to
    what one step's item_tokens_per_step holds."""
    ratio: int = 4
    """How much longer each tier's queries are than the one before (and how many more items
    it has); its items are sqrt(ratio) times longer."""

    def __post_init__(self) -> None:
        for name in ("query_tokens", "item_tokens"):
            span = getattr(self, name)
            if (
                len(span) != 2
                or any(isinstance(n, bool) or not isinstance(n, int) for n in span)
                or not 1 <= span[0] <= span[1]
            ):
                raise SettingsError(
                    f"warmup_workload.{name}: must be [shortest, longest] ints with "
                    f"1 <= shortest <= longest, got {list(span)}"
                )
        for name, low in (("labels", 1), ("items", 1), ("ratio", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SettingsError(
                    f"warmup_workload.{name}: must be an int >= {low}, got {value!r}"
                )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> WarmupWorkload:
        """From YAML; an unknown key is an error naming it."""
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                raise SettingsError(f"warmup_workload.{key}: unknown key (known: {known})")
        missing = [k for k in ("query_tokens", "item_tokens") if k not in values]
        if missing:
            raise SettingsError(f"warmup_workload.{missing[0]}: required ([shortest, longest])")
        return cls(**{k: as_tuples(v) for k, v in values.items()})


def derive_envelopes(workload: WarmupWorkload, item_tokens_per_step: int) -> tuple[Shape, ...]:
    """The warm-up envelopes ``(query_tokens, items, item_tokens, labels)`` of a workload.

    Tier k (k = 0, 1, ...) while its query is shorter than the longest: queries of
    ``shortest * ratio**k`` tokens, items of ``shortest item * sqrt(ratio)**k`` tokens (at
    most the longest item), ``items * ratio**k`` of them (at most what ``item_tokens_per_step``
    holds). The last tier: the longest query with the longest items, as many as one step
    holds (at least one). Every tier takes ``labels`` labels. The last tier admits every
    request the workload states; the others give shorter requests smaller signatures.
    """
    (query, longest_query), (item, longest_item) = workload.query_tokens, workload.item_tokens
    envelopes: list[Shape] = []
    tier = 0
    while query * workload.ratio**tier < longest_query:
        length = min(round(item * math.sqrt(workload.ratio) ** tier), longest_item)
        count = min(workload.items * workload.ratio**tier, item_tokens_per_step // length)
        envelopes.append((query * workload.ratio**tier, max(count, 1), length, workload.labels))
        tier += 1
    last = max(item_tokens_per_step // longest_item, 1)
    envelopes.append((longest_query, last, longest_item, workload.labels))
    return tuple(envelopes)


@dataclass(frozen=True)
class WarmupSettings:
    """What start-up compiles before the replica reports healthy, and whether requests are
    limited to it. ``ReplicaSettings.warmup_shapes`` is the envelopes in force:
    ``warmup_shapes`` where set, else the workload's tiers."""

    warmup_workload: WarmupWorkload | None = None
    """The expected requests as ranges, from which the envelopes derive (``derive_envelopes``)
    unless warmup_shapes is set."""
    warmup_shapes: tuple[Shape, ...] | None = None
    """Envelopes written out: (query_tokens, items, item_tokens, labels), each scored once at
    start-up. Set (even to []), they replace the workload's; unset: the workload's, if any."""
    warmup_batch_sizes: tuple[int, ...] = (1,)
    """Each warm-up envelope is also scored as a step of this many concurrent requests, so
    the batch buckets that cross-request batching reaches are compiled before traffic."""
    completion_warmup_shapes: tuple[Shape, ...] = ()
    """/v1/completions shapes compiled at start-up: (prefix_tokens, prompts, tokens_after,
    top_k): that many prompts sharing a prefix, each with tokens_after more tokens, and top_k
    alternatives per position. A compiled signature serves every smaller request (padded)
    until that request's own shape compiles in the background."""
    limit_to_warmup: bool = False
    """True: the limits are what warm-up covers. A request that no envelope admits (query,
    longest item and labels within it) is refused with a 400, and start-up refuses envelopes
    whose full steps (the largest batch bucket, items up to the step's capacity) no warm
    signature covers; so no request ever waits for a compile. False: such a request compiles
    its signature on the request path."""

    def __post_init__(self) -> None:
        for shape in self.warmup_shapes or ():
            if len(shape) != 4 or any(int(n) < 0 for n in shape) or shape[0] < 1 or shape[3] < 1:
                raise SettingsError(
                    "warmup_shapes: each entry is [query_tokens>=1, items, item_tokens, "
                    f"labels>=1], got {list(shape)}"
                )
        for shape in self.completion_warmup_shapes:
            if len(shape) != 4 or shape[0] < 0 or min(shape[1:3]) < 1 or not 0 <= shape[3] <= 20:
                raise SettingsError(
                    "completion_warmup_shapes: each entry is [prefix_tokens>=0, prompts>=1, "
                    f"tokens_after>=1, top_k in 0..20], got {list(shape)}"
                )
