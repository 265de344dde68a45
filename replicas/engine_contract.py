"""What a scoring replica uses of its engine, all of it: the one contract every engine keeps.

Jax-free (rank 0 beside ``contract``): ``replicas.serving.deployment`` types its engine with
it without importing one. Implementations: ``replicas.engine.scoring_engine.ScoringEngine``
(one host), ``replicas.engine.group_engine.GroupEngine`` (a host group's leader),
``replicas.engine.slice_engine.SliceEngine`` (a reserved TPU slice) and the test fakes
(``tests/support/fake_engine.py``); ``tests/unit/test_engine_contract.py`` checks each
has every member.

Errors: a work the engine must not run raises ``replicas.errors.ScoringError`` (its reason
the HTTP answer's); an engine that cannot score any more (a host of its group died) raises
``replicas.errors.EngineUnavailable``; anything else an engine raises is a failed step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, Protocol, runtime_checkable

from replicas.answers import Answer
from replicas.contract import ModelInfo, ScoreWork
from replicas.errors import Reason, ScoringError


@dataclass(frozen=True)
class EngineStats:
    """An engine's counters since it started, as ``Engine.stats()`` returns them: the replica
    reads its compile marks from them, its metrics how much each step grew them, and
    ``GET /v1/stats`` answers ``as_dict()`` inside the replica's own counters. A counter is a
    field, so a renamed one fails where it is read or made, never reads 0. Counts are ints
    (compiles, signatures, steps, tokens, cache entries, bytes), ``engine_seconds`` a float.
    Picklable (a slice's leader sends it to the replica across Ray)."""

    compile_count: int  # executables compiled so far
    warmup_compiles: int  # compiles by source: at start (warm-up, replayed records)
    request_path_compiles: int  # ... inside a step (the request waited for it)
    background_compiles: int  # ... on the background worker
    evicted_signatures: int  # compiled signatures dropped at max_traffic_signatures
    declined_background_compiles: int  # uncompiled shapes left on a covering signature
    declined_one_off: int  # ... of them by reason (compiler.DECLINE_REASONS)
    declined_small_padding: int
    declined_low_value: int
    evicted_one_off: int  # evicted signatures by reason (compiler.EVICT_REASONS)
    evicted_low_value: int
    background_pending: int  # background compiles queued or running now
    steps: int  # compiled steps run (a prefix step and its items step: two)
    computed_tokens: int  # tokens computed, padding included
    useful_tokens: int  # ... that were not padding
    prompt_tokens: int  # /v1/completions prompts' tokens:
    reused_prefix_tokens: int  # ... read from a shared or cached prefix
    computed_prompt_tokens: int  # ... computed (padding not counted)
    engine_seconds: float  # seconds inside score_batch, rounded to microseconds
    query_cache_hits: int  # queries whose keys/values the cache held
    query_cache_misses: int
    query_cache_entries: int  # entries held now
    query_cache_bytes: int  # bytes they hold now
    query_cache_capacity_bytes: int  # the cache's budget (query_cache_bytes)
    # A host group's engine only (GroupEngine, SliceEngine); None on one host.
    hosts: int | None = None  # hosts of the group
    host_members: tuple[Mapping[str, Any], ...] | None = None  # process, node, pid per host
    host_compile_counts: tuple[int, ...] | None = None  # compile_count per host, leader first
    tpu_slice: tuple[str | None, ...] | None = None  # each host's TPU slice name (SliceEngine)

    @classmethod
    def zero(cls) -> EngineStats:
        """An engine that has counted nothing: every counter 0, no host group."""
        counters: dict[str, Any] = {f.name: 0 for f in fields(cls) if f.default is MISSING}
        return cls(**counters | {"engine_seconds": 0.0})

    def as_dict(self) -> dict[str, Any]:
        """The counters as ``GET /v1/stats`` answers them: one key per field, in field order;
        a host group's fields only when set, as lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.default is MISSING:
                out[f.name] = value
            elif value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@runtime_checkable
class Engine(Protocol):
    """A scoring engine as the replica drives it: one step at a time, from one thread."""

    @property
    def info(self) -> ModelInfo:
        """The model served: vocab, limits, head or pooling, the LoRA adapters loaded now
        (this changes when an adapter loads or unloads)."""
        ...

    @property
    def compile_count(self) -> int:
        """Executables compiled so far (a signature never compiles twice)."""
        ...

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Answer]:
        """One step's answers, one per work in order, each its work's ``answer`` type
        (replicas.answers): log-probs ``[items, labels]`` of a ScoreWork, a
        ``PromptLogprobs`` list of a PromptWork, vectors of an EmbedWork.
        Raises ScoringError for work it must not run (before any of it runs) and
        EngineUnavailable when it can no longer score."""
        ...

    def stats(self) -> EngineStats:
        """Counters the replica adds to its own: compiles by source (``background_pending``,
        ``background_compiles``, ``request_path_compiles`` say whether a step ran beside a
        compile), steps, tokens, engine seconds, query cache; an engine that counts nothing
        answers ``EngineStats.zero()``."""
        ...

    def check_health(self) -> None:
        """Raise (EngineUnavailable) when the engine cannot score any more, so Serve replaces
        the replica; a no-op for an engine with nothing outside its process to check."""
        ...

    def load_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter at ``path`` into a free slot as ``name``, between steps
        (compiling nothing). Raises ScoringError (``invalid_request``) on an engine without
        adapter slots, ``AdapterNotFound`` with no adapter directory at ``path`` (the load
        route's 404), ValueError or OSError naming what does not fit (files, base, slots)."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Free ``name``'s slot, between steps; ScoringError (``invalid_request``) without
        adapter slots."""
        ...


def refuse_adapter_change(engine: str) -> ScoringError:
    """The 400 of an engine whose adapters load only at start (``lora_adapters`` on every
    host): its ``load_adapter`` and ``unload_adapter`` raise this."""
    message = (
        f"{engine} loads and unloads no LoRA adapters at run time (lora_adapters load on "
        "every host at start)"
    )
    return ScoringError(Reason.INVALID_REQUEST, message)
