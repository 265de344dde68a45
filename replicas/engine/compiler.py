"""Compiled steps by signature: exact look-up, covering fallback, background compiles.

A signature is a layout's frozen dims dataclass (``covers``, ``cost``, ``cost_for``,
``astuple``). After warm-up a request never waits for a compile when a compiled signature
covers its own: it runs on the cheapest covering one, and its exact signature compiles in a
background thread (one at a time) once the shape recurs. Only a request that nothing
compiled covers compiles on the request path, and that is counted (target 0).

Traffic's signatures (compiled after the configured warm-up) are kept by their value
(``signature_record``: decayed uses times the compute the cheapest covering alternative
would waste on them), at most ``max_traffic`` of them, the least valuable dropped first, so
neither memory (about 4 MiB of executable each on CPU) nor start-up time grows with the
variety of traffic. A new shape compiles when it recurs (two uses within a half-life); at
the bound only when its requests run at least ``PADDING_TO_COMPILE`` padded and it is worth
``REPLACE_MARGIN`` times the least valuable kept signature, which it then replaces (the
margin keeps two shapes of similar worth from replacing each other without end). One-off
shapes never compile and decay to nothing. Warm-up signatures, and the ones another compile
needed (a stream step's prefix step), are kept. With a record file (in the persistent compilation
cache's directory, one per model and settings: ``signature_record``) the most valuable
signatures compile again at the next start-up, where the persistent cache makes it a load,
with the uses they had; a recorded signature this engine cannot build is skipped (``replay``).

The background worker runs only while compiles are queued, at niceness
``BACKGROUND_NICENESS`` (a Linux thread's own), so a compile yields the cores to the steps
that answer requests: unniced, a compile behind a server's first requests made their steps
1.8-3x slower on 2 cores (docs/benchmarks.md, "Served against llama.cpp"). At interpreter
exit (``atexit``) queued compiles are dropped and the running one is waited for, so XLA is
never torn down under a compile (a daemon thread inside XLA at exit aborts the process).

Gated (a host group, several JAX processes stepping in lock-step): a background compile is
held, not used, until ``publish`` names it. The leader publishes a signature once every host
holds it, at the same step on every host, so every host resolves every step the same way.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cluster.niceness import set_thread_niceness, thread_niceness
from replicas.engine.memory import release_free_heap
from replicas.engine.signature_record import Entry, Key, SignatureRecord, Usage

logger = logging.getLogger(__name__)

PADDING_TO_COMPILE = 1.25  # at the bound, a new shape must run at least this padded
RECURS_AT = 1.5  # decayed uses at which a shape recurs: a second use within a half-life
REPLACE_MARGIN = 2.0  # ... and be worth this many times the least valuable kept one
UNCOVERED_SAVING = 4.0  # a signature nothing else covers saves this many times its cost
SEEN_LIMIT = 256  # uncompiled shapes whose uses are kept
PERSIST_EVERY_S = 60.0  # uses reach the record at most this often
DECLINE_REASONS = ("one_off", "small_padding", "low_value")
EVICT_REASONS = ("one_off", "low_value")
EXIT_WAIT_S = 600.0  # interpreter exit waits at most this long for a running compile
BACKGROUND_NICENESS = 19  # the worker's: Linux weight 15 against a step's 110 at niceness 10


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._compile_fn = compile_fn
        self._background = background
        self._record = SignatureRecord(record, dims_types)
        self._history = {entry.key: entry for entry in self._record.read()}  # last run's
        self._executables: dict[Key, Any] = {}
        self._gated = gated
        self._held: dict[Key, Any] = {}  # gated background compiles not yet published
        self._max_traffic = max_traffic  # 0: unbounded
        self._traffic: dict[Key, Usage] = {}  # evictable signatures and their uses
        self._seen: OrderedDict[Key, Usage] = OrderedDict()  # uncompiled shapes' uses
        self._clock = clock  # wall-clock seconds: uses persist across restarts
        self._persisted_at = clock()
        self._lock = threading.Condition()  # guards the dicts and counters
        self._compile_lock = threading.RLock()  # one compile at a time (nested: same thread)
        self._local = threading.local()  # the source a nested compile is counted under
        self._queue: deque[Key] = deque()  # background compiles not started yet
        self._pending: set[Key] = set()  # ... and the running one
        self._worker: threading.Thread | None = None  # alive while compiles are queued
        self._stopped = False  # no more background compiles (interpreter exit)
        self._exit_hook = False
        self.counts = {"warmup": 0, "request_path": 0, "background": 0, "evicted": 0}
        self.counts |= {"declined": 0} | {f"declined_{r}": 0 for r in DECLINE_REASONS}
        self.counts |= {f"evicted_{r}": 0 for r in EVICT_REASONS}

    def __len__(self) -> int:
        return len(self._executables)

    @property
    def record_path(self) -> Path | None:
        """This engine's record file (None: no record)."""
        return self._record.path

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
            if key in self._held:  # a deterministic path needs it now: use it on this host
                if source != "background":
                    self._store(key, self._held.pop(key), None, keep)
                return
            self._local.source = source
            try:
                executable = self._compile_fn(kind, dims)
            finally:
                self._local.source = outer
            self._store(key, executable, source, keep)
            if outer is None and source != "warmup":  # start-up trims once, at its end
                release_free_heap()

    def _store(self, key: Key, executable: Any, source: str | None, keep: bool) -> None:
        with self._lock:
            if self._gated and source == "background":
                self._held[key] = executable
            else:
                self._executables[key] = executable
                self._admit(key, keep, replayed=source == "warmup")
                self._persist()
            if source:
                self.counts[source] += 1
            self._pending.discard(key)
            self._lock.notify_all()

    def _admit(self, key: Key, keep: bool, replayed: bool) -> None:
        """Count ``key`` as traffic's unless kept, with the uses it had (recorded ones on a
        replay, else those seen while it ran covered); drop the least valuable beyond the
        bound (called under the lock)."""
        if keep or not self._max_traffic:
            self._traffic.pop(key, None)
            self._seen.pop(key, None)
            return
        now = self._clock()
        recorded = self._history.get(key)
        seen = self._seen.pop(key, None)
        if replayed and recorded is not None:
            self._traffic[key] = recorded.usage
        else:
            self._traffic[key] = seen or Usage().used(now)
        while len(self._traffic) > self._max_traffic:
            victim = min(
                (k for k in self._traffic if k != key),
                key=lambda k: (self._value(k, now), self._traffic[k].last),
            )
            uses = self._traffic.pop(victim).at(now)
            del self._executables[victim]
            reason = "one_off" if uses < RECURS_AT else "low_value"
            self.counts["evicted"] += 1
            self.counts[f"evicted_{reason}"] += 1

    def _saving(self, key: Key) -> float:
        """Cost units per use that ``key`` saves over the cheapest other compiled signature
        covering it (called under the lock)."""
        kind, dims = key
        others = [
            d.cost_for(dims)
            for k, d in self._executables
            if k == kind and d != dims and d.covers(dims)
        ]
        return min(others) - dims.cost if others else UNCOVERED_SAVING * dims.cost

    def _value(self, key: Key, now: float) -> float:
        return self._traffic[key].at(now) * self._saving(key)

    def _touch(self, key: Key) -> None:
        if key in self._traffic:
            self._traffic[key] = self._traffic[key].used(self._clock())
            if self._clock() - self._persisted_at >= PERSIST_EVERY_S:
                self._persist()

    def _decline(self, key: Key, chosen: Any) -> str | None:
        """Why the uncompiled ``key``, run on ``chosen``, is not compiled now; None: compile
        it (called under the lock)."""
        now = self._clock()
        usage = self._seen.pop(key, Usage()).used(now)
        self._seen[key] = usage
        while len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)
        if usage.at(now) < RECURS_AT:
            return "one_off"
        if not self._max_traffic or len(self._traffic) < self._max_traffic:
            return None
        dims = key[1]
        padded = chosen.cost_for(dims)
        if padded < PADDING_TO_COMPILE * dims.cost:
            return "small_padding"
        worth = usage.at(now) * (padded - dims.cost)
        if worth <= REPLACE_MARGIN * min(self._value(k, now) for k in self._traffic):
            return "low_value"
        return None

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
        one covering it (compiling ``dims`` in the background once it recurs and is worth
        it), else ``dims`` compiled now. A covering signature may hold fewer independent
        rows; the layout then runs the step in pieces."""
        key = (kind, dims)
        with self._lock:
            if key in self._executables:
                self._touch(key)
                return dims
            covers = [d for k, d in self._executables if k == kind and d.covers(dims)]
            if covers and self._background:
                chosen = min(covers, key=lambda d: d.cost_for(dims))
                self._touch((kind, chosen))
                # Queued, compiling, or compiled and held until published (gated): wait.
                waiting = key in self._pending or key in self._held
                reason = None if waiting else self._decline(key, chosen)
                if reason is not None:
                    self.counts["declined"] += 1
                    self.counts[f"declined_{reason}"] += 1
        if covers and self._background:
            if reason is None and not waiting:
                self._schedule(key)
            return chosen
        self.ensure(kind, dims, "request_path")
        return dims

    def compiled(self, kind: str, dims: Any) -> Any | None:
        """The signature ``resolve`` would run ``dims`` on without compiling: itself or the
        cheapest compiled one covering it; None when none is compiled (nothing counted)."""
        with self._lock:
            if (kind, dims) in self._executables:
                return dims
            covers = [d for k, d in self._executables if k == kind and d.covers(dims)]
        return min(covers, key=lambda d: d.cost_for(dims)) if covers else None

    def compiles_now(self, kind: str, dims: Any) -> bool:
        """Whether ``resolve`` would compile ``dims`` on the request path (nothing counted):
        nothing compiled covers it, or only a covering one does and background compiles are
        off (``resolve`` runs on a covering signature only while they are on)."""
        chosen = self.compiled(kind, dims)
        return chosen is None or (chosen != dims and not self._background)

    def compile_later(self, kind: str, dims: Any) -> None:
        """Compile ``dims`` in the background (background compiles on), unless it is
        compiled, queued or held: for work that runs another way until it is ready."""
        key = (kind, dims)
        with self._lock:
            known = key in self._executables or key in self._pending or key in self._held
        if self._background and not known:
            self._schedule(key)

    def wait_idle(self, timeout_s: float = 600.0) -> bool:
        """Block until no background compile is queued or running (tests, benchmarks)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending, timeout_s)

    def recorded(self) -> list[Key]:
        """The recorded signatures (compiled again at start-up), most valuable first."""
        now = self._clock()
        entries = sorted(self._history.values(), key=lambda e: -e.value(now))
        return [entry.key for entry in entries]

    def replay(self, kind: str, dims: Any) -> bool:
        """Compile a recorded signature at start-up, as traffic's. One this engine cannot
        build (a record written by an older version, or edited) is skipped with a warning
        and forgotten, never failing the start; False then."""
        try:
            self.ensure(kind, dims, "warmup", keep=False)
        except Exception as error:
            logger.warning("skipping recorded signature %s %s: %r", kind, dims, error)
            with self._lock:
                self._history.pop((kind, dims), None)
            return False
        return True

    # -- background -------------------------------------------------------------------

    def _schedule(self, key: Key) -> None:
        with self._lock:
            if key in self._pending or self._stopped:
                return
            self._pending.add(key)
            self._queue.append(key)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="scorejax-compiler", daemon=True
                )
                self._worker.start()
                if not self._exit_hook:  # a weak reference: the hook keeps no engine alive
                    atexit.register(_stop_at_exit, weakref.ref(self))
                    self._exit_hook = True

    def _work(self) -> None:
        """Compile queued signatures one at a time, niced; end once none is queued (or
        stopped)."""
        set_thread_niceness(max(BACKGROUND_NICENESS, thread_niceness(threading.get_native_id())))
        while True:
            with self._lock:
                if self._stopped or not self._queue:
                    self._worker = None
                    self._lock.notify_all()
                    return
                kind, dims = self._queue.popleft()
            try:
                self.ensure(kind, dims, "background")
            except Exception:  # a failed background compile must not kill the worker
                logger.exception("background compile of %s %s failed", kind, dims)
            with self._lock:  # also when another path compiled it first
                self._pending.discard((kind, dims))
                self._lock.notify_all()

    def stop(self, timeout_s: float = EXIT_WAIT_S) -> None:
        """Start no more background compiles: drop the queued ones and wait for the running
        one (XLA must not be torn down under it)."""
        with self._lock:
            self._stopped = True
            self._pending.difference_update(self._queue)
            self._queue.clear()
            worker = self._worker
            self._lock.notify_all()
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout_s)

    # -- record -------------------------------------------------------------------------

    def _persist(self) -> None:
        """Rewrite the record: every usable signature with its uses and saving (kept ones
        with none), in compile order (called under the lock)."""
        self._persisted_at = self._clock()
        self._record.write(
            Entry(key, self._traffic.get(key, Usage()), self._saving(key))
            for key in self._executables
        )


def _stop_at_exit(compiler: weakref.ref[StepCompiler]) -> None:
    """At interpreter exit: wait for a compiler's running background compile, if it lives."""
    live = compiler()
    if live is not None:
        live.stop()
