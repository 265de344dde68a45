"""What the ingress and a scoring replica record as metrics (a recording sink, no Ray); the
real export through Ray's metrics agent is scraped in tests/serve/test_serve_http.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest

from app.http import Outcome, build_api
from app.metrics import IngressMetrics
from app.service import Timings
from replicas.contract import ScoredWork, ScoreWork
from replicas.engine_contract import EngineStats
from replicas.serving.metrics import METRICS, SPECS, ReplicaMetrics, step_deltas
from tests.support.fake_engine import fake_logprobs
from tests.support.http_support import ask
from tests.unit.test_app_http import SERVICE


@dataclass
class Recorded:
    counts: list[tuple[str, float, dict[str, str]]] = field(default_factory=list)
    observed: list[tuple[str, float, dict[str, str]]] = field(default_factory=list)

    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        assert SPECS[name].kind == "counter" and set(tags or {}) == set(SPECS[name].tag_keys)
        self.counts.append((name, value, dict(tags or {})))

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        assert SPECS[name].kind == "histogram" and set(tags or {}) == set(SPECS[name].tag_keys)
        self.observed.append((name, value, dict(tags or {})))

    def total(self, name: str, **tags: str) -> float:
        return sum(v for n, v, t in self.counts if n == name and tags.items() <= t.items())


def counted(**counters: int) -> EngineStats:
    """An engine's stats with ``counters`` set, every other counter 0."""
    return dataclasses.replace(EngineStats.zero(), **counters)


def test_every_metric_is_named_for_scorejax_and_histograms_have_sorted_buckets() -> None:
    assert all(spec.name.startswith("scorejax_") for spec in METRICS)
    for spec in METRICS:
        assert (spec.kind == "histogram") == bool(spec.boundaries)
        assert list(spec.boundaries) == sorted(set(spec.boundaries))


def test_a_replica_records_each_step_and_what_the_engine_counters_grew_by() -> None:
    sink = Recorded()
    metrics = ReplicaMetrics(sink)
    warm = {"warmup_compiles": 5, "computed_tokens": 100, "useful_tokens": 75}
    metrics.after_step(3, 0.2, counted(**warm | {"query_cache_misses": 3}))
    later = warm | {"request_path_compiles": 1, "computed_tokens": 300, "useful_tokens": 125}
    metrics.after_step(2, 0.4, counted(**later | {"query_cache_misses": 4, "query_cache_hits": 1}))
    assert [v for n, v, _ in sink.observed if n == "scorejax_batch_size"] == [3, 2]
    assert [v for n, v, _ in sink.observed if n == "scorejax_step_seconds"] == [0.2, 0.4]
    # padding: 25 of the first 100 tokens, then 150 of the next 200
    assert [v for n, v, _ in sink.observed if n == "scorejax_padding_ratio"] == [0.25, 0.75]
    assert sink.total("scorejax_compiles", source="warmup") == 5
    assert sink.total("scorejax_compiles", source="request_path") == 1
    assert sink.total("scorejax_query_cache_misses") == 4
    assert sink.total("scorejax_query_cache_hits") == 1
    assert sink.total("scorejax_computed_tokens") == 300


def test_declined_compiles_and_evicted_signatures_are_counted_by_reason() -> None:
    sink = Recorded()
    metrics = ReplicaMetrics(sink)
    metrics.after_step(1, 0.1, counted(declined_one_off=2, evicted_low_value=0))
    metrics.after_step(
        1, 0.1, counted(declined_one_off=5, declined_low_value=1, evicted_low_value=1)
    )
    assert sink.total("scorejax_declined_compiles", reason="one_off") == 5
    assert sink.total("scorejax_declined_compiles", reason="low_value") == 1
    assert sink.total("scorejax_declined_compiles", reason="small_padding") == 0
    assert sink.total("scorejax_evicted_signatures", reason="low_value") == 1


def test_an_engine_without_counters_still_records_batch_and_step() -> None:
    sink = Recorded()
    ReplicaMetrics(sink).after_step(4, 1.5, EngineStats.zero())
    assert {n for n, _, _ in sink.observed} == {"scorejax_batch_size", "scorejax_step_seconds"}
    assert all(value == 0 for _, value, _ in sink.counts)
    assert step_deltas(counted(useful_tokens=2), counted(useful_tokens=7))["useful_tokens"] == 5


def test_the_ingress_records_status_reason_stages_and_size() -> None:
    sink = Recorded()
    metrics = IngressMetrics(sink)
    metrics.record(Outcome("/v1/score", "POST", 200, "", 0.5, Timings(0.01, 0.1, 0.3), 4, 90))
    metrics.record(Outcome("unmatched", "GET", 404, "not_found", 0.001))
    assert sink.total("scorejax_requests", route="/v1/score", status="200") == 1
    assert sink.total("scorejax_requests", route="unmatched", reason="not_found") == 1
    stages = {t["stage"]: v for n, v, t in sink.observed if n == "scorejax_latency_seconds"}
    assert stages == {"total": 0.001, "tokenize": 0.01, "queue": 0.1, "inference": 0.3}
    sizes = {n: v for n, v, _ in sink.observed if n.endswith("_per_request")}
    assert sizes == {"scorejax_items_per_request": 4, "scorejax_tokens_per_request": 90}


async def _healthy() -> None:
    return None


def test_every_answer_reaches_the_recorder_once_with_its_route() -> None:
    outcomes: list[Outcome] = []

    async def backend(work: ScoreWork) -> ScoredWork:
        await asyncio.sleep(0.05)
        return ScoredWork(fake_logprobs(work), inference_s=0.02)

    api = build_api(SERVICE, backend, _healthy, recorder=outcomes.append, keys=frozenset({"k"}))
    body = json.dumps({"query": "ab", "items": ["c", "de"], "label_token_ids": [3]}).encode()
    auth = {"authorization": "Bearer k"}
    assert ask(api, "POST", "/v1/score", body, auth).status == 200
    assert ask(api, "POST", "/v1/score", b"{", auth).status == 400
    assert ask(api, "POST", "/v1/score", body).status == 401
    assert ask(api, "GET", "/random/path", b"", auth).status == 404
    assert ask(api, "GET", "/health").status == 200
    scored, bad, refused, missing, health = outcomes
    # prompt tokens as SGLang counts them: query + item per item, (2 + 1) + (2 + 2)
    assert (scored.route, scored.status, scored.items, scored.tokens) == ("/v1/score", 200, 2, 7)
    assert scored.timings is not None and scored.timings.inference_s == pytest.approx(0.02)
    assert scored.total_s >= 0.05
    assert (bad.status, bad.reason, bad.items) == (400, "invalid_json", None)
    assert (refused.status, refused.reason) == (401, "unauthorized")
    assert (missing.route, missing.reason) == ("unmatched", "not_found")
    assert (health.route, health.status) == ("/health", 200)
    assert np.isfinite(scored.total_s)
