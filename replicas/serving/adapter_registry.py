"""The LoRA adapters one app serves, shared by its ingress and scoring replicas (semantics 21).

Adapters load and unload at run time through the ingress (vLLM's ``/v1/load_lora_adapter``
and ``/v1/unload_lora_adapter``), while an app has several ingress replicas and maybe several
scoring replicas, each with its own engine slots. One ``AdapterRegistry`` deployment (no CPU
of its own; only in apps with ``max_loras`` > 0) holds the truth: names -> directories and a
version that every change raises. A load is first made by one scoring replica (which reads
the files and refuses an adapter that does not fit the base), then recorded here; an unload
is recorded here. Every other replica follows (``AdapterFollower``): a work naming an adapter
waits for a view of the registry fetched after it arrived (read-your-writes, semantics 21:
once load or unload answered 200, no replica serves the old state), other works see a change
at most ``REFRESH_S`` after it.
A registry restarted by Serve starts again from ``lora_adapters``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from replicas.engine_contract import Engine

logger = logging.getLogger("ray.serve")

REFRESH_S = 0.5  # how stale a replica's view of the registry may be before its next work


@dataclass
class AdapterBook:
    """Names -> adapter directories, at most ``max_loras``, with a version per change."""

    max_loras: int
    paths: dict[str, str] = field(default_factory=dict)
    version: int = 0

    def snapshot(self) -> tuple[int, dict[str, str]]:
        return self.version, dict(self.paths)

    def add(self, name: str, path: str) -> int:
        """Record ``name`` (ValueError when taken or when every slot is); the new version."""
        if name in self.paths:
            raise ValueError(f"lora adapter {name!r}: already loaded (unload it first)")
        if len(self.paths) >= self.max_loras:
            raise ValueError(
                f"lora adapter {name!r}: all max_loras={self.max_loras} slots hold adapters "
                f"({', '.join(sorted(self.paths))})"
            )
        self.paths[name] = path
        self.version += 1
        return self.version

    def remove(self, name: str) -> int:
        """Forget ``name`` (KeyError when unknown); the new version."""
        del self.paths[name]
        self.version += 1
        return self.version


@serve.deployment(
    name="AdapterRegistry",
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1024,
    health_check_period_s=10,
)
class AdapterRegistry:
    """The app's one ``AdapterBook``, seeded with ``lora_adapters``."""

    def __init__(self, adapters: tuple[tuple[str, str], ...], max_loras: int) -> None:
        self._book = AdapterBook(max_loras, dict(adapters))

    async def snapshot(self) -> tuple[int, dict[str, str]]:
        return self._book.snapshot()

    async def add(self, name: str, path: str) -> int:
        return self._book.add(name, path)

    async def remove(self, name: str) -> int:
        return self._book.remove(name)


Apply = Callable[[Mapping[str, str], Mapping[str, str]], Awaitable[None]]


class AdapterFollower:
    """A replica's view of the registry, handed as (loaded, wanted) to ``apply`` when it
    changed. ``follow(wanted)`` for a work naming an adapter, and ``follow(force=True)``,
    return once a view fetched after the call began is applied (read-your-writes: a load or
    unload that answered 200 before the work arrived is seen); plain ``follow()`` fetches at
    most every ``REFRESH_S``. Fetches run one at a time, and every call waiting for a fresh
    view shares the next one (one registry call per step's worth of works, not per work)."""

    def __init__(self, registry: Any, known: Mapping[str, str], apply: Apply) -> None:
        self._registry, self._apply = registry, apply
        self._version, self._paths = -1, dict(known)
        self._checked = float("-inf")
        self._running: asyncio.Future | None = None  # the fetch under way
        self._queued: asyncio.Future | None = None  # the fetch that starts after it

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._paths)

    async def follow(self, wanted: str | None = None, force: bool = False) -> None:
        fresh = force or wanted is not None
        if not fresh and time.monotonic() - self._checked < REFRESH_S:
            return
        if self._queued is None:
            self._queued = asyncio.ensure_future(self._fetch_after(self._running))
        await asyncio.shield(self._queued)  # a caller that goes leaves the shared fetch be

    async def _fetch_after(self, previous: asyncio.Future | None) -> None:
        """Wait for the fetch under way, then fetch and apply: this one began after every
        caller that is waiting for it."""
        if previous is not None:
            await asyncio.wait([previous])  # its failure was its callers' to see
        self._running, self._queued = self._queued, None
        self._checked = time.monotonic()
        try:
            version, paths = await self._registry.snapshot.remote()
        except Exception as error:  # the registry restarting: serve with the view we have
            logger.warning("lora adapter registry unavailable, adapters as before: %s", error)
            return
        if version == self._version:
            return
        try:
            await self._apply(self._paths, paths)
        finally:
            self._version, self._paths = version, paths

    def loaded(self, name: str, path: str) -> None:
        """This replica loaded ``name`` itself (before the registry records it)."""
        self._paths[name] = path


def adapter_changes(
    loaded: Mapping[str, str], wanted: Mapping[str, str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """What to unload (gone, or the same name now at another path) and what to load."""
    unload = [name for name, path in loaded.items() if wanted.get(name) != path]
    load = [(name, path) for name, path in wanted.items() if loaded.get(name) != path]
    return unload, load


def apply_to_engine(engine: Engine, run: Callable[[Callable[[], Any]], Awaitable[Any]]) -> Apply:
    """An ``Apply`` that swaps ``engine``'s adapters with ``run`` (between steps); an adapter
    that fails to load here is logged and stays unknown (its requests: 404)."""

    async def apply(loaded: Mapping[str, str], wanted: Mapping[str, str]) -> None:
        unload, load = adapter_changes(loaded, wanted)
        for name in unload:
            if name in engine.info.adapters:
                await run(lambda n=name: engine.unload_adapter(n))
        for name, path in load:
            try:
                await run(lambda n=name, p=path: engine.load_adapter(n, p))
            except Exception:
                logger.exception("lora adapter %r at %s: not loaded on this replica", name, path)

    return apply
