"""ModelConfig fields of the families that use the shared layers' options: Mistral, Gemma 2
and Gemma 3 (text; also the text tower of a ``Gemma3ForConditionalGeneration`` checkpoint).

What each family turns on, read from its transformers config:

- Mistral: Llama, with an optional ``sliding_window`` on every layer.
- Gemma 2: (1 + w) RMSNorm before and after each block, embeddings times sqrt(hidden),
  gelu-tanh MLP, queries scaled by ``query_pre_attn_scalar ** -0.5``, attention and final
  logits soft-capped, windowed and global layers alternating (``layer_types``).
- Gemma 3: Gemma 2 without soft-caps, plus QK-norm; windowed layers use RoPE base
  ``rope_parameters["sliding_attention"]``, global ones ``["full_attention"]`` (linear
  scaling on the larger models).
- EmbeddingGemma (``embeddinggemma``): a Gemma 3 config with ``use_bidirectional_attention``,
  Gemma 3's fields; its attention is ``replicas.model.embedding_gemma``'s. ``sliding_window``
  is kept as transformers holds it (config.json's ``// 2 + 1``: keys less than it apart).
- BERT (an encoder, run by ``replicas.model.encoder``): LayerNorm (``layer_norm_eps``) after
  each block, exact GELU, learned positions and token types. XLM-RoBERTa: BERT with its
  positions counted from ``pad_token_id + 1`` (``position_offset``).
- ModernBERT (an encoder too): pre-norm LayerNorm blocks (``norm_bias``; the first layer's
  attention reads its input unnormed), a final LayerNorm, GeGLU MLP, no biases, no position
  embeddings but RoPE (``rope_parameters``: full_attention on the global layers,
  sliding_attention on the local ones, which read +-``local_attention // 2`` positions).

Errors name the config field that is not supported.
"""

from __future__ import annotations

from typing import Any

from replicas.model.errors import UnsupportedModelError
from replicas.model.head_config import position_offset

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
EMBEDDING_GEMMA = "embeddinggemma"  # Gemma 3 with use_bidirectional_attention
ENCODER_FAMILIES = (
    "bert",
    "xlm_roberta",
    "modernbert",
)  # bidirectional encoders (replicas.model.encoder)


def text_config(hf: Any) -> Any:
    """The text model's config: ``text_config`` of a multimodal checkpoint, else ``hf``."""
    sub = getattr(hf, "text_config", None)
    return hf if sub is None else sub


def _shared(hf: Any, family: str) -> dict[str, Any]:
    heads = int(hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    if getattr(hf, "attention_bias", False):
        raise UnsupportedModelError("attention_bias: attention biases are not supported")
    if getattr(hf, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias: MLP biases are not supported")
    window = getattr(hf, "sliding_window", None)
    return {
        "family": family,
        "vocab_size": int(hf.vocab_size),
        "hidden_size": int(hf.hidden_size),
        "intermediate_size": int(hf.intermediate_size),
        "num_layers": int(hf.num_hidden_layers),
        "num_heads": heads,
        "num_kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(hf.rms_norm_eps),
        "tie_word_embeddings": bool(getattr(hf, "tie_word_embeddings", False)),
        "max_position_embeddings": int(getattr(hf, "max_position_embeddings", 8192)),
        "sliding_window": None if window is None else int(window),
    }


def _sliding_layers(hf: Any) -> tuple[bool, ...]:
    kinds = tuple(getattr(hf, "layer_types", None) or ())
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UnsupportedModelError(f"layer_types: {unknown} not supported")
    return tuple(kind == "sliding_attention" for kind in kinds)


def _gemma(hf: Any, family: str) -> dict[str, Any]:
    act = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", None)
    if act not in GELU_TANH:
        raise UnsupportedModelError(f"hidden_activation: {act!r} not in {GELU_TANH}")
    if getattr(hf, "use_bidirectional_attention", False):
        if family != "gemma3":
            raise UnsupportedModelError("use_bidirectional_attention: only causal models score")
        family = EMBEDDING_GEMMA  # its layers read each input both ways (model.embedding_gemma)
    fields = _shared(hf, family)
    final_cap = getattr(hf, "final_logit_softcapping", None)
    attn_cap = getattr(hf, "attn_logit_softcapping", None)
    fields.update(
        hidden_act="gelu_tanh",
        norm_offset=True,
        post_norms=True,
        embed_scale=True,
        query_scale=float(hf.query_pre_attn_scalar) ** -0.5,
        attn_softcap=None if attn_cap is None else float(attn_cap),
        final_softcap=None if final_cap is None else float(final_cap),
        sliding_layers=_sliding_layers(hf),
    )
    return fields


def _gemma3_rope(hf: Any) -> dict[str, Any]:
    """Global layers' base and linear factor, windowed layers' base."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    kind = full.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise UnsupportedModelError(f"rope_parameters.full_attention.rope_type: {kind!r}")
    if local.get("rope_type", "default") != "default":
        raise UnsupportedModelError(
            f"rope_parameters.sliding_attention.rope_type: {local.get('rope_type')!r}"
        )
    return {
        "rope_theta": float(full.get("rope_theta", 1_000_000.0)),
        "rope_linear_factor": float(full.get("factor", 1.0)) if kind == "linear" else 1.0,
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)),
    }


def _rope_theta(hf: Any) -> float:
    """The RoPE base of a family without RoPE scaling (others are refused by name)."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UnsupportedModelError(f"rope_type: {kind!r} is not supported for this family")
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


GELU_EXACT = ("gelu",)


def _encoder_dims(hf: Any, family: str, norm_eps: float) -> dict[str, Any]:
    """What BERT-like encoders share: full multi-head attention, untied, exact GELU."""
    heads = int(hf.num_attention_heads)
    return {
        "family": family,
        "vocab_size": int(hf.vocab_size),
        "hidden_size": int(hf.hidden_size),
        "intermediate_size": int(hf.intermediate_size),
        "num_layers": int(hf.num_hidden_layers),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": int(hf.hidden_size) // heads,
        "rms_norm_eps": norm_eps,
        "tie_word_embeddings": False,
        "max_position_embeddings": int(hf.max_position_embeddings),
        "hidden_act": "gelu",
    }


def _bert(hf: Any, family: str) -> dict[str, Any]:
    """BERT: post-norm LayerNorm blocks with biases, exact-GELU MLP (not gated), learned
    absolute positions and token types; no RoPE (``rope_theta`` is unused)."""
    act = getattr(hf, "hidden_act", None)
    if act not in GELU_EXACT:
        raise UnsupportedModelError(f"hidden_act: {act!r} not in {GELU_EXACT}")
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise UnsupportedModelError(f"position_embedding_type: {kind!r} (only absolute)")
    return {
        **_encoder_dims(hf, family, float(hf.layer_norm_eps)),
        "rope_theta": 0.0,
        "type_vocab_size": int(hf.type_vocab_size),
        "position_offset": position_offset(hf),
    }


def _modernbert(hf: Any) -> dict[str, Any]:
    """ModernBERT: ``sliding_window`` is the half window (``local_attention // 2``)."""
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(hf, flag, False):
            raise UnsupportedModelError(f"{flag}: ModernBERT's biases are not supported")
    act = getattr(hf, "hidden_activation", None)
    if act not in GELU_EXACT:
        raise UnsupportedModelError(f"hidden_activation: {act!r} not in {GELU_EXACT}")
    return {
        **_encoder_dims(hf, "modernbert", float(hf.norm_eps)),
        "norm_bias": bool(hf.norm_bias),
        "classifier_bias": bool(getattr(hf, "classifier_bias", False)),
        "sliding_window": int(hf.local_attention) // 2,
        "sliding_layers": _sliding_layers(hf),
        **_gemma3_rope(hf),
    }


def family_fields(hf: Any, family: str) -> dict[str, Any]:
    """ModelConfig keyword arguments of a Mistral, Gemma 2, Gemma 3 (text), BERT or
    ModernBERT config."""
    if family == "modernbert":
        return _modernbert(hf)
    if family in ENCODER_FAMILIES:
        return _bert(hf, family)
    if family == "mistral":
        return {**_shared(hf, family), "rope_theta": _rope_theta(hf)}
    if family == "gemma2":
        return {**_gemma(hf, family), "rope_theta": _rope_theta(hf)}
    fields = _gemma(hf, family)
    fields.update(qk_norm=True, **_gemma3_rope(hf))
    return fields
