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

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from replicas.contract import ModelInfo, ScoreWork
from replicas.errors import Reason, ScoringError


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

    def score_batch(self, works: Sequence[ScoreWork]) -> list[Any]:
        """One step's answers, one per work in order: log-probs ``[items, labels]`` of a
        ScoreWork, a ``PromptLogprobs`` list of a PromptWork, vectors of an EmbedWork.
        Raises ScoringError for work it must not run (before any of it runs) and
        EngineUnavailable when it can no longer score."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters the replica adds to its own: compiles by source (``background_pending``,
        ``background_compiles``, ``request_path_compiles`` say whether a step ran beside a
        compile), steps, tokens, engine seconds, query cache. May be empty."""
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
