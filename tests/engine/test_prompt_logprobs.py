"""Prompt log-likelihood (semantics 14, 15) on a tiny random-weight model: every prompt
token's log-prob and top-k against a plain causal forward pass of each prompt alone, with
prompts of one request sharing a prefix, the query cache's longest-prefix reuse (whole and
in part), and the counters of reused and computed tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replicas.contract import PromptWork, ScoreWork, check_model_limits
from replicas.engine.layouts.prompt_plan import group_prompts
from replicas.engine.layouts.token_steps import PREFIX_BLOCK
from replicas.engine.scoring_engine import ScoringEngine
from replicas.engine.warm_coverage import warmup_prompts
from replicas.errors import ScoringError
from replicas.model.causal_lm import CausalSpec
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.model_helpers import tiny_random_lm

VOCAB = 300
SMALL = {
    "token_buckets": (16, 32, 64, 128, 256, 512),
    "item_token_buckets": (16, 32, 64, 128, 512),
    "max_multi_item_seq_len": 512,
    "background_compile": False,
}


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_lm("llama", layers=2, vocab=VOCAB, seed=0)


def make_engine(tiny, **overrides) -> ScoringEngine:
    model, params, mesh = tiny
    settings = ReplicaSettings.from_keys(
        **{**SMALL, "multi_item_scoring_delimiter": 0, **overrides}
    )
    return ScoringEngine(model, params, mesh, settings, "tiny")


def reference(tiny, prompt: tuple[int, ...]) -> np.ndarray:
    """Log-softmax ``[L, V]`` after each prefix of ``prompt`` (row j: after tokens <= j)."""
    model, params, _ = tiny
    tokens = jnp.asarray([prompt], jnp.int32)
    positions = jnp.arange(len(prompt), dtype=jnp.int32)[None]
    spec = CausalSpec(jnp.asarray([len(prompt)], jnp.int32))
    hidden = model.hidden_states(params, tokens, positions, spec)
    return np.asarray(jax.nn.log_softmax(model.logits(params, hidden[0]), axis=-1))


def check(tiny, prompt, answer, top_k: int, atol: float = 2e-5) -> None:
    ref = reference(tiny, prompt)  # [L, V]
    own = [ref[j - 1, prompt[j]] for j in range(1, len(prompt))]
    assert np.isnan(answer.token_logprobs[0])
    np.testing.assert_allclose(answer.token_logprobs[1:], own, atol=atol)
    k = max(top_k, 1)
    for j in range(1, len(prompt) + 1):
        best = np.sort(ref[j - 1])[::-1][:k]
        np.testing.assert_allclose(answer.top_logprobs[j], best, atol=atol)
        assert answer.top_ids[j, 0] == int(np.argmax(ref[j - 1]))
    assert (answer.top_ids[0] == -1).all()


def ids(rng, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(1, VOCAB, n))


def test_choices_behind_one_context_equal_each_prompt_alone(tiny) -> None:
    rng = np.random.default_rng(0)
    engine = make_engine(tiny, query_cache_bytes=0)
    context = ids(rng, 70)
    prompts = tuple(context + ids(rng, n) for n in (3, 9, 1, 20))
    [answers] = engine.score_batch([PromptWork(prompts, top_k=3)])
    for prompt, answer in zip(prompts, answers, strict=True):
        check(tiny, prompt, answer, 3)
    stats = engine.stats()
    assert stats.prompt_tokens == sum(len(p) for p in prompts)
    assert stats.reused_prefix_tokens == 3 * 64  # the context's whole blocks, 3 times
    assert stats.computed_prompt_tokens == stats.prompt_tokens - 3 * 64


def test_mixed_lengths_short_prompts_and_other_work_in_one_batch(tiny) -> None:
    rng = np.random.default_rng(1)
    engine = make_engine(tiny)
    prompts = (ids(rng, 1), ids(rng, 5), ids(rng, 16), ids(rng, 17), ids(rng, 140))
    score = ScoreWork(ids(rng, 20), (ids(rng, 4), ids(rng, 2)), (5, 6))
    out = engine.score_batch([PromptWork(prompts[:3]), score, PromptWork(prompts[3:], 20)])
    for prompt, answer in zip(prompts[:3], out[0], strict=True):
        check(tiny, prompt, answer, 0)
    for prompt, answer in zip(prompts[3:], out[2], strict=True):
        check(tiny, prompt, answer, 20)
    alone = make_engine(tiny).score_batch([score])[0]
    assert_fp32_close(out[1], alone)


def test_a_cached_prefix_is_reused_whole_or_by_its_first_blocks(tiny) -> None:
    rng = np.random.default_rng(2)
    engine = make_engine(tiny)
    cold = make_engine(tiny, query_cache_bytes=0)
    context = ids(rng, 100)
    first = context + ids(rng, 12)  # computes a 96-token prefix (whole blocks) and caches it
    engine.score_batch([PromptWork((first,), 2)])
    assert engine.stats().reused_prefix_tokens == 0
    again = (first, context + ids(rng, 30), context[:40] + ids(rng, 3))
    warm = engine.score_batch([PromptWork((p,), 2) for p in again])
    # The same prompt reads all 96 tokens, the second shares 6 blocks and the third 2.
    assert engine.stats().reused_prefix_tokens == 96 + 96 + 32
    reference_answers = cold.score_batch([PromptWork((p,), 2) for p in again])
    for prompt, [hot], [plain] in zip(again, warm, reference_answers, strict=True):
        check(tiny, prompt, hot, 2)
        assert_fp32_close(hot.token_logprobs[1:], plain.token_logprobs[1:])
        assert_fp32_close(hot.top_logprobs[1:], plain.top_logprobs[1:])


def test_lone_prompts_run_whole_many_per_step_and_keep_nothing(tiny) -> None:
    """keep_lone_prefixes=False (rerank's documents): prompts sharing no block with another
    run whole as the items of one stream row: the same answers as each prompt's own prefix
    step, in one step instead of two per prompt, and nothing kept in the query cache. Prompts
    that do share blocks still compute them once."""
    rng = np.random.default_rng(3)
    context = ids(rng, 40)
    lone = tuple(ids(rng, n) for n in (30, 21, 5, 44, 17))
    prompts = (*lone, context + ids(rng, 4), context + ids(rng, 6))
    engine, kept = make_engine(tiny), make_engine(tiny)
    [packed] = engine.score_batch([PromptWork(prompts, top_k=2, keep_lone_prefixes=False)])
    [plain] = kept.score_batch([PromptWork(prompts, top_k=2)])
    for prompt, answer, other in zip(prompts, packed, plain, strict=True):
        check(tiny, prompt, answer, 2)
        assert_fp32_close(answer.token_logprobs[1:], other.token_logprobs[1:])
    stats, plain_stats = engine.stats(), kept.stats()
    # packed: the context's prefix step and its choices' stream step, and one stream step
    # for every lone prompt (they read no prefix, a stream of another prefix width)
    assert stats.steps == 3 < plain_stats.steps
    assert stats.reused_prefix_tokens == 32  # the second choice reads the context's blocks
    assert stats.query_cache_entries == 1 < plain_stats.query_cache_entries
    # scored_tail: the same last tokens, nothing else scored in the stream (rerank's query)
    tail = PromptWork(prompts, keep_lone_prefixes=False, scored_tail=3)
    [tails] = make_engine(tiny).score_batch([tail])
    for answer, full in zip(tails, packed, strict=True):
        assert_fp32_close(answer.token_logprobs[-3:], full.token_logprobs[-3:])
    for answer in tails[:5]:  # lone: every row came from the stream
        assert np.isnan(answer.token_logprobs[:-3]).all() and (answer.top_ids[-1] == -1).all()


def test_prompts_without_a_whole_block_run_packed_though_prefixes_are_kept(tiny) -> None:
    """/v1/completions keeps each lone prompt's whole blocks for a later request that shares
    them (keep_lone_prefixes), but a prompt of at most 16 tokens has no whole block to keep:
    such prompts run whole, many to a step (1024 one-token prompts had taken one step each,
    ~0.45 s apiece on the shipped CPU config, past the request deadline)."""
    rng = np.random.default_rng(5)
    prompts = tuple(ids(rng, n) for n in (1, 3, 16, 2, 9))
    engine = make_engine(tiny, batch_buckets=(1,))  # the shipped CPU config: one row a step
    [answers] = engine.score_batch([PromptWork(prompts, top_k=2)])
    for prompt, answer in zip(prompts, answers, strict=True):
        check(tiny, prompt, answer, 2)
    assert engine.stats().steps == 1
    assert engine.stats().query_cache_entries == 0


def test_prompts_group_by_whole_shared_blocks() -> None:
    base = tuple(range(1, 41))
    prompts = [(*base, 7, 8), (9,) * 5, (*base, 1), base[:20] + (3,) * 30]
    groups = group_prompts(prompts, PREFIX_BLOCK, max_remainder=64)
    by_members = {g.members: g.prefix_length for g in groups}
    # Sorted, 3 < 2 < 0 < 1. Prompts 0 and 2 share 40 tokens, prompt 3 shares 20 with them:
    # all three behind one whole block (16 tokens), each remainder within 64; prompt 1
    # shares nothing and is shorter than a block, so it runs whole, behind no prefix.
    assert by_members == {(3, 2, 0): 16, (1,): 0}
    tight = group_prompts(prompts, PREFIX_BLOCK, max_remainder=30)
    assert {g.members: g.prefix_length for g in tight} == {(3,): 48, (2, 0): 32, (1,): 0}


def test_bad_prompt_work_is_refused_by_reason(tiny) -> None:
    engine = make_engine(tiny, max_items_per_request=2)
    with pytest.raises(ScoringError) as empty:
        engine.score_batch([PromptWork(((),))])
    assert empty.value.reason == "empty_prompt"
    with pytest.raises(ScoringError) as error:
        engine.score_batch([PromptWork(((VOCAB,),))])
    assert error.value.reason == "token_id_exceeds_vocab"
    with pytest.raises(ScoringError) as limit:  # the replica's check (the engine trusts it)
        check_model_limits(PromptWork(((1,), (2,), (3,))), engine.info)
    assert limit.value.reason == "too_many_items"


def test_prefix_reuse_off_computes_every_prompt_whole_with_the_same_answers(tiny) -> None:
    rng = np.random.default_rng(3)
    context = ids(rng, 50)
    prompts = tuple(context + ids(rng, n) for n in (4, 4, 12))
    on, off = make_engine(tiny), make_engine(tiny, prefix_reuse=False)
    for _ in range(2):  # the second call: every prefix cached (on), nothing cached (off)
        [with_reuse] = on.score_batch([PromptWork(prompts, 1)])
        [without] = off.score_batch([PromptWork(prompts, 1)])
        for a, b in zip(with_reuse, without, strict=True):
            assert_fp32_close(a.token_logprobs[1:], b.token_logprobs[1:])
            np.testing.assert_array_equal(a.top_ids[1:, 0], b.top_ids[1:, 0])
    stats = off.stats()
    assert stats.reused_prefix_tokens == 0 and len(off.cache) == 0
    assert stats.computed_prompt_tokens == stats.prompt_tokens == 2 * sum(map(len, prompts))
    assert on.stats().reused_prefix_tokens == 2 * 48 + 3 * 48


def test_warm_completions_never_compile_on_the_request_path(tiny) -> None:
    rng = np.random.default_rng(4)
    engine = make_engine(
        tiny,
        background_compile=True,
        warmup_shapes=((16, 2, 16, 2),),
        completion_warmup_shapes=((64, 4, 16, 1),),
        limit_to_warmup=True,
        item_tokens_per_step=128,
        batch_buckets=(1, 2),
        warmup_batch_sizes=(2,),
    )
    engine.warmup()
    context = ids(rng, 60)
    works = [
        PromptWork(tuple(context + ids(rng, n) for n in (5, 20, 1, 11)), top_k=1),
        PromptWork((ids(rng, 3), ids(rng, 79), ids(rng, 40)), top_k=20),
        PromptWork(tuple(ids(rng, 16) + ids(rng, n) for n in range(1, 9))),
    ]
    for work in works:
        [answers] = engine.score_batch([work])
        for prompt, answer in zip(work.prompts, answers, strict=True):
            check(tiny, prompt, answer, work.top_k)
    engine.wait_for_background_compiles()
    assert engine.stats().request_path_compiles == 0
    with pytest.raises(ScoringError, match="completion_warmup_shapes") as error:  # the replica's
        check_model_limits(PromptWork((ids(rng, 81),)), engine.info)
    assert error.value.reason == "sequence_too_long"


def test_a_zero_prefix_warm_shape_warms_packed_lone_prompts(tiny) -> None:
    """completion_warmup_shapes [0, n, tokens, k]: lone prompts packed many to a step (rerank's
    documents), warm, so such a request runs on its own signature with little padding."""
    engine = make_engine(tiny, completion_warmup_shapes=((0, 4, 30, 1),), batch_buckets=(1,))
    engine.warmup()
    (work,) = warmup_prompts(((0, 4, 30, 1),))
    assert not work.keep_lone_prefixes and len(work.prompts) == 4
    rng = np.random.default_rng(5)
    prompts = tuple(ids(rng, n) for n in (25, 30, 18, 29))  # 102 tokens, as warm-up's 120
    compiles = engine.compile_count
    [answers] = engine.score_batch([PromptWork(prompts, keep_lone_prefixes=False)])
    for prompt, answer in zip(prompts, answers, strict=True):
        check(tiny, prompt, answer, 0)
    stats = engine.stats()
    assert engine.compile_count == compiles and stats.steps == 1
    assert stats.computed_tokens <= 1.3 * stats.useful_tokens
