"""``limit_to_warmup``: the limits are what warm-up covers, so no request waits for a compile.

Envelopes are checked against literal cases, the start-up check against settings that
break it, the ingress against its 400s, and the engine by scoring random admitted work on
a tiny random-weight model with zero request-path compiles.
"""

import asyncio
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml

from app.openapi import score_request_schema
from app.service import ScoringService
from cluster.mesh import build_mesh
from replicas.contract import Envelope, ModelInfo, ScoreWork, check_limits, check_model_limits
from replicas.engine.scoring_engine import ScoringEngine
from replicas.engine.warm_coverage import full_step_items
from replicas.errors import ScoringError
from replicas.model.causal_lm import CausalLM
from replicas.model.config import ModelConfig
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fake_engine import fake_logprobs

VOCAB = 300
SERVE_CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
# Two envelopes: short queries with long items, long queries with short items.
WARM = {
    "token_buckets": (16, 32, 64),
    "item_token_buckets": (16, 32, 64, 128),
    "item_tokens_per_step": 64,
    "batch_buckets": (1, 2),
    "warmup_batch_sizes": (1, 2),
    "max_items_per_request": 64,
    "max_multi_item_seq_len": 4096,
    "multi_item_scoring_delimiter": 0,
    "warmup_shapes": ((12, 2, 24, 4), (48, 4, 6, 2)),
    "limit_to_warmup": True,
}


def work(query: int, items: tuple[int, ...], labels: int, item_first: bool = False) -> ScoreWork:
    return ScoreWork((1,) * query, tuple((2,) * n for n in items), tuple(range(labels)), item_first)


def test_an_envelope_admits_by_query_longest_item_and_labels() -> None:
    envelope = Envelope(query_tokens=12, item_tokens=24, labels=4)
    assert envelope.admits(12, 24, 4, shared=True)
    assert not envelope.admits(13, 1, 1, shared=True)
    assert not envelope.admits(1, 25, 1, shared=True)
    assert not envelope.admits(1, 1, 5, shared=True)
    assert envelope.admits(35, 1, 4, shared=False)  # a row: query + item <= 36
    assert not envelope.admits(35, 2, 4, shared=False)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (work(12, (24, 3), 4), None),
        (work(48, (6, 6, 6), 2), None),
        (work(48, (6, 7), 2), "sequence_too_long"),  # neither envelope holds both
        (work(13, (24,), 2), "sequence_too_long"),
        (work(12, (24,), 5), "too_many_labels"),  # more than any envelope
        (work(12, (6,), 3), None),
        (work(48, (6,), 3), "sequence_too_long"),  # 3 labels only with 12-token queries
        (work(30, (24,), 4, item_first=True), "sequence_too_long"),  # row 54: 2 labels
        (work(30, (6,), 4, item_first=True), None),
    ],
)
def test_limits_refuse_what_no_envelope_admits_by_reason(case: ScoreWork, reason: str) -> None:
    limits = ReplicaSettings.from_keys(**WARM).limits
    if reason is None:
        check_limits(case, limits, multi_item=True)
        return
    with pytest.raises(ScoringError) as caught:
        check_limits(case, limits, multi_item=True)
    assert caught.value.reason == reason
    assert "warmup_shapes" in str(caught.value)


def test_a_request_over_max_request_tokens_is_refused_counting_repeated_queries() -> None:
    limits = ReplicaSettings.from_keys(
        max_request_tokens=100, multi_item_scoring_delimiter=0
    ).limits
    shared = work(40, (10,) * 6, 2)  # 40 + 60 computed tokens: the query once
    check_limits(shared, limits, multi_item=True)
    rows = ScoreWork(shared.query_ids, shared.item_ids, shared.label_ids, item_first=True)
    with pytest.raises(ScoringError, match=r"300 tokens computed .*query counts once per"):
        check_limits(rows, limits, multi_item=True)  # 6 x (40 + 10)
    with pytest.raises(SettingsError, match=r"^max_request_tokens: must be >= 1"):
        ReplicaSettings.from_keys(max_request_tokens=0)


def test_limit_to_warmup_without_warmup_shapes_is_refused_by_name() -> None:
    with pytest.raises(SettingsError, match=r"^limit_to_warmup: needs warmup_shapes"):
        ReplicaSettings.from_keys(limit_to_warmup=True)


def test_a_full_step_is_items_of_the_envelope_length_and_one_remainder() -> None:
    settings = ReplicaSettings.from_keys(**WARM)  # step capacity 64 stream tokens
    assert full_step_items(Envelope(12, 24, 4), settings) == [24, 24, 16]
    assert full_step_items(Envelope(48, 6, 2), settings) == [6] * 10 + [4]
    assert full_step_items(Envelope(12, 64, 4), settings) == [64]
    capped = ReplicaSettings.from_keys(**{**WARM, "max_items_per_request": 3})
    assert full_step_items(Envelope(48, 6, 2), capped) == [6, 6, 6]


@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(
        family="qwen3",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        qk_norm=True,
    )
    model = CausalLM(config)
    return model, model.init_params(jax.random.PRNGKey(3)), build_mesh((1, 1))


def engine_for(tiny, settings: ReplicaSettings) -> ScoringEngine:
    model, params, mesh = tiny
    return ScoringEngine(model, params, mesh, settings, "tiny")


def test_start_up_refuses_a_batch_bucket_warm_up_does_not_reach(tiny) -> None:
    settings = ReplicaSettings.from_keys(**{**WARM, "warmup_batch_sizes": (1,)})
    with pytest.raises(SettingsError, match=r"^warmup_batch_sizes: .* add 2 to warmup_batch"):
        engine_for(tiny, settings)


def test_the_shipped_config_passes_its_start_up_check_and_serves_long_documents(tiny) -> None:
    (app, *_) = yaml.safe_load(SERVE_CONFIG.read_text())["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    assert settings.warmup.limit_to_warmup
    engine = engine_for(tiny, settings.replace(compilation_cache_dir=None))  # checks coverage
    assert max(e.item_tokens for e in settings.limits.envelopes) >= 512  # rerank documents
    assert len(engine.warmup_keys()) >= len(settings.warmup_shapes)


def random_work(rng: np.random.Generator) -> ScoreWork:
    """Work inside a random envelope, its items often at full length (steps fill up), and
    one time in five one field past it."""
    query, _, longest, labels = WARM["warmup_shapes"][rng.integers(0, 2)]
    over = rng.integers(0, 15)  # 0..2: query, item or labels one past the envelope
    lengths = rng.choice([longest, longest, int(rng.integers(0, longest + 1))], rng.integers(1, 20))
    ids = lambda n: tuple(int(t) for t in rng.integers(1, VOCAB, n))  # noqa: E731
    return ScoreWork(
        ids(int(rng.integers(1, query + 1)) if over else query + 1),
        tuple(ids(int(n)) for n in lengths) + (() if over != 1 else (ids(longest + 1),)),
        tuple(
            int(t) for t in rng.integers(1, VOCAB, int(rng.integers(1, labels + 1)) + (over == 2))
        ),
        bool(rng.integers(0, 4) == 0),
    )


def test_every_admitted_request_runs_on_warm_signatures_and_the_rest_is_refused(tiny) -> None:
    engine = engine_for(tiny, ReplicaSettings.from_keys(**WARM))
    engine.warmup()
    rng = np.random.default_rng(0)
    admitted, refused = [], 0
    for candidate in [random_work(rng) for _ in range(40)]:
        try:  # the replica's limits (the engine trusts them), then the engine's own checks
            check_model_limits(candidate, engine.info)
            engine.validate(candidate)
        except ScoringError:
            refused += 1
            continue
        admitted.append(candidate)
    start = 0
    for size in [1, 2, 3] * 7:  # batches of 1..3 requests (at most two per step)
        engine.score_batch(admitted[start : start + size])
        start += size
    stats = engine.stats()
    assert stats.request_path_compiles == 0, engine.last_signatures
    assert refused > 0 and stats.warmup_compiles > 0
    engine.wait_for_background_compiles(300)


def test_the_ingress_answers_400_by_reason_and_lists_the_envelopes(tiny_llama_dir: Path) -> None:
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    limits = ReplicaSettings.from_keys(**WARM).limits
    info = ModelInfo("tiny", VOCAB, 0, limits)
    tokenizer = load_tokenizer(resolve_model_source(tiny_llama_dir))
    service = ScoringService(info=info, tokenizer=tokenizer, clock=lambda: 0.0)
    calls: list[ScoreWork] = []

    async def backend(work: ScoreWork) -> Any:
        calls.append(work)
        return fake_logprobs(work)

    def reason(**payload: Any) -> tuple[str, str | None]:
        with pytest.raises(ScoringError) as caught:
            asyncio.run(service.score(payload, backend))
        return caught.value.reason.value, caught.value.param

    assert reason(query=[5] * 13, items=[[5] * 24], label_token_ids=[1]) == (
        "sequence_too_long",
        None,
    )
    assert reason(query=[5], items=[[5]], label_token_ids=[1] * 5) == (
        "too_many_labels",
        "label_token_ids",
    )
    assert not calls
    asyncio.run(
        service.score({"query": [5] * 12, "items": [[5] * 24], "label_token_ids": [1]}, backend)
    )
    assert len(calls) == 1
    (model,) = service.models_body()["data"]
    assert model["warm_envelopes"] == [
        {"query_tokens": 12, "item_tokens": 24, "labels": 4},
        {"query_tokens": 48, "item_tokens": 6, "labels": 2},
    ]
    schema = score_request_schema(info)["properties"]
    assert schema["label_token_ids"]["maxItems"] == 4
