"""A tiny random BGE-M3 saved as BAAI/bge-m3 ships (tests/engine/test_hybrid.py): an
``XLMRobertaModel`` saved by sentence-transformers with CLS pooling and Normalize, and its two
heads beside it as torch pickles, ``colbert_linear.pt`` (a Linear D -> D) and
``sparse_linear.pt`` (a Linear D -> 1), as FlagEmbedding loads them.

FlagEmbedding does not install here (no wheel in this environment's index), so the references
are its ``BGEM3FlagModel`` formulas (``encode``, ``colbert_score``,
``compute_lexical_matching_score``, ``compute_score``'s ``colbert+sparse+dense``) applied to the
saved directory with transformers' ``XLMRobertaModel`` and the heads loaded by torch's
weights-only loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.encoder_helpers import TINY_BERT, randomize_bert_, save_tokenizer, xlmr_config


def save_bge_m3(directory: Path, seed: int = 3) -> Path:
    """The directory, with the heads as ``.pt`` pickles (convert them before serving)."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    hidden = TINY_BERT["hidden_size"]
    hf_dir = directory.parent / f"{directory.name}-hf"
    base = transformers.XLMRobertaModel(xlmr_config(), add_pooling_layer=False)
    randomize_bert_(base, seed)
    base.save_pretrained(hf_dir, safe_serialization=True)
    save_tokenizer(hf_dir)
    modules = [Transformer(str(hf_dir), max_seq_length=120), Pooling(hidden, "cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(directory), safe_serialization=True)
    generator = torch.Generator().manual_seed(seed + 100)
    for name, out in (("colbert_linear", hidden), ("sparse_linear", 1)):
        weight = torch.randn((out, hidden), generator=generator) / hidden**0.5
        bias = 0.2 * torch.randn((out,), generator=generator)
        torch.save({"weight": weight, "bias": bias}, directory / f"{name}.pt")
    return directory


def _model(directory: Path) -> tuple[Any, Any, dict[str, Any]]:
    import torch
    from transformers import AutoTokenizer, XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(directory, add_pooling_layer=False).eval()
    heads = {
        name: torch.load(directory / f"{name}.pt", map_location="cpu", weights_only=True)
        for name in ("colbert_linear", "sparse_linear")
    }
    return model, AutoTokenizer.from_pretrained(directory), heads


def m3_encode(directory: Path, texts: list[str], max_length: int = 120) -> dict[str, list]:
    """FlagEmbedding's ``encode`` (return_dense, return_sparse, return_colbert_vecs), one text
    at a time (no padding): ``dense`` [D], ``lexical`` {token id: weight}, ``colbert`` [n-1, D]."""
    import torch

    model, tokenizer, heads = _model(directory)
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    unused.add(tokenizer.unk_token_id)
    out: dict[str, list] = {"dense": [], "lexical": [], "colbert": []}
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
            hidden = model(**batch).last_hidden_state[0]  # [n, D]
            dense = torch.nn.functional.normalize(hidden[0], dim=-1)
            sparse = heads["sparse_linear"]
            weights = torch.relu(hidden @ sparse["weight"].T + sparse["bias"])[:, 0]
            lexical: dict[int, float] = {}
            for w, token in zip(weights.tolist(), batch["input_ids"][0].tolist(), strict=True):
                if token not in unused and w > 0 and w > lexical.get(token, 0):
                    lexical[token] = w
            colbert = heads["colbert_linear"]
            vectors = hidden[1:] @ colbert["weight"].T + colbert["bias"]
            out["dense"].append(dense.numpy())
            out["lexical"].append(lexical)
            out["colbert"].append(torch.nn.functional.normalize(vectors, dim=-1).numpy())
    return out


def m3_scores(
    directory: Path, query: str, documents: list[str], weights: tuple = (0.4, 0.2, 0.4)
) -> np.ndarray:
    """``compute_score``'s ``colbert+sparse+dense`` of each (query, document): the weighted
    mean of the dense dot, the lexical matching score and ``colbert_score``."""
    q = m3_encode(directory, [query])
    d = m3_encode(directory, documents)
    scores = []
    for dense, lexical, colbert in zip(d["dense"], d["lexical"], d["colbert"], strict=True):
        s_dense = float(np.dot(q["dense"][0], dense))
        s_sparse = sum(w * lexical[t] for t, w in q["lexical"][0].items() if t in lexical)
        s_colbert = float((q["colbert"][0] @ colbert.T).max(axis=1).sum() / len(q["colbert"][0]))
        total = weights[0] * s_dense + weights[1] * s_sparse + weights[2] * s_colbert
        scores.append(total / sum(weights))
    return np.asarray(scores)
