"""A BERT embedder (a ``BertModel`` saved by sentence-transformers, CLS or mean pooling,
Normalize; and an ``XLMRobertaModel``, mean: positions from pad + 1, its ``[UNK]`` = pad id
uncounted) in the engine equals
sentence-transformers' ``encode`` in float32 within 1e-5, alone and packed with other
sequences of other lengths in one step, and a vector does not depend on what shares its step;
a ``ModernBertModel`` (3 layers, global then local, a +-4 window far shorter than most
sequences, LayerNorm biases, RoPE bases off their defaults) the same
(tests/support/encoder_helpers.py: random LayerNorms and biases). One engine per variant,
rows of 64 and 256 tokens, so a step packs many sequences, each attending within its own
across the whole row (``attend_row``; the blocked form: tests/unit/test_encoder_attention.py).
An encoder's rows hold about their longest input's window, not the step's capacity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.embeddings import Embedder
from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
from replicas.contract import EmbedWork
from tests.support.embed_helpers import assert_split_as_whole, embed_settings, reference_vectors
from tests.support.encoder_helpers import save_bert_embedder, sentences

TOL = 1e-5


def bert_settings(directory: Path) -> Any:
    return embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
    )  # fmt: skip


@pytest.fixture(
    scope="module",
    params=[("bert", "cls"), ("bert", "mean"), ("xlm_roberta", "mean"), ("modernbert", "mean")],
    ids=["bert-cls", "bert-mean", "xlmr-mean", "modernbert-mean"],
)
def bert(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from replicas.engine.scoring_engine import ScoringEngine

    family, pooling = request.param
    root = tmp_path_factory.mktemp("bert")
    directory = save_bert_embedder(root / pooling, pooling, family=family)
    engine = ScoringEngine.from_settings(bert_settings(directory), warm=True)
    embedder = Embedder(engine.info, load_tokenizer(resolve_model_source(directory)))
    return directory, engine, embedder


def test_vectors_equal_sentence_transformers_alone_and_packed(bert) -> None:
    directory, engine, embedder = bert
    texts = sentences(1, 24)
    reference = reference_vectors(directory, texts)
    work = embedder.text_work(texts, None)
    assert all(ids[0] == 2 and ids[-1] == 3 for ids in work.inputs)  # [CLS] ... [SEP]
    assert len({t for ids in work.inputs for t in ids}) > 10  # words, not [UNK] alone
    assert sum(ids.count(1) for ids in work.inputs) > 3  # [UNK]: XLM-R's pad_token_id
    (together,) = engine.score_batch([work])
    np.testing.assert_allclose(together, reference, atol=TOL, rtol=0)
    assert_split_as_whole(engine, work, reference, [1, 9], seed=2, alone=(0, 5), tol=TOL)
    assert engine.info.kind == "embedding" and engine.info.pooling.dimension == 32


def test_a_vector_does_not_depend_on_its_step(bert) -> None:
    _, engine, embedder = bert
    work = embedder.text_work(sentences(4, 12, longest=60), None)
    (base,) = engine.score_batch([work])
    changed = EmbedWork((work.inputs[0], tuple(reversed(work.inputs[1])), *work.inputs[2:]))
    (other,) = engine.score_batch([changed])
    np.testing.assert_array_equal(other[0], base[0])
    np.testing.assert_array_equal(other[2:], base[2:])


def test_the_pallas_segment_kernel_embeds_as_sentence_transformers(tmp_path: Path) -> None:
    """``attention: pallas`` (the TPU default; interpret mode on this CPU): an XLM-RoBERTa
    embedder's packed sequences attend through ``pallas_attention.segment_attention`` and
    the vectors still equal ``encode``, packed and alone."""
    from replicas.engine.scoring_engine import ScoringEngine

    directory = save_bert_embedder(tmp_path / "xlmr", "mean", family="xlm_roberta")
    settings = embed_settings(
        directory, token_buckets=(64,), item_token_buckets=(64,), item_tokens_per_step=64,
        attention="pallas",
    )  # fmt: skip
    engine = ScoringEngine.from_settings(settings, warm=True)
    assert engine.model.segment_attention is not None  # the kernel, not attend_segments
    embedder = Embedder(engine.info, load_tokenizer(resolve_model_source(directory)))
    texts = sentences(7, 9, longest=20)
    work = embedder.text_work(texts, None)
    (together,) = engine.score_batch([work])
    np.testing.assert_allclose(together, reference_vectors(directory, texts), atol=TOL, rtol=0)
    (alone,) = engine.score_batch([EmbedWork((work.inputs[3],))])
    np.testing.assert_allclose(alone[0], together[3], atol=TOL, rtol=0)


def test_an_encoders_rows_hold_about_their_longest_inputs_window(tmp_path: Path) -> None:
    """Its attention reads the whole row, so rows stay near the window of their first
    (longest) input, ``ENCODER_ROW`` (64) tokens at least: one input of 100 tokens and 60 of
    10 (700) make a row of 128 at most and ten of 64, not one row of 1024; rows of one limit
    share a step up to its capacity; each step's window is its row."""
    from replicas.engine.layouts.embed_packing import ENCODER_ROW
    from replicas.engine.scoring_engine import ScoringEngine

    directory = save_bert_embedder(tmp_path / "cls", "cls")
    buckets = (64, 256, 512, 1024)
    settings = embed_settings(directory, item_token_buckets=buckets, item_tokens_per_step=1024)
    engine = ScoringEngine.from_settings(settings, warm=False)
    work = EmbedWork(((2, *(7,) * 98, 3), *((2, *(7,) * 8, 3),) * 60))
    steps = [dims for kind, dims in engine.plan([work]) if kind == "embed"]
    assert ENCODER_ROW == 64 and all(dims.window == dims.tokens for dims in steps)
    # a row of 100 + 2 x 10 (its limit the 100's window, 128; padded to the bucket 256), then
    # nine rows of 6 x 10 and one of 4 x 10 (limit 64): eight of them in one step (a step's
    # weights read once for up to its capacity in tokens), the last two in another
    assert [(dims.batch, dims.tokens) for dims in steps] == [(1, 256), (8, 64), (2, 64)]
    (vectors,) = engine.score_batch([work])
    assert vectors.shape == (61, 32) and np.isfinite(vectors).all()


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_bfloat16_vectors_stay_within_the_bf16_bound(family: str, tmp_path: Path) -> None:
    """``dtype: bfloat16`` (weights and activations; LayerNorm, softmax and GELU in float32):
    every vector is as far from float32 ``encode`` as sentence-transformers' own model cast
    to ``torch.bfloat16`` gets, within twice that plus one bfloat16 rounding of a unit
    vector's entry (2^-8): the bf16 bound. (XLM-RoBERTa runs BERT's code.)"""
    import torch
    from sentence_transformers import SentenceTransformer

    from replicas.engine.scoring_engine import ScoringEngine

    directory = save_bert_embedder(tmp_path / family, "mean", family=family)
    settings = embed_settings(
        directory, token_buckets=(256,), item_token_buckets=(64, 256), item_tokens_per_step=256,
        dtype="bfloat16",
    )  # fmt: skip
    engine = ScoringEngine.from_settings(settings, warm=False)
    embedder = Embedder(engine.info, load_tokenizer(resolve_model_source(directory)))
    texts = sentences(5, 16)
    (ours,) = engine.score_batch([embedder.text_work(texts, None)])
    exact = reference_vectors(directory, texts)
    model = SentenceTransformer(str(directory), device="cpu", local_files_only=True)
    theirs = model.to(torch.bfloat16).encode(texts, convert_to_tensor=True).float().numpy()
    torch_error = float(np.abs(theirs - exact).max())
    assert 0 < float(np.abs(ours - exact).max()) <= 2 * torch_error + 2**-8, torch_error
