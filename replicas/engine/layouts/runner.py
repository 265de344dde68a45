"""What a layout needs from the engine that runs it (the engine implements ``Runner``).

Where arrays live is a pure function of the replica's mesh (``Placement``: its data shards,
the logical-axis table, abstract arguments), so the engine hands layouts one frozen value for
it; the rest is the engine's state: the settings, the query cache, compiled steps by
signature, running them and counting tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import jax
from jax.sharding import Mesh

from cluster.sharding import named_sharding, replicated
from replicas.engine.query_cache import QueryCache
from replicas.model.protocol import DecoderModel
from replicas.settings import ReplicaSettings


@dataclass(frozen=True)
class Placement:
    """Where a step's arrays live on the replica's ``[data, model]`` mesh."""

    mesh: Mesh

    @property
    def groups(self) -> int:
        """Data shards (the mesh's ``data`` size): a step's rows split into this many."""
        return int(self.mesh.shape["data"])

    @cached_property
    def replicated(self) -> Any:
        """Whole on every device."""
        return replicated(self.mesh)

    def sharding(self, axes: tuple[str | None, ...], shape: tuple[int, ...]) -> Any:
        """Where an array of ``shape`` with logical ``axes`` lives (the one table)."""
        return named_sharding(axes, shape, self.mesh)

    def spec(self, shape: tuple[int, ...], dtype: Any, axes: tuple[str | None, ...] | None) -> Any:
        """An abstract argument of ``shape``: placed by its logical ``axes`` through the one
        table (cluster.sharding), or whole on every device (None)."""
        sharding = self.replicated if axes is None else self.sharding(axes, shape)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


class Runner(Protocol):
    @property
    def settings(self) -> ReplicaSettings: ...

    @property
    def cache(self) -> QueryCache: ...

    @property
    def placement(self) -> Placement:
        """The replica's mesh and where arrays live on it."""
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

    def run_device(self, kind: str, dims: Any, args: tuple[Any, ...]) -> Any:
        """Run the executable on host/device arguments; its outputs stay on device
        (``np.asarray`` brings them to the host)."""
        ...

    def count_tokens(self, computed: int, useful: int) -> None: ...

    def count_prompt_tokens(self, computed: int, reused: int) -> None:
        """Prompt tokens computed, and read from a shared or cached prefix instead."""
        ...


class DecoderSteps:
    """What a decoder layout (or the prefix extender) holds: its model and the runner that
    compiles and runs its steps."""

    def __init__(self, model: DecoderModel, runner: Runner) -> None:
        self._model = model
        self._runner = runner
