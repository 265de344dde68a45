"""Longest cached prefix at block granularity (semantics 15), one index over the query cache.

Every prefix the query cache holds is registered at each of its block boundaries under a
chained hash of its blocks (block j's hash covers blocks 0..j), so finding the longest cached
prefix of new tokens costs one hash per block, whatever the cache holds. A cache key says what
its entry is (``CacheKey.kind``: a /v1/score query's prefix entries, or a prompt prefix with
its log-probs), and a look-up asks for one kind, so the two never answer for each other. A hit
is checked token by token against the key's tokens (no hash collision can change a result).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

PREFIX_BLOCK = 16  # prefix reuse granularity (tokens); docs/benchmarks.md measures it
QUERY = "query"  # a /v1/score or /v1/rerank query's keys/values by data block, at ``width``
PROMPT = "prompt"  # a prompt prefix: keys/values, block-end states, its tokens' log-probs


@dataclass(frozen=True)
class CacheKey:
    """What a query-cache entry holds: its ``kind``, the token ids it was computed for (an
    adapter's tagged ids included) and, for a query, the prefix bucket it was computed at."""

    kind: str
    tokens: tuple[int, ...]
    width: int = 0


def block_hashes(tokens: Sequence[int], block: int, blocks: int) -> list[int]:
    """The chained hash of the first ``j + 1`` blocks of ``tokens``, for j < ``blocks``."""
    hashes, running = [], 0
    for j in range(blocks):
        running = hash((running, tuple(tokens[j * block : (j + 1) * block])))
        hashes.append(running)
    return hashes


class PrefixIndex:
    """Block-aligned prefixes of cached keys, per kind -> the key (newest wins)."""

    def __init__(self, block: int, max_keys: int = 1 << 17) -> None:
        self.block = block
        self._max_keys = max_keys
        self._keys: dict[tuple[str, int, int], CacheKey] = {}

    def add(self, key: CacheKey) -> None:
        """Register ``key.tokens``' whole blocks under ``key``."""
        tokens = key.tokens
        for j, value in enumerate(block_hashes(tokens, self.block, len(tokens) // self.block)):
            self._keys[(key.kind, j + 1, value)] = key

    def rebuild(self, live: Iterable[CacheKey]) -> None:
        """Forget evicted entries: keep only the ``live`` keys' blocks."""
        self._keys = {}
        for key in live:
            self.add(key)

    def clear(self) -> None:
        self._keys = {}

    @property
    def full(self) -> bool:
        return len(self._keys) > self._max_keys

    def longest(
        self, kind: str, tokens: Sequence[int], limit: int, live: Callable[[CacheKey], bool]
    ) -> tuple[int, CacheKey | None]:
        """The longest ``r`` (a multiple of the block, <= ``limit``) whose first ``r``
        tokens a ``kind`` key starts with that ``live(key)`` accepts (its entry is still
        cached and fits the caller), and that key; ``(0, None)`` when none."""
        blocks = min(limit, len(tokens)) // self.block
        hashes = block_hashes(tokens, self.block, blocks)
        for j in range(blocks, 0, -1):
            key = self._keys.get((kind, j, hashes[j - 1]))
            if key is None:
                continue
            r = j * self.block
            if live(key) and tuple(key.tokens[:r]) == tuple(tokens[:r]):
                return r, key
        return 0, None
