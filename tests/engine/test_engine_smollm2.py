"""The engine on the real SmolLM2-135M-Instruct: multi-item equals single-item scoring."""

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings
from tests.support.fp32 import SMOLLM2_LAYERS, assert_fp32_close

MODEL = "SmolLM2-135M-Instruct"
PARIS, LONDON, BERLIN = 7042, 4528, 11452


@pytest.fixture(scope="module")
def smollm2(smollm2_loaded):
    mesh, loaded = build_mesh((1, 1)), smollm2_loaded
    tokenizer = load_tokenizer(resolve_model_source(MODEL))

    def engine(**settings):
        return ScoringEngine(
            loaded.model, loaded.params, mesh, ReplicaSettings.from_keys(**settings), MODEL
        )

    return tokenizer, {
        "single": engine(),
        "shared_prefix": engine(multi_item_scoring_delimiter=0),
        "packed_reference": engine(multi_item_scoring_delimiter=0, layout="packed_reference"),
    }


def text_work(tokenizer, query, items, labels):
    return ScoreWork(
        tuple(tokenizer.encode(query)),
        tuple(tuple(tokenizer.encode(item, add_special_tokens=False)) for item in items),
        labels,
    )


def test_paris_is_the_top_label_after_the_capital_of_france(smollm2):
    tokenizer, engines = smollm2
    work = text_work(tokenizer, "The capital of France is", [""], (PARIS, LONDON, BERLIN))
    for engine in engines.values():
        (scores,) = engine.score_batch([work])
        assert scores.argmax() == 0
        np.testing.assert_allclose(scores[0, 0], -0.258, atol=2e-3)  # transformers: -0.2581


@pytest.mark.parametrize("layout", ["shared_prefix", "packed_reference"])
def test_multi_item_equals_single_item_on_unicode_text(smollm2, layout):
    tokenizer, engines = smollm2
    items = [" 日本語", " emoji 🎉", "", " Ünïcödé façade", " the flag of the republic"]
    work = text_work(tokenizer, "I pledge allegiance — «Grüße» to", items, (PARIS, 311, 315, 0))
    (single,) = engines["single"].score_batch([work])
    (multi,) = engines[layout].score_batch([work])
    assert single.shape == (5, 4)
    assert_fp32_close(multi, single, SMOLLM2_LAYERS)


def test_query_cache_warm_equals_cold_on_the_real_model(smollm2):
    tokenizer, engines = smollm2
    engine = engines["shared_prefix"]
    query = "Which of these is a fruit? Answer yes or no. Candidate:"
    first = text_work(tokenizer, query, [" apple", " car"], (PARIS, LONDON))
    fresh = text_work(tokenizer, query, [" banana", " chair", ""], (PARIS, LONDON))
    (cold,) = engine.score_batch([fresh])  # the query's first time: computed
    engine.score_batch([first])
    hits = engine.stats().query_cache_hits
    (warm,) = engine.score_batch([fresh])  # the same query again: only the items run
    assert engine.stats().query_cache_hits == hits + 1
    assert_fp32_close(warm, cold, SMOLLM2_LAYERS)


def test_prompt_log_probs_equal_transformers_and_warm_equals_cold(smollm2, smollm2_transformers):
    """/v1/completions' engine work on the real model: every token's log-prob within 1e-4 of
    transformers (fp32, the same GGUF weights) and the same top-1; prompts sharing a context
    (a prefix computed once), then again from the prefix cache (within 1e-6 of cold)."""
    import torch

    from replicas.contract import PromptWork

    tokenizer, engines = smollm2
    engine = engines["shared_prefix"]
    context = (
        "Question: Which of these animals is the largest mammal alive today, by a wide "
        "margin, whether measured by weight or by length?\nAnswer:"
    )
    texts = [context + c for c in (" the blue whale", " an elephant", " a mouse")] + ["Hi"]
    prompts = tuple(tuple(tokenizer.encode(text)) for text in texts)
    work = PromptWork(prompts, top_k=3)
    (cold,) = engine.score_batch([work])
    reused = engine.stats().reused_prefix_tokens
    (warm,) = engine.score_batch([work])
    assert engine.stats().reused_prefix_tokens > reused  # the second call read the cache
    model = smollm2_transformers
    worst = 0.0
    for prompt, answer, again in zip(prompts, cold, warm, strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt])).logits[0].double()
        ref = torch.log_softmax(logits, -1).numpy()  # [L, V]
        want = [ref[j - 1, prompt[j]] for j in range(1, len(prompt))]
        worst = max(worst, float(np.abs(answer.token_logprobs[1:] - want).max(initial=0.0)))
        assert list(answer.top_ids[1:, 0]) == list(ref.argmax(-1))
        assert_fp32_close(again.token_logprobs[1:], answer.token_logprobs[1:], SMOLLM2_LAYERS)
        assert_fp32_close(again.top_logprobs[1:], answer.top_logprobs[1:], SMOLLM2_LAYERS)
    print(f"\n[completions] SmolLM2 worst |log-prob - transformers|: {worst:.2g}")
    assert worst <= 1e-4
