"""LoRA adapters loaded and unloaded at run time through the ingress (semantics 21).

``AdapterAdmin`` answers vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``:
a load is made by one scoring replica first (which reads the files and refuses what does not
fit the base), then recorded in the app's ``AdapterRegistry``; an unload is recorded there.
Every replica follows the registry (``replicas/serving/adapter_registry.py``), and each
ingress replica keeps ``LiveNames``, the names it validates ``model`` against, from it every
``REFRESH_S``: an adapter loaded or unloaded through one ingress is known to every ingress
and scoring replica within about a second, and to a request naming it at once: an
ingress that does not know a requested name asks the registry (``know``), and a scoring replica
runs a work naming an adapter only after a view of the registry fetched after the work arrived
(``AdapterFollower``), so load and unload are read-your-writes (semantics 21).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from app.schema import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from app.validation import validate_body
from replicas.errors import Reason, ScoringError
from replicas.serving.adapter_registry import REFRESH_S

logger = logging.getLogger("ray.serve")


class LiveNames:
    """The adapter names an ingress serves now (its ``ModelInfo.adapters``)."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names = tuple(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"LiveNames({self._names!r})"

    def set(self, names: Iterable[str]) -> None:
        self._names = tuple(names)


class AdapterAdmin:
    """The load and unload routes of one ingress: ``replica`` and ``registry`` are handles."""

    def __init__(self, base: str, names: LiveNames, replica: Any, registry: Any) -> None:
        self._base, self.names = base, names
        self._replica, self._registry = replica, registry
        self._follower: asyncio.Task | None = None

    async def load(self, payload: Any) -> dict[str, Any]:
        request = validate_body(payload, LoadLoraAdapterRequest)
        name, path = request.lora_name, request.lora_path
        await self.refresh()
        if name == self._base or name in self.names:
            what = "the base model's name" if name == self._base else "already loaded"
            raise ScoringError(
                Reason.INVALID_REQUEST, f"lora adapter {name!r}: {what}", param="lora_name"
            )
        await self._call(self._replica.load_adapter, name, path)
        await self._call(self._registry.add, name, path)
        self.names.set((*self.names, name))
        return {"object": "lora_adapter", "lora_name": name, "lora_path": path, "loaded": True}

    async def unload(self, payload: Any) -> dict[str, Any]:
        request = validate_body(payload, UnloadLoraAdapterRequest)
        name = request.lora_name
        await self.refresh()
        if name not in self.names:
            raise ScoringError(
                Reason.MODEL_NOT_FOUND, f"lora adapter {name!r}: not loaded", "lora_name", 404
            )
        await self._call(self._registry.remove, name)
        self.names.set(n for n in self.names if n != name)
        return {"object": "lora_adapter", "lora_name": name, "loaded": False}

    async def know(self, payload: Any) -> None:
        """Read-your-writes here: a request naming a ``model`` this ingress does not know
        (loaded through another ingress within ``REFRESH_S``) refreshes the names first, so
        it is served, or refused with the registry's word. A known name needs no call: the
        scoring replica checks it against a fresh view before its step."""
        name = payload.get("model") if isinstance(payload, dict) else None
        if isinstance(name, str) and name != self._base and name not in self.names:
            await self.current()

    async def current(self) -> None:
        """Read-your-writes for ``/v1/models``: the names refreshed first (a load or unload
        through another ingress is listed at once); the registry restarting: the last names."""
        try:
            await self.refresh()
        except Exception as error:
            logger.warning("lora adapter registry unavailable: %s", error)

    async def refresh(self) -> None:
        _, paths = await self._registry.snapshot.remote()
        self.names.set(paths)

    async def start_following(self) -> None:
        """At the app's start-up: ``follow`` in the background."""
        if self._follower is None:
            self._follower = asyncio.create_task(self.follow())

    async def follow(self) -> None:
        """Refresh ``names`` every ``REFRESH_S`` for as long as the ingress lives."""
        while True:
            await self.current()
            await asyncio.sleep(REFRESH_S)

    @staticmethod
    async def _call(method: Any, *args: Any) -> Any:
        """A handle call; a refusal (a ValueError or KeyError it raised) is a 400, no adapter
        directory at the path a 404."""
        try:
            return await method.remote(*args)
        except Exception as raw:
            error = getattr(raw, "cause", None) or raw  # a RayTaskError carries the original
            message = getattr(error, "message", None) or str(error).strip("'\"")
            if isinstance(error, ScoringError) and error.reason == Reason.NOT_FOUND:  # no dir
                raise ScoringError(Reason.NOT_FOUND, message, "lora_path", 404) from None
            if isinstance(error, ValueError | KeyError):
                raise ScoringError(Reason.INVALID_REQUEST, message, "lora_path") from None
            raise ScoringError(Reason.UNAVAILABLE, f"lora adapter change failed: {error}") from None
