"""Tiny random-weight embedding models saved as sentence-transformers directories, and their
reference vectors (sentence-transformers' ``encode`` in float32), for tests/engine/test_embed_*.py.

Each directory is what sentence-transformers 6.2 writes for a decoder embedder: the
transformers base model (``Qwen3Model``, ``LlamaModel``, ``Gemma3TextModel``; safetensors names
without ``model.``, no LM head; its config.json declares ``matryoshka_dimensions``) at the root
with SmolLM2's tokenizer, ``modules.json``
(Transformer -> Pooling -> optional Dense -> optional Normalize), ``1_Pooling/config.json``
(the Llama one ``include_prompt: false``), the prompts in ``config_sentence_transformers.json``
and the Transformer's ``modality_config`` in ``sentence_bert_config.json``: ``text`` only
when the tokenizer's chat template was removed (the default), ``text`` and ``message`` when
it was kept (``chat_template=True``: sentence-transformers then renders every text through
the template). A variant's weights are the same either way. Nothing is downloaded.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from replicas.contract import EmbedWork
from tests.support.model_helpers import GEMMA3, TINY, randomize_

VOCAB = 49152  # SmolLM2's tokenizer
QUERY_PROMPT = "Instruct: find the passage\nQuery: "
# name -> (transformers config class, base model class, overrides of TINY, pooling, dense)
EMBED_VARIANTS: dict[str, tuple[str, str, dict[str, Any], str, int | None]] = {
    "qwen3-last": ("Qwen3Config", "Qwen3Model", {"head_dim": 32}, "lasttoken", None),
    "llama-mean": ("LlamaConfig", "LlamaModel", {}, "mean", None),
    "gemma3-mean-dense": ("Gemma3TextConfig", "Gemma3TextModel", GEMMA3, "mean", 48),
}
EXCLUDES_PROMPT = ("llama-mean",)  # Pooling(include_prompt=False)
MATRYOSHKA = (16, 32)  # the sizes every variant's config.json declares (within its dimension)


def save_embedding_model(
    variant: str, directory: Path, tokenizer_dir: Path, max_seq_length: int = 512,
    chat_template: bool = False,
) -> Path:  # fmt: skip
    """Build ``variant`` with random weights and save it as a sentence-transformers directory
    (a ``query`` prompt, Normalize; the Gemma one a Dense 64 -> 48 with tanh first), with
    the tokenizer's chat template or without."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    class_name, model_class, overrides, pooling, dense = EMBED_VARIANTS[variant]
    torch.manual_seed(sum(map(ord, variant)))
    config = getattr(transformers, class_name)(
        **{**TINY, **overrides, "vocab_size": VOCAB, "max_position_embeddings": 1024},
        matryoshka_dimensions=list(MATRYOSHKA),  # config.json declares its Matryoshka sizes
    )
    base = getattr(transformers, model_class)(config)
    randomize_(base, seed=sum(map(ord, variant)))
    hf_dir = directory.parent / f"{directory.name}-hf"
    base.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    if not chat_template:  # sentence-transformers 6 renders text through one when it is there
        tokenizer.chat_template = None
    tokenizer.save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    include = variant not in EXCLUDES_PROMPT
    modules: list[Any] = [
        transformer,
        Pooling(config.hidden_size, pooling_mode=pooling, include_prompt=include),
    ]
    if dense is not None:
        modules.append(Dense(config.hidden_size, dense, activation_function=torch.nn.Tanh()))
    modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.prompts = {"query": QUERY_PROMPT, "document": ""}
    model.save(str(directory), safe_serialization=True)
    return directory


def embed_settings(model: Path, **changes: Any) -> Any:
    """Test settings: rows of up to 1024 tokens, one per step; warm-up compiles two
    signatures (rows of 256 and 1024 tokens)."""
    from replicas.settings import ReplicaSettings

    values = {
        "model": str(model),
        "token_buckets": (1024,),
        "item_token_buckets": (256, 1024),
        "item_tokens_per_step": 1024,
        "batch_buckets": (1,),
        "max_items_per_request": 64,
        "query_cache_bytes": 0,
    }
    return ReplicaSettings.from_keys(**{**values, **changes})


@functools.lru_cache(maxsize=8)
def st_model(directory: str) -> Any:
    """One loaded SentenceTransformer per directory (loading costs ~1 s)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(directory, device="cpu", local_files_only=True)


def reference_vectors(
    directory: Path, texts: list[str], prompt_name: str | None = None, **kwargs: Any
) -> np.ndarray:
    """sentence-transformers' ``encode`` of ``texts`` in float32 ``[n, dim]``."""
    model = st_model(str(directory))
    vectors = model.encode(texts, prompt_name=prompt_name, convert_to_numpy=True, **kwargs)
    return np.asarray(vectors, np.float32)


def chunk_reference(directory: Path, chunks: list[tuple[int, ...]], pooling: str) -> np.ndarray:
    """sentence-transformers' modules but Normalize run on each chunk's token ids alone, the
    chunks folded as vLLM's chunked processing folds them (mean pooling: weighted by their
    tokens), then L2-normalized: one vector ``[D]``."""
    import torch

    modules = list(st_model(str(directory)))[:-1]  # Transformer, Pooling(, Dense); Normalize
    vectors = []
    for ids in chunks:
        features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
        with torch.no_grad():
            for module in modules:
                features = module(features)
        vectors.append(features["sentence_embedding"][0].double().numpy())
    if pooling == "mean":
        folded = np.average(vectors, axis=0, weights=[len(ids) for ids in chunks])
    else:
        folded = vectors[0] if pooling == "cls" else vectors[-1]
    return (folded / np.linalg.norm(folded)).astype(np.float32)


def texts_of(seed: int, count: int, longest: int = 512) -> list[str]:
    """Texts of about 1..``longest`` tokens (SmolLM2's tokenizer: ~1 token per word)."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "blue"]
    lengths = np.exp(rng.uniform(0, np.log(longest - 2), count)).astype(int) + 1
    return [" ".join(rng.choice(words, n)) for n in lengths]


def assert_split_as_whole(
    engine: Any, work: Any, reference: np.ndarray, cuts: list[int], seed: int,
    alone: tuple[int, ...], tol: float,
) -> None:  # fmt: skip
    """``work``'s inputs, split over concurrent works at ``cuts`` of a seeded permutation,
    and the ``alone`` ones each in a work of its own, embed as ``reference [N, D]`` says:
    what shares a row or a step never changes a vector."""
    order = np.random.default_rng(seed).permutation(len(work.inputs))
    parts = np.split(order, cuts)
    answers = engine.score_batch([EmbedWork(tuple(work.inputs[i] for i in p)) for p in parts])
    for part, answer in zip(parts, answers, strict=True):
        np.testing.assert_allclose(answer, reference[part], atol=tol, rtol=0)
    for i in alone:
        (single,) = engine.score_batch([EmbedWork((work.inputs[i],))])
        np.testing.assert_allclose(single[0], reference[i], atol=tol, rtol=0)
