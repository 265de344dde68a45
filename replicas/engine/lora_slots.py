"""The engine's LoRA adapter slots (semantics 21): which adapter holds which slot, the
stacked A/B arrays on the mesh, and works tagged with their adapter's slot.

Slot 0 is the base model (zeros); slots 1..max_loras hold adapters. Loading an adapter writes
its slot in the host copy of the stacks and places the changed arrays on the mesh with the
shardings every step was compiled for: no step compiles again. A work names its adapter;
``tag`` rewrites its token ids to ``slot * V + id`` (and a stacked head's label ids to
``slot * L + label``), how the slot reaches every layout and keys every cache by adapter
(``replicas.model.lora``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from cluster.sharding import tree_shardings
from replicas.checkpoints.adapters import LoraAdapter, load_adapter
from replicas.contract import EmbedWork, PromptWork, ScoreWork
from replicas.errors import Reason, ScoringError
from replicas.model.lora import has_head_slots, lora_logical_axes, lora_shapes
from replicas.model.protocol import Params, ScoringModel
from replicas.settings import AdapterSettings

Work = ScoreWork | PromptWork | EmbedWork


class AdapterSlots:
    """``max_loras`` adapter slots beside the base weights, on ``mesh``."""

    def __init__(
        self, model: ScoringModel, params: Params, mesh: Mesh, max_loras: int, max_rank: int
    ) -> None:
        config = model.config
        self._config, self._max_rank = config, max_rank
        self._vocab = config.vocab_size
        self._count = max_loras + 1  # slot 0: the base model
        shapes = lora_shapes(config, self._count, max_rank)
        self._shardings = tree_shardings(lora_logical_axes(config), shapes, mesh)
        dtype = np.dtype(model.dtype)
        self._host: dict[str, Any] = jax.tree_util.tree_map(
            lambda shape: np.zeros(shape, dtype), shapes, is_leaf=lambda n: isinstance(n, tuple)
        )
        self._labels = config.head.num_labels if has_head_slots(config) else 0
        if self._labels:
            self._base_head = np.asarray(params["head"]["score"], dtype)  # [D, L]
            self._host["head"]["score"][:] = self._base_head
        self._slots: dict[str, int] = {}  # adapter name -> slot
        self._device = self._place(self._host)

    @property
    def names(self) -> tuple[str, ...]:
        """Loaded adapters, in slot order."""
        return tuple(sorted(self._slots, key=self._slots.__getitem__))

    @property
    def params(self) -> Params:
        """``params["lora"]``: the stacks on the mesh."""
        return self._device

    def _place(self, host: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda array, sharding: jax.make_array_from_callback(
                array.shape, sharding, lambda index: array[index]
            ),
            host,
            self._shardings,
        )

    def load(self, name: str, path: str) -> int:
        """Read the adapter at ``path`` into a free slot (AdapterError naming it when it
        does not fit the base, ValueError when every slot is taken); returns its slot."""
        if name in self._slots:
            raise ValueError(f"lora adapter {name!r}: already loaded (unload it first)")
        free = [s for s in range(1, self._count) if s not in self._slots.values()]
        if not free:
            raise ValueError(
                f"lora adapter {name!r}: all max_loras={self._count - 1} slots hold adapters "
                f"({', '.join(self.names)})"
            )
        adapter = load_adapter(name, path, self._config, self._max_rank)
        slot = free[0]
        self._write(slot, adapter)
        self._slots[name] = slot
        return slot

    def unload(self, name: str) -> None:
        """Free ``name``'s slot (zeros: a stale tag would read the base model)."""
        self._write(self._slots.pop(name), None)

    def _write(self, slot: int, adapter: LoraAdapter | None) -> None:
        layers = self._host["layers"]
        for target, pair in layers.items():
            pair["a"][:, slot] = 0
            pair["b"][:, slot] = 0
            if adapter is not None and target in adapter.a:
                rank = adapter.rank
                pair["a"][:, slot, ..., :rank] = adapter.a[target]
                pair["b"][:, slot, :rank] = adapter.b[target]
        if self._labels:
            head = adapter.head if adapter is not None else None
            self._host["head"]["score"][slot] = self._base_head if head is None else head
        self._device = self._place(self._host)

    # -- works ----------------------------------------------------------------------------

    def slot_of(self, name: str | None) -> int:
        """The slot a work's ``adapter`` names (0: none); an unknown name is refused."""
        if name is None:
            return 0
        if name not in self._slots:
            raise ScoringError(Reason.MODEL_NOT_FOUND, f"model {name!r}: no such LoRA adapter")
        return self._slots[name]

    def tag(self, work: Work) -> Work:
        """``work`` with every token id tagged by its adapter's slot (unchanged: slot 0)."""
        slot = self.slot_of(work.adapter)
        if slot == 0:
            return work
        offset = slot * self._vocab

        def ids(tokens: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(offset + t for t in tokens)

        if isinstance(work, PromptWork):
            return dataclasses.replace(work, prompts=tuple(map(ids, work.prompts)))
        if isinstance(work, EmbedWork):
            return dataclasses.replace(work, inputs=tuple(map(ids, work.inputs)))
        labels = work.label_ids
        if self._labels:  # a stacked head: the slot's own outputs
            labels = tuple(slot * self._labels + label for label in labels)
        return dataclasses.replace(
            work,
            query_ids=ids(work.query_ids),
            item_ids=tuple(map(ids, work.item_ids)),
            label_ids=labels,
        )


def refuse_without_slots(work: Work) -> None:
    """LoRA off: any adapter name is unknown."""
    if work.adapter is not None:
        message = f"model {work.adapter!r}: no such model (no LoRA adapters served)"
        raise ScoringError(Reason.MODEL_NOT_FOUND, message)


def start_slots(
    model: ScoringModel, params: Params, mesh: Mesh, adapters: AdapterSettings, name: str
) -> AdapterSlots | None:
    """The configured slots with ``lora_adapters`` loaded (None: ``max_loras`` 0); an
    adapter that does not fit the base fails start-up naming it."""
    if not adapters.max_loras:
        return None
    slots = AdapterSlots(model, params, mesh, adapters.max_loras, adapters.max_lora_rank)
    for adapter, path in adapters.lora_adapters:
        if adapter == name:
            raise ValueError(f"lora_adapters: {adapter!r} is the base model's own name")
        slots.load(adapter, path)
    return slots
