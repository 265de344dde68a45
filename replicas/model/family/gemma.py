"""Gemma 2 and Gemma 3 (text; also the text tower of a ``Gemma3ForConditionalGeneration``).

- Gemma 2: (1 + w) RMSNorm before and after each block, embeddings times sqrt(hidden),
  gelu-tanh MLP, queries scaled by ``query_pre_attn_scalar ** -0.5``, attention and final
  logits soft-capped, windowed and global layers alternating (``layer_types``).
- Gemma 3: Gemma 2 without soft-caps, plus QK-norm; windowed layers use RoPE base
  ``rope_parameters["sliding_attention"]``, global ones ``["full_attention"]`` (linear
  scaling on the larger models).

Four norms per layer: Gemma's ``post_attention_layernorm`` is the attention block's output
norm (Llama's name for the MLP's input norm).
"""

from __future__ import annotations

from typing import Any

from replicas.model.errors import UnsupportedModelError
from replicas.model.family.entry import Family
from replicas.model.family.fields import decoder_fields, rope_bases, rope_theta, sliding_layers
from replicas.model.family.llama import decoder_mappings, layer
from replicas.model.family.qwen import QK_NORM
from replicas.model.tensors import SAME

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
_NORMS = tuple(
    layer((ours, "scale"), f"{hf}.weight", f"{gguf}.weight", SAME)
    for ours, hf, gguf in (
        ("mlp_norm", "pre_feedforward_layernorm", "ffn_norm"),
        ("post_attn_norm", "post_attention_layernorm", "post_attention_norm"),
        ("post_mlp_norm", "post_feedforward_layernorm", "post_ffw_norm"),
    )
)


def _gemma(hf: Any, family: str) -> dict[str, Any]:
    act = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", None)
    if act not in GELU_TANH:
        raise UnsupportedModelError(f"hidden_activation: {act!r} not in {GELU_TANH}")
    if family != "gemma3" and getattr(hf, "use_bidirectional_attention", False):
        raise UnsupportedModelError("use_bidirectional_attention: only causal models score")
    final_cap = getattr(hf, "final_logit_softcapping", None)
    attn_cap = getattr(hf, "attn_logit_softcapping", None)
    return {
        **decoder_fields(hf, family), "hidden_act": "gelu_tanh", "norm_offset": True,
        "post_norms": True, "embed_scale": True,
        "query_scale": float(hf.query_pre_attn_scalar) ** -0.5,
        "attn_softcap": None if attn_cap is None else float(attn_cap),
        "final_softcap": None if final_cap is None else float(final_cap),
        "sliding_layers": sliding_layers(hf),
    }  # fmt: skip


def _gemma2(hf: Any) -> dict[str, Any]:
    return {**_gemma(hf, "gemma2"), "rope_theta": rope_theta(hf)}


def gemma3_fields(hf: Any) -> dict[str, Any]:
    return {**_gemma(hf, "gemma3"), "qk_norm": True, **rope_bases(hf)}


def gemma_mappings(config: Any) -> tuple:
    """Llama's names, Gemma's four norms per layer, Gemma 3's q/k norms."""
    return decoder_mappings(config, _NORMS * config.post_norms, QK_NORM * config.qk_norm)


GEMMA2 = Family(
    "gemma2", _gemma2, gemma_mappings, ("Gemma2ForCausalLM",),
    heads=(("Gemma2ForSequenceClassification", "linear"),), base=("Gemma2Model",),
    model_types=("gemma2",),
)  # fmt: skip
GEMMA3 = Family(
    "gemma3", gemma3_fields, gemma_mappings,
    ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),  # the latter: its text tower
    heads=(("Gemma3TextForSequenceClassification", "linear"),), base=("Gemma3TextModel",),
    model_types=("gemma3_text", "gemma3"),
    renames=(  # the text tower, transformers v5 and v4 names
        ("model.language_model.", "model."), ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ),
)  # fmt: skip
