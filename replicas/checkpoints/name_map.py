"""Explicit checkpoint name maps: which file tensor fills which leaf of the parameter tree.

Every leaf of ``replicas.model.params.param_logical_axes`` has exactly one ``TensorMapping``: its
Hugging Face name, its GGUF name and the layout change from the Hugging Face layout
(``nn.Linear`` weights are ``[out, in]``) to ours. GGUF tensors are first brought to the
Hugging Face layout (ggml order reversed, llama q/k rows un-permuted, see
``replicas.checkpoints.gguf_loading``), so one layout table serves both formats.

The families share the Llama names; Qwen2 adds q/k/v biases, Qwen3 and Gemma 3 per-head
q/k RMSNorm, Gemma 2/3 four norms per layer (``_GEMMA_NORMS``). Shapes below: D hidden,
H query heads, K key/value heads, Dh head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.model.config import ModelConfig

LAYER = "{layer}"


class CheckpointError(ValueError):
    """The checkpoint files are missing, unreadable or do not match the config."""


class AdapterNotFound(CheckpointError):
    """No LoRA adapter directory at the path a load names (the load route's 404)."""


# Layout kinds: Hugging Face layout -> our layout of one (per-layer) tensor.
SAME = "same"  # identical: embeddings [V, D], norm scales [D] or [Dh]
TRANSPOSE = "transpose"  # [out, in] -> [in, out]: MLP [F, D] -> [D, F], lm_head [V, D] -> [D, V]
HEADS_IN = "heads_in"  # q/k/v_proj.weight [H*Dh, D] -> [D, H, Dh]
HEADS_OUT = "heads_out"  # o_proj.weight [D, H*Dh] -> [H, Dh, D]
HEADS_BIAS = "heads_bias"  # q/k/v_proj.bias [H*Dh] -> [H, Dh]
LAYOUTS = (SAME, TRANSPOSE, HEADS_IN, HEADS_OUT, HEADS_BIAS)


@dataclass(frozen=True)
class TensorMapping:
    """One parameter leaf and where it comes from.

    ``hf_name`` and ``gguf_name`` contain ``{layer}`` for leaves stacked on the layers axis.
    """

    path: tuple[str, ...]
    hf_name: str
    gguf_name: str
    layout: str
    first: int = 0  # the first stacked layer the file holds (earlier ones: zeros, unread)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} not in {LAYOUTS}")
        if (LAYER in self.hf_name) != (LAYER in self.gguf_name):
            raise ValueError(f"{self.hf_name} and {self.gguf_name} disagree on {LAYER}")

    @property
    def per_layer(self) -> bool:
        return LAYER in self.hf_name

    def names(self, num_layers: int) -> list[tuple[str, str]]:
        """(hf_name, gguf_name) of every stacked slice, layer 0 first."""
        if not self.per_layer:
            return [(self.hf_name, self.gguf_name)]
        return [
            (self.hf_name.format(layer=i), self.gguf_name.format(layer=i))
            for i in range(self.first, num_layers)
        ]


def _layer(path: tuple[str, ...], hf: str, gguf: str, layout: str) -> TensorMapping:
    return TensorMapping(
        ("layers", *path), f"model.layers.{LAYER}.{hf}", f"blk.{LAYER}.{gguf}", layout
    )


_COMMON = (
    TensorMapping(("embed",), "model.embed_tokens.weight", "token_embd.weight", SAME),
    TensorMapping(("final_norm", "scale"), "model.norm.weight", "output_norm.weight", SAME),
    _layer(("attn_norm", "scale"), "input_layernorm.weight", "attn_norm.weight", SAME),
    _layer(("attn", "q"), "self_attn.q_proj.weight", "attn_q.weight", HEADS_IN),
    _layer(("attn", "k"), "self_attn.k_proj.weight", "attn_k.weight", HEADS_IN),
    _layer(("attn", "v"), "self_attn.v_proj.weight", "attn_v.weight", HEADS_IN),
    _layer(("attn", "o"), "self_attn.o_proj.weight", "attn_output.weight", HEADS_OUT),
    _layer(("mlp_norm", "scale"), "post_attention_layernorm.weight", "ffn_norm.weight", SAME),
    _layer(("mlp", "gate"), "mlp.gate_proj.weight", "ffn_gate.weight", TRANSPOSE),
    _layer(("mlp", "up"), "mlp.up_proj.weight", "ffn_up.weight", TRANSPOSE),
    _layer(("mlp", "down"), "mlp.down_proj.weight", "ffn_down.weight", TRANSPOSE),
)
_QKV_BIAS = (  # Qwen2
    _layer(("attn", "q_bias"), "self_attn.q_proj.bias", "attn_q.bias", HEADS_BIAS),
    _layer(("attn", "k_bias"), "self_attn.k_proj.bias", "attn_k.bias", HEADS_BIAS),
    _layer(("attn", "v_bias"), "self_attn.v_proj.bias", "attn_v.bias", HEADS_BIAS),
)
_QK_NORM = (  # Qwen3
    _layer(("attn", "q_norm", "scale"), "self_attn.q_norm.weight", "attn_q_norm.weight", SAME),
    _layer(("attn", "k_norm", "scale"), "self_attn.k_norm.weight", "attn_k_norm.weight", SAME),
)
_LM_HEAD = TensorMapping(("lm_head",), "lm_head.weight", "output.weight", TRANSPOSE)
_HEADS = {  # score heads (safetensors only: GGUF files carry no such head)
    "linear": (TensorMapping(("head", "score"), "score.weight", "cls.score", TRANSPOSE),),
    "reward_mlp": (
        TensorMapping(("head", "dense"), "score.0.weight", "cls.dense", TRANSPOSE),
        TensorMapping(("head", "dense_bias"), "score.0.bias", "cls.dense_bias", SAME),
        TensorMapping(("head", "out"), "score.2.weight", "cls.out", TRANSPOSE),
        TensorMapping(("head", "out_bias"), "score.2.bias", "cls.out_bias", SAME),
    ),
}
_MLP_NORM = ("mlp_norm", "scale")
# Gemma 2/3: four norms per layer; Gemma's post_attention_layernorm is the attention block's
# output norm (Llama's name for the MLP's input norm).
_GEMMA_NORMS = (
    _layer(_MLP_NORM, "pre_feedforward_layernorm.weight", "ffn_norm.weight", SAME),
    _layer(
        ("post_attn_norm", "scale"), "post_attention_layernorm.weight",
        "post_attention_norm.weight", SAME,
    ),
    _layer(
        ("post_mlp_norm", "scale"), "post_feedforward_layernorm.weight", "post_ffw_norm.weight",
        SAME,
    ),
)  # fmt: skip


def _bert(path: tuple[str, ...], hf: str, layout: str) -> TensorMapping:
    """A BERT tensor (``{layer}`` in ``hf``: stacked); GGUF names are never read for it."""
    return TensorMapping(path, hf, "bert." + hf, layout)


def _bert_layer(path: tuple[str, ...], hf: str, layout: str) -> TensorMapping:
    return _bert(("layers", *path), f"encoder.layer.{LAYER}.{hf}", layout)


def _bert_norm(path: tuple[str, ...], hf: str, layer: bool) -> tuple[TensorMapping, ...]:
    make = _bert_layer if layer else _bert
    return (make((*path, "scale"), f"{hf}.weight", SAME), make((*path, "bias"), f"{hf}.bias", SAME))


_BERT_ATTN = tuple(
    mapping
    for ours, hf in (("q", "query"), ("k", "key"), ("v", "value"))
    for mapping in (
        _bert_layer(("attn", ours), f"attention.self.{hf}.weight", HEADS_IN),
        _bert_layer(("attn", f"{ours}_bias"), f"attention.self.{hf}.bias", HEADS_BIAS),
    )
)
# BertModel names (BertForSequenceClassification's ``bert.`` prefix is dropped on reading)
_BERT = (
    _bert(("embed",), "embeddings.word_embeddings.weight", SAME),
    _bert(("position_embed",), "embeddings.position_embeddings.weight", SAME),
    _bert(("type_embed",), "embeddings.token_type_embeddings.weight", SAME),
    *_bert_norm(("embed_norm",), "embeddings.LayerNorm", layer=False),
    *_BERT_ATTN,
    _bert_layer(("attn", "o"), "attention.output.dense.weight", HEADS_OUT),
    _bert_layer(("attn", "o_bias"), "attention.output.dense.bias", SAME),
    *_bert_norm(("attn_norm",), "attention.output.LayerNorm", layer=True),
    _bert_layer(("mlp", "up"), "intermediate.dense.weight", TRANSPOSE),
    _bert_layer(("mlp", "up_bias"), "intermediate.dense.bias", SAME),
    _bert_layer(("mlp", "down"), "output.dense.weight", TRANSPOSE),
    _bert_layer(("mlp", "down_bias"), "output.dense.bias", SAME),
    *_bert_norm(("mlp_norm",), "output.LayerNorm", layer=True),
)


_BERT_HEAD = (  # BertForSequenceClassification: pooler (dense + tanh), classifier
    _bert(("head", "pooler"), "pooler.dense.weight", TRANSPOSE),
    _bert(("head", "pooler_bias"), "pooler.dense.bias", SAME),
    _bert(("head", "score"), "classifier.weight", TRANSPOSE),
    _bert(("head", "score_bias"), "classifier.bias", SAME),
)


_ROBERTA_HEAD = (  # XLMRobertaForSequenceClassification: the same math, its own names
    _bert(("head", "pooler"), "classifier.dense.weight", TRANSPOSE),
    _bert(("head", "pooler_bias"), "classifier.dense.bias", SAME),
    _bert(("head", "score"), "classifier.out_proj.weight", TRANSPOSE),
    _bert(("head", "score_bias"), "classifier.out_proj.bias", SAME),
)


def _mb(path: tuple[str, ...], hf: str, layout: str, first: int = 0) -> TensorMapping:
    """A ModernBertModel tensor (``model.`` in ModernBertForSequenceClassification)."""
    return TensorMapping(path, hf, "mb." + hf, layout, first)


def _mb_norm(config: ModelConfig, path: tuple[str, ...], hf: str, first: int = 0) -> tuple:
    parts = ("scale", "weight"), ("bias", "bias")
    return tuple(
        _mb((*path, ours), f"{hf}.{name}", SAME, first)
        for ours, name in parts[: 2 if config.norm_bias else 1]
    )


def _modernbert_head(config: ModelConfig) -> tuple[TensorMapping, ...]:
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


def modernbert_mappings(config: ModelConfig) -> tuple[TensorMapping, ...]:
    """ModernBertModel's names; layer 0 has no ``attn_norm`` (read from layer 1 on)."""
    layer = f"model.layers.{LAYER}."  # text_tower_name prefixes a base model's layers
    return (
        *_modernbert_head(config),
        _mb(("embed",), "embeddings.tok_embeddings.weight", SAME),
        *_mb_norm(config, ("embed_norm",), "embeddings.norm"),
        *_mb_norm(config, ("final_norm",), "final_norm"),
        *_mb_norm(config, ("layers", "attn_norm"), layer + "attn_norm", first=1),
        _mb(("layers", "attn", "qkv"), layer + "attn.Wqkv.weight", TRANSPOSE),
        _mb(("layers", "attn", "o"), layer + "attn.Wo.weight", TRANSPOSE),
        *_mb_norm(config, ("layers", "mlp_norm"), layer + "mlp_norm"),
        _mb(("layers", "mlp", "wi"), layer + "mlp.Wi.weight", TRANSPOSE),
        _mb(("layers", "mlp", "down"), layer + "mlp.Wo.weight", TRANSPOSE),
    )


def encoder_mappings(config: ModelConfig) -> tuple[TensorMapping, ...]:
    """Every leaf of an encoder's tree (``replicas.model.encoder_params``)."""
    if config.rotary:
        return modernbert_mappings(config)
    if config.head is None:
        return _BERT
    return _BERT + (_ROBERTA_HEAD if config.family == "xlm_roberta" else _BERT_HEAD)


def tensor_mappings(config: ModelConfig) -> tuple[TensorMapping, ...]:
    """Every leaf of ``param_logical_axes(config)`` with its source names and layout."""
    if config.encoder:
        return encoder_mappings(config)
    mappings = list(_COMMON)
    if config.post_norms:
        mappings = [m for m in mappings if m.path != ("layers", *_MLP_NORM)] + list(_GEMMA_NORMS)
    if config.qkv_bias:
        mappings += _QKV_BIAS
    if config.qk_norm:
        mappings += _QK_NORM
    if config.head is not None:
        mappings += _HEADS[config.head.kind]
    elif not config.tie_word_embeddings and config.pooling is None:
        mappings.append(_LM_HEAD)
    return tuple(mappings)


# A multimodal checkpoint's text tower (Gemma3ForConditionalGeneration, transformers v5 and
# v4 names) is read under the causal LM's names; its vision parts are not read.
_TEXT_TOWERS = (("model.language_model.", "model."), ("language_model.model.", "model."))
_TEXT_TOWERS += (("language_model.lm_head.", "lm_head."),)
# BertForSequenceClassification's and XLMRobertaForSequenceClassification's encoders: the
# base model's names
_TEXT_TOWERS += (("bert.", ""), ("roberta.", ""))
# ModernBertForSequenceClassification's: ModernBertModel's names (its layers keep ``model.``)
_TEXT_TOWERS += (("model.embeddings.", "embeddings."), ("model.final_norm.", "final_norm."))
_VISION_PARTS = ("vision_tower.", "multi_modal_projector.")
_BASE_PARTS = ("embed_tokens.", "layers.", "norm.")


def text_tower_name(name: str) -> str | None:
    """A safetensors name as the causal LM's name, or None for a vision-tower tensor."""
    for prefix, ours in _TEXT_TOWERS:
        if name.startswith(prefix):
            return ours + name[len(prefix) :]
    bare = name.removeprefix("model.")
    if bare.startswith(_VISION_PARTS):
        return None
    if name.startswith(_BASE_PARTS):  # a base model's (Qwen3Model...): no ``model.`` prefix
        return "model." + name
    return name


def hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Hugging Face shape of a tensor whose shape in our layout is ``shape``."""
    if layout == SAME:
        return shape
    if layout == TRANSPOSE:
        return shape[::-1]
    if layout == HEADS_IN:  # ours [D, H, Dh]
        return (shape[1] * shape[2], shape[0])
    if layout == HEADS_OUT:  # ours [H, Dh, D]
        return (shape[2], shape[0] * shape[1])
    if layout == HEADS_BIAS:  # ours [H, Dh]
        return (shape[0] * shape[1],)
    raise ValueError(f"layout {layout!r} not in {LAYOUTS}")


def to_our_layout(layout: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Hugging Face layout -> our layout; ``shape`` is the target (per-layer) shape."""
    if layout == SAME:
        return array.reshape(shape)
    if layout == TRANSPOSE:
        return array.T
    if layout in (HEADS_IN, HEADS_OUT):
        return array.T.reshape(shape)  # [H*Dh, D] -> [D, H*Dh]; [D, H*Dh] -> [H*Dh, D]
    if layout == HEADS_BIAS:
        return array.reshape(shape)
    raise ValueError(f"layout {layout!r} not in {LAYOUTS}")


def get_path(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
