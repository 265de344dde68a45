"""Qwen2 and Qwen3: Llama with biases on the q, k and v projections (Qwen2) or a per-head
RMSNorm on q and k before RoPE (Qwen3); neither windowed. ``Qwen2ForRewardModel`` (remote
code of Qwen2.5-Math-RM and process reward models) puts D -> D, ReLU, D -> 1 on the hidden
states.
"""

from __future__ import annotations

from typing import Any

from replicas.model.family.entry import Family
from replicas.model.family.fields import refuse
from replicas.model.family.llama import OUTPUT_BIAS, decoder_mappings, layer, llama_fields
from replicas.model.tensors import HEADS_BIAS, SAME

QKV_BIAS = (
    layer(("attn", "q_bias"), "self_attn.q_proj.bias", "attn_q.bias", HEADS_BIAS),
    layer(("attn", "k_bias"), "self_attn.k_proj.bias", "attn_k.bias", HEADS_BIAS),
    layer(("attn", "v_bias"), "self_attn.v_proj.bias", "attn_v.bias", HEADS_BIAS),
)
QK_NORM = (  # Gemma 3's too
    layer(("attn", "q_norm", "scale"), "self_attn.q_norm.weight", "attn_q_norm.weight", SAME),
    layer(("attn", "k_norm", "scale"), "self_attn.k_norm.weight", "attn_k_norm.weight", SAME),
)


_WINDOW = ("use_sliding_window", "sliding-window attention is")


def _qwen2(hf: Any) -> dict[str, Any]:
    refuse(hf, _WINDOW)
    return {**llama_fields(hf, "qwen2"), "qkv_bias": True}


def _qwen3(hf: Any) -> dict[str, Any]:
    refuse(hf, OUTPUT_BIAS, _WINDOW)
    return {**llama_fields(hf, "qwen3"), "qk_norm": True}


QWEN2 = Family(
    "qwen2", _qwen2, lambda config: decoder_mappings(config, QKV_BIAS * config.qkv_bias),
    ("Qwen2ForCausalLM",), base=("Qwen2Model",), model_types=("qwen2",),
    heads=(("Qwen2ForSequenceClassification", "linear"), ("Qwen2ForRewardModel", "reward_mlp")),
)  # fmt: skip
QWEN3 = Family(
    "qwen3", _qwen3, lambda config: decoder_mappings(config, QK_NORM * config.qk_norm),
    ("Qwen3ForCausalLM",), base=("Qwen3Model",), model_types=("qwen3",),
    heads=(("Qwen3ForSequenceClassification", "linear"),),
)  # fmt: skip
