"""The encoders loadtest.bench_encoder and loadtest.bench_encoder_served build (random weights,
float32, nothing downloaded), by ``--shape``:

- ``bge-m3``: XLM-RoBERTa at bge-m3's width (hidden 1024, 16 heads, MLP 4096, vocabulary
  250,002, 8194 positions), ``--layers`` of its 24; CLS pooling; a Unigram tokenizer over
  ``WORDS`` (one token per word), 512 tokens a sequence;
- ``minilm``: all-MiniLM-L6-v2's shape (``BertModel``: 6 layers, hidden 384, 12 heads, MLP
  1536, vocabulary 30,522, 512 positions; mean pooling, ``max_seq_length`` 256);
- ``bert-base``: BERT-base's (12 layers, hidden 768, 12 heads, MLP 3072; the same tokenizer
  and pooling as minilm).

The BERT shapes' tokenizer is a lower-casing WordPiece (``BertTokenizerFast``, as
transformers saves one) over ``ENGLISH``: about a third of its words are in the vocabulary
only as two pieces (``hou`` + ``##se``), so texts run about 1.3 tokens a word, as English
does under BERT's vocabulary. Every embedder ends in Normalize and is saved by
sentence-transformers; a cross-encoder is the shape's ``...ForSequenceClassification`` with
one label, saved by ``CrossEncoder``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORDS = tuple(f"w{i}" for i in range(1000))  # one Unigram piece each (bge-m3's tokenizer)
_ENGLISH = (
    "the of and to in is was for on that with as by at from his it an were are which this "
    "be has had not but their first one new or after who they have her she two its been "
    "also all more other time there years when into over three would only most city year "
    "world people during under may between about school many state some against while "
    "later house water river stone cloud light green music known history family season "
    "village station church company series water number system second since government "
    "several local national around public north south east west early until part large "
    "because through small each where both city county area name high began again around "
    "member league final village general club early played group album single release "
    "record built island building population released support study science language "
    "model training question answer search engine document sentence meaning similar "
    "different example report market price service product customer energy health "
    "research network computer data power field student teacher university council "
    "president minister party election court police army war battle force air ship"
)
ENGLISH = tuple(_ENGLISH.split())
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class Shape:
    family: str  # "xlm_roberta" or "bert"
    hidden: int
    heads: int
    mlp: int
    layers: int
    pooling: str  # sentence-transformers' pooling mode
    max_seq_length: int

    def describe(self, name: str, layers: int) -> str:
        kind = "XLM-RoBERTa" if self.family == "xlm_roberta" else "BERT"
        return (
            f"{name}'s shape ({kind}, {layers} layers, hidden {self.hidden}, {self.heads} "
            f"heads, MLP {self.mlp}, {self.pooling} pooling, Normalize, max_seq_length "
            f"{self.max_seq_length}; random weights, float32)"
        )


SHAPES = {
    "bge-m3": Shape("xlm_roberta", 1024, 16, 4096, 24, "cls", 512),
    "minilm": Shape("bert", 384, 12, 1536, 6, "mean", 256),
    "bert-base": Shape("bert", 768, 12, 3072, 12, "mean", 256),
}


def model_config(shape: Shape, layers: int, **changes: Any) -> Any:
    import transformers

    common = {"hidden_size": shape.hidden, "num_hidden_layers": layers,
              "num_attention_heads": shape.heads, "intermediate_size": shape.mlp}  # fmt: skip
    if shape.family == "bert":
        return transformers.BertConfig(
            vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, **common, **changes
        )
    return transformers.XLMRobertaConfig(
        vocab_size=250_002, max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, **common, **changes,
    )  # fmt: skip


def wordpiece_vocab() -> list[str]:
    """``SPECIALS``, every third word of ``ENGLISH`` as two pieces, the rest whole."""
    vocab = list(SPECIALS)
    for i, word in enumerate(dict.fromkeys(ENGLISH)):
        if i % 3 == 2 and len(word) > 3:
            vocab += [word[: len(word) // 2], "##" + word[len(word) // 2 :]]
        else:
            vocab.append(word)
    vocab += [".", ","]
    return list(dict.fromkeys(vocab))


def save_tokenizer(directory: Path, shape: Shape) -> None:
    if shape.family == "bert":
        from transformers import BertTokenizerFast

        vocab = {piece: i for i, piece in enumerate(wordpiece_vocab())}
        tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=512)
        tokenizer.save_pretrained(directory)
        return
    from transformers import XLMRobertaTokenizerFast

    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + word, -1.0) for word in WORDS] + [("<mask>", 0.0)]
    XLMRobertaTokenizerFast(vocab=pieces, model_max_length=512).save_pretrained(directory)


def save_embedder(directory: Path, shape: Shape, layers: int) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    hf_dir = directory.parent / f"{directory.name}-hf"
    base = transformers.BertModel if shape.family == "bert" else transformers.XLMRobertaModel
    base(model_config(shape, layers), add_pooling_layer=False).save_pretrained(
        hf_dir, safe_serialization=True
    )
    save_tokenizer(hf_dir, shape)
    return save_sentence_transformer(directory, hf_dir, shape.hidden, shape.pooling,
                                     shape.max_seq_length)  # fmt: skip


def save_sentence_transformer(
    directory: Path, hf_dir: Path, hidden: int, pooling: str, max_seq_length: int
) -> Path:
    """The transformers model in ``hf_dir`` under Transformer, Pooling and Normalize, saved by
    sentence-transformers into ``directory``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    modules = [Transformer(str(hf_dir), max_seq_length=max_seq_length),
               Pooling(hidden, pooling), Normalize()]  # fmt: skip
    SentenceTransformer(modules=modules, device="cpu").save(str(directory), safe_serialization=True)
    return directory


def save_cross_encoder(directory: Path, shape: Shape, layers: int) -> Path:
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    torch.manual_seed(1)
    hf_dir = directory.parent / f"{directory.name}-hf"
    config = model_config(shape, layers, num_labels=1)
    family = "Bert" if shape.family == "bert" else "XLMRoberta"
    getattr(transformers, f"{family}ForSequenceClassification")(config).save_pretrained(hf_dir)
    save_tokenizer(hf_dir, shape)
    CrossEncoder(str(hf_dir), device="cpu", max_length=shape.max_seq_length).save(str(directory))
    return directory


def text_of(rng: np.random.Generator, count: int, shape: Shape) -> str:
    """``count`` words: the shape's tokenizer's (``WORDS`` or ``ENGLISH``)."""
    if shape.family != "bert":
        return " ".join(rng.choice(WORDS, count))
    return " ".join(rng.choice(ENGLISH, count)).capitalize() + "."


def for_old_sentence_transformers(directory: Path) -> Path:
    """A copy of ``directory`` (Transformer, Pooling, Normalize) as sentence-transformers 3
    (Infinity's pin) reads one: its modules.json naming the modules by their old paths, the
    Transformer's and Pooling's configs in version 3's keys; the other files linked."""
    old = directory.parent / f"{directory.name}-st3"
    shutil.copytree(directory, old, copy_function=os.link)
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        module["type"] = f"sentence_transformers.models.{module['type'].rsplit('.', 1)[-1]}"
    (old / "modules.json").unlink()
    (old / "modules.json").write_text(json.dumps(modules, indent=2))
    config = json.loads((directory / "sentence_bert_config.json").read_text())
    kept = {k: config[k] for k in ("max_seq_length", "do_lower_case") if k in config}
    (old / "sentence_bert_config.json").unlink()
    (old / "sentence_bert_config.json").write_text(json.dumps(kept))
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = pooling.pop("embedding_dimension")
    (old / "1_Pooling" / "config.json").unlink()
    (old / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return old
