"""The engine section: layouts, attention kernels, the bucket ladders a step's signature is
padded to, and how signatures compile and are kept. Jax-free."""

from __future__ import annotations

from dataclasses import dataclass

from replicas.settings.common import SettingsError, bucket_ladder, check_buckets, check_choice

LAYOUTS = ("shared_prefix", "packed_reference")
ATTENTION = ("auto", "xla", "pallas", "cudnn")
LAYER_LOOPS = ("scan", "unrolled", "auto")


@dataclass(frozen=True)
class EngineSettings:
    """How the engine lays out, pads, compiles and caches a replica's steps."""

    layout: str = "shared_prefix"
    """shared_prefix (the query's keys/values once, items after it) or packed_reference
    (RFC-008's packed row with a dense mask)."""
    attention: str = "auto"
    """Attention kernels (replicas.model.attention): auto picks Pallas item-stream kernels on
    TPU, cuDNN flash attention for causal rows on GPU in bf16/fp16, XLA otherwise; or forced.
    Pallas off TPU runs in interpret mode (slow; for tests)."""
    layer_loop: str = "scan"
    """How a decoder's steps loop over its layers (replicas.model.layer_loop): scan (the
    layer compiled once, over weights stacked on a leading axis), unrolled (one array per
    layer, every layer's ops in each step: no per-step copy of each layer's weights out of the
    stack, which XLA:CPU makes; the same results; each step compiles every layer's ops, so
    warm-up takes several times longer, cached like any) or auto (on a CPU, the stack and a
    copy of it as one array per layer, twice the layer weights' memory: steps of at most 64
    tokens, where the copies weigh most, run unrolled over the copy and larger ones scan the
    stack, so only small steps compile every layer's ops; scan on an accelerator). Encoders
    always scan."""
    token_buckets: tuple[int, ...] = bucket_ladder(16, 8192)
    """Token rows: query (prefix) lengths T, single-item rows' length L (``query + item``),
    packed reference and fused rows: a geometric ladder, ~1.125x apart."""
    item_token_buckets: tuple[int, ...] = bucket_ladder(16, 8192)
    """Item-stream tokens S of a step: items end to end (also prompt and embedding streams).
    A single-item step's R rows of L tokens hold R * L up to the largest of these within
    item_tokens_per_step times the largest batch bucket (layouts/single_item.py)."""
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Requests (or row units) per step."""
    item_tokens_per_step: int = 2048
    """Items beyond this many stream tokens run in further steps behind the same query."""
    fused_step_tokens: int = 0
    """A multi-item work whose query and items together fit this many tokens runs in one
    pass, query and items in one row (replicas/engine/layouts/fused.py), concurrent ones back
    to back in it, instead of a prefix step then an item-stream step; 0 = off. Rows fill up to
    the largest token_buckets entry within it. Pays where a pass costs a weight read whatever
    its tokens (CPU)."""
    query_cache_bytes: int = 256 * 1024 * 1024
    """Query cache (semantics 9): bytes of per-layer prefix keys/values kept, LRU; 0 = off."""
    prefix_reuse: bool = True
    """Prefix reuse (semantics 15): /v1/completions prompts of a request that share whole
    blocks compute their prefix once, and the query cache serves the longest cached prefix
    (to prompts, and to /v1/score and /v1/rerank queries that start with a cached one's
    blocks). False computes every prompt whole and keeps only exact query hits (the
    benchmark's "reuse off"; answers are the same)."""
    background_compile: bool = True
    """Serve an uncompiled signature on a covering compiled one while it compiles in the
    background; False compiles on the request path instead."""
    max_traffic_signatures: int = 32
    """Signatures compiled after the configured warm-up (traffic's own shapes) kept at most
    (about 4 MiB each on CPU; 0 = unbounded), the least valuable (decayed uses x compute
    saved over the covering signature) dropped first; a shape compiles once it recurs, and
    at the bound only when it runs >= 1.25x padded and is worth 2x the least valuable."""
    compilation_cache_dir: str | None = None
    """Persistent XLA cache, plus a record of every signature compiled, which the next start
    compiles again (a cache load); unset: none."""
    engine_niceness: int = 0
    """Niceness of the replica's compute threads (the engine's steps, compiles and the thread
    pools jax starts for them; cluster/niceness.py): above 0 they yield the CPU to the
    processes that answer and refuse requests (proxy, ingress) whenever those need it, so a
    refusal under overload is not queued behind a step; 0 = as the replica's process."""

    def __post_init__(self) -> None:
        check_choice("layout", self.layout, LAYOUTS)
        check_choice("attention", self.attention, ATTENTION)
        check_choice("layer_loop", self.layer_loop, LAYER_LOOPS)
        for name in ("token_buckets", "item_token_buckets", "batch_buckets"):
            check_buckets(name, getattr(self, name))
        if self.item_tokens_per_step < self.item_token_buckets[0]:
            raise SettingsError(
                f"item_tokens_per_step: must be >= the smallest item_token_buckets entry "
                f"{self.item_token_buckets[0]}, got {self.item_tokens_per_step}"
            )
        if self.fused_step_tokens and self.fused_step_tokens < self.token_buckets[0]:
            raise SettingsError(
                f"fused_step_tokens: must be 0 (off) or >= the smallest token_buckets entry "
                f"{self.token_buckets[0]}, got {self.fused_step_tokens}"
            )
        if self.max_traffic_signatures < 0:
            raise SettingsError(
                f"max_traffic_signatures: must be >= 0 (0 = unbounded), "
                f"got {self.max_traffic_signatures}"
            )
        if self.query_cache_bytes < 0:
            raise SettingsError(f"query_cache_bytes: must be >= 0, got {self.query_cache_bytes}")
        if not 0 <= self.engine_niceness <= 19:
            raise SettingsError(f"engine_niceness: must be in [0, 19], got {self.engine_niceness}")

    @property
    def longest_row(self) -> int:
        """The most tokens a query, an item, a single-item row or a prompt may hold: the
        largest bucket both ladders have."""
        return min(self.token_buckets[-1], self.item_token_buckets[-1])
