"""Typed model configuration of every family (``replicas.model.family.registry``).

Built from a transformers ``PretrainedConfig`` (config.json or GGUF metadata) so that one
parser covers every source: the family its config selects reads its fields. Errors name
the field that is unsupported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from replicas.contract import PoolingHead, ScoreHead
from replicas.model.errors import UnsupportedModelError
from replicas.model.family.fields import RopeScaling, text_config
from replicas.model.family.registry import ENCODERS, recognize
from replicas.model.family.registry import NAMES as FAMILIES
from replicas.model.head_config import score_head_from_hf
from replicas.settings.model import QUANTIZATIONS

NO_WINDOW = 1 << 30  # the window of a global layer: every earlier key is inside it


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2: biases on q, k and v projections
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 8192
    head: ScoreHead | None = None  # a seq-cls / reward head in place of the LM head
    pooling: PoolingHead | None = None  # an embedding model: pooled hidden states, no LM head
    # Options of the shared layers that Mistral and Gemma turn on (their family files read
    # them from the transformers config); the defaults are Llama's behaviour.
    hidden_act: str = "silu"  # MLP gate activation: silu, or gelu_tanh (Gemma)
    norm_offset: bool = False  # Gemma: every RMSNorm scales by (1 + w), not w
    post_norms: bool = False  # Gemma 2/3: RMSNorm on each block's output before the residual
    embed_scale: bool = False  # Gemma: embeddings are multiplied by sqrt(hidden_size)
    query_scale: float | None = None  # attention logit scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    final_softcap: float | None = None  # Gemma 2: the same on the LM head's logits
    # A windowed layer's token at position p reads keys at positions q with p - window < q <= p
    # (transformers' sliding_window convention; EmbeddingGemma: |p - q| < window). None: no
    # layer is windowed.
    sliding_window: int | None = None
    # Per layer: True where the layer is windowed (Gemma: local layers); () with a window:
    # every layer (Mistral).
    sliding_layers: tuple[bool, ...] = ()
    local_rope_theta: float | None = None  # Gemma 3: RoPE base of the windowed layers
    rope_linear_factor: float = 1.0  # Gemma 3 4B+: linear RoPE scaling of the global layers
    # Encoders (BERT): learned absolute positions and token types, LayerNorm with biases
    # (``rms_norm_eps`` is its eps), post-norm blocks; see replicas.model.encoder.
    type_vocab_size: int = 0
    position_offset: int = 0  # added to every position before its embedding (XLM-R: pad + 1)
    norm_bias: bool = True  # the encoder's LayerNorms have biases (ModernBERT: norm_bias)
    classifier_bias: bool = False  # ModernBERT's head dense has a bias
    # How the layers' projections run (the ``quantization`` setting, replicas.model.quant):
    # none, int8 (W8A8, per-token activation scales), int8_smooth (int8 on SmoothQuant-rescaled
    # weights, model.smooth), int8_weight or fp8.
    quantization: str = "none"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UnsupportedModelError(f"family: {self.family!r} not in {FAMILIES}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_key_value_heads: {self.num_kv_heads} does not divide "
                f"num_attention_heads {self.num_heads}"
            )
        if self.head_dim % 2 and (self.rotary or not self.encoder):
            raise UnsupportedModelError(f"head_dim: must be even for RoPE, got {self.head_dim}")
        acts = ("silu", "gelu_tanh") + (("gelu",) if self.encoder else ())  # exact: encoders
        if self.hidden_act not in acts:
            raise UnsupportedModelError(f"hidden_act: {self.hidden_act!r} not in {acts}")
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise UnsupportedModelError(
                f"layer_types: {len(self.sliding_layers)} entries for {self.num_layers} layers"
            )
        if self.quantization not in QUANTIZATIONS:
            raise UnsupportedModelError(
                f"quantization: {self.quantization!r} not in {QUANTIZATIONS}"
            )
        if self.encoder and self.quantization not in ("none", "int8_weight"):
            raise UnsupportedModelError(
                f"quantization: {self.quantization!r} quantizes activations, which an encoder "
                f"does not: a {self.family} encoder runs none or int8_weight"
            )
        if self.encoder and self.rotary and self.quantization != "none":
            raise UnsupportedModelError(
                f"quantization: {self.quantization!r}: ModernBERT's fused projections run "
                "unquantized (set quantization: none)"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise UnsupportedModelError(f"sliding_window: must be >= 1, got {self.sliding_window}")

    @property
    def encoder(self) -> bool:
        """A bidirectional encoder (BERT): ``replicas.model.encoder`` runs it."""
        return self.family in ENCODERS

    @property
    def embeds(self) -> bool:
        """Its engine runs embed steps only: an embedding model (a pooling head) or an
        encoder (a cross-encoder's pairs too)."""
        return self.pooling is not None or self.encoder

    @property
    def rotary(self) -> bool:
        """An encoder with RoPE, pre-norm blocks and a GeGLU MLP (ModernBERT)."""
        return self.family == "modernbert"

    @property
    def windowed(self) -> bool:
        """Some layer attends within a sliding window."""
        return self.sliding_window is not None and (
            not self.sliding_layers or any(self.sliding_layers)
        )

    def layer_windows(self) -> tuple[int, ...]:
        """Each layer's window (``NO_WINDOW`` for a global layer)."""
        window = self.sliding_window or NO_WINDOW
        local = self.sliding_layers or (True,) * self.num_layers
        return tuple(window if is_local else NO_WINDOW for is_local in local)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def with_layers(self, num_layers: int) -> ModelConfig:
        """The first ``num_layers`` layers (their kinds kept; for per-layer cost compiles)."""
        kinds = self.sliding_layers and tuple(self.sliding_layers[:num_layers])
        return self.replace(num_layers=num_layers, sliding_layers=kinds)


def config_from_hf(hf: Any) -> ModelConfig:
    """Translate a transformers config of a supported family into ModelConfig."""
    return ModelConfig(**recognize(hf).fields(text_config(hf)), head=score_head_from_hf(hf))
