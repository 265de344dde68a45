"""What the ingress records per HTTP answer (``replicas.serving.metrics`` holds the table)."""

from __future__ import annotations

from app.http import Outcome
from replicas.serving.metrics import MetricSink, RaySink

NAMES = (
    "scorejax_requests",
    "scorejax_latency_seconds",
    "scorejax_items_per_request",
    "scorejax_tokens_per_request",
)


class IngressMetrics:
    def __init__(self, sink: MetricSink | None = None) -> None:
        self._sink = sink if sink is not None else RaySink(NAMES)

    def record(self, outcome: Outcome) -> None:
        """One answer: its count by status and reason, its stage latencies, its size."""
        sink, route = self._sink, outcome.route
        tags = {"route": route, "method": outcome.method}
        tags |= {"status": str(outcome.status), "reason": outcome.reason}
        sink.count("scorejax_requests", 1, tags)
        stages: dict[str, float | None] = {"total": outcome.total_s}
        timings = outcome.timings
        if timings is not None:
            stages |= {"tokenize": timings.tokenization_s, "queue": timings.queue_s}
            stages["inference"] = timings.inference_s
        for stage, seconds in stages.items():
            if seconds is not None:
                sink.observe("scorejax_latency_seconds", seconds, {"route": route, "stage": stage})
        if outcome.items is not None:
            sink.observe("scorejax_items_per_request", outcome.items, {"route": route})
        if outcome.tokens is not None:
            sink.observe("scorejax_tokens_per_request", outcome.tokens, {"route": route})
