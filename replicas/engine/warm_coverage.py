"""Warm-up that covers every request the limits admit (``limit_to_warmup``).

With ``limit_to_warmup`` a request is admitted only within one warm-up envelope (query,
longest item and labels within one ``warmup_shapes`` entry; ``replicas.contract.Envelope``).
That promise holds only if every step such a request can produce is covered by a signature
warm-up compiles. Signatures cover field by field, so an envelope's largest steps decide:
requests whose item streams fill a step exactly (items of the envelope's length, the
remainder as one shorter item) and single-item rows ``query + item`` at full length. Warm-up
compiles those its envelopes' own signatures do not cover, and start-up refuses settings
whose largest batch bucket is not warm. Pure planning here: nothing is compiled or scored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from replicas.contract import Envelope, PromptWork, ScoreWork, packed_length
from replicas.engine.layouts.common import step_capacity
from replicas.settings import ReplicaSettings, SettingsError, WarmupSettings

Key = tuple[str, Any]
logger = logging.getLogger(__name__)


def full_step_items(envelope: Envelope, settings: ReplicaSettings) -> list[int]:
    """Item lengths of the largest stream step an envelope admits: items of
    ``item_tokens`` up to the step's capacity, the remainder as one shorter item, trimmed to
    ``max_items_per_request`` and ``max_multi_item_seq_len``."""
    capacity, length = step_capacity(settings.engine), max(envelope.item_tokens, 1)
    lengths = [length] * max(capacity // length, 1)
    if length < capacity and capacity % length:
        lengths.append(capacity % length)
    lengths = lengths[: settings.http.max_items_per_request]
    while len(lengths) > 1 and (
        packed_length(envelope.query_tokens, lengths) > settings.http.max_multi_item_seq_len
    ):
        lengths.pop()
    return lengths


def extreme_works(settings: ReplicaSettings) -> list[tuple[Envelope, ScoreWork, bool]]:
    """Per envelope, the work whose steps dominate every admitted request's, and whether its
    items share the query as a prefix (multi-item mode: also its ``item_first`` form)."""
    return [
        (envelope, work, settings.model.multi_item and not work.item_first)
        for envelope in settings.limits.envelopes
        for work in synthetic_works(
            settings,
            envelope.query_tokens,
            full_step_items(envelope, settings),
            envelope.labels,
        )
    ]


def synthetic_works(
    settings: ReplicaSettings, query_tokens: int, item_tokens: Sequence[int], labels: int
) -> list[ScoreWork]:
    """A work of one token that is not the delimiter, with items of ``item_tokens`` tokens
    (multi-item mode: also its ``item_first`` form)."""
    token = 1 if settings.model.multi_item_scoring_delimiter != 1 else 2
    work = ScoreWork(
        query_ids=(token,) * query_tokens,
        item_ids=tuple((token,) * n for n in item_tokens),
        label_ids=tuple(range(labels)),
    )
    return [work, replace(work, item_first=True)] if settings.model.multi_item else [work]


def covered(key: Key, warm: Sequence[Key]) -> bool:
    kind, dims = key
    return any(k == kind and d.covers(dims) for k, d in warm)


def full_step_keys(
    settings: ReplicaSettings, plan: Callable[[Sequence[ScoreWork]], list[Key]]
) -> list[Key]:
    """The envelopes' largest steps at each ``warmup_batch_sizes`` entry; warm-up compiles
    those that no envelope's own signatures cover."""
    keys: list[Key] = []
    for batch in settings.warmup.warmup_batch_sizes:
        for _, work, _ in extreme_works(settings):
            keys += plan([work] * batch)
    return list(dict.fromkeys(keys))


def check_warm_coverage(
    settings: ReplicaSettings,
    plan: Callable[[Sequence[ScoreWork]], list[Key]],
    warm: Sequence[Key],
) -> None:
    """Raise SettingsError naming the setting to change when a full step of some envelope
    at the largest batch bucket (what cross-request batching can reach) is covered by no
    ``warm`` key."""
    batch = settings.engine.batch_buckets[-1]
    for envelope, work, shared in extreme_works(settings):
        for kind, dims in plan([work] * batch):
            if covered((kind, dims), warm):
                continue
            raise SettingsError(
                f"warmup_batch_sizes: limit_to_warmup admits {envelope.describe(shared)} and "
                f"<= {envelope.labels} labels, but their largest step ({kind} {dims}, "
                f"{batch} requests) is covered by no warm-up signature; add {batch} to "
                f"warmup_batch_sizes"
            )


def warmup_works(
    settings: ReplicaSettings, shapes: Sequence[tuple[int, int, int, int]]
) -> list[ScoreWork]:
    """Synthetic work of each (query_tokens, items, item_tokens, labels) shape (multi-item
    mode: also its ``item_first`` form)."""
    return [
        work
        for query_len, num_items, item_len, num_labels in shapes
        for work in synthetic_works(settings, query_len, [item_len] * num_items, num_labels)
    ]


def warmup_prompts(shapes: Sequence[tuple[int, int, int, int]]) -> list[PromptWork]:
    """Per (prefix_tokens, prompts, tokens_after, top_k): prompts that share the prefix and
    differ from their first token after it. A prefix of 0: prompts that share nothing, run
    whole and packed many to a step (rerank's query_likelihood documents)."""
    works = []
    for prefix, prompts, after, top_k in shapes:
        shared = (1,) * prefix
        tails = tuple(shared + (2 + i,) + (1,) * (after - 1) for i in range(prompts))
        works.append(PromptWork(tails, top_k, keep_lone_prefixes=prefix > 0))
    return works


def completion_shapes_for(
    warmup: WarmupSettings, has_lm_head: bool, name: str
) -> tuple[tuple[int, int, int, int], ...]:
    """The ``completion_warmup_shapes`` this model compiles: prompt log-prob steps read the
    LM head, so a score-head model (no LM head; /v1/completions answers it with a 400) skips
    them, saying so once, and the shipped config starts for it with only ``model`` changed."""
    shapes = warmup.completion_warmup_shapes
    if shapes and not has_lm_head:
        logger.info(
            "completion_warmup_shapes: ignored for %s, a score-head model has no LM head "
            "(/v1/completions is refused for it)",
            name,
        )
        return ()
    return shapes
