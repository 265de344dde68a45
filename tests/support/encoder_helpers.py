"""Tiny random encoders saved by sentence-transformers (tests/engine/test_encoder_embed.py,
test_cross_encoder.py): a WordPiece tokenizer over a word list written here, the model
(hidden 32, 2 layers, 4 heads) with every weight random, LayerNorm scales and biases and
token-type rows too (not transformers' ones and zeros); embedders get Pooling (CLS or mean)
and Normalize, cross-encoders ``CrossEncoder``'s defaults. The texts hold words outside the
list, so ``[UNK]`` (id 1) is among their tokens: an XLM-RoBERTa model (``pad_token_id`` 1)
then counts no position for it, as transformers' position ids do. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "blue", "red"]
WORDS += ["what", "is", "the", "a", "of", "and", "to", "in", "##s", "##ed", "##ing", "."]
UNKNOWN = ["zebra"]  # outside the vocabulary: [UNK]
TINY_BERT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
}


def save_tokenizer(directory: Path) -> Any:
    """A BertTokenizerFast over ``SPECIALS + WORDS`` saved in ``directory`` (transformers 5
    reads ``vocab``, a mapping; a ``vocab_file`` alone leaves only the special tokens)."""
    from transformers import BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(SPECIALS + WORDS)}
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tokenizer.save_pretrained(directory)
    return tokenizer


def randomize_bert_(model: Any, seed: int) -> None:
    """Every parameter random: matrices N(0, 1/fan_in), LayerNorm scales 1 + N(0, 0.04),
    biases (LayerNorm's too) N(0, 0.04), embeddings N(0, 0.25)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if "LayerNorm.weight" in name or "norm.weight" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.2 * noise)
            elif "embeddings" in name:
                param.copy_(0.5 * noise)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5)


def bert_config(**changes: Any) -> Any:
    from transformers import BertConfig

    return BertConfig(**{**TINY_BERT, "vocab_size": len(SPECIALS + WORDS), **changes})


def xlmr_config(**changes: Any) -> Any:
    """Positions from pad + 1 = 2: 130 of them hold sequences of 128. ``pad_token_id`` 1 is
    the WordPiece tokenizer's ``[UNK]``, a token that texts hold; two token types, as the
    tokenizer's pairs have."""
    from transformers import XLMRobertaConfig

    shape = {**TINY_BERT, "max_position_embeddings": 130}
    fields = {**shape, "vocab_size": len(SPECIALS + WORDS), "pad_token_id": 1}
    return XLMRobertaConfig(**{**fields, **changes})


def modernbert_config(**changes: Any) -> Any:
    """Three layers (global, local, local: every 3rd global), a window of +-4 positions (far
    shorter than the test sequences), LayerNorm biases on, RoPE bases off their defaults."""
    from transformers import ModernBertConfig

    shape = {k: TINY_BERT[k] for k in TINY_BERT if k not in ("type_vocab_size",)}
    fields = {
        **shape, "num_hidden_layers": 3, "global_attn_every_n_layers": 3, "local_attention": 8,
        "norm_bias": True, "global_rope_theta": 5000.0, "local_rope_theta": 300.0,
        "vocab_size": len(SPECIALS + WORDS), "pad_token_id": 0, "cls_token_id": 2,
        "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3, "norm_eps": 1e-5,
    }  # fmt: skip
    return ModernBertConfig(**{**fields, **changes})


# family -> (its config, base model class, sequence classifier class, tokenizer saver)
FAMILIES = {
    "bert": (bert_config, "BertModel", "BertForSequenceClassification", save_tokenizer),
    "xlm_roberta": (
        xlmr_config, "XLMRobertaModel", "XLMRobertaForSequenceClassification", save_tokenizer,
    ),
    "modernbert": (
        modernbert_config, "ModernBertModel", "ModernBertForSequenceClassification",
        save_tokenizer,
    ),
}  # fmt: skip


def save_bert_embedder(directory: Path, pooling: str, seed: int = 0, family: str = "bert") -> Path:
    """A tiny random ``BertModel`` (``XLMRobertaModel``) saved by sentence-transformers with
    ``pooling`` (cls or mean) and Normalize."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    config, base_class, _, save_tokens = FAMILIES[family]
    torch.manual_seed(seed)
    hf_dir = directory.parent / f"{directory.name}-hf"
    pooler = {} if family == "modernbert" else {"add_pooling_layer": False}
    base = getattr(transformers, base_class)(config(), **pooler)
    randomize_bert_(base, seed)
    base.save_pretrained(hf_dir, safe_serialization=True)
    save_tokens(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=120)
    modules = [transformer, Pooling(TINY_BERT["hidden_size"], pooling_mode=pooling), Normalize()]
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(directory), safe_serialization=True)
    return directory


def sentences(seed: int, count: int, longest: int = 100) -> list[str]:
    """Texts of about 1..``longest`` words of the tokenizer's word list and ``UNKNOWN``."""
    rng = np.random.default_rng(seed)
    words = [w for w in WORDS if not w.startswith("##")] + UNKNOWN
    lengths = np.exp(rng.uniform(0, np.log(longest), count)).astype(int) + 1
    return [" ".join(rng.choice(words, n)) for n in lengths]


def save_bert_cross_encoder(
    directory: Path, num_labels: int = 1, seed: int = 1, family: str = "bert",
    pooling: str = "cls",
) -> Path:  # fmt: skip
    """A tiny random ``BertForSequenceClassification`` (``XLMRobertaFor...``) saved by
    sentence-transformers' ``CrossEncoder`` (its default activation: sigmoid for one label)."""
    import transformers
    from sentence_transformers import CrossEncoder

    config, _, classifier, save_tokens = FAMILIES[family]
    hf_dir = directory.parent / f"{directory.name}-hf"
    extra = {"classifier_bias": True, "classifier_pooling": pooling}
    extra = extra if family == "modernbert" else {}
    model = getattr(transformers, classifier)(config(num_labels=num_labels, **extra))
    randomize_bert_(model, seed)
    model.save_pretrained(hf_dir, safe_serialization=True)
    save_tokens(hf_dir)
    CrossEncoder(str(hf_dir), device="cpu").save(str(directory), safe_serialization=True)
    return directory
