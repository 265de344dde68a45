"""The scoring engine: token-id work in, label log-probabilities out.

It takes a ``model.protocol.ScoringModel``, builds the layouts (``layouts.contract.Layout``)
its kind's steps use, validates work and hands each layout the works it selects (which works
each takes: ``layouts.contract``; a decoder's small multi-item works run fused, with
``fused_step_tokens``). It implements what layouts need to run (``layouts.runner.Runner``):
compiled steps by signature (``compiler.StepCompiler``, with covering look-ups and
background compiles), the query cache, arguments placed on the mesh, and counters. Returns
per work a float32 ``[items, labels]`` array, a list of PromptLogprobs, or float32
``[inputs, dimension]`` vectors.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from cluster.mesh import build_mesh
from replicas.answers import Answer, answered
from replicas.contract import EmbedWork, ModelInfo, PromptWork, ScoreWork
from replicas.engine.compiler import StepCompiler
from replicas.engine.layouts.contract import Layout, multi_item
from replicas.engine.layouts.embed import EmbedLayout, vector_width
from replicas.engine.layouts.packed_reference import PackedReferenceLayout
from replicas.engine.layouts.prompts import PromptLayout
from replicas.engine.layouts.runner import Placement
from replicas.engine.layouts.shared_prefix import SharedPrefixLayout
from replicas.engine.layouts.single_item import SingleItemLayout
from replicas.engine.lora_slots import AdapterSlots, refuse_without_slots, start_slots
from replicas.engine.memory import release_free_heap
from replicas.engine.query_cache import QueryCache
from replicas.engine.signature_record import record_identity, record_path
from replicas.engine.warm_coverage import (
    check_warm_coverage,
    completion_shapes_for,
    covered,
    full_step_keys,
    warmup_prompts,
    warmup_works,
)
from replicas.engine.work_checks import validate_work
from replicas.engine_contract import EngineStats
from replicas.errors import Reason, ScoringError
from replicas.model.attention import mesh_platform, with_attention
from replicas.model.causal_lm import Params
from replicas.model.layer_loop import layers_for_loop
from replicas.model.protocol import DecoderModel, ScoringModel
from replicas.model.token_split import token_split
from replicas.settings import ReplicaSettings, check_delimiter_in_vocab

__all__ = ["ScoringEngine", "configure_compilation_cache"]


def configure_compilation_cache(directory: str | None) -> None:
    """Point jax's persistent compilation cache at ``directory`` (process-wide)."""
    if directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


class ScoringEngine:
    """Owns model parameters on a mesh, the layouts, their compiled steps and the cache."""

    def __init__(
        self, model: ScoringModel, params: Params, mesh: Mesh, settings: ReplicaSettings,
        name: str, dense: Sequence[Any] = (),
    ) -> None:  # fmt: skip
        """``dense``: an embedding model's Dense layers (``replicas.checkpoints.dense``)."""
        vocab = model.config.vocab_size
        check_delimiter_in_vocab(settings.model, vocab, name)
        model = with_attention(model, settings.engine.attention, mesh)
        model = dataclasses.replace(model, lora_groups=int(mesh.shape["data"]))
        self._lora = start_slots(model, params, mesh, settings.adapters, name)
        if self._lora is not None:  # the stacks ride in params: loading one compiles nothing
            params = {**params, "lora": self._lora.params}
        if model.decoder:  # its residual stream split by tokens, its layers as layer_loop says
            split = token_split(model.config.quantization, mesh)
            model = dataclasses.replace(model, token_split=split)
            params = layers_for_loop(params, settings.engine.layer_loop, mesh_platform(mesh))
        self._model, self._params, self._settings = model, params, settings
        delimiter, c = settings.model.multi_item_scoring_delimiter, model.config
        adapters = () if self._lora is None else self._lora.names
        self._info = ModelInfo(name, vocab, delimiter, settings.limits, c.head, c.pooling, adapters)
        model_kind = self._info.model_kind
        self._completion_shapes = completion_shapes_for(settings.warmup, model_kind.lm_head, name)
        self._placement = Placement(mesh)
        self._cache = QueryCache(settings.engine.query_cache_bytes)
        self._lock = threading.Lock()  # one score_batch at a time
        self._counters = {
            "steps": 0,
            "computed_tokens": 0,
            "useful_tokens": 0,
            "prompt_tokens": 0,  # /v1/completions prompts' tokens:
            "reused_prefix_tokens": 0,  # read from a shared or cached prefix
            "computed_prompt_tokens": 0,  # computed (padding not counted)
        }
        self._engine_seconds = 0.0
        self.last_signatures: list[tuple[str, Any]] = []  # what the last score_batch ran
        # Only the layouts its kind's steps use, in the order they score a batch (and plan
        # one): embed steps (an embedding model, a cross-encoder, any encoder), or a decoder's.
        embeds = model_kind.embeds or not model.decoder
        self._embed = EmbedLayout(model, self, dense) if embeds else None
        self._layouts = (self._embed,) if self._embed else self._decoder_layouts(model)
        owners = step_owners(self._layouts)
        identity = record_identity(name, model, params, mesh, settings)  # the record's owner
        self._compiler = StepCompiler(
            lambda kind, dims: owners[kind].compile(kind, dims),
            {kind: layout.kinds[kind] for kind, layout in owners.items()},
            background=settings.engine.background_compile,
            record=record_path(settings.engine.compilation_cache_dir, identity),
            gated=settings.placement.hosts_per_replica > 1,
            max_traffic=settings.engine.max_traffic_signatures,
        )
        if settings.warmup.limit_to_warmup and not embeds:  # before minutes of compiles
            check_warm_coverage(settings, self.plan, self._configured_keys())

    def _decoder_layouts(self, model: DecoderModel) -> tuple[Layout, ...]:
        """A decoder's multi-item (shared-prefix or packed reference), single-item, prompts."""
        packed = self._settings.engine.layout == "packed_reference"
        self._multi = (PackedReferenceLayout if packed else SharedPrefixLayout)(model, self)
        self._prompts = PromptLayout(model, self)
        return self._multi, SingleItemLayout(model, self), self._prompts

    @classmethod
    def from_settings(cls, settings: ReplicaSettings, warm: bool = True) -> ScoringEngine:
        """Load the configured model onto its mesh (every visible device of every host when
        ``hosts_per_replica`` > 1) and, with ``warm``, compile the configured shapes."""
        from replicas.checkpoints.loading import load_configured

        configure_compilation_cache(settings.engine.compilation_cache_dir)
        mesh = build_mesh(settings.placement.mesh_shape)
        spec = settings.model
        loaded, dense = load_configured(
            spec.name, mesh, spec.dtype, spec.pooling, spec.normalize, spec.quantization
        )
        engine = cls(loaded.model, loaded.params, mesh, settings, spec.name, dense)
        if warm:
            engine.warmup()
        return engine

    @property
    def model(self) -> ScoringModel:
        return self._model

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def compile_count(self) -> int:
        """Executables compiled so far; a signature never compiles twice."""
        return len(self._compiler)

    def stats(self) -> EngineStats:
        """The counters (one that EngineStats has no field for: a TypeError here)."""
        counts = self._compiler.counts
        return EngineStats(
            compile_count=self.compile_count,
            warmup_compiles=counts["warmup"],
            request_path_compiles=counts["request_path"],
            background_compiles=counts["background"],
            evicted_signatures=counts["evicted"],
            declined_background_compiles=counts["declined"],
            **{name: n for name, n in counts.items() if name.startswith(("evicted_", "declined_"))},
            background_pending=self._compiler.pending,
            **self._counters,
            engine_seconds=round(self._engine_seconds, 6),
            **self._cache.stats(),
        )

    def check_health(self) -> None:
        """Nothing to check: one process, whose failures its steps raise."""

    def executables(self) -> dict[tuple[str, Any], Any]:
        """Compiled steps by ``(kind, dims)`` (``jax.stages.Compiled``: memory and cost
        analysis for deviceless checks, ``planning.tpu_check``)."""
        return self._compiler.executables()

    def wait_for_background_compiles(self, timeout_s: float = 600.0) -> bool:
        return self._compiler.wait_idle(timeout_s)

    # -- validation ---------------------------------------------------------------------

    def validate(self, work: ScoreWork | PromptWork | EmbedWork) -> None:
        """Raise ScoringError for work that must not run."""
        multi = isinstance(work, ScoreWork) and multi_item(self._settings, work)
        validate_work(work, self._info, multi)
        if self._lora is None:
            refuse_without_slots(work)
        else:
            self._lora.slot_of(work.adapter)

    def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter into a free slot between steps (compiles nothing)."""
        self._swap_adapter(lambda slots: slots.load(name, path))

    def unload_adapter(self, name: str) -> None:
        """Free ``name``'s slot between steps (KeyError when none holds it)."""
        self._swap_adapter(lambda slots: slots.unload(name))

    def _swap_adapter(self, change: Callable[[AdapterSlots], Any]) -> None:
        if self._lora is None:
            message = "max_loras: 0, this replica serves no LoRA adapters"
            raise ScoringError(Reason.INVALID_REQUEST, message)
        with self._lock:
            change(self._lora)
            # A freed slot's next adapter tags ids as the old one did: no cached entry survives.
            self._cache.clear()
            self._params = {**self._params, "lora": self._lora.params}
            self._info = dataclasses.replace(self._info, adapters=self._lora.names)

    # -- scoring ------------------------------------------------------------------------

    def _route(self, works: Sequence[Any]) -> list[tuple[Layout, list[Any]]]:
        """Each layout with what it selects of ``works`` (layouts selecting nothing left
        out), in scoring order."""
        routed = [(layout, layout.select(works)) for layout in self._layouts]
        return [(layout, selected) for layout, selected in routed if selected]

    def score_batch(self, works: Sequence[ScoreWork | PromptWork | EmbedWork]) -> list[Answer]:
        """Per work, in order, its ``answer`` (replicas.answers): a ScoreWork's float32
        ``[items, labels]`` log-probs, a PromptWork's PromptLogprobs (one per prompt), an
        EmbedWork's float32 ``[inputs, dimension]`` vectors."""
        for work in works:
            self.validate(work)
        width = vector_width(self._info)
        results: list[Any] = [w.empty_answer(width) for w in works]
        routed = self._route(works)
        with self._lock:
            if self._lora is not None:  # each work's token ids carry its adapter's slot
                works = [self._lora.tag(work) for work in works]
            self.last_signatures = []
            start = time.perf_counter()
            try:
                for layout, selected in routed:  # tagging changes no selection
                    layout.score(works, selected, results)
            finally:
                self._engine_seconds += time.perf_counter() - start
        return [answered(w, r) for w, r in zip(works, results, strict=True)]

    def warmup(self, shapes: Sequence[tuple[int, int, int, int]] | None = None) -> int:
        """Compile ``warmup_keys(shapes)``; returns how many executables were compiled."""
        return self.compile_keys(self.warmup_keys(shapes))

    def warmup_keys(
        self, shapes: Sequence[tuple[int, int, int, int]] | None = None
    ) -> list[tuple[str, Any]]:
        """The ``max_traffic_signatures`` most valuable recorded signatures, then every
        signature that synthetic work of each (query_tokens, items, item_tokens, labels)
        shape would run, once per ``warmup_batch_sizes`` entry (multi-item mode: also its
        ``item_first`` form)."""
        configured = self._configured_keys(shapes)
        recorded = [key for key in self._compiler.recorded() if key not in configured]
        limit = self._settings.engine.max_traffic_signatures
        return list(dict.fromkeys(recorded[: limit or None] + configured))

    def _configured_keys(
        self, shapes: Sequence[tuple[int, int, int, int]] | None = None
    ) -> list[tuple[str, Any]]:
        if self._embed is not None:  # an embedding model runs only embedding steps
            return self._embed.warmup_keys()
        keys: list[tuple[str, Any]] = []
        for batch_size in self._settings.warmup.warmup_batch_sizes:
            for work in warmup_works(self._settings, shapes or self._settings.warmup_shapes):
                keys += self.plan([work] * batch_size)
            if not shapes:
                prompts = warmup_prompts(self._completion_shapes)
                keys += self.plan([work for work in prompts for _ in range(batch_size)])
        labels = max((shape[3] for shape in shapes or self._settings.warmup_shapes), default=0)
        if labels and isinstance(self._multi, SharedPrefixLayout):
            keys += self._multi.fused.warm_keys(labels)  # every small work's one pass
        if self._settings.warmup.limit_to_warmup and not shapes:
            keys += [k for k in full_step_keys(self._settings, self.plan) if not covered(k, keys)]
            full = self._prompts.full_keys(self._completion_shapes)
            keys += [k for k in full if not covered(k, keys)]
        return list(dict.fromkeys(keys))

    def plan(self, works: Sequence[ScoreWork | PromptWork]) -> list[tuple[str, Any]]:
        """The exact signatures scoring ``works`` as one batch would run (prompt works: as
        if nothing were cached)."""
        return [
            key for layout, selected in self._route(works) for key in layout.plan(works, selected)
        ]

    def compile_keys(self, keys: Sequence[tuple[str, Any]]) -> int:
        """Compile ``(kind, dims)`` signatures at start-up (nothing is scored). The configured
        warm-up's are kept for good; others (replayed from the record) count as traffic's,
        which ``max_traffic_signatures`` bounds; one that fails to build is skipped."""
        before = self.compile_count
        configured = set(self._configured_keys())
        recorded = set(self._compiler.recorded()) - configured
        for kind, dims in keys:
            if (kind, dims) in recorded:
                self._compiler.replay(kind, dims)
            else:
                self._compiler.ensure(kind, dims, "warmup", keep=(kind, dims) in configured)
        release_free_heap()  # the compiles' transient memory (replicas/engine/memory.py)
        return self.compile_count - before

    def held_signatures(self) -> list[tuple[str, Any]]:
        """Background compiles done on this host, not yet usable (host groups)."""
        return self._compiler.held()

    def publish(self, keys: Sequence[tuple[str, Any]]) -> None:
        """Make held signatures usable; every host of a group publishes the same keys at the
        same step."""
        self._compiler.publish(list(keys))

    # -- Runner (what layouts call) -----------------------------------------------------

    @property
    def settings(self) -> ReplicaSettings:
        return self._settings

    @property
    def cache(self) -> QueryCache:
        return self._cache

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def params(self) -> Params:
        """The parameters as the executables take them (``layer_loop`` decides the layers'
        form: with ``auto`` on a CPU, a per-layer copy beside the stack)."""
        return self._params

    def lower(self, step: Callable[..., Any], specs: tuple[Any, ...]) -> Any:
        return step.lower(self._params, *specs).compile()

    def ensure(self, kind: str, dims: Any) -> None:
        self._compiler.ensure(kind, dims)

    def resolve(self, kind: str, dims: Any) -> Any:
        return self._compiler.resolve(kind, dims)

    def compiled(self, kind: str, dims: Any) -> Any | None:
        return self._compiler.compiled(kind, dims)

    def compiles_now(self, kind: str, dims: Any) -> bool:
        return self._compiler.compiles_now(kind, dims)

    def compile_later(self, kind: str, dims: Any) -> None:
        self._compiler.compile_later(kind, dims)

    def run_device(self, kind: str, dims: Any, args: tuple[Any, ...]) -> Any:
        executable = self._compiler.executable(kind, dims)
        (_, *shardings), _ = executable.input_shardings  # params first
        fallback = self._placement.replicated
        placed = jax.tree.map(partial(place, fallback=fallback), args, tuple(shardings))
        self._counters["steps"] += 1
        self.last_signatures.append((kind, dims))
        return executable(self._params, *placed)

    def count_tokens(self, computed: int, useful: int) -> None:
        self._counters["computed_tokens"] += computed
        self._counters["useful_tokens"] += useful

    def count_prompt_tokens(self, computed: int, reused: int) -> None:
        self._counters["prompt_tokens"] += computed + reused
        self._counters["computed_prompt_tokens"] += computed
        self._counters["reused_prefix_tokens"] += reused


def step_owners(layouts: Sequence[Layout]) -> dict[str, Layout]:
    """The layout that compiles each step kind: the first declaring it. Layouts sharing a
    kind declare the same dims type (they compile it alike, ``stream.compile_prefix`` /
    ``compile_stream``)."""
    owners: dict[str, Layout] = {}
    for layout in layouts:
        for kind, dims_type in layout.kinds.items():
            owner = owners.setdefault(kind, layout)
            if owner.kinds[kind] is not dims_type:
                raise TypeError(f"step kind {kind}: {owner} and {layout} declare other dims")
    return owners


def place(value: Any, sharding: Any, fallback: Any) -> Any:
    """A host array onto the mesh as the executable expects it; each process puts only the
    shards its own devices hold (a host group's hosts each place their part). An argument the
    compiled step never reads reports no sharding; it is placed replicated."""
    if isinstance(value, np.ndarray):
        where = sharding if isinstance(sharding, jax.sharding.Sharding) else fallback
        return jax.make_array_from_callback(value.shape, where, lambda index: value[index])
    return value
