"""Tiny random retrieval models saved by sentence-transformers 6.2, and the library's own
answers for them: late-interaction (ColBERT, ``MultiVectorEncoder``) in the native layout and
in PyLate v3's, and sparse (SPLADE, ``SparseEncoder``) with ``Transformer(fill-mask)`` or the
deprecated ``MLMTransformer`` that hub SPLADE checkpoints carry. The encoders are
``tests.support.encoder_helpers``' families (WordPiece vocabulary ``SPECIALS + WORDS``: "." is
the only punctuation in it, ``[MASK]`` is id 4), every weight random. Reference values load
the saved directory with the library on CPU in float32; nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tests.support.encoder_helpers import FAMILIES, TINY_BERT, randomize_bert_

MASKED_LM = {
    "bert": "BertForMaskedLM",
    "xlm_roberta": "XLMRobertaForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
}
# PyLate v3 spellings of the two modules it listed (ST <= 5.3's ``models`` path, PyLate's Dense)
PYLATE_TRANSFORMER = "sentence_transformers.models.Transformer"
PYLATE_DENSE = "pylate.models.Dense.Dense"
# ST 5.0-5.3 spellings of the SPLADE modules, as hub checkpoints carry them
ST5_MLM_TRANSFORMER = "sentence_transformers.sparse_encoder.models.MLMTransformer"
ST5_SPLADE_POOLING = "sentence_transformers.sparse_encoder.models.SpladePooling"


class ColbertTokens(NamedTuple):
    """Per input: the token ids fed to the encoder (query rows at the expansion width, the pads
    swapped for ``[MASK]``), the attention mask the encoder sees, and the scoring mask
    (``attention_mask`` after ``MultiVectorMask``): True where a vector is returned and scored."""

    ids: list[list[int]]
    attended: list[list[bool]]
    scored: list[list[bool]]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def _save_base(hf_dir: Path, family: str, seed: int, masked_lm: bool) -> None:
    """The family's tiny encoder (``*Model`` without pooler, or ``*ForMaskedLM`` with its decoder
    tied to the word embeddings), every weight random, and the WordPiece tokenizer."""
    import torch
    import transformers

    config, base_class, _, save_tokens = FAMILIES[family]
    torch.manual_seed(seed)
    if masked_lm:
        extra = {"classifier_bias": True} if family == "modernbert" else {}
        model = getattr(transformers, MASKED_LM[family])(
            config(architectures=[MASKED_LM[family]], **extra)
        )
    else:
        pooler = {} if family == "modernbert" else {"add_pooling_layer": False}
        model = getattr(transformers, base_class)(config(), **pooler)
    randomize_bert_(model, seed)
    if masked_lm:
        model.tie_weights()  # named_parameters holds a tied weight once: it stays shared
        decoder, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        assert decoder.weight is embeddings.weight, "the MLM decoder is not tied"
    model.save_pretrained(hf_dir, safe_serialization=True)
    save_tokens(hf_dir)


def save_colbert(
    directory: Path, family: str = "bert", seed: int = 0, attend: bool = False,
    strategy: str = "fixed", query_length: int = 12, dimension: int = 16,
    skiplist: bool = True, prompts: dict[str, str] | None = None,
) -> Path:  # fmt: skip
    """A tiny random ColBERT saved natively by ``MultiVectorEncoder``; returns ``directory``.

    Modules: Transformer (``max_seq_length`` 120, ``document_length`` 100, ``query_expansion``
    ``{strategy, attend, length: query_length}``), Dense 32 -> ``dimension`` without bias (a
    seeded N(0, 1/32) matrix), MultiVectorMask (``string.punctuation`` or no skiplist; only "."
    is in the vocabulary) and a token-level Normalize. Prompts default to ``{"query": "what ",
    "document": "the "}`` (in-vocabulary words). The base model lies in ``<name>-hf`` beside it.
    """
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sentence_transformer.modules import Normalize

    hf_dir = directory.parent / f"{directory.name}-hf"
    _save_base(hf_dir, family, seed, masked_lm=False)
    expansion = {"strategy": strategy, "attend": attend, "length": query_length}
    transformer = Transformer(
        str(hf_dir), max_seq_length=120, query_expansion=expansion, document_length=100
    )
    hidden = TINY_BERT["hidden_size"]
    dense = Dense(
        in_features=hidden, out_features=dimension, bias=False,
        activation_function=torch.nn.Identity(), module_input_name="token_embeddings",
    )  # fmt: skip
    generator = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        weight = torch.randn((dimension, hidden), generator=generator) / hidden**0.5
        dense.linear.weight.copy_(weight)
    words = list(string.punctuation) if skiplist else []
    modules = [
        transformer, dense, MultiVectorMask(skiplist_words=words),
        Normalize(module_input_name="token_embeddings"),
    ]  # fmt: skip
    prompts = prompts or {"query": "what ", "document": "the "}
    model = MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu")
    model.save(str(directory), safe_serialization=True)
    return directory


def save_pylate_colbert(
    directory: Path, family: str = "bert", seed: int = 0, attend: bool = False,
    query_length: int = 12, dimension: int = 16, skiplist: bool = True,
    query_prefix: str = "what ", document_prefix: str = "the ",
) -> Path:  # fmt: skip
    """The ``save_colbert`` model (strategy "fixed", equal weights for equal arguments) in
    PyLate v3's layout; returns ``directory``.

    ``modules.json``: only ``sentence_transformers.models.Transformer`` (path "") and
    ``pylate.models.Dense.Dense`` (1_Dense, its config without module IO names).
    ``sentence_bert_config.json``: ``{"max_seq_length": 120, "do_lower_case": false}``.
    ``config_sentence_transformers.json``: ``model_type`` "ColBERT", ``query_prefix``,
    ``document_prefix``, ``query_length``, ``document_length`` 100,
    ``attend_to_expansion_tokens``, ``do_query_expansion`` true, ``skiplist_words``, empty
    prompts, ``similarity_fn_name`` "cosine" (which the loader ignores: MaxSim). The prefixes
    default to in-vocabulary words, which the loader prepends as text and need no special-token
    registration, so the load matches ``save_colbert(prompts={"query": query_prefix,
    "document": document_prefix})``; PyLate's own "[Q] " / "[D] " are not in this vocabulary
    and would tokenize to three ``[UNK]`` each.
    """
    prompts = {"query": query_prefix, "document": document_prefix}
    save_colbert(
        directory, family=family, seed=seed, attend=attend, strategy="fixed",
        query_length=query_length, dimension=dimension, skiplist=skiplist, prompts=prompts,
    )  # fmt: skip
    modules = _read_json(directory / "modules.json")[:2]
    modules[0]["type"], modules[1]["type"] = PYLATE_TRANSFORMER, PYLATE_DENSE
    _write_json(directory / "modules.json", modules)
    for module in ("2_MultiVectorMask", "3_Normalize"):
        shutil.rmtree(directory / module)
    dense = _read_json(directory / "1_Dense" / "config.json")
    for key in ("module_input_name", "module_output_name"):
        dense.pop(key)
    _write_json(directory / "1_Dense" / "config.json", dense)
    _write_json(
        directory / "sentence_bert_config.json", {"max_seq_length": 120, "do_lower_case": False}
    )
    saved = _read_json(directory / "config_sentence_transformers.json")
    config = {
        "__version__": {**saved["__version__"], "pylate": "1.1.7"},
        "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "cosine", "model_type": "ColBERT",
        "query_prefix": query_prefix, "document_prefix": document_prefix,
        "query_length": query_length, "document_length": 100,
        "attend_to_expansion_tokens": attend, "do_query_expansion": True,
        "skiplist_words": list(string.punctuation) if skiplist else [],
    }  # fmt: skip
    _write_json(directory / "config_sentence_transformers.json", config)
    return directory


def save_splade(
    directory: Path, family: str = "bert", seed: int = 1, max_active_dims: int | None = None,
    activation: str = "relu", pooling: str = "max", legacy: bool = False,
) -> Path:  # fmt: skip
    """A tiny random SPLADE saved by ``SparseEncoder``; returns ``directory``.

    A ``*ForMaskedLM`` (decoder tied to the word embeddings, its bias random) in ``<name>-hf``,
    then ``Transformer(transformer_task="fill-mask")`` and ``SpladePooling(pooling,
    activation)``, ``max_active_dims`` in ``config_sentence_transformers.json`` when set.
    ``legacy``: saved with the deprecated ``MLMTransformer`` instead, then written as ST 5.0-5.3
    saved it (hub checkpoints): module types ``sentence_transformers.sparse_encoder.models.
    MLMTransformer`` / ``.SpladePooling``, ``sentence_bert_config.json`` holding only
    ``max_seq_length`` (120) and ``do_lower_case``, SpladePooling's ``word_embedding_dimension``.
    """
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    hf_dir = directory.parent / f"{directory.name}-hf"
    _save_base(hf_dir, family, seed, masked_lm=True)
    if legacy:
        transformer = MLMTransformer(str(hf_dir), max_seq_length=120)
    else:
        transformer = Transformer(str(hf_dir), transformer_task="fill-mask", max_seq_length=120)
    splade = SpladePooling(pooling, activation_function=activation)
    model = SparseEncoder(
        modules=[transformer, splade], device="cpu", max_active_dims=max_active_dims
    )
    model.save(str(directory), safe_serialization=True)
    if legacy:
        modules = _read_json(directory / "modules.json")
        modules[0]["type"], modules[1]["type"] = ST5_MLM_TRANSFORMER, ST5_SPLADE_POOLING
        _write_json(directory / "modules.json", modules)
        st5 = {"max_seq_length": 120, "do_lower_case": False}
        _write_json(directory / "sentence_bert_config.json", st5)
        vocab = model[0].auto_model.config.vocab_size
        pooled = {"pooling_strategy": pooling, "activation_function": activation}
        _write_json(
            directory / "1_SpladePooling" / "config.json",
            {**pooled, "word_embedding_dimension": vocab},
        )
    return directory


def _colbert(directory: Path) -> Any:
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(directory), device="cpu")


def colbert_vectors(directory: Path, texts: list[str], task: str) -> list[np.ndarray]:
    """The library's vectors per input (``encode_query`` for task "query", else
    ``encode_document``): float32 arrays [scored tokens, dimension], unit rows, the scoring mask
    already applied (query rows: the expansion width; documents: real tokens less skiplist)."""
    model = _colbert(directory)
    encode = model.encode_query if task == "query" else model.encode_document
    return list(encode(texts, convert_to_numpy=True, batch_size=len(texts)))


def colbert_scores(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    """MaxSim of ``query`` against each document by ``model.similarity`` (sum over query
    vectors of the best dot product with a document vector): float32 [documents]."""
    model = _colbert(directory)
    queries = model.encode_query([query], convert_to_numpy=True)
    docs = model.encode_document(documents, convert_to_numpy=True)
    return np.asarray(model.similarity(queries, docs))[0]


def colbert_token_ids(directory: Path, texts: list[str], task: str) -> ColbertTokens:
    """What the library feeds the encoder per input, one text at a time (no batch padding):
    ``model.preprocess(text, prompt=model.prompts[task], task=task)``, then the forward's
    ``attention_mask`` after ``MultiVectorMask``; see ``ColbertTokens``. Query rows hold the
    expansion width (strategy "fixed": exactly ``length``; "min": at least), the pads there
    ``[MASK]``; document rows hold their real tokens (prompt and specials included)."""
    import torch

    model = _colbert(directory)
    prompt = model.prompts.get(task) or None
    ids, attended, scored = [], [], []
    for text in texts:
        features = model.preprocess([text], prompt=prompt, task=task)
        ids.append(features["input_ids"][0].tolist())
        attended.append(features["attention_mask"][0].bool().tolist())
        with torch.inference_mode():
            out = model(dict(features), task=task)
        scored.append(out["attention_mask"][0].bool().tolist())
    return ColbertTokens(ids, attended, scored)


def _sparse(directory: Path) -> Any:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(directory), device="cpu")


def _sparse_encode(model: Any, texts: list[str], task: str | None) -> Any:
    encode = {"query": model.encode_query, "document": model.encode_document}.get(
        task or "", model.encode
    )
    return encode(texts, convert_to_sparse_tensor=True, batch_size=len(texts))


def splade_vectors(
    directory: Path, texts: list[str], task: str | None = None
) -> list[dict[int, float]]:
    """The library's sparse vectors per input (``encode``, or ``encode_query`` /
    ``encode_document`` for a task), saved ``max_active_dims`` applied: ``{vocab index: weight}``
    of the COO tensor's entries (weights > 0, float32 values as Python floats)."""
    embeddings = _sparse_encode(_sparse(directory), texts, task).coalesce().cpu()
    rows, columns = embeddings.indices().tolist()
    values = embeddings.values().tolist()
    vectors: list[dict[int, float]] = [{} for _ in texts]
    for row, column, value in zip(rows, columns, values, strict=True):
        vectors[row][column] = value
    return vectors


def splade_scores(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    """``model.similarity`` (dot product) of the query's ``encode_query`` vector with each
    document's ``encode_document`` vector: float32 [documents]."""
    model = _sparse(directory)
    queries = _sparse_encode(model, [query], "query")
    docs = _sparse_encode(model, documents, "document")
    scores = model.similarity(queries, docs)
    scores = scores.to_dense() if scores.is_sparse else scores
    return scores.cpu().numpy()[0]
