"""Compiled steps by signature: exact look-up, covering fallback, background compiles.

A signature is a layout's frozen dims dataclass (``covers``, ``cost``, ``astuple``). After
warm-up a request never waits for a compile when a compiled signature covers its own: it runs
on the cheapest covering one while its exact signature compiles in a background thread, one
at a time. Only a request that nothing compiled covers compiles on the request path, and
that is counted (target 0). With a record file (in the persistent compilation cache's
directory) every signature ever compiled is compiled again at the next start-up, where the
persistent cache makes it a load, so padding stays converged across restarts.

Traffic's signatures are bounded: at most ``max_traffic`` signatures compiled after the
configured warm-up (background, request path, or replayed from the record) are kept, the least
recently used dropped first, with its record entry, so neither memory (about 4 MiB of
executable each on CPU) nor start-up time grows with the variety of traffic. Warm-up
signatures, and the ones another compile needed (a stream step's prefix step), are kept.
Once the bound is reached, a background compile (an optimisation: a covering signature
already serves the request) only starts when the least recently used one has not run for
``idle_s``; otherwise traffic with more shapes than the bound would compile without end,
each compile taking seconds of the same CPU that scores.

Gated (a host group, several JAX processes stepping in lock-step): a background compile is
held, not used, until ``publish`` names it. The leader publishes a signature once every host
holds it, at the same step on every host, so every host resolves every step the same way.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from replicas.engine.memory import release_free_heap

logger = logging.getLogger(__name__)


class Dims(Protocol):
    def covers(self, other: Any) -> bool: ...

    def astuple(self) -> tuple[int, ...]: ...

    @property
    def cost(self) -> int: ...

    def cost_for(self, exact: Any) -> int: ...


Key = tuple[str, Any]


class StepCompiler:
    """Executables keyed by ``(kind, dims)``; ``compile_fn(kind, dims)`` builds one."""

    def __init__(
        self,
        compile_fn: Callable[[str, Any], Any],
        dims_types: Mapping[str, type],
        *,
        background: bool = True,
        record: Path | None = None,
        gated: bool = False,
        max_traffic: int = 0,
        idle_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._compile_fn = compile_fn
        self._dims_types = dict(dims_types)
        self._background = background
        self._record = record
        self._executables: dict[Key, Any] = {}
        self._gated = gated
        self._held: dict[Key, Any] = {}  # gated background compiles not yet published
        self._max_traffic = max_traffic  # 0: unbounded
        # Evictable signatures -> when each last ran, least recently used first.
        self._traffic: OrderedDict[Key, float] = OrderedDict()
        self._idle_s, self._clock = idle_s, clock
        self._lock = threading.Condition()  # guards the dicts and counters
        self._compile_lock = threading.RLock()  # one compile at a time (nested: same thread)
        self._local = threading.local()  # the source a nested compile is counted under
        self._queue: queue.Queue[Key] = queue.Queue()
        self._pending: set[Key] = set()
        self._worker: threading.Thread | None = None
        self.counts = {"warmup": 0, "request_path": 0, "background": 0, "evicted": 0, "declined": 0}

    def __len__(self) -> int:
        return len(self._executables)

    def executable(self, kind: str, dims: Any) -> Any:
        """The compiled step of ``(kind, dims)``; one dropped since ``resolve`` chose it (a
        background compile evicted it in between: only with a tiny ``max_traffic``) compiles
        again on the request path, so a step never fails for it."""
        key = (kind, dims)
        with self._lock:
            executable = self._executables.get(key)
            if executable is not None:
                self._touch(key)
                return executable
        self.ensure(kind, dims, "request_path")
        return self._executables[key]

    def executables(self) -> dict[Key, Any]:
        """Every usable compiled step by ``(kind, dims)``, in compile order."""
        with self._lock:
            return dict(self._executables)

    @property
    def pending(self) -> int:
        """Background compiles queued or running."""
        with self._lock:
            return len(self._pending)

    def ensure(
        self, kind: str, dims: Any, source: str | None = None, *, keep: bool | None = None
    ) -> None:
        """Compile ``(kind, dims)`` now unless it exists; ``source`` names the counter (a
        compile nested in another one counts under the outer one's source). ``keep``: never
        evicted (default: warm-up compiles, and compiles nested in another one)."""
        key = (kind, dims)
        with self._compile_lock:
            outer = getattr(self._local, "source", None)
            keep = (source == "warmup" or outer is not None) if keep is None else keep
            source = source or outer or "request_path"
            if key in self._executables:
                if keep:  # now needed by a kept one (or by warm-up): no longer evictable
                    with self._lock:
                        self._traffic.pop(key, None)
                return
            if key in self._held and source == "background":
                return
            if key in self._held:  # a deterministic path needs it now: use it on this host
                self._store(key, self._held.pop(key), None, keep)
                return
            self._local.source = source
            try:
                executable = self._compile_fn(kind, dims)
            finally:
                self._local.source = outer
            self._store(key, executable, source, keep)
            self._remember(key)
            if outer is None and source != "warmup":  # start-up trims once, at its end
                release_free_heap()

    def _store(self, key: Key, executable: Any, source: str | None, keep: bool) -> None:
        evicted: list[Key] = []
        with self._lock:
            if self._gated and source == "background":
                self._held[key] = executable
            else:
                self._executables[key] = executable
                evicted = self._admit(key, keep)
            if source:
                self.counts[source] += 1
            self._pending.discard(key)
            self._lock.notify_all()
        self._forget(evicted)

    def _admit(self, key: Key, keep: bool) -> list[Key]:
        """Count ``key`` as traffic's unless kept; drop the least recently used beyond the
        bound (called under the lock)."""
        if keep or not self._max_traffic:
            self._traffic.pop(key, None)
            return []
        self._traffic[key] = self._clock()
        evicted = []
        while len(self._traffic) > self._max_traffic:
            victim, _ = self._traffic.popitem(last=False)
            del self._executables[victim]
            evicted.append(victim)
            self.counts["evicted"] += 1
        return evicted

    def _touch(self, key: Key) -> None:
        if key in self._traffic:
            self._traffic[key] = self._clock()
            self._traffic.move_to_end(key)

    def _has_room(self) -> bool:
        """Whether a background compile may start: below the bound, or the least recently
        used signature has been idle for ``idle_s`` (called under the lock)."""
        if not self._max_traffic or len(self._traffic) < self._max_traffic:
            return True
        oldest = next(iter(self._traffic.values()))
        return self._clock() - oldest >= self._idle_s

    def held(self) -> list[Key]:
        """Background compiles finished on this host and not yet published (gated mode)."""
        with self._lock:
            return list(self._held)

    def publish(self, keys: list[Key]) -> None:
        """Make ``keys`` usable (gated mode; the same keys at the same step on every host).
        A key this host does not hold yet is compiled now, so hosts never diverge."""
        for kind, dims in keys:
            self.ensure(kind, dims, "request_path")

    def resolve(self, kind: str, dims: Any) -> Any:
        """The signature to run ``dims`` on: itself if compiled, else the cheapest compiled
        one covering it (compiling ``dims`` in the background), else ``dims`` compiled now.
        A covering signature may hold fewer independent rows; the layout then runs the step
        in pieces."""
        with self._lock:
            if (kind, dims) in self._executables:
                self._touch((kind, dims))
                return dims
            covers = [d for k, d in self._executables if k == kind and d.covers(dims)]
            if covers and self._background:
                chosen = min(covers, key=lambda d: d.cost_for(dims))
                self._touch((kind, chosen))
                room = self._has_room()
                if not room:
                    self.counts["declined"] += 1
        if covers and self._background:
            if room:
                self._schedule((kind, dims))
            return chosen
        self.ensure(kind, dims, "request_path")
        return dims

    def wait_idle(self, timeout_s: float = 600.0) -> bool:
        """Block until no background compile is queued or running (tests, benchmarks)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending, timeout_s)

    def recorded(self) -> list[Key]:
        """The signatures the record lists (compiled again at start-up)."""
        return self._read_record()

    # -- background -------------------------------------------------------------------

    def _schedule(self, key: Key) -> None:
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="scorejax-compiler", daemon=True
                )
                self._worker.start()
        self._queue.put(key)

    def _work(self) -> None:
        while True:
            kind, dims = self._queue.get()
            try:
                self.ensure(kind, dims, "background")
            except Exception:  # a failed background compile must not kill the worker
                logger.exception("background compile of %s %s failed", kind, dims)
                with self._lock:
                    self._pending.discard((kind, dims))
                    self._lock.notify_all()

    # -- record -------------------------------------------------------------------------

    def _read_record(self) -> list[Key]:
        """The recorded signatures this engine knows how to build (stale entries, e.g. from
        an older version or another layout, are skipped)."""
        if self._record is None or not self._record.exists():
            return []
        try:
            entries = json.loads(self._record.read_text())
        except (OSError, ValueError):
            logger.warning("ignoring unreadable compile record %s", self._record)
            return []
        keys = []
        for entry in entries if isinstance(entries, list) else []:
            try:
                dims_type = self._dims_types[entry["kind"]]
                keys.append((entry["kind"], dims_type(*entry["dims"])))
            except (KeyError, TypeError):
                continue
        return keys

    def _remember(self, key: Key) -> None:
        if self._record is None:
            return
        keys = self._read_record()
        if key not in keys:
            self._write_record([*keys, key])

    def _forget(self, evicted: list[Key]) -> None:
        if self._record is None or not evicted:
            return
        keys = self._read_record()
        kept = [k for k in keys if k not in evicted]
        if len(kept) < len(keys):
            self._write_record(kept)

    def _write_record(self, keys: list[Key]) -> None:
        entries = [{"kind": kind, "dims": list(dims.astuple())} for kind, dims in keys]
        try:
            self._record.parent.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            tmp = self._record.with_suffix(".tmp")  # type: ignore[union-attr]
            tmp.write_text(json.dumps(entries))
            tmp.replace(self._record)  # type: ignore[arg-type]
        except OSError:
            logger.warning("cannot write compile record %s", self._record)
