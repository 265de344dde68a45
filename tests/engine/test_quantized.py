"""Quantized scoring (the ``quantization`` setting, docs/quantization.md) on tiny models:
item isolation holds as exactly as in float32 (multi-item equals single-item, a request's
scores do not depend on what shares its step), a quantized model stays within a stated bound
of the float32 model on the same weights, checkpoints are quantized at load, LoRA adapters run
on a quantized base, and fp8 is refused at start-up where the backend has none."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.causal_lm import CausalLM, CausalSpec
from replicas.model.config import ModelConfig
from replicas.model.quant import quantize_layers
from replicas.model.smooth import activation_maxima, smooth_layers
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fp32 import assert_fp32_close, assert_fp32_close_ragged
from tests.support.head_helpers import save_tiny_head
from tests.support.lora_helpers import ALL_TARGETS, lora_settings, save_adapter
from tests.support.model_helpers import save_tiny

VOCAB = 300
DELIMITER = 0
SMALL = {
    "token_buckets": (16, 64),
    "item_token_buckets": (16, 64),
    "max_multi_item_seq_len": 128,
    "background_compile": False,
}
MULTI = {"multi_item_scoring_delimiter": DELIMITER, "batch_buckets": (1, 4)}
# int8 against float32 on the same weights, in nats of a label's log-prob. Measured on these
# tiny models: int8 0.0026 and int8_weight 0.0017 (random 0.02-init weights; int8_weight
# before its block scales), 4x margin;
# SmolLM2's figures are the quality gate's (loadtest/quant_quality.py).
TO_FLOAT32 = 0.01


CONFIG = ModelConfig(
    family="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
    tie_word_embeddings=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def models() -> dict:
    """The float32 tiny Llama and the same weights quantized, by ``quantization``."""
    config = CONFIG
    params = CausalLM(config).init_params(jax.random.PRNGKey(0))
    out = {"none": (CausalLM(config), params), "smoothed": (CausalLM(config), _smoothed(params))}
    for form in ("int8", "int8_weight"):
        quantized = {**params, "layers": quantize_layers(params["layers"], form)}
        out[form] = (CausalLM(config.replace(quantization=form)), quantized)
    layers = quantize_layers(out["smoothed"][1]["layers"], "int8_smooth", xp=np)
    out["int8_smooth"] = (CausalLM(config.replace(quantization="int8_smooth")),
                          {**params, "layers": layers})  # fmt: skip
    return out


def _smoothed(params: dict) -> dict:
    """The float tiny model's layers SmoothQuant-rescaled (model.smooth) on calibration rows
    of random tokens, as the loader does for ``int8_smooth`` with the shipped text."""
    model = CausalLM(CONFIG)
    rows = np.random.default_rng(5).integers(1, VOCAB, (2, 32)).astype(np.int32)
    maxima = activation_maxima(model, params, rows)
    host = jax.tree.map(np.asarray, params["layers"])
    return {**params, "layers": smooth_layers(host, maxima, CONFIG.num_kv_heads)}


def _engine(models: dict, form: str, **overrides: object) -> ScoringEngine:
    model, params = models[form]
    settings = ReplicaSettings.from_keys(**{**SMALL, **overrides})
    return ScoringEngine(model, params, build_mesh((1, 1)), settings, "tiny")


@pytest.fixture(scope="module")
def multi(models: dict) -> dict:
    """Multi-item engines (query-first works through the shared prefix) by form."""
    return {form: _engine(models, form, **MULTI) for form in models if form != "smoothed"}


def _work(
    seed: int, query: int = 13, item_lens: tuple[int, ...] = (3, 0, 7, 1), vocab: int = VOCAB
) -> ScoreWork:
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(1, vocab, n))  # noqa: E731
    return ScoreWork(ids(query), tuple(ids(n) for n in item_lens), (5, 7, 9))


WORKS = [_work(0), _work(1, query=14, item_lens=(5,) * 9), _work(2, query=1)]


@pytest.mark.parametrize("form", ["int8_weight", "int8", "int8_smooth"])
def test_quantized_multi_item_equals_quantized_single_item(
    models: dict, multi: dict, form: str
) -> None:
    """int8_weight quantizes no activation, so its multi-item and fused paths equal its
    single-item path at the float32 floor. int8's per-token scales make a score independent
    of its step, but two paths round differently in float32, and a rounding difference can
    tip one activation onto the next int8 step (docs/quantization.md, "Item isolation"), on
    some CPU if not on this one: across paths int8 is held to the bound of its quantization,
    and within one path to the bit (the batch-mates test below)."""
    single = _engine(models, form).score_batch(WORKS)
    fused = _engine(models, form, **MULTI, fused_step_tokens=64).score_batch(WORKS)
    for path, got in (("multi-item", multi[form].score_batch(WORKS)), ("fused", fused)):
        if form == "int8_weight":
            assert_fp32_close_ragged(got, single, what=f"{form} {path}")
        else:
            worst = max(float(np.abs(g - w).max()) for g, w in zip(got, single, strict=True))
            assert worst <= TO_FLOAT32, (path, worst)


def test_int8_scores_do_not_depend_on_batch_mates(multi: dict) -> None:
    """Per-token activation scales: a request's tokens are quantized by their own rows, so
    other batch-mates of the same shapes (the same executable; a per-step scale would follow
    their activations) change no bit, another item of the same length changes no other item,
    and a step of its own (another executable) stays within int8's bound across paths."""
    engine = multi["int8"]
    target = _work(8, query=12)
    mates = [_work(9, query=15, item_lens=(4, 4)), _work(10, query=10)]
    others = [_work(11, query=15, item_lens=(4, 4)), _work(12, query=10)]
    alone = engine.score_batch([target])[0]
    shared = engine.score_batch([mates[0], target, mates[1]])[1]
    np.testing.assert_array_equal(engine.score_batch([others[0], target, others[1]])[1], shared)
    assert float(np.abs(shared - alone).max()) <= TO_FLOAT32
    same_len = dataclasses.replace(target, item_ids=((7, 8, 9), *target.item_ids[1:]))
    changed = engine.score_batch([same_len])[0]
    assert not np.array_equal(changed[0], alone[0])
    np.testing.assert_array_equal(changed[1:], alone[1:])


@pytest.mark.parametrize("form", ["int8", "int8_smooth", "int8_weight"])
def test_quantized_stays_within_its_bound_of_float32(multi: dict, form: str) -> None:
    want = multi["none"].score_batch(WORKS)
    got = multi[form].score_batch(WORKS)
    worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    assert 0 < worst <= TO_FLOAT32, worst


def test_smoothing_keeps_the_float_model(models: dict) -> None:
    """SmoothQuant's folds (into the norms, v and up) leave the float model's hidden states
    at the float32 floor of the unsmoothed one, with a real scan over its layers."""
    tokens = jnp.asarray(np.random.default_rng(6).integers(1, VOCAB, (2, 12)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    spec = CausalSpec(lengths=jnp.asarray([12, 7], jnp.int32))
    hidden = {
        name: np.asarray(jax.jit(model.hidden_states)(params, tokens, positions, spec))[1, :7]
        for name, (model, params) in models.items() if name in ("none", "smoothed")
    }  # fmt: skip
    assert_fp32_close(hidden["smoothed"], hidden["none"], what="smoothed float model")
    assert not np.array_equal(models["smoothed"][1]["layers"]["mlp"]["up"],
                              np.asarray(models["none"][1]["layers"]["mlp"]["up"]))  # fmt: skip


def test_a_checkpoint_is_quantized_at_load_and_fp8_is_refused_on_cpu(tiny_llama_dir) -> None:
    mesh = build_mesh((1, 1))
    loaded = load_model(tiny_llama_dir, mesh, quantization="int8")
    attn = loaded.params["layers"]["attn"]
    assert attn["q"].dtype == np.int8 and attn["o_scale"].shape == (2, 64)
    assert loaded.params["embed"].dtype == np.float32  # embeddings and LM head stay float
    with pytest.raises(SettingsError, match=r"^quantization: fp8 needs"):
        load_model(tiny_llama_dir, mesh, quantization="fp8")


def test_int8_smooth_calibrates_at_load_and_needs_a_tokenizer(tiny_llama_dir, tmp_path) -> None:
    """The loader places the float weights, calibrates on the shipped text with the model's
    tokenizer, smooths and quantizes; a directory without a tokenizer stops naming the
    setting."""
    mesh = build_mesh((1, 1))
    plain = load_model(tiny_llama_dir, mesh, quantization="int8").params["layers"]
    smooth = load_model(tiny_llama_dir, mesh, quantization="int8_smooth").params["layers"]
    assert smooth["mlp"]["down"].dtype == np.int8 and smooth["attn"]["o_scale"].shape == (2, 64)
    assert not np.array_equal(smooth["attn_norm"]["scale"], plain["attn_norm"]["scale"])
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_llama_dir / name, tmp_path / name)
    with pytest.raises(SettingsError, match=r"^quantization: int8_smooth calibrates"):
        load_model(tmp_path, mesh, quantization="int8_smooth")


def test_lora_adapter_on_an_int8_base(tmp_path) -> None:
    """An adapter's delta runs in float32 beside the int8 base: its scores stay within the
    base's bound of the float32 model with the same adapter, and differ from the base's."""
    base = save_tiny("llama", tmp_path / "base")
    adapter = save_adapter(base, tmp_path / "a", seed=1, r=4, lora_alpha=8,
                           target_modules=ALL_TARGETS)  # fmt: skip
    keys = {**lora_settings(max_loras=2, max_lora_rank=4), "model": str(base),
            "lora_adapters": (("a", str(adapter)),)}  # fmt: skip
    work = _work(3, query=11, vocab=256)
    tuned = dataclasses.replace(work, adapter="a")
    scores = {}
    for form in ("none", "int8"):
        settings = ReplicaSettings.from_keys(**keys, quantization=form)
        engine = ScoringEngine.from_settings(settings, warm=False)
        scores[form] = engine.score_batch([work, tuned])
    (base8, tuned8), (base32, tuned32) = scores["int8"], scores["none"]
    bound = 4 * float(np.abs(base8 - base32).max())  # the base's own quantization error
    assert float(np.abs(tuned8 - tuned32).max()) <= bound
    assert float(np.abs(tuned8 - base8).max()) > bound


def _served(model: object, form: str, **keys: object) -> tuple:
    """The ingress's service and a backend on an engine of ``form`` (no warm-up)."""
    from app.service import ScoringService

    settings = ReplicaSettings.from_keys(model=str(model), quantization=form, **keys)
    engine = ScoringEngine.from_settings(settings, warm=False)

    async def backend(work: object) -> object:
        return engine.score_batch([work])[0]

    return ScoringService.from_settings(settings), backend


def test_int8_serves_every_route_within_its_bound(tiny_llama_dir, embedding_dirs, tmp_path) -> None:
    """``quantization: int8`` through the ingress's own code on each kind of model: score,
    rerank and completions on a causal LM, classify on a score head, embeddings on an
    embedding model; each answer within int8's bound of the same route in float32."""
    routes = {
        **SMALL,
        "token_buckets": (128,),
        "item_token_buckets": (128,),
        "max_multi_item_seq_len": 256,
    }  # fmt: skip (the rerank template)
    calls = {
        "score": lambda s, b: s.score(
            {"query": "The capital of France is", "items": ["", " Paris"], "label_token_ids": [1]},
            b,
        ),
        "rerank": lambda s, b: s.rerank_timed({"query": "q", "documents": ["a b", "c"]}, b),
        "completions": lambda s, b: s.complete_timed(
            {"prompt": "Paris is a city", "echo": True, "max_tokens": 0, "logprobs": 1}, b
        ),
    }
    values = {
        "score": lambda body: body["scores"],
        "rerank": lambda body: [
            r["relevance_score"] for r in sorted(body[0]["results"], key=lambda r: r["index"])
        ],
        "completions": lambda body: body[0]["choices"][0]["logprobs"]["token_logprobs"][1:],
    }
    answers = {}
    for form in ("none", "int8"):
        service, backend = _served(tiny_llama_dir, form, **routes)
        answers[form] = {n: values[n](asyncio.run(c(service, backend))) for n, c in calls.items()}
    for name in calls:
        difference = np.subtract(answers["int8"][name], answers["none"][name])
        assert np.abs(difference).max() <= TO_FLOAT32, name
    from transformers import AutoTokenizer

    head = save_tiny_head("qwen3-seqcls-3", tmp_path / "head", vocab_size=49152)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(head)
    probs = {}
    for form in ("none", "int8"):
        service, backend = _served(head, form, **routes)
        body = asyncio.run(service.classify_timed({"input": ["good", "bad"]}, backend))[0]
        probs[form] = np.asarray([entry["probs"] for entry in body["data"]])
    assert probs["int8"].shape == (2, 3)
    # The head model's norms and weights are randomized (not 0.02-init): measured 0.011 in
    # probability, 4x margin.
    assert np.abs(probs["int8"] - probs["none"]).max() <= 0.05
    vectors = {}
    for form in ("none", "int8"):
        service, backend = _served(embedding_dirs["qwen3-last"], form, **routes)
        body = asyncio.run(service.embed_timed({"input": ["a b", "c"]}, backend))[0]
        vectors[form] = np.asarray([row["embedding"] for row in body["data"]])
    assert (np.sum(vectors["int8"] * vectors["none"], axis=1) >= 0.999).all()
