"""Prometheus metrics through ``ray.serve.metrics``: one table of every scorejax metric, a sink
that records into Ray's metric objects, and what a scoring replica records per engine step.

Ray's metrics agent exports them on each node's metrics export port with its own ``ray_``
namespace in front: ``scorejax_requests`` is scraped as ``ray_scorejax_requests_total``
(docs/operations.md, "Metrics"). Serve adds the ``deployment``, ``replica`` and
``application`` tags. Recording never raises: metrics must not fail a request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from replicas.engine.compiler import DECLINE_REASONS, EVICT_REASONS
from replicas.engine_contract import EngineStats

logger = logging.getLogger(__name__)

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)
RATIOS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "counter" | "histogram"
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()


METRICS = (
    # The ingress (app.metrics): one record per HTTP answer.
    MetricSpec("scorejax_requests", "counter", "HTTP answers by route, method, status and reason",
               ("route", "method", "status", "reason")),
    MetricSpec("scorejax_latency_seconds", "histogram",
               "Seconds per stage of a request: total, tokenize, queue, inference",
               ("route", "stage"), SECONDS),
    MetricSpec("scorejax_items_per_request", "histogram", "Items (documents) per scored request",
               ("route",), COUNTS),
    MetricSpec("scorejax_tokens_per_request", "histogram", "Prompt tokens per scored request",
               ("route",), TOKENS),
    # A scoring replica: one record per engine step.
    MetricSpec("scorejax_batch_size", "histogram", "Requests per engine step", (), COUNTS),
    MetricSpec("scorejax_step_seconds", "histogram", "Seconds per engine step", (), SECONDS),
    MetricSpec("scorejax_padding_ratio", "histogram",
               "Share of an engine step's computed tokens that are padding", (), RATIOS),
    MetricSpec("scorejax_compiles", "counter", "XLA compiles by source", ("source",)),
    MetricSpec("scorejax_declined_compiles", "counter",
               "Uncompiled shapes left on a covering signature, by reason", ("reason",)),
    MetricSpec("scorejax_evicted_signatures", "counter",
               "Compiled signatures dropped at max_traffic_signatures, by reason", ("reason",)),
    MetricSpec("scorejax_query_cache_hits", "counter", "Query prefix cache hits"),
    MetricSpec("scorejax_query_cache_misses", "counter", "Query prefix cache misses"),
    MetricSpec("scorejax_computed_tokens", "counter", "Tokens computed, padding included"),
    MetricSpec("scorejax_useful_tokens", "counter", "Tokens computed that were not padding"),
    MetricSpec("scorejax_prompt_tokens", "counter", "/v1/completions prompt tokens"),
    MetricSpec("scorejax_reused_prefix_tokens", "counter",
               "Prompt tokens read from a shared or cached prefix, not computed"),
    MetricSpec("scorejax_computed_prompt_tokens", "counter",
               "Prompt tokens computed (padding not counted)"),
)  # fmt: skip
SPECS = {spec.name: spec for spec in METRICS}
COMPILE_SOURCES = ("warmup", "request_path", "background")
# EngineStats fields recorded by reason: (metric, field prefix, reasons)
BY_REASON = (
    ("scorejax_declined_compiles", "declined_", DECLINE_REASONS),
    ("scorejax_evicted_signatures", "evicted_", EVICT_REASONS),
)
# EngineStats fields recorded as scorejax_<name> by how much each step grew them
STEP_COUNTERS = (
    "query_cache_hits",
    "query_cache_misses",
    "computed_tokens",
    "useful_tokens",
    "prompt_tokens",
    "reused_prefix_tokens",
    "computed_prompt_tokens",
)


class MetricSink(Protocol):
    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...


class RaySink:
    """Records into ``ray.serve.metrics`` objects, made once per process for ``names``."""

    def __init__(self, names: tuple[str, ...]) -> None:
        from ray.serve import metrics

        self._metrics: dict[str, Any] = {}
        for name in names:
            spec = SPECS[name]
            if spec.kind == "counter":
                metric = metrics.Counter(name, spec.description, spec.tag_keys)
            else:
                metric = metrics.Histogram(
                    name, spec.description, list(spec.boundaries), spec.tag_keys
                )
            self._metrics[name] = metric

    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        if value > 0:
            self._record(name, "inc", value, tags)

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._record(name, "observe", value, tags)

    def _record(self, name: str, method: str, value: float, tags: Mapping[str, str] | None) -> None:
        try:
            getattr(self._metrics[name], method)(value, tags=dict(tags or {}))
        except Exception:  # a metric must never fail the request it describes
            logger.exception("recording metric %s failed", name)


def step_deltas(before: EngineStats, after: EngineStats) -> dict[str, int]:
    """How much each engine counter grew between two ``engine.stats()`` snapshots (a name
    that is no EngineStats field raises AttributeError)."""
    names = [f"{source}_compiles" for source in COMPILE_SOURCES] + list(STEP_COUNTERS)
    names += [prefix + reason for _, prefix, reasons in BY_REASON for reason in reasons]
    return {name: int(getattr(after, name)) - int(getattr(before, name)) for name in names}


class ReplicaMetrics:
    """What a scoring replica records after each engine step."""

    NAMES = (
        "scorejax_batch_size",
        "scorejax_step_seconds",
        "scorejax_padding_ratio",
        "scorejax_compiles",
        *(metric for metric, _, _ in BY_REASON),
        *(f"scorejax_{name}" for name in STEP_COUNTERS),
    )

    def __init__(self, sink: MetricSink | None = None) -> None:
        self._sink = sink if sink is not None else RaySink(self.NAMES)
        self._last = EngineStats.zero()

    def after_step(self, batch_size: int, seconds: float, stats: EngineStats) -> None:
        """One engine step of ``batch_size`` requests; ``stats``: the engine's counters
        after it (the first step's growth is from zero: warm-up's compiles count)."""
        sink = self._sink
        sink.observe("scorejax_batch_size", batch_size)
        sink.observe("scorejax_step_seconds", seconds)
        grown = step_deltas(self._last, stats)
        self._last = stats
        for source in COMPILE_SOURCES:
            sink.count("scorejax_compiles", grown[f"{source}_compiles"], {"source": source})
        for name in STEP_COUNTERS:
            sink.count(f"scorejax_{name}", grown[name])
        for metric, prefix, reasons in BY_REASON:
            for reason in reasons:
                sink.count(metric, grown[prefix + reason], {"reason": reason})
        computed = grown["computed_tokens"]
        if computed > 0:
            sink.observe("scorejax_padding_ratio", 1 - grown["useful_tokens"] / computed)
