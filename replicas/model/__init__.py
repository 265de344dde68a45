"""The model: a Flax causal LM for the Llama, Qwen2, Qwen3, Mistral, Gemma 2 and Gemma 3
(text) families, with score heads, pooling heads and LoRA slots; a bidirectional encoder for
BERT and XLM-RoBERTa (embedders and cross-encoders); quantized projections.

``config`` (ModelConfig from a Hugging Face config; the architectures it accepts),
``family`` (one file per family and their registry: what selects it, its fields, its
tensor names, its class), ``tensors`` (TensorMapping: a leaf's checkpoint names), ``layers``
(RMSNorm, RoPE, attention over dense masks and item streams, MLP), ``causal_lm`` (CausalLM
with the attention spec it runs under), ``heads`` and ``head_config`` (seq-cls and reward
score heads), ``pooling_config`` and ``st_inputs`` (embedding models' pooling and input
format), ``lora`` and ``slot_routing`` (LoRA adapter slots, dense or grouped by slot),
``attention`` (the backend choice: XLA reference, Pallas on TPU, cuDNN on GPU),
``pallas_attention`` (the TPU kernels beside their XLA reference), ``masks`` (built from
lengths), ``params`` (logical axes and shardings of every parameter), ``flops`` and
``catalog`` (production sizes for deviceless compiles), ``errors`` (the parsers' errors),
``encoder`` (Encoder: BERT-style post-norm blocks over packed sequences),
``embedding_gemma`` (EmbeddingGemma: Gemma 3's layers read both ways), ``classes`` (the
model class a config's family runs: ``model_for``), ``quant`` (the quantized projection and
its numpy reference).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ModelConfig": ".config",
        "UnsupportedModelError": ".config",
        "config_from_hf": ".config",
        "CausalLM": ".causal_lm",
        "Encoder": ".encoder",
        "EmbeddingGemma": ".embedding_gemma",
        "model_for": ".classes",
        "AttentionSpec": ".causal_lm",
        "with_attention": ".attention",
        "param_shapes": ".params",
        "param_shardings": ".params",
        "model_config": ".catalog",
        "token_flops": ".flops",
    },
)
