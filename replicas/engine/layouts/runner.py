"""What a layout needs from the engine that runs it (the engine implements this)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from replicas.engine.query_cache import QueryCache
from replicas.settings import ReplicaSettings


class Runner(Protocol):
    @property
    def settings(self) -> ReplicaSettings: ...

    @property
    def cache(self) -> QueryCache: ...

    @property
    def replicated(self) -> Any: ...

    @property
    def mesh(self) -> Any:
        """The replica's ``[data, model]`` mesh."""
        ...

    def sharding(self, axes: tuple[str | None, ...], shape: tuple[int, ...]) -> Any:
        """Where an array of ``shape`` with logical ``axes`` lives (the one table)."""
        ...

    @property
    def groups(self) -> int:
        """Data shards (the mesh's ``data`` size): a step's rows split into this many."""
        ...

    def spec(self, shape: tuple[int, ...], dtype: Any, axes: tuple[str | None, ...] | None) -> Any:
        """An abstract argument of ``shape``: placed by its logical ``axes`` through the one
        table (cluster.sharding), or whole on every device (None)."""
        ...

    def lower(self, step: Callable[..., Any], specs: tuple[Any, ...]) -> Any:
        """Compile ``step(params, *specs)`` ahead of time."""
        ...

    def ensure(self, kind: str, dims: Any) -> None:
        """Compile ``(kind, dims)`` now if it is not compiled yet."""
        ...

    def resolve(self, kind: str, dims: Any) -> Any:
        """The compiled signature to run ``dims`` on (itself or one covering it)."""
        ...

    def compiled(self, kind: str, dims: Any) -> Any | None:
        """The compiled signature ``resolve`` would pick, or None; never compiles."""
        ...

    def compile_later(self, kind: str, dims: Any) -> None:
        """Compile ``(kind, dims)`` in the background if background compiles are on."""
        ...

    def run(self, kind: str, dims: Any, args: tuple[Any, ...]) -> np.ndarray:
        """Run the executable on host/device arguments; its output as a NumPy array."""
        ...

    def run_device(self, kind: str, dims: Any, args: tuple[Any, ...]) -> Any:
        """Run the executable; its outputs stay on device."""
        ...

    def count_tokens(self, computed: int, useful: int) -> None: ...

    def count_prompt_tokens(self, computed: int, reused: int) -> None:
        """Prompt tokens computed, and read from a shared or cached prefix instead."""
        ...
