"""A sparse model's masked-LM head (replicas/model/mlm_head.py): a tiny random
``BertForMaskedLM``, ``XLMRobertaForMaskedLM`` (its pad id among the tokens) and
``ModernBertForMaskedLM`` (a +-4 window, shorter than the sequences; its dense's bias), loaded
through the checkpoint loader as a sparse model (``params["mlm"]``, the decoder tied to
``params["embed"]``), give transformers' ``logits`` in float32 within 1e-4 on sequences of
three lengths, one per row behind padding (tests/support/mlm_helpers.py). Their configs read
as the encoder family; an untied decoder, another activation or no decoder bias is refused
naming the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import load_model
from replicas.embed_contract import PoolingHead, SparseOutput
from replicas.model.config import config_from_hf
from replicas.model.errors import UnsupportedModelError
from replicas.model.mlm_head import mlm_logits
from replicas.model.params import param_shapes
from tests.support.mlm_helpers import masked_lm_config, save_masked_lm

TOL = 1e-4
LENGTHS = (5, 13, 21)


def sparse_head(vocab: int) -> PoolingHead:
    return PoolingHead(pooling="splade", normalize=False, dimension=vocab, sparse=SparseOutput())


def sequences(vocab: int, seed: int) -> list[np.ndarray]:
    """Random token ids of each length, id 1 (XLM-R's pad: no position counted, as
    transformers counts them) third."""
    rng = np.random.default_rng(seed)
    return [
        np.concatenate([rng.integers(2, vocab, 2), [1], rng.integers(2, vocab, n - 3)])
        for n in LENGTHS
    ]


@pytest.mark.parametrize("family", ["bert", "xlm_roberta", "modernbert"])
def test_mlm_logits_equal_transformers(family: str, tmp_path: Path) -> None:
    import torch

    reference_model = save_masked_lm(tmp_path, family, seed=3)
    vocab = reference_model.config.vocab_size
    loaded = load_model(tmp_path, build_mesh((1, 1)), "float32", pooling=sparse_head(vocab))
    config, params = loaded.config, loaded.params
    assert config.family == family and config.head is None and config.encoder
    assert "decoder" not in params["mlm"] and params["mlm"]["bias"].shape == (vocab,)
    structure = jax.tree_util.tree_structure
    assert structure(loaded.model.init_params(jax.random.key(0))) == structure(params)

    seqs = sequences(vocab, seed=4)
    width = max(LENGTHS)
    tokens = np.zeros((len(seqs), width), np.int32)
    positions = np.zeros_like(tokens)
    item_ids = np.full_like(tokens, -1)
    for row, ids in enumerate(seqs):
        tokens[row, : len(ids)], positions[row, : len(ids)] = ids, np.arange(len(ids))
        item_ids[row, : len(ids)] = 0
    hidden = loaded.model.encode(params, tokens, positions, item_ids, width)  # [B, S, D]
    logits = np.asarray(jax.jit(mlm_logits, static_argnums=0)(config, params, hidden))

    with torch.no_grad():
        for row, ids in enumerate(seqs):
            expected = reference_model(torch.tensor(ids[None])).logits[0].numpy()
            np.testing.assert_allclose(logits[row, : len(ids)], expected, atol=TOL, rtol=0)
    assert logits.dtype == np.float32 and logits.shape == (len(seqs), width, vocab)


@pytest.mark.parametrize("family", ["bert", "xlm_roberta", "modernbert"])
def test_a_masked_lm_config_reads_as_its_encoder_and_holds_the_head_only_when_sparse(
    family: str,
) -> None:
    config = config_from_hf(masked_lm_config(family))
    assert config.family == family and config.encoder and config.head is None
    assert "mlm" not in param_shapes(config)
    sparse = dataclasses.replace(config, pooling=sparse_head(config.vocab_size))
    shapes = param_shapes(sparse)["mlm"]
    d = config.hidden_size
    assert shapes["dense"] == (d, d) and shapes["dense_bias"] == (d,)
    assert shapes["norm"] == {"scale": (d,), "bias": (d,)}


@pytest.mark.parametrize(
    ("family", "changes", "field"),
    [
        ("bert", {"tie_word_embeddings": False}, "tie_word_embeddings"),
        ("xlm_roberta", {"tie_word_embeddings": False}, "tie_word_embeddings"),
        ("modernbert", {"classifier_activation": "relu"}, "classifier_activation"),
        ("modernbert", {"decoder_bias": False}, "decoder_bias"),
    ],
)
def test_a_head_mlm_logits_cannot_run_is_refused_naming_the_field(
    family: str, changes: dict, field: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=f"^{field}: "):
        config_from_hf(masked_lm_config(family, **changes))
