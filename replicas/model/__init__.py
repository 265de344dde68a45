"""The model: a Flax causal LM for the Llama, Qwen2 and Qwen3 families.

``config`` (ModelConfig from a Hugging Face config), ``layers`` (RMSNorm, RoPE, attention
over dense masks and item streams, MLP), ``causal_lm`` (CausalLM with the attention spec it
runs under), ``attention`` (the backend choice: XLA reference, Pallas on TPU, cuDNN on
GPU), ``pallas_attention`` (the TPU kernels beside their XLA reference), ``masks`` (built
from lengths), ``params`` (logical axes and shardings of every parameter), ``flops`` and
``catalog`` (production sizes for deviceless compiles).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ModelConfig": ".config",
        "UnsupportedModelError": ".config",
        "config_from_hf": ".config",
        "CausalLM": ".causal_lm",
        "AttentionSpec": ".causal_lm",
        "with_attention": ".attention",
        "param_shapes": ".params",
        "param_shardings": ".params",
        "model_config": ".catalog",
        "token_flops": ".flops",
    },
)
