"""Llama (``LlamaForCausalLM``): the decoder every other decoder family extends, and the
tensor names they share (Hugging Face's and GGUF's). GGUF tensors are first brought to the
Hugging Face layout (``replicas.checkpoints.gguf_loading``): one layout serves both formats."""

from __future__ import annotations

from typing import Any

from replicas.model.family.entry import Family
from replicas.model.family.fields import MLP_BIAS, decoder_dims, refuse, rope
from replicas.model.tensors import HEADS_IN, HEADS_OUT, SAME, TRANSPOSE, TensorMapping


def layer(path: tuple[str, ...], hf: str, gguf: str, layout: str) -> TensorMapping:
    """A decoder layer's tensor, stacked on the layers axis."""
    return TensorMapping(
        ("layers", *path), "model.layers.{layer}." + hf, "blk.{layer}." + gguf, layout
    )


COMMON = (
    TensorMapping(("embed",), "model.embed_tokens.weight", "token_embd.weight", SAME),
    TensorMapping(("final_norm", "scale"), "model.norm.weight", "output_norm.weight", SAME),
    layer(("attn_norm", "scale"), "input_layernorm.weight", "attn_norm.weight", SAME),
    layer(("attn", "q"), "self_attn.q_proj.weight", "attn_q.weight", HEADS_IN),
    layer(("attn", "k"), "self_attn.k_proj.weight", "attn_k.weight", HEADS_IN),
    layer(("attn", "v"), "self_attn.v_proj.weight", "attn_v.weight", HEADS_IN),
    layer(("attn", "o"), "self_attn.o_proj.weight", "attn_output.weight", HEADS_OUT),
    layer(("mlp_norm", "scale"), "post_attention_layernorm.weight", "ffn_norm.weight", SAME),
    layer(("mlp", "gate"), "mlp.gate_proj.weight", "ffn_gate.weight", TRANSPOSE),
    layer(("mlp", "up"), "mlp.up_proj.weight", "ffn_up.weight", TRANSPOSE),
    layer(("mlp", "down"), "mlp.down_proj.weight", "ffn_down.weight", TRANSPOSE),
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


def decoder_mappings(config: Any, *parts: tuple[TensorMapping, ...]) -> tuple[TensorMapping, ...]:
    """Llama's names and a family's ``parts`` (each leaf in place of Llama's of its path),
    then the score head's, else an untied LM head (an embedding model has none)."""
    own = [mapping for part in parts for mapping in part]
    mappings = [m for m in COMMON if m.path not in {o.path for o in own}] + own
    if config.head is not None:
        mappings += _HEADS[config.head.kind]
    elif not config.tie_word_embeddings and config.pooling is None:
        mappings.append(_LM_HEAD)
    return tuple(mappings)


OUTPUT_BIAS = ("attention_bias", "output-projection biases are")


def llama_fields(hf: Any, family: str) -> dict[str, Any]:
    """The fields of a Llama-like config (Llama, Qwen2, Qwen3), its checks made."""
    theta, scaling = rope(hf)
    return {**decoder_dims(hf, family), "rope_theta": theta, "rope_scaling": scaling}


def _llama(hf: Any) -> dict[str, Any]:
    refuse(hf, MLP_BIAS, OUTPUT_BIAS)
    return llama_fields(hf, "llama")


LLAMA = Family(
    "llama", _llama, decoder_mappings, ("LlamaForCausalLM",),
    heads=(("LlamaForSequenceClassification", "linear"),), base=("LlamaModel",),
    model_types=("llama",),
)  # fmt: skip
