"""LoRA adapters (semantics 21) against transformers + peft in float32: three PEFT adapters of
a tiny random Qwen3 (different ranks, target modules, scalings, one on a single layer) served
by one engine, each equal to peft on the same base whatever shares its step; prompt log-probs
and single-item rows too; the query cache never mixes adapters; an adapter loaded at run time
compiles nothing and changes no other adapter's answers. A tiny Llama checks a second family
against peft unmerged and merged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import load_model
from replicas.contract import PromptWork, ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.errors import ScoringError
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.lora_helpers import (
    ALL_TARGETS,
    lora_settings,
    peft_model,
    reference_logprobs,
    reference_scores,
    save_adapter,
)
from tests.support.model_helpers import save_tiny

TO_PEFT = 1e-4  # semantics 21: each adapter's answers vs transformers + peft
SETTINGS = lora_settings(max_loras=4, max_lora_rank=8)
# name -> (seed, rank, alpha, target modules, extra LoraConfig fields)
ADAPTERS = {
    "a": (1, 4, 8, ["q_proj", "v_proj"], {"use_rslora": True}),
    "b": (2, 8, 16, ALL_TARGETS, {}),
    "c": (3, 2, 4, ["o_proj", "down_proj"], {"layers_to_transform": [1]}),
    "d": (4, 3, 6, ["k_proj", "gate_proj", "up_proj"], {}),  # loaded at run time
}
LABELS = (3, 17, 99, 200)


def _ids(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(1, 256, n))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny Qwen3, its four adapters, and one engine serving a, b and c."""
    root = tmp_path_factory.mktemp("lora-qwen3")
    base = save_tiny("qwen3", root / "base")
    paths = {
        name: save_adapter(base, root / name, seed=s, r=r, lora_alpha=al, target_modules=t, **x)
        for name, (s, r, al, t, x) in ADAPTERS.items()
    }
    adapters = tuple((name, str(paths[name])) for name in "abc")
    settings = ReplicaSettings.from_keys(**SETTINGS, model=str(base), lora_adapters=adapters)
    engine = ScoringEngine.from_settings(settings, warm=False)
    return {"base": base, "paths": paths, "engine": engine, "peft": {}}


def _peft(fixture: dict, name: str | None):
    """transformers + peft with adapter ``name`` (None: the base), built once per module."""
    if name not in fixture["peft"]:
        path = None if name is None else fixture["paths"][name]
        fixture["peft"][name] = peft_model(fixture["base"], path)
    return fixture["peft"][name]


def _work(seed: int, adapter: str | None, item_first: bool = False) -> ScoreWork:
    rng = np.random.default_rng(seed)
    items = tuple(_ids(rng, n) for n in (4, 0, 7, 1, 5))
    return ScoreWork(_ids(rng, 11), items, LABELS, item_first, adapter=adapter)


def _rows(work: ScoreWork) -> list[list[int]]:
    if work.item_first:
        return [list(item + work.query_ids) for item in work.item_ids]
    return [list(work.query_ids + item) for item in work.item_ids]


def test_mixed_adapters_share_steps_and_each_equals_peft(qwen3):
    engine = qwen3["engine"]
    names = ["a", "b", "c", None]
    works = [_work(10 + i, name) for i, name in enumerate(names)]
    before = engine.stats().steps
    mixed = engine.score_batch(works)
    mixed_steps = engine.stats().steps - before
    assert mixed_steps == 2  # one prefix step and one item-stream step for all four
    base_out = reference_scores(_peft(qwen3, None), _rows(works[0]), list(LABELS))
    for work, out in zip(works, mixed, strict=True):
        reference = reference_scores(_peft(qwen3, work.adapter), _rows(work), list(LABELS))
        assert np.abs(out - reference).max() <= TO_PEFT, work.adapter
        (alone,) = engine.score_batch([work])
        assert_fp32_close(alone, out, what=str(work.adapter))  # two step shapes of ours
    # each adapter really moves the scores (a wrong slot would read another's or none)
    assert np.abs(mixed[0] - base_out).max() > 0.1


def test_single_item_rows_mixed_adapters_equal_peft(qwen3):
    """``item_first`` works run per item as causal rows; rows of different adapters share
    the step and each equals peft on the same conversation."""
    engine = qwen3["engine"]
    works = [_work(20 + i, name, item_first=True) for i, name in enumerate(["b", "c", None])]
    for work, out in zip(works, engine.score_batch(works), strict=True):
        reference = reference_scores(_peft(qwen3, work.adapter), _rows(work), list(LABELS))
        assert np.abs(out - reference).max() <= TO_PEFT, work.adapter


def test_prompt_logprobs_with_an_adapter_equal_peft(qwen3):
    """/v1/completions' echo log-probs: every prompt token's log-prob and the top tokens
    after each, with adapter b, two prompts sharing a prefix block."""
    rng = np.random.default_rng(30)
    shared = _ids(rng, 16)
    prompts = (shared + _ids(rng, 5), shared + _ids(rng, 3))
    works = [PromptWork(prompts, top_k=2, adapter=name) for name in ("b", None)]
    for work, answers in zip(works, qwen3["engine"].score_batch(works), strict=True):
        references = reference_logprobs(_peft(qwen3, work.adapter), [list(p) for p in prompts])
        for prompt, answer, reference in zip(prompts, answers, references, strict=True):
            expected = reference[np.arange(len(prompt) - 1), list(prompt[1:])]
            assert np.abs(answer.token_logprobs[1:] - expected).max() <= TO_PEFT
            assert answer.top_ids[-1, 0] == int(reference[-1].argmax())


def test_query_cache_is_keyed_by_adapter(qwen3):
    """The same query for adapter a, then b, then a: b misses (never reads a's keys and
    values), a's second run hits, and every answer equals peft's."""
    engine = qwen3["engine"]
    rng = np.random.default_rng(40)
    query = _ids(rng, 20)  # long enough to be worth caching, not fused (fused is off)
    items = (_ids(rng, 3), _ids(rng, 6))
    outcomes = []
    for name in ("a", "b", "a"):
        stats = engine.stats()
        (out,) = engine.score_batch([ScoreWork(query, items, LABELS, adapter=name)])
        after = engine.stats()
        hit = after.query_cache_hits - stats.query_cache_hits
        outcomes.append(hit)
        rows = [list(query + item) for item in items]
        reference = reference_scores(_peft(qwen3, name), rows, list(LABELS))
        assert np.abs(out - reference).max() <= TO_PEFT, name
    assert outcomes == [0, 0, 1]


def test_runtime_load_compiles_nothing_and_leaves_other_adapters_alone(qwen3):
    engine = qwen3["engine"]
    work_a = _work(50, "a")
    engine.score_batch([work_a])
    engine.score_batch([work_a, _work(51, None)])  # the shapes the mixed call runs
    engine.cache.clear()  # as a load clears it: a's query is computed again below
    (before,) = engine.score_batch([work_a])
    compiles = engine.compile_count
    engine.load_adapter("d", str(qwen3["paths"]["d"]))
    assert "d" in engine.info.adapters
    (alone_a,) = engine.score_batch([work_a])  # the load emptied the cache: a miss again
    work_d = _work(51, "d")
    out_a, out_d = engine.score_batch([work_a, work_d])
    assert engine.compile_count == compiles
    # The same step on the same rows, another slot's weights written: bit-exact.
    assert np.array_equal(alone_a, before)
    assert_fp32_close(out_a, before, what="a beside d")
    reference = reference_scores(_peft(qwen3, "d"), _rows(work_d), list(LABELS))
    assert np.abs(out_d - reference).max() <= TO_PEFT
    engine.unload_adapter("d")
    assert "d" not in engine.info.adapters
    with pytest.raises(ScoringError) as refused:
        engine.score_batch([work_d])
    assert refused.value.reason == "model_not_found"


def test_a_slot_reused_after_an_unload_never_reads_the_old_adapters_cache(qwen3):
    """d is unloaded and another adapter (a's files, named e) takes its slot: the same query
    misses the cache and equals peft with a, never d's cached keys and values."""
    engine = qwen3["engine"]
    rng = np.random.default_rng(70)
    query, items = _ids(rng, 20), (_ids(rng, 3), _ids(rng, 6))
    engine.load_adapter("d", str(qwen3["paths"]["d"]))
    engine.score_batch([ScoreWork(query, items, LABELS, adapter="d")])
    engine.unload_adapter("d")
    engine.load_adapter("e", str(qwen3["paths"]["a"]))
    try:
        (out,) = engine.score_batch([ScoreWork(query, items, LABELS, adapter="e")])
    finally:
        engine.unload_adapter("e")
    reference = reference_scores(_peft(qwen3, "a"), [list(query + i) for i in items], list(LABELS))
    assert np.abs(out - reference).max() <= TO_PEFT


def test_unknown_adapter_is_model_not_found(qwen3):
    with pytest.raises(ScoringError) as refused:
        qwen3["engine"].score_batch([_work(60, "nope")])
    assert refused.value.reason == "model_not_found" and "nope" in str(refused.value)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny Llama with one adapter on every projection, and an engine serving it."""
    root = tmp_path_factory.mktemp("lora-llama")
    base = save_tiny("llama", root / "base")
    path = save_adapter(base, root / "x", seed=7, r=8, lora_alpha=4, target_modules=ALL_TARGETS)
    settings = ReplicaSettings.from_keys(
        **SETTINGS, model=str(base), lora_adapters=(("x", str(path)),)
    )
    return {"base": base, "path": path, "engine": ScoringEngine.from_settings(settings, warm=False)}


@pytest.mark.parametrize("merged", [False, True])
def test_llama_adapter_equals_peft_unmerged_and_merged(llama, merged):
    """A second family; peft's merged weights (``merge_and_unload``) give the same answer."""
    work = _work(70, "x")
    (out,) = llama["engine"].score_batch([work])
    reference = peft_model(llama["base"], llama["path"], merged=merged)
    assert np.abs(out - reference_scores(reference, _rows(work), list(LABELS))).max() <= TO_PEFT


def test_grouped_update_equals_peft_in_every_layout(qwen3):
    """The update grouped by slot (model.slot_routing: ``auto`` runs it from 9 slots on;
    the module's engine, 5 slots, runs dense) on the same adapters. Small works run fused,
    several in one row back to back: the slot travels with each token, so a row holding
    works of a, b and the base scores each as peft does. A shared prefix with its item
    stream, single-item rows and prompt log-probs equal peft too."""
    adapters = (("a", str(qwen3["paths"]["a"])), ("b", str(qwen3["paths"]["b"])))
    settings = ReplicaSettings.from_keys(
        **{**SETTINGS, "fused_step_tokens": 32}, model=str(qwen3["base"]), lora_adapters=adapters
    )
    mesh = build_mesh(settings.placement.mesh_shape)
    loaded = load_model(settings.model.name, mesh, settings.model.dtype)
    grouped = dataclasses.replace(loaded.model, lora_update="grouped")
    engine = ScoringEngine(grouped, loaded.params, mesh, settings, "qwen3-grouped")
    rng = np.random.default_rng(80)
    small = [
        ScoreWork(_ids(rng, 5), (_ids(rng, 2), _ids(rng, 3)), LABELS, adapter=name)
        for name in ("a", "b", None)
    ]
    before = engine.stats().steps
    outputs = engine.score_batch(small)
    assert engine.stats().steps - before == 1  # one fused row holds all three
    assert engine.last_signatures[0][0] == "fused"
    works = [*small, _work(91, "b"), _work(92, "a", item_first=True)]
    outputs += engine.score_batch(works[3:])
    for work, out in zip(works, outputs, strict=True):
        reference = reference_scores(_peft(qwen3, work.adapter), _rows(work), list(LABELS))
        assert np.abs(out - reference).max() <= TO_PEFT, work.adapter
    prompt = _ids(rng, 9)
    ((answer,),) = engine.score_batch([PromptWork((prompt,), top_k=1, adapter="a")])
    (reference,) = reference_logprobs(_peft(qwen3, "a"), [list(prompt)])
    expected = reference[np.arange(len(prompt) - 1), list(prompt[1:])]
    assert np.abs(answer.token_logprobs[1:] - expected).max() <= TO_PEFT
