"""The query cache (semantics 9): per-layer keys/values of recent queries.

Keyed by ``prefix_index.CacheKey`` (what the entry is, its token ids and, for a query, the
prefix bucket it was computed at); least recently used entries are evicted to stay within
``capacity_bytes``; an entry larger than the whole budget is not cached. A hit runs only the
items, with the same executables a miss uses, so warm scores equal cold scores bit for bit.
Every ``CacheKey`` entry is also registered in the cache's one ``PrefixIndex``, so ``longest``
finds the longest cached block-aligned prefix of new tokens, of the kind asked for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from replicas.engine.prefix_index import PREFIX_BLOCK, CacheKey, PrefixIndex


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


class QueryCache:
    """LRU of prefix entries bounded in bytes; counts hits and misses."""

    def __init__(self, capacity_bytes: int, block: int = PREFIX_BLOCK) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[Hashable, Sized] = OrderedDict()
        self._index = PrefixIndex(block)
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Sized | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def peek(self, key: Hashable) -> Sized | None:
        """The entry under ``key`` without counting or touching it."""
        return self._entries.get(key)

    def touch(self, key: Hashable) -> None:
        """Count a hit on ``key`` (a prefix reused from it) and mark it recently used."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1

    def entries(self) -> list[Sized]:
        """What the cache holds, least recently used first (nothing is counted as used)."""
        return list(self._entries.values())

    def put(self, key: Hashable, entry: Sized) -> bool:
        """Insert (evicting the least recently used); False if it does not fit at all."""
        size = entry.nbytes
        if size > self.capacity_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
        self._entries[key] = entry
        self.bytes += size
        if isinstance(key, CacheKey):
            if self._index.full:  # forget evicted entries' blocks
                self._index.rebuild(k for k in self._entries if isinstance(k, CacheKey))
            self._index.add(key)
        return True

    def longest(
        self,
        kind: str,
        tokens: Sequence[int],
        limit: int,
        accept: Callable[[Sized], bool] = lambda entry: True,
    ) -> tuple[int, CacheKey | None, Sized | None]:
        """The longest cached ``kind`` prefix of ``tokens`` (a whole number of blocks, at
        most ``limit`` tokens) whose entry ``accept`` takes: ``(r, key, entry)``, or
        ``(0, None, None)``. Nothing is counted or touched."""

        def live(key: CacheKey) -> bool:
            entry = self._entries.get(key)
            return entry is not None and accept(entry)

        reused, key = self._index.longest(kind, tokens, limit, live)
        return (reused, key, self._entries[key]) if key is not None else (0, None, None)

    def clear(self) -> None:
        """Drop every entry (an adapter slot changed hands: its tagged keys would read the
        old adapter's keys and values); the counters stay."""
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def stats(self) -> dict[str, int]:
        """The cache's counters, named as ``EngineStats`` fields (the engine spreads them in)."""
        return {
            "query_cache_hits": self.hits,
            "query_cache_misses": self.misses,
            "query_cache_entries": len(self._entries),
            "query_cache_bytes": self.bytes,
            "query_cache_capacity_bytes": self.capacity_bytes,
        }
