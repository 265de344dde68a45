"""What every layout is to the engine (``Layout``), and which works each layout takes.

A layout declares the step kinds it runs (``kinds``: kind -> its frozen dims type, the
compiled signature), takes its part of a batch of works (``select``), and for that part
plans (the exact signatures a cold call would run, nothing compiled), compiles a signature
of one of its kinds, and scores (packs, runs and unpacks into ``results``). The engine
dispatches through this and nothing else (``ScoringEngine._route``); what a layout needs
from the engine is ``runner.Runner``. Several layouts may run one kind (the shared-prefix
and prompt layouts both run ``prefix`` and ``items``), each declaring the same dims type and
compiling it alike (``stream.compile_prefix``, ``stream.compile_stream``).
``tests/unit/test_layout_contract.py`` checks every layout class against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from replicas.contract import PromptWork, ScoreWork
from replicas.settings import ReplicaSettings

Key = tuple[str, Any]  # (kind, dims): one compiled signature


class Layout(Protocol):
    kinds: ClassVar[Mapping[str, type]]

    def select(self, works: Sequence[Any]) -> list[Any]:
        """What of ``works`` this layout scores (work indices, or (work, item) pairs), in
        the order it scores them; empty: none."""
        ...

    def plan(self, works: Sequence[Any], selected: Sequence[Any]) -> list[Key]:
        """The exact signatures ``score`` would run for ``selected`` with nothing cached."""
        ...

    def compile(self, kind: str, dims: Any) -> Any:
        """The step ``(kind, dims)`` compiled ahead of time (through the runner)."""
        ...

    def score(self, works: Sequence[Any], selected: Sequence[Any], results: list) -> None:
        """Score ``selected`` and fill its works' entries of ``results``."""
        ...


def multi_item(settings: ReplicaSettings, work: ScoreWork) -> bool:
    """Multi-item layouts serve query-first work; item_first goes through single-item."""
    return settings.model.multi_item and not work.item_first


def multi_item_works(settings: ReplicaSettings, works: Sequence[Any]) -> list[int]:
    """ScoreWork with items that a multi-item layout takes."""
    return [
        i
        for i, w in enumerate(works)
        if isinstance(w, ScoreWork) and multi_item(settings, w) and w.num_items
    ]


def single_item_pairs(settings: ReplicaSettings, works: Sequence[Any]) -> list[tuple[int, int]]:
    """(work, item) rows of the ScoreWork that the single-item layout takes."""
    return [
        (i, j)
        for i, w in enumerate(works)
        if isinstance(w, ScoreWork) and not multi_item(settings, w)
        for j in range(w.num_items)
    ]


def prompt_works(works: Sequence[Any]) -> list[int]:
    """PromptWork with prompts."""
    return [i for i, w in enumerate(works) if isinstance(w, PromptWork) and w.num_items]
