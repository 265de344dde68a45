"""BERT and XLM-RoBERTa, encoders (``replicas.model.encoder`` runs them): LayerNorm
(``layer_norm_eps``, with biases) after each block, an exact-GELU MLP (not gated), learned
absolute positions and token types, no RoPE. XLM-RoBERTa: BERT with its positions counted
from ``pad_token_id + 1`` (``position_offset``) and its head's own names. GGUF names are
never read for them.
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


def _fields(family: str) -> Any:
    def fields(hf: Any) -> dict[str, Any]:
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


def _mappings(head: tuple[TensorMapping, ...]) -> Any:
    return lambda config: _BERT if config.head is None else _BERT + head


BERT = Family(
    "bert", _fields("bert"), _mappings(_head("pooler.dense", "classifier")),
    heads=(("BertForSequenceClassification", "cross_encoder"),), base=("BertModel",),
    model_types=("bert",), encoder=True, renames=(("bert.", ""),),
)  # fmt: skip
XLM_ROBERTA = Family(  # XLMRobertaForSequenceClassification: BERT's head, its own names
    "xlm_roberta", _fields("xlm_roberta"),
    _mappings(_head("classifier.dense", "classifier.out_proj")),
    heads=(("XLMRobertaForSequenceClassification", "cross_encoder"),),
    base=("XLMRobertaModel",), model_types=("xlm-roberta",), encoder=True,
    renames=(("roberta.", ""),),
)  # fmt: skip
