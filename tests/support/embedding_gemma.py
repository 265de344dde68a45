"""A tiny random-weight EmbeddingGemma saved as google/embeddinggemma-300m's
sentence-transformers directory is laid out (for tests/engine/test_embedding_gemma.py and
tests/serve/test_serve_embedding_gemma.py).

The real model: a ``Gemma3TextModel`` with ``use_bidirectional_attention: true`` (24 layers,
five windowed of 512 then a global one), mean Pooling, Dense 768 -> 3072 and 3072 -> 768
(no biases, identity), Normalize, the task prompts below, ``max_seq_length`` 2048. Here: 3
layers of width 64 (windowed, global, windowed; 4 query heads over 2 key/value heads of 16,
``query_pre_attn_scalar`` 24, so the logit scale is not ``Dh ** -0.5``), a window of 8 in
config.json (transformers holds 5: keys up to 4 positions to either side, so most inputs
cross it), Dense 64 -> 256 -> 64, SmolLM2's tokenizer without its chat template.
Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.model_helpers import TINY, randomize_

VOCAB = 49152  # SmolLM2's tokenizer
WIDE = 256  # the first Dense's output (the real model's 3072)
CONFIG = {
    **TINY,
    "vocab_size": VOCAB,
    "max_position_embeddings": 1024,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "query_pre_attn_scalar": 24,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "use_bidirectional_attention": True,
}
# config_sentence_transformers.json of google/embeddinggemma-300m
PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ",
    "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ",
    "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ",
    "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: ",
}
SEED = 300


def save_embedding_gemma(directory: Path, tokenizer_dir: Path, max_seq_length: int = 512) -> Path:
    """Build the tiny EmbeddingGemma with random weights and save it with
    ``SentenceTransformer.save`` (safetensors) at ``directory``."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    torch.manual_seed(SEED)
    config = transformers.Gemma3TextConfig(**CONFIG)
    base = transformers.Gemma3TextModel(config)
    randomize_(base, seed=SEED)
    hf_dir = directory.parent / f"{directory.name}-hf"
    base.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(hf_dir)
    width = config.hidden_size
    identity = torch.nn.Identity()
    modules: list[Any] = [
        Transformer(str(hf_dir), max_seq_length=max_seq_length),
        Pooling(width, pooling_mode="mean"),
        Dense(width, WIDE, bias=False, activation_function=identity),
        Dense(WIDE, width, bias=False, activation_function=identity),
        Normalize(),
    ]
    model = SentenceTransformer(modules=modules, device="cpu")
    model.prompts = dict(PROMPTS)
    model.save(str(directory), safe_serialization=True)
    return directory
