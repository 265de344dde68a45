"""BERT and XLM-RoBERTa, encoders (``replicas.model.encoder`` runs them): LayerNorm
(``layer_norm_eps``, with biases) after each block, an exact-GELU MLP (not gated), learned
absolute positions and token types, no RoPE. XLM-RoBERTa: BERT with its positions counted
from ``pad_token_id + 1`` (``position_offset``) and its heads' own names. A sparse model's
masked-LM head (``*ForMaskedLM``): dense, GELU, LayerNorm, then the word embeddings (tied)
and a bias (``replicas.model.mlm_head``). GGUF names are never read for them.
"""

from __future__ import annotations

from typing import Any

from replicas.model.errors import UnsupportedModelError
from replicas.model.family.entry import Family
from replicas.model.family.fields import dims
from replicas.model.tensors import HEADS_BIAS, HEADS_IN, HEADS_OUT, SAME, TRANSPOSE, TensorMapping

GELU_EXACT = ("gelu",)


def position_offset(hf: Any) -> int:
    """What an encoder adds to each position: XLM-RoBERTa counts from ``pad_token_id + 1``
    (transformers' ``create_position_ids_from_input_ids`` on an unpadded sequence)."""
    return int(hf.pad_token_id) + 1 if getattr(hf, "model_type", None) == "xlm-roberta" else 0


def encoder_dims(hf: Any, family: str, norm_eps: float) -> dict[str, Any]:
    """What BERT-like encoders share: full multi-head attention, untied, exact GELU."""
    heads = int(hf.num_attention_heads)
    return {
        **dims(hf, family), "num_kv_heads": heads, "head_dim": int(hf.hidden_size) // heads,
        "rms_norm_eps": norm_eps, "tie_word_embeddings": False, "hidden_act": "gelu",
        "max_position_embeddings": int(hf.max_position_embeddings),
    }  # fmt: skip


def reads_mlm_head(config: Any) -> bool:
    """Its tree holds the masked-LM head (``params["mlm"]``): a sparse model's
    ``ModelConfig``."""
    return config.pooling is not None and config.pooling.sparse is not None


def check_masked_lm(hf: Any) -> None:
    """A ``*ForMaskedLM`` config's head is one ``mlm_head`` runs: its decoder the word
    embeddings (tied), else refused naming the field."""
    archs = getattr(hf, "architectures", None) or ()
    masked_lm = any(arch.endswith("ForMaskedLM") for arch in archs)
    if masked_lm and not getattr(hf, "tie_word_embeddings", True):
        raise UnsupportedModelError(
            "tie_word_embeddings: False (a masked-LM head's decoder is read as the word embeddings)"
        )


def _fields(family: str) -> Any:
    def fields(hf: Any) -> dict[str, Any]:
        check_masked_lm(hf)  # its head's GELU is ``hidden_act`` (BERT's) or exact (XLM-R's)
        act = getattr(hf, "hidden_act", None)
        if act not in GELU_EXACT:
            raise UnsupportedModelError(f"hidden_act: {act!r} not in {GELU_EXACT}")
        kind = getattr(hf, "position_embedding_type", "absolute")
        if kind != "absolute":
            raise UnsupportedModelError(f"position_embedding_type: {kind!r} (only absolute)")
        return {
            **encoder_dims(hf, family, float(hf.layer_norm_eps)),
            "rope_theta": 0.0,
            "type_vocab_size": int(hf.type_vocab_size),
            "position_offset": position_offset(hf),
        }

    return fields


def _bert(path: tuple[str, ...], hf: str, layout: str) -> TensorMapping:
    """A BertModel tensor (``{layer}`` in ``hf``: stacked)."""
    return TensorMapping(path, hf, "bert." + hf, layout)


def _layer(path: tuple[str, ...], hf: str, layout: str) -> TensorMapping:
    return _bert(("layers", *path), "encoder.layer.{layer}." + hf, layout)


def _norm(path: tuple[str, ...], hf: str, layer: bool) -> tuple[TensorMapping, ...]:
    make = _layer if layer else _bert
    return (make((*path, "scale"), f"{hf}.weight", SAME), make((*path, "bias"), f"{hf}.bias", SAME))


_ATTN = tuple(
    mapping
    for ours, hf in (("q", "query"), ("k", "key"), ("v", "value"))
    for mapping in (
        _layer(("attn", ours), f"attention.self.{hf}.weight", HEADS_IN),
        _layer(("attn", f"{ours}_bias"), f"attention.self.{hf}.bias", HEADS_BIAS),
    )
)
# BertModel names (BertForSequenceClassification's ``bert.``: ``renames``)
_BERT = (
    _bert(("embed",), "embeddings.word_embeddings.weight", SAME),
    _bert(("position_embed",), "embeddings.position_embeddings.weight", SAME),
    _bert(("type_embed",), "embeddings.token_type_embeddings.weight", SAME),
    *_norm(("embed_norm",), "embeddings.LayerNorm", layer=False),
    *_ATTN,
    _layer(("attn", "o"), "attention.output.dense.weight", HEADS_OUT),
    _layer(("attn", "o_bias"), "attention.output.dense.bias", SAME),
    *_norm(("attn_norm",), "attention.output.LayerNorm", layer=True),
    _layer(("mlp", "up"), "intermediate.dense.weight", TRANSPOSE),
    _layer(("mlp", "up_bias"), "intermediate.dense.bias", SAME),
    _layer(("mlp", "down"), "output.dense.weight", TRANSPOSE),
    _layer(("mlp", "down_bias"), "output.dense.bias", SAME),
    *_norm(("mlp_norm",), "output.LayerNorm", layer=True),
)


def _head(pooler: str, score: str) -> tuple[TensorMapping, ...]:
    """A ``*ForSequenceClassification``'s pooler (dense + tanh) and classifier."""
    return (
        _bert(("head", "pooler"), f"{pooler}.weight", TRANSPOSE),
        _bert(("head", "pooler_bias"), f"{pooler}.bias", SAME),
        _bert(("head", "score"), f"{score}.weight", TRANSPOSE),
        _bert(("head", "score_bias"), f"{score}.bias", SAME),
    )


def _mlm(dense: str, norm: str, bias: str) -> tuple[TensorMapping, ...]:
    """A ``*ForMaskedLM``'s head but its decoder weight (tied: the word embeddings)."""
    return (
        _bert(("mlm", "dense"), f"{dense}.weight", TRANSPOSE),
        _bert(("mlm", "dense_bias"), f"{dense}.bias", SAME),
        *_norm(("mlm", "norm"), norm, layer=False),
        _bert(("mlm", "bias"), bias, SAME),
    )


def _mappings(head: tuple[TensorMapping, ...], mlm: tuple[TensorMapping, ...]) -> Any:
    def mappings(config: Any) -> tuple[TensorMapping, ...]:
        tail = head if config.head is not None else mlm if reads_mlm_head(config) else ()
        return _BERT + tail

    return mappings


# BertForMaskedLM: ``cls.predictions.decoder.bias``, where saved, is ``cls.predictions.bias``
_BERT_MLM = _mlm("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                 "cls.predictions.bias")  # fmt: skip
BERT = Family(
    "bert", _fields("bert"), _mappings(_head("pooler.dense", "classifier"), _BERT_MLM),
    heads=(("BertForSequenceClassification", "cross_encoder"),), base=("BertModel",),
    masked_lm=("BertForMaskedLM",), model_types=("bert",), encoder=True,
    renames=(("bert.", ""), ("cls.predictions.decoder.bias", "cls.predictions.bias")),
)  # fmt: skip
XLM_ROBERTA = Family(  # XLMRobertaForSequenceClassification: BERT's head, its own names
    "xlm_roberta", _fields("xlm_roberta"),
    _mappings(_head("classifier.dense", "classifier.out_proj"),
              _mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")),
    heads=(("XLMRobertaForSequenceClassification", "cross_encoder"),),
    base=("XLMRobertaModel",), masked_lm=("XLMRobertaForMaskedLM",),
    model_types=("xlm-roberta",), encoder=True,
    renames=(("roberta.", ""), ("lm_head.decoder.bias", "lm_head.bias")),
)  # fmt: skip
