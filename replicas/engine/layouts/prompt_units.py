"""The prompt layout's units (semantics 14 and 15): a prefix kept in the query cache, the
prompts of one work that run behind one prefix in one stream row (``prompts.PromptLayout``
plans and runs them, in ``stream``'s prefix and item-stream steps with the token head), and
how units and needs are cut into steps."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from replicas.contract import PromptWork
from replicas.engine.layouts.prefix_blocks import PrefixEntry, fit_width
from replicas.engine.layouts.prompt_plan import chunk_members, least_loaded
from replicas.engine.layouts.token_steps import PREFIX_BLOCK

MAX_REMAINDER = 512  # the most tokens of one prompt run behind a prefix (an item)
Need = tuple[int, tuple[int, ...], int, tuple[Any, ...]]  # (block, tokens, top_k, prefix key)


@dataclass(frozen=True)
class CachedPrompt:
    """A prefix in the query cache: its keys/values on one data block, the hidden states at
    its block ends (device -> ``[1, n / PREFIX_BLOCK, D]``), and the log-prob of each of its
    tokens and the top-k after each (row j: after ``tokens[:j]``; row 0 unused)."""

    tokens: tuple[int, ...]
    entry: PrefixEntry
    states: dict[Any, jax.Array]
    token_logprobs: np.ndarray  # [n]
    top_ids: np.ndarray  # [n, k]
    top_logprobs: np.ndarray  # [n, k]
    extra_bytes: int

    @property
    def nbytes(self) -> int:
        return self.entry.nbytes + self.extra_bytes

    @property
    def top_k(self) -> int:
        return self.top_ids.shape[1]

    def read(self, reused: int, width: int) -> PrefixEntry:
        """The entry a stream row reading the first ``reused`` tokens sees at ``width``."""
        entry = self.entry
        keys = {d: fit_width(a, width) for d, a in entry.keys.items()}
        values = {d: fit_width(a, width) for d, a in entry.values.items()}
        block = reused // PREFIX_BLOCK - 1
        last = {d: s[:, block] for d, s in self.states.items()}  # [1, D]
        return PrefixEntry(keys, values, last, reused, width, entry.block, entry.nbytes)


@dataclass(frozen=True)
class Unit:
    """Prompts of one work behind one prefix, run in one stream row on ``block``."""

    work: int
    members: tuple[int, ...]
    items: tuple[tuple[int, ...], ...]
    reused: int
    block: int
    top_k: int
    source: CachedPrompt | None = None
    prefix: tuple[int, ...] = ()  # a prefix to compute (when source is None and reused > 0)
    owner: tuple[int, ...] = ()  # who alone reads the prefix (prefix_reuse off), else ()

    @property
    def prefix_key(self) -> tuple[Any, ...]:
        """One computed prefix per key: the tokens on a data block (and its only reader)."""
        return (self.prefix, self.block, self.owner)

    @property
    def size(self) -> int:
        return sum(len(item) for item in self.items)


def packed_units(
    w: int, work: PromptWork, lone: Sequence[int], capacity: int, top_k: int, load: list[int]
) -> list[Unit]:
    """Prompts ``lone`` run whole (no prefix), as many per stream row as ``capacity`` holds,
    each row on the least loaded data block."""
    items = [tuple(work.prompts[i]) for i in lone]
    units = []
    for start, end in chunk_members(items, capacity):
        block = least_loaded(load)
        units.append(Unit(w, tuple(lone[start:end]), tuple(items[start:end]), 0, block, top_k))
        load[block] += 1
    return units


def block_chunks(
    needs: Sequence[Any], groups: int, per_block: int, block_of: Any = None
) -> Iterator[tuple[list[Any], int]]:
    """``needs`` in steps holding at most ``per_block`` of each data block's, each with how
    many its fullest block holds (``block_of``: a need's block, default its first field)."""
    pending = list(needs)
    while pending:
        counts, step, rest = [0] * groups, [], []
        for need in pending:
            block = block_of(need) if block_of else need[0]
            if counts[block] < per_block:
                counts[block] += 1
                step.append(need)
            else:
                rest.append(need)
        yield step, max(counts)
        pending = rest
