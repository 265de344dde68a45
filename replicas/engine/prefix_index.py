"""Longest cached prefix at block granularity (semantics 15).

Every prompt prefix the query cache holds is registered at each of its block boundaries
under a chained hash of its blocks (block j's hash covers blocks 0..j), so finding the
longest cached prefix of a new prompt costs one hash per block, whatever the cache holds.
A hit is checked token by token against the entry (no hash collision can change a result).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any


def block_hashes(tokens: Sequence[int], block: int, blocks: int) -> list[int]:
    """The chained hash of the first ``j + 1`` blocks of ``tokens``, for j < ``blocks``."""
    hashes, running = [], 0
    for j in range(blocks):
        running = hash((running, tuple(tokens[j * block : (j + 1) * block])))
        hashes.append(running)
    return hashes


class PrefixIndex:
    """Block-aligned prefixes of cached entries -> the entry's cache key (newest wins)."""

    def __init__(self, block: int, max_keys: int = 1 << 16) -> None:
        self.block = block
        self._max_keys = max_keys
        self._keys: dict[tuple[int, int], Hashable] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, tokens: Sequence[int], key: Hashable) -> None:
        """Register ``tokens``' whole blocks under ``key``."""
        for j, value in enumerate(block_hashes(tokens, self.block, len(tokens) // self.block)):
            self._keys[(j + 1, value)] = key

    def rebuild(self, live: Iterable[tuple[Sequence[int], Hashable]]) -> None:
        """Forget evicted entries: keep only ``live`` (tokens, key) pairs' blocks."""
        self._keys = {}
        for tokens, key in live:
            self.add(tokens, key)

    @property
    def full(self) -> bool:
        return len(self._keys) > self._max_keys

    def longest(
        self, tokens: Sequence[int], limit: int, find: Callable[[Hashable], Any]
    ) -> tuple[int, Any]:
        """The longest ``r`` (a multiple of the block, <= ``limit``) whose first ``r``
        tokens a live entry starts with, and that entry (``find(key)``: the entry, or None
        once evicted; the entry's ``tokens`` are compared); ``(0, None)`` when none."""
        blocks = min(limit, len(tokens)) // self.block
        hashes = block_hashes(tokens, self.block, blocks)
        for j in range(blocks, 0, -1):
            key = self._keys.get((j, hashes[j - 1]))
            if key is None:
                continue
            entry = find(key)
            r = j * self.block
            if entry is not None and tuple(entry.tokens[:r]) == tuple(tokens[:r]):
                return r, entry
        return 0, None
