"""Host-side planning of prompt log-likelihood work: which prefix each prompt reads.

Prompts of one request that share a prefix are grouped (sorted, so sharing prompts are
neighbours); a group's prefix is their common prefix, cut to whole blocks of
``PREFIX_BLOCK`` tokens and to one token short of its shortest prompt, so every prompt
keeps at least one token to score after it. The prefix runs once; each prompt's remaining
tokens run as an item behind it, scored at every token. Pure Python, no jax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def block_floor(length: int, block: int) -> int:
    return length // block * block


@dataclass(frozen=True)
class PromptGroup:
    """Prompts ``members`` (indices into the work's prompts) behind one prefix of
    ``prefix_length`` tokens (0: none, each prompt runs whole)."""

    members: tuple[int, ...]
    prefix_length: int


def group_prompts(
    prompts: Sequence[Sequence[int]], block: int, max_remainder: int
) -> list[PromptGroup]:
    """Groups of prompts sharing whole blocks, each member's remainder (its tokens after the
    prefix) at most ``max_remainder`` tokens where a prefix allows it."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    groups: list[PromptGroup] = []
    members: list[int] = []
    shared = 0
    for i in order:
        if members:
            common = min(shared, common_length(prompts[members[0]], prompts[i]))
            joined = [*members, i]
            length = prefix_length(prompts, joined, common, block)
            if length >= block and all(len(prompts[j]) - length <= max_remainder for j in joined):
                members, shared = joined, common
                continue
            groups.append(
                PromptGroup(tuple(members), prefix_length(prompts, members, shared, block))
            )
        members, shared = [i], len(prompts[i])
    if members:
        groups.append(PromptGroup(tuple(members), prefix_length(prompts, members, shared, block)))
    return groups


def alone(prompts: Sequence[Sequence[int]], block: int) -> list[PromptGroup]:
    """Every prompt in a group of its own, behind its own whole blocks (no sharing)."""
    return [
        PromptGroup((i,), block_floor(len(prompt) - 1, block)) for i, prompt in enumerate(prompts)
    ]


def split_lone(
    prompts: Sequence[Sequence[int]],
    groups: Sequence[PromptGroup],
    max_whole: int,
    keep_prefixes: bool = False,
) -> tuple[list[PromptGroup], list[int]]:
    """``groups`` less the one-member groups whose prompt is at most ``max_whole`` tokens
    (an item runs no longer), and those prompts' indices, in order. ``keep_prefixes``: a
    lone prompt with a prefix of whole blocks keeps it (computed and cached for a later
    request that shares it); one shorter than a block has none to keep and is packed too."""
    kept, lone = [], []
    for group in groups:
        (first, *others) = group.members
        cached = keep_prefixes and group.prefix_length > 0
        if others or cached or len(prompts[first]) > max_whole:
            kept.append(group)
        else:
            lone.append(first)
    return kept, sorted(lone)


def prefix_length(
    prompts: Sequence[Sequence[int]], members: Sequence[int], shared: int, block: int
) -> int:
    """Whole blocks of the members' ``shared`` prefix, one token short of the shortest."""
    shortest = min(len(prompts[i]) for i in members)
    return block_floor(min(shared, shortest - 1), block)


def reuse_pays(reused: int, prefix: int, members: int) -> bool:
    """Whether reading ``reused`` cached tokens and running the rest of a ``prefix``-token
    prefix once per member costs less than computing the whole prefix once."""
    return reused == prefix or (reused > 0 and members * (prefix - reused) < prefix)


def chunk_members(items: Sequence[Sequence[int]], capacity: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` runs of items, each at most ``capacity`` tokens (a longer
    single item gets a run of its own)."""
    runs, start, size = [], 0, 0
    for n, item in enumerate(items):
        if n > start and size + len(item) > capacity:
            runs.append((start, n))
            start, size = n, 0
        size += len(item)
    if items:
        runs.append((start, len(items)))
    return runs


def least_loaded(load: list[int]) -> int:
    """The data block with the fewest units so far (the first on ties)."""
    return min(range(len(load)), key=lambda block: load[block])
