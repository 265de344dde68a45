"""The query cache (semantics 9): per-layer keys/values of recent queries.

Keyed by the query's token ids and the prefix bucket it was computed at; least recently
used entries are evicted to stay within ``capacity_bytes``; an entry larger than the whole
budget is not cached. A hit runs only the items, with the same executables a miss uses, so
warm scores equal cold scores bit for bit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


class QueryCache:
    """LRU of prefix entries bounded in bytes; counts hits and misses."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[Hashable, Sized] = OrderedDict()
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

    def cached_keys(self) -> list[Hashable]:
        """The cached keys, least recently used first."""
        return list(self._entries)

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
        return True

    def clear(self) -> None:
        """Drop every entry (an adapter slot changed hands: its tagged keys would read the
        old adapter's keys and values); the counters stay."""
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "query_cache_hits": self.hits,
            "query_cache_misses": self.misses,
            "query_cache_entries": len(self._entries),
            "query_cache_bytes": self.bytes,
            "query_cache_capacity_bytes": self.capacity_bytes,
        }
