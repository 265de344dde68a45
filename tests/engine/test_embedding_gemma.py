"""EmbeddingGemma (replicas/model/embedding_gemma.py) equals sentence-transformers (fp32).

A tiny random EmbeddingGemma saved as google/embeddinggemma-300m's directory is laid out
(tests/support/embedding_gemma.py: bidirectional Gemma 3 layers, windowed and global, mean
Pooling, Dense 64 -> 256 -> 64 without biases, Normalize, its task prompts): the config is
the ``embeddinggemma`` family, and every vector equals ``encode``'s within 1e-5 per
component, alone and in mixed batches of inputs of 1..512 tokens (most far past the window
of 4 positions to either side), whatever shares its row and whether its step's attention
reads the whole row or runs in blocks; its ``query`` and ``document`` prompts apply as
sentence-transformers applies them. A bidirectional Gemma 3 without a pooling head is
refused by name. The attention itself equals the rule written out densely.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.embeddings import Embedder
from replicas.checkpoints.sources import load_hf_config, load_tokenizer, resolve_model_source
from tests.support.embed_helpers import (
    assert_split_as_whole,
    embed_settings,
    reference_vectors,
    texts_of,
)
from tests.support.embedding_gemma import CONFIG, PROMPTS, WIDE

TOL = 1e-5  # tiny models: docs/semantics.md, "The float32 floor"


@pytest.fixture(scope="module")
def served(embedding_gemma_dir: Path) -> tuple[Any, Embedder]:
    """A warm engine of the directory (two compiled signatures) and its ingress-side
    Embedder."""
    from replicas.engine.scoring_engine import ScoringEngine

    engine = ScoringEngine.from_settings(embed_settings(embedding_gemma_dir), warm=True)
    tokenizer = load_tokenizer(resolve_model_source(embedding_gemma_dir))
    return engine, Embedder(engine.info, tokenizer)


def test_the_directory_is_the_embeddinggemma_family_with_its_modules(
    embedding_gemma_dir: Path,
) -> None:
    from replicas.model.config import config_from_hf
    from replicas.model.pooling_config import pooling_head_for

    hf = load_hf_config(resolve_model_source(embedding_gemma_dir))
    config = config_from_hf(hf)
    assert config.family == "embeddinggemma"
    assert config.sliding_window == CONFIG["sliding_window"] // 2 + 1  # as transformers holds it
    assert config.sliding_layers == (True, False, True)
    assert config.query_scale == CONFIG["query_pre_attn_scalar"] ** -0.5
    head = pooling_head_for(embedding_gemma_dir, hf)
    assert head is not None and (head.pooling, head.normalize) == ("mean", True)
    assert head.dense == ((64, WIDE, "identity"), (WIDE, 64, "identity"))
    assert dict(head.prompts) == PROMPTS and head.default_prompt_name is None


def test_a_bidirectional_gemma3_without_pooling_is_refused_by_name() -> None:
    import jax.numpy as jnp
    import transformers

    from replicas.model.classes import model_for
    from replicas.model.config import config_from_hf
    from replicas.model.errors import UnsupportedModelError

    hf = transformers.Gemma3TextConfig(**CONFIG, architectures=["Gemma3ForCausalLM"])
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        model_for(config_from_hf(hf), jnp.float32)


def test_vectors_equal_sentence_transformers_alone_and_in_mixed_batches(
    served: tuple[Any, Embedder], embedding_gemma_dir: Path
) -> None:
    engine, embedder = served
    texts = texts_of(11, 24)
    reference = reference_vectors(embedding_gemma_dir, texts)  # padded batches of 1..512
    work = embedder.text_work(texts, None)
    assert max(len(ids) for ids in work.inputs) > 256 > 2 * CONFIG["sliding_window"]
    (together,) = engine.score_batch([work])
    np.testing.assert_allclose(together, reference, atol=TOL, rtol=0)
    assert_split_as_whole(engine, work, reference, [1, 7], seed=4, alone=(3,), tol=TOL)
    assert engine.info.pooling.dimension == reference.shape[1] == 64


def test_short_inputs_packed_in_one_row_stay_apart(
    served: tuple[Any, Embedder], embedding_gemma_dir: Path
) -> None:
    """40 inputs of up to 60 tokens share a row of 1024 in the step of their own window (256,
    compiled for them): its attention runs in blocks of 128 queries reading two blocks to
    either side, not the whole row as the warm steps' does."""
    from replicas.engine.layouts.embed_packing import EmbedDims

    engine, embedder = served
    texts = texts_of(12, 40, longest=60)
    own = EmbedDims(1, 1024, 256)
    engine.compile_later("embed", own)
    assert engine.wait_for_background_compiles(600)
    (vectors,) = engine.score_batch([embedder.text_work(texts, None)])
    assert engine.last_signatures == [("embed", own)]
    reference = reference_vectors(embedding_gemma_dir, texts)
    np.testing.assert_allclose(vectors, reference, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["query", "document"])
def test_its_prompts_apply_as_sentence_transformers_applies_them(
    served: tuple[Any, Embedder], embedding_gemma_dir: Path, name: str
) -> None:
    engine, embedder = served
    texts = texts_of(13, 5, longest=40)
    assert engine.info.pooling.prompt(name) == PROMPTS[name]
    (vectors,) = engine.score_batch([embedder.text_work(texts, PROMPTS[name])])
    reference = reference_vectors(embedding_gemma_dir, texts, prompt_name=name)
    np.testing.assert_allclose(vectors, reference, atol=TOL, rtol=0)


def test_the_attention_is_the_rule_written_out() -> None:
    """Five inputs in a row of 1024 (blocks of 128 queries reading two blocks to either
    side): a global layer's token reads its whole input, a windowed one's the keys less than
    the window apart; 4 query heads over 2 key/value heads, the family's logit scale."""
    import jax.numpy as jnp

    from replicas.model.config import NO_WINDOW
    from replicas.model.embedding_gemma import attend_bidirectional

    rng = np.random.default_rng(0)
    lengths, width, heads, kv_heads, dh, scale = (100, 150, 90, 200, 120), 1024, 4, 2, 8, 0.3
    ids = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    ids = np.pad(ids, (0, width - ids.size), constant_values=-1)[None]  # [1, S]
    positions = np.concatenate([np.arange(n) for n in lengths])
    positions = np.pad(positions, (0, width - positions.size))[None]  # [1, S]
    q = rng.standard_normal((1, width, heads, dh), np.float32)
    k, v = (rng.standard_normal((1, width, kv_heads, dh), np.float32) for _ in range(2))
    empty = jnp.zeros((1, 4, kv_heads, dh))
    real = ids[0] >= 0
    for window in (5, NO_WINDOW):
        got = attend_bidirectional(
            q, empty, empty, jnp.zeros((1, 4), bool), k, v, ids, 256, scale,
            positions=positions, sliding_window=jnp.asarray(window),
        )  # fmt: skip
        mask = (ids[0, :, None] == ids[0, None, :]) & real[:, None]
        mask &= np.abs(positions[0, :, None] - positions[0, None, :]) < window  # [S, S]
        mask |= np.eye(width, dtype=bool)  # padding reads itself (not compared)
        kk, vv = (np.repeat(x[0], heads // kv_heads, axis=1) for x in (k, v))  # [S, H, Dh]
        logits = np.where(mask[None], np.einsum("shd,thd->hst", q[0], kk) * scale, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))  # [H, S, S]
        expected = np.einsum("hst,thd->shd", probs / probs.sum(-1, keepdims=True), vv)
        np.testing.assert_allclose(np.asarray(got)[0][real], expected[real], atol=1e-5)
