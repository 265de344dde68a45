"""ModernBERT, an encoder (``replicas.model.encoder`` runs it): pre-norm LayerNorm blocks
(``norm_bias``; the first layer's attention reads its input unnormed), a final LayerNorm,
GeGLU MLP, no biases, no position embeddings but RoPE (``rope_parameters``: full_attention on
the global layers, sliding_attention on the local ones, which read +-``local_attention // 2``
positions). Its cross-encoder head: dense, GELU, LayerNorm, classifier, over the CLS token or
the mean (``classifier_pooling``). ModernBertForMaskedLM's head (a sparse model's): the same
dense, GELU and LayerNorm, then the word embeddings (tied) and ``decoder.bias``.
"""

from __future__ import annotations

from typing import Any

from replicas.model.errors import UnsupportedHeadError, UnsupportedModelError
from replicas.model.family.bert import GELU_EXACT, check_masked_lm, encoder_dims, reads_mlm_head
from replicas.model.family.entry import Family
from replicas.model.family.fields import refuse, rope_bases, sliding_layers
from replicas.model.tensors import SAME, TRANSPOSE, TensorMapping


def _fields(hf: Any) -> dict[str, Any]:
    """``sliding_window`` is the half window (``local_attention // 2``)."""
    refuse(hf, *((flag, "ModernBERT's biases are") for flag in ("attention_bias", "mlp_bias")))
    act = getattr(hf, "hidden_activation", None)
    if act not in GELU_EXACT:
        raise UnsupportedModelError(f"hidden_activation: {act!r} not in {GELU_EXACT}")
    if "ModernBertForMaskedLM" in (getattr(hf, "architectures", None) or ()):
        _check_masked_lm(hf)
    return {
        **encoder_dims(hf, "modernbert", float(hf.norm_eps)),
        "norm_bias": bool(hf.norm_bias),
        "classifier_bias": bool(getattr(hf, "classifier_bias", False)),
        "sliding_window": int(hf.local_attention) // 2,
        "sliding_layers": sliding_layers(hf),
        **rope_bases(hf),
    }


def _check_masked_lm(hf: Any) -> None:
    """ModernBertForMaskedLM's head as ``mlm_head`` runs it: GELU, a decoder bias, tied."""
    check_masked_lm(hf)
    act = getattr(hf, "classifier_activation", "gelu")
    if act not in GELU_EXACT:
        raise UnsupportedModelError(f"classifier_activation: {act!r} not in {GELU_EXACT}")
    if not getattr(hf, "decoder_bias", True):
        raise UnsupportedModelError("decoder_bias: False (the masked-LM head's bias is read)")


def _head_fields(hf: Any) -> dict[str, Any]:
    """Its head's pooling and LayerNorm eps (its activation must be GELU)."""
    act = getattr(hf, "classifier_activation", "gelu")
    if act != "gelu":
        raise UnsupportedHeadError(f"classifier_activation: {act!r} (only gelu)")
    pooling = getattr(hf, "classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise UnsupportedHeadError(f"classifier_pooling: {pooling!r} not in ('cls', 'mean')")
    return {"pooling": pooling, "norm_eps": float(hf.norm_eps)}


def _mb(path: tuple[str, ...], hf: str, layout: str, first: int = 0) -> TensorMapping:
    """A ModernBertModel tensor (``model.`` in ModernBertForSequenceClassification)."""
    return TensorMapping(path, hf, "mb." + hf, layout, first)


def _norm(config: Any, path: tuple[str, ...], hf: str, first: int = 0) -> tuple:
    parts = ("scale", "weight"), ("bias", "bias")
    return tuple(
        _mb((*path, ours), f"{hf}.{name}", SAME, first)
        for ours, name in parts[: 2 if config.norm_bias else 1]
    )


def _head(config: Any) -> tuple[TensorMapping, ...]:
    """ModernBertForSequenceClassification's head (names outside its ``model.``)."""
    if config.head is None:
        return ()
    optional = (("dense_bias", "head.dense.bias", config.classifier_bias),)
    optional += (("norm_bias", "head.norm.bias", config.norm_bias),)
    return (
        _mb(("head", "dense"), "head.dense.weight", TRANSPOSE),
        _mb(("head", "norm"), "head.norm.weight", SAME),
        _mb(("head", "score"), "classifier.weight", TRANSPOSE),
        _mb(("head", "score_bias"), "classifier.bias", SAME),
        *(_mb(("head", ours), hf, SAME) for ours, hf, held in optional if held),
    )


def _mlm(config: Any) -> tuple[TensorMapping, ...]:
    """ModernBertForMaskedLM's head but its decoder weight (tied: the word embeddings)."""
    if not reads_mlm_head(config):
        return ()
    dense_bias = (_mb(("mlm", "dense_bias"), "head.dense.bias", SAME),)
    return (
        _mb(("mlm", "dense"), "head.dense.weight", TRANSPOSE),
        *(dense_bias if config.classifier_bias else ()),
        *_norm(config, ("mlm", "norm"), "head.norm"),
        _mb(("mlm", "bias"), "decoder.bias", SAME),
    )


def _mappings(config: Any) -> tuple[TensorMapping, ...]:
    """ModernBertModel's names; layer 0 has no ``attn_norm`` (read from layer 1 on)."""
    layer = "model.layers.{layer}."  # text_tower_name prefixes a base model's layers
    return (
        *_head(config),
        *_mlm(config),
        _mb(("embed",), "embeddings.tok_embeddings.weight", SAME),
        *_norm(config, ("embed_norm",), "embeddings.norm"),
        *_norm(config, ("final_norm",), "final_norm"),
        *_norm(config, ("layers", "attn_norm"), layer + "attn_norm", first=1),
        _mb(("layers", "attn", "qkv"), layer + "attn.Wqkv.weight", TRANSPOSE),
        _mb(("layers", "attn", "o"), layer + "attn.Wo.weight", TRANSPOSE),
        *_norm(config, ("layers", "mlp_norm"), layer + "mlp_norm"),
        _mb(("layers", "mlp", "wi"), layer + "mlp.Wi.weight", TRANSPOSE),
        _mb(("layers", "mlp", "down"), layer + "mlp.Wo.weight", TRANSPOSE),
    )


MODERNBERT = Family(
    "modernbert", _fields, _mappings, model_types=("modernbert",), encoder=True,
    heads=(("ModernBertForSequenceClassification", "cross_encoder"),),
    base=("ModernBertModel",), masked_lm=("ModernBertForMaskedLM",), head_fields=_head_fields,
    # ModernBertFor*'s: ModernBertModel's names (layers keep ``model.``)
    renames=(("model.embeddings.", "embeddings."), ("model.final_norm.", "final_norm.")),
)  # fmt: skip
