"""What the families' config readers share: a multimodal checkpoint's text tower, the sizes,
``layer_types``, the RoPE bases. Errors name the config field that is not supported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replicas.model.errors import UnsupportedModelError


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency-dependent RoPE scaling (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def text_config(hf: Any) -> Any:
    """The text model's config: ``text_config`` of a multimodal checkpoint, else ``hf``."""
    sub = getattr(hf, "text_config", None)
    return hf if sub is None else sub


def dims(hf: Any, family: str) -> dict[str, Any]:
    """The sizes every family reads by the same names."""
    return {
        "family": family, "vocab_size": int(hf.vocab_size), "hidden_size": int(hf.hidden_size),
        "intermediate_size": int(hf.intermediate_size), "num_layers": int(hf.num_hidden_layers),
        "num_heads": int(hf.num_attention_heads),
    }  # fmt: skip


def decoder_dims(hf: Any, family: str) -> dict[str, Any]:
    """A decoder's sizes: grouped key/value heads, RMSNorm eps, tied or not."""
    heads = int(hf.num_attention_heads)
    return {
        **dims(hf, family), "num_kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(hf, "head_dim", None) or hf.hidden_size // heads),
        "rms_norm_eps": float(hf.rms_norm_eps),
        "tie_word_embeddings": bool(getattr(hf, "tie_word_embeddings", False)),
        "max_position_embeddings": int(getattr(hf, "max_position_embeddings", 8192)),
    }  # fmt: skip


def refuse(hf: Any, *flags: tuple[str, str]) -> None:
    """An error naming the first of ``flags`` (the field, what it asks for) the config sets."""
    for flag, what in flags:
        if getattr(hf, flag, False):
            raise UnsupportedModelError(f"{flag}: {what} not supported")


MLP_BIAS = ("mlp_bias", "MLP biases are")


def decoder_fields(hf: Any, family: str) -> dict[str, Any]:
    """A decoder's sizes (Mistral, Gemma), no biases, an optional ``sliding_window``."""
    refuse(hf, ("attention_bias", "attention biases are"), MLP_BIAS)
    window = getattr(hf, "sliding_window", None)
    return {**decoder_dims(hf, family), "sliding_window": None if window is None else int(window)}


def sliding_layers(hf: Any) -> tuple[bool, ...]:
    """Per layer, whether ``layer_types`` windows it."""
    kinds = tuple(getattr(hf, "layer_types", None) or ())
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UnsupportedModelError(f"layer_types: {unknown} not supported")
    return tuple(kind == "sliding_attention" for kind in kinds)


def rope_bases(hf: Any) -> dict[str, Any]:
    """Global layers' base and linear factor, windowed layers' base (Gemma 3, ModernBERT)."""
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


def rope_parameters(hf: Any) -> dict[str, Any]:
    """transformers v5 ``rope_parameters``, else v4 ``rope_scaling``."""
    return dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})


def rope_theta(hf: Any, supported: str = "for this family") -> float:
    """The RoPE base of a family without RoPE scaling (others are refused by name)."""
    params = rope_parameters(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UnsupportedModelError(f"rope_type: {kind!r} is not supported {supported}")
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def rope(hf: Any) -> tuple[float, RopeScaling | None]:
    """(theta, Llama 3's frequency-dependent scaling or None): Llama, Qwen."""
    params = rope_parameters(hf)
    if params.get("rope_type", params.get("type")) != "llama3":
        return rope_theta(hf, "(default, llama3)"), None
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))), RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
