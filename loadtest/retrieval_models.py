"""The retrieval models loadtest.bench_retrieval builds (random weights, float32, nothing
downloaded): a BERT-shaped backbone (loadtest.encoder_models' ``bert-base`` shape and its
lower-casing WordPiece tokenizer over ``ENGLISH``, vocabulary 30,522 rows) saved

- as a ColBERT by ``MultiVectorEncoder``: Transformer (``query_expansion`` fixed, length
  ``QUERY_LENGTH``, not attended; ``document_length`` ``DOCUMENT_LENGTH``), a token Dense
  768 -> ``DIMENSION`` without bias, ``MultiVectorMask`` with ``string.punctuation`` as its
  skiplist ("." and "," are in the vocabulary) and a token-level Normalize;
- as a SPLADE by ``SparseEncoder``: ``BertForMaskedLM`` (decoder tied to the word embeddings)
  under ``Transformer(fill-mask)`` and ``SpladePooling("max")``. Random weights would make
  half the vocabulary active in every text (a real SPLADE keeps a few hundred terms), so the
  decoder's bias is set to one value that leaves about ``ACTIVE_TERMS`` terms of a
  document of ~180 tokens active (calibrated on the model's own logits at build time).

``save_tiny``: tests.support.retrieval_helpers' tiny ColBERT and SPLADE (hidden 32, 2 layers)
for a quick run of the bench.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from loadtest.encoder_models import ENGLISH, Shape, model_config, save_tokenizer

QUERY_LENGTH = 32
DOCUMENT_LENGTH = 256  # longer than every benchmark document: none is cut
MAX_SEQ_LENGTH = 512
DIMENSION = 128
ACTIVE_TERMS = 256


def _seeded() -> None:
    import torch

    torch.manual_seed(0)


def save_colbert_model(directory: Path, shape: Shape, layers: int) -> Path:
    """``shape``'s backbone with ``layers`` layers saved as a ColBERT (see the module)."""
    import torch
    import transformers
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sentence_transformer.modules import Normalize

    _seeded()
    hf_dir = directory.parent / f"{directory.name}-hf"
    transformers.BertModel(model_config(shape, layers), add_pooling_layer=False).save_pretrained(
        hf_dir, safe_serialization=True
    )
    save_tokenizer(hf_dir, shape)
    expansion = {"strategy": "fixed", "attend": False, "length": QUERY_LENGTH}
    transformer = Transformer(
        str(hf_dir), max_seq_length=MAX_SEQ_LENGTH, query_expansion=expansion,
        document_length=DOCUMENT_LENGTH,
    )  # fmt: skip
    dense = Dense(
        in_features=shape.hidden, out_features=DIMENSION, bias=False,
        activation_function=torch.nn.Identity(), module_input_name="token_embeddings",
    )  # fmt: skip
    modules = [
        transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings"),
    ]  # fmt: skip
    MultiVectorEncoder(modules=modules, device="cpu").save(str(directory), safe_serialization=True)
    return directory


def save_splade_model(
    directory: Path, shape: Shape, layers: int, calibration: list[str] | None = None
) -> Path:
    """``shape``'s masked LM with ``layers`` layers saved as a SPLADE (see the module);
    ``calibration``: the texts whose mean active terms the decoder bias aims at
    ``ACTIVE_TERMS`` (default: 8 texts of ~140 words)."""
    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    _seeded()
    hf_dir = directory.parent / f"{directory.name}-hf"
    config = model_config(shape, layers, architectures=["BertForMaskedLM"])
    model = transformers.BertForMaskedLM(config)
    model.tie_weights()
    save_tokenizer(hf_dir, shape)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    if calibration is None:
        rng = np.random.default_rng(1)
        calibration = [" ".join(rng.choice(ENGLISH, 140)) + "." for _ in range(8)]
    batch = tokenizer(calibration, padding=True, return_tensors="pt")
    model.cls.predictions.bias.data.zero_()
    with torch.inference_mode():
        logits = model(**batch).logits  # [texts, tokens, vocab], the bias 0
    logits = logits.masked_fill(~batch["attention_mask"].bool()[..., None], -torch.inf)
    best = logits.max(dim=1).values  # each text's max-pooled logit per term
    # the bias -b leaves a term active where its max logit exceeds b: b is the quantile
    # that keeps ACTIVE_TERMS of the vocabulary per text on average
    keep = 1.0 - ACTIVE_TERMS / best.shape[-1]
    bias = float(torch.quantile(best.flatten().float(), keep))
    with torch.no_grad():
        model.cls.predictions.bias.fill_(-bias)
    model.save_pretrained(hf_dir, safe_serialization=True)
    transformer = Transformer(
        str(hf_dir), transformer_task="fill-mask", max_seq_length=MAX_SEQ_LENGTH
    )
    modules = [transformer, SpladePooling("max", activation_function="relu")]
    SparseEncoder(modules=modules, device="cpu").save(str(directory), safe_serialization=True)
    return directory


def save_tiny(directory: Path, kind: str) -> Path:
    """tests.support.retrieval_helpers' tiny ColBERT (``kind`` "late") or SPLADE ("sparse")."""
    from tests.support.retrieval_helpers import save_colbert, save_splade

    return save_colbert(directory) if kind == "late" else save_splade(directory)
